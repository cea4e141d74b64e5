// One vocabulary on the command line: every command spells a concept the same way, an old
// spelling fails naming the new one, a misspelled command or option gets the closest real name,
// preset names work wherever a model or cluster file does, and a user's mistake is reported
// without our source locations.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <regex>
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
        std::string old_name, new_name;
    };
    const std::vector<Renamed> renamed = {
        {"--model", "--config"},          {"--seq", "--seq-len"},
        {"--dispatcher", "--dispatch"},   {"--no-overlap", "--no-overlap-dp-grad"},
        {"--checkpoint", "--weights"},    {"--tokens", "--new-tokens"},
        {"--tokens", "--tokens-per-rank"}};
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
            if (!has_option(help.text, r.new_name) || has_option(help.text, r.old_name)) continue;
            for (const std::string value : {" 64", ""}) {
                const auto out = run_cli(command + " " + r.old_name + value);
                EXPECT_EQ(out.exit_code, 1) << command << " " << r.old_name << value;
                EXPECT_CONTAINS(out.text, r.old_name + " was renamed " + r.new_name);
            }
            ++checked;
        }
    }
    // The newcomer's cases among them: train --seq and --model, info --model.
    EXPECT_GE(checked, 20);
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

TEST(CliVocabulary, NewSpellingsWork) {
    const auto info = run_cli("info --config tiny --seq-len 128");
    EXPECT_EQ(info.exit_code, 0) << info.text;
    EXPECT_CONTAINS(info.text, "FLOPs per token at seq 128");
    const auto simulate = run_cli(
        "simulate --config dsv3-671b --cluster gb300-nvl72 --gpus 256 --layout tp1.pp2.vpp4.ep32 "
        "--gbs 4096 --seq-len 4096 --precision mxfp8 --dispatch flat --no-overlap-dp-grad");
    EXPECT_EQ(simulate.exit_code, 0) << simulate.text;
    EXPECT_CONTAINS(simulate.text, "dispatch flat, overlap dp-param;");
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
          std::string("sample --weights /nonexistent.bin")}) {
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
