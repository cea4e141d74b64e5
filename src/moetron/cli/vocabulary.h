// The command line's words: one name per concept across every subcommand. An option that was
// renamed keeps its old spelling only as a hidden option that fails naming the new one (one
// table, kRenamedOptions in vocabulary.cpp, for every command), and a misspelled subcommand or
// option gets the closest real name ("did you mean ...?").
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
class ParseError;
class Option;
}  // namespace CLI

namespace moetron::cli {

// Adds the old spellings of renamed options to every command of `app` (subcommands included,
// after they registered their options) that has the new name: each old spelling is accepted, with
// or without a value, only to fail with "--old was renamed --new".
void add_renamed_options(CLI::App& app);

// --dispatch flat|two_tier, the one spelling of the MoE dispatch for train, simulate and plan;
// the old value two-tier fails naming two_tier.
CLI::Option* add_dispatch_option(CLI::App& cmd, std::string& dispatch, const std::string& what);

// A model config for --config: a path, or the name of a bundled preset (`tiny`).
// A cluster file for --cluster: a path, or the name of a bundled cluster (`gb300-nvl72`).
std::string model_config_path(const std::string& path_or_preset);
std::string cluster_config_path(const std::string& path_or_preset);

// A CLI11 parse error as the message a person reads: for an unknown subcommand or option, the
// closest known name; for others, CLI11's message and where to find the options.
std::string describe_parse_error(const CLI::App& app, const CLI::ParseError& error);

}  // namespace moetron::cli
