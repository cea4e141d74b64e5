#include "moetron/cli/vocabulary.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <string_view>

#include "moetron/core/error.h"
#include "moetron/core/precision.h"
#include "moetron/core/strings.h"
#include "moetron/core/user_error.h"
#include "moetron/model/moe.h"
#include "moetron/sim/step.h"
#include "moetron/train/preset_path.h"

namespace moetron::cli {

namespace {

// Old spellings and their new names. An old name is added to every command that has the new one
// (and no option of the old name itself); a name renamed differently in different commands
// (--tokens) lists each new name.
struct RenamedOption {
    const char* old_name;
    const char* new_name;
};
constexpr RenamedOption kRenamedOptions[] = {
    {"--model", "--config"},
    {"--seq", "--seq-len"},
    {"--dispatcher", "--dispatch"},
    {"--no-overlap", "--no-overlap-dp-grad"},
    {"--checkpoint", "--weights"},
    {"--tokens", "--new-tokens"},                               // sample
    {"--tokens", "--tokens-per-rank"},                          // bench a2a
    {"--low-precision-dispatch", "--dispatch-payload recipe"},  // simulate, plan
    {"--overlap-ep", "--moe-overlap dual"},                     // simulate, plan
};

// The option a new name (which may carry its value: "--moe-overlap dual") is.
std::string option_of(const std::string& new_name) {
    return new_name.substr(0, new_name.find(' '));
}

// A validator of one option's words: `check` returns why a value is refused ("" to take it), and
// --help shows `values`, the whole vocabulary of the option (a|b|c), on every command.
CLI::Validator words(const std::vector<std::string>& values,
                     std::function<std::string(const std::string&)> check) {
    return CLI::Validator([check = std::move(check)](std::string& value) { return check(value); },
                          fmt::format("{}", fmt::join(values, "|")));
}

// What `parse` says of a value: "" when it takes it, else its user error's message.
template <typename Parse>
std::string refusal_of(Parse parse) {
    try {
        parse();
    } catch (const UserError& e) {
        return e.what();
    }
    return "";
}

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

std::string_view without_dashes(std::string_view name) {
    return name.substr(std::min(name.find_first_not_of('-'), name.size()));
}

std::vector<std::string_view> dash_separated_parts(std::string_view name) {
    std::vector<std::string_view> parts;
    for (size_t begin = 0;;) {
        const size_t end = name.find('-', begin);
        parts.push_back(name.substr(begin, end - begin));
        if (end == std::string_view::npos) return parts;
        begin = end + 1;
    }
}

// True when each dash-separated part of `typed` begins a part of `name`, in order, the first
// part the first one: `seq` abbreviates `seq-len`, `no-dp-grad` abbreviates `no-overlap-dp-grad`,
// `sim` abbreviates `simulate`.
bool abbreviates(std::string_view typed, std::string_view name) {
    const std::vector<std::string_view> typed_parts = dash_separated_parts(without_dashes(typed));
    const std::vector<std::string_view> name_parts = dash_separated_parts(without_dashes(name));
    size_t n = 0;
    for (size_t t = 0; t < typed_parts.size(); ++t, ++n) {
        while (n < name_parts.size() && !name_parts[n].starts_with(typed_parts[t])) {
            if (t == 0) return false;
            ++n;
        }
        if (n == name_parts.size()) return false;
    }
    return true;
}

// A candidate farther than this from the typed word is a different word that merely looks alike
// (`seq` is no typo of `seed`): about one edit per three letters, and never more than three.
size_t max_suggestion_distance(std::string_view typed) {
    return std::clamp<size_t>(without_dashes(typed).size() / 3, 1, 3);
}

// What the user may have meant by `word`: the names it abbreviates when there are any (a word
// that begins real names is never a typo of another one), else the closest name within
// max_suggestion_distance, else nothing.
std::vector<std::string> suggestions(const std::string& word,
                                     const std::vector<std::string>& names) {
    std::vector<std::string> longer;
    for (const std::string& name : names)
        if (name != word && abbreviates(word, name)) longer.push_back(name);
    if (!longer.empty()) return longer;
    const std::vector<std::string_view> views(names.begin(), names.end());
    const std::string_view best = closest_match(word, views);
    if (!best.empty() && edit_distance(word, best) <= max_suggestion_distance(word))
        return {std::string(best)};
    return {};
}

// "did you mean X?" or "did you mean one of X, Y?"; quote: wrap each name in single quotes.
std::string did_you_mean(const std::vector<std::string>& names, bool quote) {
    std::vector<std::string> shown;
    for (const std::string& name : names) shown.push_back(quote ? "'" + name + "'" : name);
    return fmt::format("did you mean {}{}?", shown.size() > 1 ? "one of " : "",
                       fmt::join(shown, ", "));
}

std::string unknown_command(const CLI::App& cmd, const std::string& word) {
    const std::vector<std::string> names = subcommand_names(cmd);
    const std::vector<std::string> meant = suggestions(word, names);
    if (!meant.empty())
        return fmt::format("unknown command '{}'; {}", word, did_you_mean(meant, true));
    return fmt::format("unknown command '{}'; the commands of '{}' are: {}", word,
                       command_path(cmd), fmt::join(names, ", "));
}

std::string unknown_option(const CLI::App& cmd, const std::string& word) {
    const std::string flag = word.substr(0, word.find('='));
    const std::vector<std::string> meant = suggestions(flag, option_names(cmd));
    if (!meant.empty())
        return fmt::format("'{}' has no option {}; {}", command_path(cmd), flag,
                           did_you_mean(meant, false));
    return fmt::format("'{}' has no option {} (see '{} --help')", command_path(cmd), flag,
                       command_path(cmd));
}

}  // namespace

void add_renamed_options(CLI::App& app) {
    for (const RenamedOption& renamed : kRenamedOptions) {
        if (app.get_option_no_throw(option_of(renamed.new_name)) == nullptr ||
            app.get_option_no_throw(renamed.old_name) != nullptr)
            continue;
        const std::string old_name = renamed.old_name, new_name = renamed.new_name;
        app.add_option(old_name,
                       [old_name, new_name](const CLI::results_t&) -> bool {
                           MT_USER_THROW("{} was renamed {} (one name for it in every command)",
                                         old_name, new_name);
                       })
            ->expected(0, 1)  // `--seq 64`, and `--no-overlap` of a flag
            ->group("");      // hidden from --help
    }
    for (CLI::App* sub : app.get_subcommands({})) add_renamed_options(*sub);
}

CLI::Option* add_dispatch_option(CLI::App& cmd, std::string& dispatch, const std::string& what) {
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

CLI::Option* add_precision_option(CLI::App& cmd, std::string& precision, Side side,
                                  const std::string& what) {
    std::vector<std::string> values;
    for (size_t p = 0; p < kNumPrecisions; ++p)
        values.emplace_back(precision_name(static_cast<Precision>(p)));
    return cmd.add_option("--precision", precision, what)
        ->capture_default_str()
        ->check(words(values, [side](const std::string& value) {
            return refusal_of([&] {
                const Precision recipe = parse_precision(value);
                if (side == Side::engine) require_engine_recipe(recipe);
            });
        }));
}

CLI::Option* add_dispatch_payload_option(CLI::App& cmd,
                                         std::function<void(parallel::DispatchPayload)> set,
                                         parallel::DispatchPayload default_payload,
                                         const std::string& what) {
    using parallel::DispatchPayload;
    std::vector<std::string> values;
    for (const DispatchPayload p : {DispatchPayload::activation, DispatchPayload::recipe})
        values.emplace_back(parallel::dispatch_payload_name(p));
    return cmd
        .add_option_function<std::string>(
            "--dispatch-payload",
            [set = std::move(set)](const std::string& value) {
                set(parallel::parse_dispatch_payload(value));
            },
            what)
        ->default_str(std::string(parallel::dispatch_payload_name(default_payload)))
        ->check(words(values, [](const std::string& value) {
            return refusal_of([&] { (void)parallel::parse_dispatch_payload(value); });
        }));
}

CLI::Option* add_moe_overlap_option(CLI::App& cmd, std::string& overlap, Side side,
                                    const std::string& what) {
    return cmd.add_option("--moe-overlap", overlap, what)
        ->capture_default_str()
        ->check(words({"off", "shared", "dual"}, [side](const std::string& value) -> std::string {
            if (value != "off" && value != "shared" && value != "dual")
                return fmt::format("unknown MoE overlap '{}'; use off, shared or dual", value);
            if (side == Side::engine) return "";
            return refusal_of([&] { sim::check_moe_overlap_modelled(parse_moe_overlap(value)); });
        }));
}

CLI::Option* add_pp_schedule_option(CLI::App& cmd, std::string& schedule, Side side,
                                    const std::string& what) {
    return cmd.add_option("--pp-schedule", schedule, what)
        ->capture_default_str()
        ->check(words({"1f1b", "zb-h1", "dualpipe"}, [side](const std::string& value) {
            if (value == "interleaved")
                return std::string(
                    "pipeline schedule 'interleaved' is now spelled '1f1b' (it interleaves "
                    "whenever the layout has vpp > 1)");
            if (value != "1f1b" && value != "zb-h1" && value != "dualpipe")
                return fmt::format("unknown pipeline schedule '{}'; use 1f1b, zb-h1 or dualpipe",
                                   value);
            if (side == Side::engine && value == "dualpipe")
                return std::string(
                    "the engine has no DualPipe schedule yet; simulate and plan price it");
            return std::string();
        }));
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
