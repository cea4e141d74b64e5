// The command line's words: one name per concept across every subcommand. An option that was
// renamed keeps its old spelling only as a hidden option that fails naming the new one (one
// table, kRenamedOptions in vocabulary.cpp, for every command), and a misspelled subcommand or
// option gets the closest real name ("did you mean ...?").
//
// The options that the engine's commands (train, info) and the cluster model's (simulate, plan)
// share are registered here, so that each has one spelling and one set of values everywhere (its
// --help lists them all): a value one side cannot run is refused there with a message that says
// so and names the commands that take it, never as an unknown word.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "moetron/parallel/dispatch_traffic.h"

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

// Which side of moetron a command runs: the engine trains (train, info's plan of its memory), the
// cluster model prices (simulate, plan).
enum class Side { engine, cluster_model };

// --precision fp32|bf16|mxfp8|fp8-blockwise|nvfp4, the recipe (core/precision.h). The old
// spellings fp8 and fp4 fail naming fp8-blockwise and nvfp4; the engine refuses nvfp4.
CLI::Option* add_precision_option(CLI::App& cmd, std::string& precision, Side side,
                                  const std::string& what);

// --dispatch-payload activation|recipe (parallel/dispatch_traffic.h): `set` receives the choice;
// the old value fp32 fails naming activation. The defaults differ by side, and each command's
// help says which: the engine sends the recipe's format, the cluster model the activations' (as
// Megatron-LM does).
CLI::Option* add_dispatch_payload_option(CLI::App& cmd,
                                         std::function<void(parallel::DispatchPayload)> set,
                                         parallel::DispatchPayload default_payload,
                                         const std::string& what);

// --moe-overlap off|shared|dual (model/moe.h); the cluster model refuses shared, which it does not
// model (sim::check_moe_overlap_modelled).
CLI::Option* add_moe_overlap_option(CLI::App& cmd, std::string& overlap, Side side,
                                    const std::string& what);

// --pp-schedule 1f1b|zb-h1|dualpipe (1f1b interleaves whenever the layout has vpp > 1); the engine
// refuses dualpipe, and train's old value interleaved fails naming 1f1b.
CLI::Option* add_pp_schedule_option(CLI::App& cmd, std::string& schedule, Side side,
                                    const std::string& what);

// A model config for --config: a path, or the name of a bundled preset (`tiny`).
// A cluster file for --cluster: a path, or the name of a bundled cluster (`gb300-nvl72`).
std::string model_config_path(const std::string& path_or_preset);
std::string cluster_config_path(const std::string& path_or_preset);

// A CLI11 parse error as the message a person reads: for an unknown subcommand or option, the
// closest known name; for others, CLI11's message and where to find the options.
std::string describe_parse_error(const CLI::App& app, const CLI::ParseError& error);

}  // namespace moetron::cli
