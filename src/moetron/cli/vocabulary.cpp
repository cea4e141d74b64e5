#include "moetron/cli/vocabulary.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <string_view>

#include "moetron/core/error.h"
#include "moetron/core/strings.h"
#include "moetron/core/user_error.h"
#include "moetron/train/preset_path.h"

namespace moetron::cli {

namespace {

// Farther than this, a suggestion would be a guess: the message lists the choices instead.
constexpr size_t kMaxSuggestionDistance = 3;

std::string command_path(const CLI::App& cmd) {
    std::string path = cmd.get_name();
    for (const CLI::App* parent = cmd.get_parent(); parent != nullptr;
         parent = parent->get_parent())
        path = parent->get_name() + " " + path;
    return path;
}

// The deepest subcommand the parser entered (the app itself when none).
const CLI::App& innermost_command(const CLI::App& app) {
    for (const CLI::App* sub : app.get_subcommands())
        if (sub->parsed()) return innermost_command(*sub);
    return app;
}

std::vector<std::string> subcommand_names(const CLI::App& cmd) {
    std::vector<std::string> names;
    for (const CLI::App* sub : cmd.get_subcommands({})) names.push_back(sub->get_name());
    return names;
}

// The long names of the visible options (hidden ones are old spellings).
std::vector<std::string> option_names(const CLI::App& cmd) {
    std::vector<std::string> names;
    for (const CLI::Option* opt : cmd.get_options()) {
        if (opt->get_group().empty()) continue;
        for (const std::string& name : opt->get_lnames()) names.push_back("--" + name);
    }
    return names;
}

std::string closest(const std::string& name, const std::vector<std::string>& candidates) {
    const std::vector<std::string_view> views(candidates.begin(), candidates.end());
    const std::string_view best = closest_match(name, views);
    return !best.empty() && edit_distance(name, best) <= kMaxSuggestionDistance ? std::string(best)
                                                                                : std::string();
}

std::string unknown_command(const CLI::App& cmd, const std::string& word) {
    const std::vector<std::string> names = subcommand_names(cmd);
    const std::string best = closest(word, names);
    if (!best.empty()) return fmt::format("unknown command '{}'; did you mean '{}'?", word, best);
    return fmt::format("unknown command '{}'; the commands of '{}' are: {}", word,
                       command_path(cmd), fmt::join(names, ", "));
}

std::string unknown_option(const CLI::App& cmd, const std::string& word) {
    const std::string flag = word.substr(0, word.find('='));
    const std::string best = closest(flag, option_names(cmd));
    if (!best.empty())
        return fmt::format("'{}' has no option {}; did you mean {}?", command_path(cmd), flag,
                           best);
    return fmt::format("'{}' has no option {} (see '{} --help')", command_path(cmd), flag,
                       command_path(cmd));
}

}  // namespace

void add_renamed_option(CLI::App& cmd, const std::string& old_name, const std::string& new_name) {
    cmd.add_option_function<std::string>(
           old_name,
           [old_name, new_name](const std::string&) {
               MT_USER_THROW("{} was renamed {} (one name for it in every command)", old_name,
                             new_name);
           })
        ->group("");  // hidden from --help
}

void add_renamed_flag(CLI::App& cmd, const std::string& old_name, const std::string& new_name) {
    cmd.add_flag_function(old_name,
                          [old_name, new_name](int64_t) {
                              MT_USER_THROW("{} was renamed {} (one name for it in every command)",
                                            old_name, new_name);
                          })
        ->group("");
}

CLI::Option* add_dispatch_option(CLI::App& cmd, std::string& dispatch, const std::string& what) {
    add_renamed_option(cmd, "--dispatcher", "--dispatch");
    const CLI::Validator spelling(
        [](std::string& value) -> std::string {
            if (value == "two-tier") return "'two-tier' is now spelled 'two_tier'";
            if (value != "flat" && value != "two_tier")
                return fmt::format("unknown dispatch '{}' (known: flat, two_tier)", value);
            return "";
        },
        "flat|two_tier");
    return cmd.add_option("--dispatch", dispatch, what)->capture_default_str()->check(spelling);
}

std::string model_config_path(const std::string& path_or_preset) {
    return resolve_preset_or_path(path_or_preset, PresetKind::model);
}

std::string cluster_config_path(const std::string& path_or_preset) {
    return resolve_preset_or_path(path_or_preset, PresetKind::cluster);
}

std::string describe_parse_error(const CLI::App& app, const CLI::ParseError& error) {
    const CLI::App& cmd = innermost_command(app);
    for (const std::string& word : cmd.remaining()) {
        if (word.rfind("--", 0) == 0) return unknown_option(cmd, word);
        if (word.rfind('-', 0) != 0 && !cmd.get_subcommands({}).empty())
            return unknown_command(cmd, word);
    }
    if (dynamic_cast<const CLI::RequiredError*>(&error) != nullptr &&
        cmd.get_require_subcommand_min() > 0 && cmd.get_subcommands().empty())
        return fmt::format("'{}' needs a command: {}", command_path(cmd),
                           fmt::join(subcommand_names(cmd), ", "));
    return fmt::format("{} (see '{} --help')", error.what(), command_path(cmd));
}

}  // namespace moetron::cli
