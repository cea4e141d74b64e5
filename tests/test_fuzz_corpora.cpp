// The token-shard and configuration fuzzers' corpora (tests/fuzz/corpus/token_shard, .../config),
// replayed through the fuzzers' own property checks (fuzz/token_shard_check.h,
// fuzz/config_check.h), so that every build checks them without clang or libFuzzer. Hand-made
// seeds say in their names whether they must be accepted (valid-) or rejected (invalid-).
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "fuzz/config_check.h"
#include "fuzz/token_shard_check.h"
#include "temp_dir.h"

namespace moetron {
namespace {

namespace fs = std::filesystem;

// Replays every file of the corpus through check; returns how many were accepted.
int replay(const std::string& corpus_name, const std::function<bool(const std::string&)>& check) {
    const fs::path corpus = fs::path(MOETRON_SOURCE_DIR) / "tests/fuzz/corpus" / corpus_name;
    EXPECT_TRUE(fs::is_directory(corpus)) << corpus;
    int num_files = 0, num_accepted = 0;
    for (const fs::directory_entry& entry : fs::directory_iterator(corpus)) {
        const std::string name = entry.path().filename().string();
        const bool accepted = check(moetron::testing::read_file(entry.path()));
        if (name.starts_with("valid-")) {
            EXPECT_TRUE(accepted) << name;
        } else if (name.starts_with("invalid-")) {
            EXPECT_FALSE(accepted) << name;
        }
        num_accepted += accepted;
        ++num_files;
    }
    std::printf("[corpus] %s: %d inputs, %d accepted\n", corpus_name.c_str(), num_files,
                num_accepted);
    EXPECT_GE(num_files, 5);
    return num_accepted;
}

const uint8_t* bytes(const std::string& s) {
    return reinterpret_cast<const uint8_t*>(s.data());
}

TEST(FuzzCorpora, TokenShardCorpusReplaysThroughTheFuzzerProperty) {
    EXPECT_GE(replay("token_shard",
                     [](const std::string& s) {
                         return fuzz::check_token_shard_bytes(bytes(s), s.size());
                     }),
              3);
}

TEST(FuzzCorpora, ConfigCorpusReplaysThroughTheFuzzerProperty) {
    EXPECT_GE(
        replay("config",
               [](const std::string& s) { return fuzz::check_config_input(bytes(s), s.size()); }),
        2);
}

}  // namespace
}  // namespace moetron
