// One vocabulary on the command line: every command spells a concept the same way, an old
// spelling fails naming the new one, a misspelled command or option gets the closest real name,
// preset names work wherever a model or cluster file does, and a user's mistake is reported
// without our source locations.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_run.h"

namespace moetron {
namespace {

using moetron::testing::run_cli;

const std::string kTiny = MOETRON_SOURCE_DIR "/configs/models/tiny.toml";

TEST(CliVocabulary, OldSpellingsNameTheNewOnes) {
    struct Case {
        std::string args, expected;
    };
    const Case cases[] = {
        {"simulate --model " + kTiny + " --cluster h100-hgx --gpus 8 --layout tp1 --gbs 8",
         "--model was renamed --config"},
        {"plan --model " + kTiny + " --cluster h100-hgx --gpus 8 --gbs 8",
         "--model was renamed --config"},
        {"info --config tiny --seq 128", "--seq was renamed --seq-len"},
        {"simulate --config tiny --cluster h100-hgx --gpus 8 --layout tp1 --gbs 8 --seq 128",
         "--seq was renamed --seq-len"},
        {"simulate --config tiny --cluster h100-hgx --gpus 8 --layout tp1 --gbs 8 --dispatcher "
         "flat",
         "--dispatcher was renamed --dispatch"},
        {"simulate --config tiny --cluster h100-hgx --gpus 8 --layout tp1 --gbs 8 --dispatch "
         "two-tier",
         "'two-tier' is now spelled 'two_tier'"},
        {"train --steps 1 --dispatch two-tier", "'two-tier' is now spelled 'two_tier'"},
        {"train --steps 1 --no-overlap", "--no-overlap was renamed --no-overlap-dp-grad"},
        {"sample --weights nothing.bin --tokens 5", "--tokens was renamed --new-tokens"},
        {"bench a2a --tokens 5", "--tokens was renamed --tokens-per-rank"},
        {"export --checkpoint ckpt --out hf", "--checkpoint was renamed --weights"},
        {"simulate --config tiny --cluster h100-hgx --gpus 8 --layout tp1 --gbs 8 --overlap-ep",
         "--overlap-ep was renamed --moe-overlap dual"},
        {"plan --config tiny --cluster h100-hgx --gpus 8 --gbs 8 --low-precision-dispatch",
         "--low-precision-dispatch was renamed --dispatch-payload recipe"},
        {"simulate --config tiny --cluster h100-hgx --gpus 8 --layout tp1 --gbs 8 --precision fp8",
         "precision 'fp8' is now spelled 'fp8-blockwise'"},
        {"plan --config tiny --cluster h100-hgx --gpus 8 --gbs 8 --precision fp4",
         "precision 'fp4' is now spelled 'nvfp4'"},
        {"train --steps 1 --dispatch-payload fp32", "'fp32' is now spelled 'activation'"},
        {"train --steps 1 --pp-schedule interleaved", "'interleaved' is now spelled '1f1b'"},
    };
    for (const Case& c : cases) {
        const auto out = run_cli(c.args);
        EXPECT_EQ(out.exit_code, 1) << c.args << "\n" << out.text;
        EXPECT_CONTAINS(out.text, c.expected);
    }
}

// The old spellings come from one table (kRenamedOptions in cli/vocabulary.cpp): every command
// that has a new name answers its old one naming it, with or without a value. This walks every
// command's --help, so a command added later is covered too.
TEST(CliVocabulary, EveryCommandWithANewNameAnswersItsOldOne) {
    struct Renamed {
        std::string old_name, new_name;  // the new name may carry the value the old flag meant
    };
    const std::vector<Renamed> renamed = {{"--model", "--config"},
                                          {"--seq", "--seq-len"},
                                          {"--dispatcher", "--dispatch"},
                                          {"--no-overlap", "--no-overlap-dp-grad"},
                                          {"--checkpoint", "--weights"},
                                          {"--tokens", "--new-tokens"},
                                          {"--tokens", "--tokens-per-rank"},
                                          {"--low-precision-dispatch", "--dispatch-payload recipe"},
                                          {"--overlap-ep", "--moe-overlap dual"}};
    // An option line of CLI11's help: "  --seq-len INT ..." or "  --count-mtp,--no-count-mtp".
    const auto has_option = [](const std::string& help, const std::string& name) {
        const std::regex line("(^|\n) +(-[a-z], *)?([^ \n]*,)?" + name + "([ ,=\n]|$)");
        return std::regex_search(help, line);
    };
    int checked = 0;
    for (const std::string command : {"info", "train", "prepare", "sample", "simulate", "plan",
                                      "export", "import", "calibrate", "bench a2a"}) {
        const auto help = run_cli(command + " --help");
        ASSERT_EQ(help.exit_code, 0) << command << "\n" << help.text;
        for (const Renamed& r : renamed) {
            const std::string new_option = r.new_name.substr(0, r.new_name.find(' '));
            if (!has_option(help.text, new_option) || has_option(help.text, r.old_name)) continue;
            for (const std::string value : {" 64", ""}) {
                const auto out = run_cli(command + " " + r.old_name + value);
                EXPECT_EQ(out.exit_code, 1) << command << " " << r.old_name << value;
                EXPECT_CONTAINS(out.text, r.old_name + " was renamed " + r.new_name);
            }
            ++checked;
        }
    }
    // The newcomer's cases among them: train --seq and --model, info --model.
    EXPECT_GE(checked, 28);
    EXPECT_CONTAINS(run_cli("train --seq 64").text, "--seq was renamed --seq-len");
    EXPECT_CONTAINS(run_cli("train --model tiny").text, "--model was renamed --config");
    EXPECT_CONTAINS(run_cli("info --model tiny").text, "--model was renamed --config");
}

// A word that begins flags is offered those flags, never a different word that merely looks
// alike (train --seq once answered "did you mean --seed?", and following it set the seed); a
// short word is offered a neighbour only one edit away.
TEST(CliVocabulary, AWordIsNeverOfferedADifferentWordThatLooksAlike) {
    const auto sample = run_cli("sample --weights nothing --seq 64");  // no --seq-len in sample
    EXPECT_EQ(sample.exit_code, 1) << sample.text;
    EXPECT_CONTAINS(sample.text, "'moetron sample' has no option --seq (see");
    EXPECT_NOT_CONTAINS(sample.text, "--seed");
    EXPECT_CONTAINS(run_cli("train --seq-l 64").text, "did you mean --seq-len?");
    EXPECT_CONTAINS(run_cli("train --no-dp-grad").text, "did you mean --no-overlap-dp-grad?");
    EXPECT_CONTAINS(run_cli("train --save-ev 5").text, "did you mean --save-every?");
    EXPECT_CONTAINS(run_cli("train --sav x").text,
                    "did you mean one of --save, --save-every, --save-final?");
    EXPECT_CONTAINS(run_cli("train --sed 1").text, "did you mean --seed?");  // a typo still is one
    EXPECT_CONTAINS(run_cli("train --batchsize 2").text, "did you mean --batch-size?");
    EXPECT_CONTAINS(run_cli("sim").text, "unknown command 'sim'; did you mean 'simulate'?");
}

// The options of a command as its --help lists them: each long name, with the words its value
// takes when the help lists them ("--precision TEXT:fp32|bf16|...=bf16" or CLI11's
// "TEXT:{off,shared,dual}"); none for a number, a path or a flag.
std::map<std::string, std::vector<std::string>> options_of(const std::string& command) {
    const auto help = run_cli(command + " --help");
    EXPECT_EQ(help.exit_code, 0) << command << "\n" << help.text;
    std::map<std::string, std::vector<std::string>> options;
    const std::regex line("(^|\n) +(-[a-z], *)?(--[a-z0-9-]+)[^ \n]*( [A-Z]+(:([^ =\n]+))?)?");
    const std::regex words("\\{?([a-z0-9_-]+([|,][a-z0-9_-]+)+)\\}?");
    for (auto it = std::sregex_iterator(help.text.begin(), help.text.end(), line);
         it != std::sregex_iterator(); ++it) {
        std::vector<std::string>& values = options[(*it)[3]];
        std::smatch listed;
        const std::string type = (*it)[6];
        if (!std::regex_match(type, listed, words)) continue;
        std::stringstream list(listed[1].str());
        for (std::string value;
             std::getline(list, value, type.find('|') != std::string::npos ? '|' : ',');)
            values.push_back(value);
    }
    return options;
}

// The commands of both sides: the engine's (train, info, bench a2a) and the cluster model's.
const std::vector<std::string> kSharingCommands = {"train", "info", "simulate", "plan",
                                                   "bench a2a"};

// Issue 31: one spelling per concept. Every option two of these commands share lists the same
// words for its value in each (read from their --help, so that an option added to one command
// is compared too), and no command lists an old spelling.
TEST(CliVocabulary, SharedOptionsHaveOneSpellingAndOneSetOfValues) {
    std::map<std::string, std::map<std::string, std::vector<std::string>>> by_option;
    for (const std::string& command : kSharingCommands)
        for (const auto& [name, values] : options_of(command)) by_option[name][command] = values;
    int shared = 0, with_words = 0;
    for (const auto& [name, commands] : by_option) {
        if (commands.size() < 2 || name == "--help" || name == "--json") continue;
        ++shared;
        const auto& [first_command, first_values] = *commands.begin();
        if (!first_values.empty()) ++with_words;
        for (const auto& [command, values] : commands)
            EXPECT_EQ(values, first_values)
                << name << ": '" << command << "' and '" << first_command << "' differ";
    }
    EXPECT_GE(shared, 12);
    EXPECT_GE(with_words, 5);
    // The concepts of issue 31 are among the shared ones, in the commands that have them.
    const std::map<std::string, std::set<std::string>> expected = {
        {"--config", {"train", "info", "simulate", "plan"}},
        {"--seq-len", {"train", "info", "simulate", "plan"}},
        {"--precision", {"train", "info", "simulate", "plan"}},
        {"--dispatch", {"train", "info", "simulate", "plan"}},
        {"--dispatch-payload", {"train", "info", "simulate", "plan"}},
        {"--moe-overlap", {"train", "info", "simulate", "plan"}},
        {"--layout", {"train", "info", "simulate"}},
        {"--domain-size", {"train", "info", "bench a2a"}},
        {"--pp-schedule", {"train", "simulate", "plan"}},
        {"--pp-layout", {"train", "simulate"}},
        {"--redundant-experts", {"train", "info", "simulate", "plan"}},
        {"--no-overlap-dp-grad", {"train", "simulate"}},
        {"--seed", {"train", "bench a2a"}}};
    for (const auto& [name, commands] : expected) {
        std::set<std::string> have;
        for (const auto& [command, values] : by_option[name]) have.insert(command);
        EXPECT_EQ(have, commands) << name;
    }
    EXPECT_EQ(by_option["--precision"]["simulate"],
              (std::vector<std::string>{"fp32", "bf16", "mxfp8", "fp8-blockwise", "nvfp4"}));
    for (const std::string old_name : {"--model", "--seq", "--dispatcher", "--no-overlap",
                                       "--low-precision-dispatch", "--overlap-ep"})
        EXPECT_EQ(by_option.count(old_name), 0u) << old_name << " is listed";
}

// A value of a shared option that one side cannot run (the engine has no NVFP4 recipe and no
// DualPipe; the cluster model does not price the shared-expert overlap) is refused there with
// a message that says so, never as an unknown word; every other value parses (`--help` after
// the value stops a command that took it before it runs).
TEST(CliVocabulary, EveryValueIsTakenOrRefusedWithAReason) {
    std::map<std::string, std::set<std::string>> words_of;
    std::vector<std::pair<std::string, std::string>> uses;  // command, option
    for (const std::string& command : kSharingCommands) {
        for (const auto& [name, values] : options_of(command)) {
            if (values.empty()) continue;
            words_of[name].insert(values.begin(), values.end());
            uses.emplace_back(command, name);
        }
    }
    std::set<std::string> refused;
    int taken = 0;
    for (const auto& [command, name] : uses) {
        for (const std::string& value : words_of[name]) {
            const std::string args = command + " " + name + " " + value;
            const auto out = run_cli(args + " --help");
            if (out.exit_code == 0) {
                ++taken;
                continue;
            }
            EXPECT_EQ(out.exit_code, 1) << args << "\n" << out.text;
            EXPECT_CONTAINS(out.text, "moetron: error: " + name + ": ");
            EXPECT_CONTAINS(out.text, "simulate and plan");
            EXPECT_NOT_CONTAINS(out.text, "unknown");
            refused.insert(args);
        }
    }
    EXPECT_GE(taken, 40);
    EXPECT_EQ(refused, (std::set<std::string>{"train --precision nvfp4", "info --precision nvfp4",
                                              "train --pp-schedule dualpipe",
                                              "simulate --moe-overlap shared",
                                              "plan --moe-overlap shared"}));
}

// An old value of a shared option fails naming its new spelling in every command that has it.
TEST(CliVocabulary, OldValuesNameTheNewOnes) {
    struct OldValue {
        std::string option, old_value, new_value;
    };
    const std::vector<OldValue> old_values = {{"--precision", "fp8", "fp8-blockwise"},
                                              {"--precision", "fp4", "nvfp4"},
                                              {"--dispatch", "two-tier", "two_tier"},
                                              {"--dispatch-payload", "fp32", "activation"},
                                              {"--pp-schedule", "interleaved", "1f1b"}};
    int checked = 0;
    for (const std::string& command : kSharingCommands) {
        const auto options = options_of(command);
        for (const OldValue& v : old_values) {
            if (options.count(v.option) == 0) continue;
            const auto out = run_cli(command + " " + v.option + " " + v.old_value + " --help");
            EXPECT_EQ(out.exit_code, 1) << command << " " << v.option << " " << v.old_value;
            EXPECT_CONTAINS(out.text, "'" + v.old_value + "' is now spelled '" + v.new_value + "'");
            EXPECT_NOT_CONTAINS(out.text, ".cpp:");
            ++checked;
        }
    }
    EXPECT_EQ(checked, 19);  // --precision x 2, --dispatch, --dispatch-payload: 4 commands each;
                             // --pp-schedule: 3
}

TEST(CliVocabulary, NewSpellingsWork) {
    const auto info = run_cli("info --config tiny --seq-len 128");
    EXPECT_EQ(info.exit_code, 0) << info.text;
    EXPECT_CONTAINS(info.text, "FLOPs per token at seq 128");
    const auto simulate = run_cli(
        "simulate --config dsv3-671b --cluster gb300-nvl72 --gpus 256 --layout tp1.pp2.vpp4.ep32 "
        "--gbs 4096 --seq-len 4096 --precision mxfp8 --dispatch flat --no-overlap-dp-grad");
    EXPECT_EQ(simulate.exit_code, 0) << simulate.text;
    EXPECT_CONTAINS(simulate.text, "dispatch flat, overlap dp-param;");
    // train's recipe names, which simulate once called unknown (newcomer report, issue 31).
    const auto fp8 = run_cli(
        "simulate --config dsv3-671b --cluster h100-hgx --gpus 1024 --layout tp1.pp8.vpp4.ep64 "
        "--gbs 8192 --precision fp8-blockwise --recompute full --dispatch-payload recipe "
        "--moe-overlap dual");
    EXPECT_EQ(fp8.exit_code, 0) << fp8.text;
    EXPECT_CONTAINS(fp8.text, "micro-batches of 1 x 4096 tokens, fp8-blockwise\n");
    EXPECT_CONTAINS(fp8.text, ", dispatch two_tier, dispatch-payload recipe, moe-overlap dual, ");
    EXPECT_CONTAINS(fp8.text, "(of fp8 dense peak)");  // the rate the recipe runs at
}

// The simulate and plan reports spell the dispatch as --dispatch does (two_tier, not two-tier),
// so that what they print can be typed back.
TEST(CliVocabulary, ReportsSpellTheDispatchAsItsFlag) {
    const auto simulate = run_cli(
        "simulate --config dsv3-671b --cluster gb300-nvl72 --gpus 256 --layout tp1.pp2.vpp4.ep32 "
        "--gbs 4096 --precision mxfp8 --dispatch two_tier");
    EXPECT_EQ(simulate.exit_code, 0) << simulate.text;
    EXPECT_CONTAINS(simulate.text, ", dispatch two_tier, overlap ");
    EXPECT_NOT_CONTAINS(simulate.text, "two-tier");
    const auto json =
        run_cli("simulate --config tiny --cluster h100-hgx --gpus 8 --layout tp1 --gbs 8 --json");
    EXPECT_EQ(json.exit_code, 0) << json.text;
    EXPECT_CONTAINS(json.text, "dispatch two_tier");  // simulate's default
}

TEST(CliVocabulary, MisspelledCommandSuggestsTheClosest) {
    const auto out = run_cli("simualte");
    EXPECT_EQ(out.exit_code, 1) << out.text;
    EXPECT_CONTAINS(out.text, "unknown command 'simualte'; did you mean 'simulate'?");
    const auto nested = run_cli("bench a2b");
    EXPECT_CONTAINS(nested.text, "unknown command 'a2b'; did you mean 'a2a'?");
    const auto nothing = run_cli("");
    EXPECT_CONTAINS(nothing.text, "needs a command: ");
}

TEST(CliVocabulary, MisspelledOptionSuggestsTheClosest) {
    const auto out = run_cli("train --step 100");
    EXPECT_EQ(out.exit_code, 1) << out.text;
    EXPECT_CONTAINS(out.text, "'moetron train' has no option --step; did you mean --steps?");
    const auto far = run_cli("info --config tiny --zzzzzzzzzz");
    EXPECT_CONTAINS(far.text, "has no option --zzzzzzzzzz (see 'moetron info --help')");
}

TEST(CliVocabulary, UserErrorsCarryNoSourceLocation) {
    for (const std::string& args :
         {std::string("info --config /nonexistent/model.toml"), std::string("train --step 3"),
          std::string("train --steps 1 --data /nonexistent.tok"),
          std::string("train --steps 1 --text /nonexistent.txt"),
          std::string("sample --weights /nonexistent.bin"),
          std::string("simulate --config tiny --cluster h100-hgx --gpus 8 --layout tp1 --gbs 8 "
                      "--precision nvfp4"),
          std::string("simulate --config tiny --cluster h100-hgx --gpus 8 --layout tp1 --gbs 8 "
                      "--precision fp6"),
          std::string("train --precision nvfp4"), std::string("train --pp-schedule dualpipe")}) {
        const auto out = run_cli(args);
        EXPECT_EQ(out.exit_code, 1) << args << "\n" << out.text;
        EXPECT_NOT_CONTAINS(out.text, ".cpp:");
        EXPECT_NOT_CONTAINS(out.text, "check:");
    }
}

TEST(CliVocabulary, PresetNamesAndTheirList) {
    const auto unknown = run_cli("info --config tinny");
    EXPECT_EQ(unknown.exit_code, 1) << unknown.text;
    EXPECT_CONTAINS(unknown.text,
                    "there is no model preset 'tinny'; the presets are: dsv3-671b, "
                    "small, tiny");
    const auto cluster = run_cli("plan --config tiny --cluster h100 --gpus 8 --gbs 8");
    EXPECT_EQ(cluster.exit_code, 1) << cluster.text;
    EXPECT_CONTAINS(cluster.text, "there is no cluster preset 'h100'; the presets are: ");
    EXPECT_CONTAINS(cluster.text, "h100-hgx");
}

TEST(CliVocabulary, TrainHelpDoesNotSayOneProcess) {
    const auto out = run_cli("--help");
    EXPECT_EQ(out.exit_code, 0) << out.text;
    EXPECT_NOT_CONTAINS(out.text, "on one process");
    const auto export_help = run_cli("export --help");
    EXPECT_CONTAINS(export_help.text, "TEXT=bf16");  // the default dtype is shown
}

// The project's version, as CMakeLists.txt declares it.
std::string project_version() {
    std::ifstream cmake(MOETRON_SOURCE_DIR "/CMakeLists.txt");
    std::stringstream text;
    text << cmake.rdbuf();
    std::smatch match;
    const std::string s = text.str();
    if (!std::regex_search(s, match, std::regex("project\\(moetron VERSION ([0-9.]+)"))) return "";
    return match[1];
}

// The first line of a shell command's output ("" when it fails).
std::string first_line_of(const std::string& command) {
    std::FILE* pipe = ::popen((command + " 2>/dev/null").c_str(), "r");
    if (pipe == nullptr) return "";
    char buffer[512] = {};
    const bool read = std::fgets(buffer, sizeof buffer, pipe) != nullptr;
    const int status = ::pclose(pipe);
    if (!read || status != 0) return "";
    std::string line = buffer;
    if (!line.empty() && line.back() == '\n') line.pop_back();
    return line;
}

TEST(CliVersion, PrintsTheVersionTheCommitAndTheBackends) {
    const auto out = run_cli("--version");
    ASSERT_EQ(out.exit_code, 0) << out.text;
    const std::string version = project_version();
    ASSERT_FALSE(version.empty()) << "no project(moetron VERSION ...) in CMakeLists.txt";
    EXPECT_EQ(out.text.rfind("moetron " + version + " (", 0), 0u) << out.text;

    const std::string source = MOETRON_SOURCE_DIR;
    if (!first_line_of("git -C '" + source + "' rev-parse --show-toplevel").empty()) {
        // git describe: [TAG-N-g]HASH[-dirty]; the hash is a commit of this repository.
        std::smatch match;
        ASSERT_TRUE(std::regex_search(out.text, match,
                                      std::regex("\\(git (.*-g)?([0-9a-f]{7,})(-dirty)?\\)")))
            << out.text;
        EXPECT_FALSE(first_line_of("git -C '" + source + "' rev-parse --verify " + match[2].str() +
                                   "^{commit}")
                         .empty())
            << match[2] << " is no commit of " << source;
    } else {
        EXPECT_CONTAINS(out.text, "(not built from a git checkout)");
    }
#ifdef MOETRON_HAVE_CUDA
    EXPECT_CONTAINS(out.text, "\nCUDA backend: yes (CUDA ");
#else
    EXPECT_CONTAINS(out.text, "\nCUDA backend: no (no nvcc found at configure time)");
#endif
#ifdef MOETRON_HAVE_MPI
    EXPECT_CONTAINS(out.text, "\nMPI: yes (MPI ");
#else
    EXPECT_CONTAINS(out.text, "\nMPI: no");
#endif
    EXPECT_CONTAINS(run_cli("--help").text, "--version");
}

}  // namespace
}  // namespace moetron
