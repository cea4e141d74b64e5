// The checkpoint-slices fuzzer's corpus (tests/fuzz/corpus/checkpoint_slices), replayed through
// the fuzzer's own property check (fuzz/checkpoint_slices_check.h), so the reader's regressions
// fail here even where clang and libFuzzer are absent; and the hand-made invalid seeds' errors
// name the file or directory they come from.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/checkpoint_slices_check.h"
#include "moetron/checkpoint/checkpoint_pieces.h"
#include "moetron/core/error.h"

namespace moetron {
namespace {

namespace fs = std::filesystem;

std::string read_whole(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

fs::path corpus_dir() {
    return fs::path(MOETRON_SOURCE_DIR) / "tests/fuzz/corpus/checkpoint_slices";
}

// The message CheckpointTensors::open throws for an input, or "" when it opens.
std::string open_error(const std::string& bytes) {
    const std::vector<std::string> files =
        fuzz::shard_files_of(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    std::vector<fuzz::MemoryFile> memory(files.size());
    std::vector<std::string> names;
    for (size_t f = 0; f < files.size(); ++f) {
        write_all(memory[f].fd(), files[f].data(), files[f].size(), memory[f].path());
        names.push_back(memory[f].path().substr(std::string("/proc/self/fd/").size()));
    }
    try {
        CheckpointTensors::open("/proc/self/fd", names, fuzz::fuzz_model_entries());
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(CheckpointSlicesCorpus, ReplaysThroughTheFuzzerProperty) {
    ASSERT_TRUE(fs::is_directory(corpus_dir())) << corpus_dir();
    int num_files = 0, num_valid = 0;
    for (const fs::directory_entry& entry : fs::directory_iterator(corpus_dir())) {
        const std::string bytes = read_whole(entry.path());
        const bool valid = fuzz::check_checkpoint_input(
            reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
        const std::string name = entry.path().filename().string();
        // Hand-made seeds say what they are; inputs the fuzzer found may be anything.
        if (name.starts_with("valid-") || name.starts_with("layout-")) {
            EXPECT_TRUE(valid) << name;
        } else if (name.starts_with("invalid-")) {
            EXPECT_FALSE(valid) << name;
        }
        num_valid += valid;
        ++num_files;
    }
    std::printf("[corpus] %d inputs, %d open\n", num_files, num_valid);
    EXPECT_GE(num_valid, 8);
    EXPECT_GE(num_files - num_valid, 20);
}

TEST(CheckpointSlicesCorpus, InvalidSeedsNameTheirFile) {
    int num_invalid = 0;
    for (const fs::directory_entry& entry : fs::directory_iterator(corpus_dir())) {
        const std::string name = entry.path().filename().string();
        if (!name.starts_with("invalid-")) continue;
        const std::string message = open_error(read_whole(entry.path()));
        // Every error names the shard file, or the checkpoint directory for a gap or an overlap.
        EXPECT_NE(message.find("/proc/self/fd"), std::string::npos) << name << ": " << message;
        ++num_invalid;
    }
    EXPECT_GE(num_invalid, 20);
}

// The fuzzer's first finding: a float where an integer belongs ("shape": [1e300, 4]) reached
// nlohmann's conversion to int64_t, undefined behaviour past its range. It is malformed.
TEST(CheckpointSlicesCorpus, FloatsWhereIntegersBelongAreMalformed) {
    for (const char* seed : {"invalid-shape-float-huge", "invalid-flat-float-huge"}) {
        const std::string message = open_error(read_whole(corpus_dir() / seed));
        EXPECT_NE(message.find("not an integer of 64 bits"), std::string::npos)
            << seed << ": " << message;
        EXPECT_NE(message.find("layers.0.attn.o_proj"), std::string::npos) << message;
    }
}

// An unknown tensor's error names it, not only the array that holds it.
TEST(CheckpointSlicesCorpus, UnknownTensorIsNamed) {
    const std::string message = open_error(read_whole(corpus_dir() / "invalid-unknown-tensor"));
    EXPECT_NE(message.find("tensor 'layers.9.attn.o_proj'"), std::string::npos) << message;
}

}  // namespace
}  // namespace moetron
