// train/weights_file: the weights dump of `train --save-final`, read back by `sample`.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "expect_contains.h"
#include "moetron/core/error.h"
#include "moetron/train/weights_file.h"

namespace moetron {
namespace {

namespace fs = std::filesystem;

ParamEntry entry(const char* name, Shape shape, int64_t offset) {
    ParamEntry e;
    e.name = name;
    e.shape = shape;
    e.offset = offset;
    e.numel = shape.numel();
    return e;
}

std::string temp_path(const char* name) {
    return (fs::temp_directory_path() /
            (std::string("moetron_weights_") + std::to_string(::getpid()) + "_" + name))
        .string();
}

std::string error_of(const auto& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

class WeightsFile : public ::testing::Test {
  protected:
    void TearDown() override { fs::remove(path_); }
    std::string path_ = temp_path("w.bin");
    std::vector<ParamEntry> entries_ = {entry("embed", {4, 3}, 0), entry("norm", {3}, 12),
                                        entry("head", {2, 3}, 15)};
};

TEST_F(WeightsFile, RoundTrips) {
    std::vector<float> params(21);
    for (size_t i = 0; i < params.size(); ++i) params[i] = 0.5f * static_cast<float>(i) - 3.0f;
    save_weights(path_, entries_, params.data(), "toy: V=4 D=3");
    std::vector<float> loaded(21, -1.0f);
    load_weights(path_, entries_, loaded.data(), "toy: V=4 D=3");
    EXPECT_EQ(loaded, params);
}

TEST_F(WeightsFile, BadFilesGiveClearErrorsAndLeaveParamsAlone) {
    std::vector<float> params(21, 1.0f);
    std::vector<float> target(21, 7.0f);
    EXPECT_CONTAINS(error_of([&] { load_weights(path_, entries_, target.data(), "toy"); }),
                    "does not exist");

    save_weights(path_, entries_, params.data(), "toy: V=4 D=3");
    // Another model: a different shape, or a different tensor count.
    std::vector<ParamEntry> other = entries_;
    other[2] = entry("head", {5, 3}, 15);
    std::string e = error_of([&] { load_weights(path_, other, target.data(), "toy: V=5 D=3"); });
    EXPECT_CONTAINS(e, path_);
    EXPECT_CONTAINS(e, "another model");
    EXPECT_CONTAINS(e, "saved from: toy: V=4 D=3");
    EXPECT_CONTAINS(e, "tensor 2 is 'head' (2, 3) in the file but 'head' (5, 3) in the model");
    other.pop_back();
    EXPECT_CONTAINS(error_of([&] { load_weights(path_, other, target.data(), "toy"); }),
                    "the file has 3 tensors, the model 2");

    // Truncated values.
    fs::resize_file(path_, fs::file_size(path_) - 4);
    e = error_of([&] { load_weights(path_, entries_, target.data(), "toy"); });
    EXPECT_CONTAINS(e, "is truncated");
    EXPECT_CONTAINS(e, "parameter values");
    for (float x : target) ASSERT_EQ(x, 7.0f) << "a failed load must not touch the parameters";

    // Trailing bytes.
    save_weights(path_, entries_, params.data(), "toy");
    {
        std::ofstream out(path_, std::ios::binary | std::ios::app);
        out << "junk";
    }
    EXPECT_CONTAINS(error_of([&] { load_weights(path_, entries_, target.data(), "toy"); }),
                    "bytes after the last parameter value");

    // Not a weights file.
    {
        std::ofstream out(path_, std::ios::binary | std::ios::trunc);
        out << "hello world, not weights";
    }
    EXPECT_CONTAINS(error_of([&] { load_weights(path_, entries_, target.data(), "toy"); }),
                    "is not a moetron weights file");
}

}  // namespace
}  // namespace moetron
