// train/checkpoint_pieces: shard files of pieces of global tensors, written by hand, read back
// across file boundaries; gaps, overlaps, foreign tensors and wrong shapes are errors naming the
// file or the tensor and range. (Whole checkpoints of distributed runs are tested in
// tests/mpi/test_mpi_checkpoint.cpp.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/train/checkpoint_pieces.h"
#include "moetron/train/safetensors.h"

namespace moetron {
namespace {

namespace fs = std::filesystem;

class TempDir {
  public:
    TempDir() {
        path_ = fs::temp_directory_path() /
                ("moetron_pieces_" + std::to_string(::getpid()) + "_" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(path_);
        fs::create_directories(path_);
    }
    ~TempDir() { fs::remove_all(path_); }
    const fs::path& path() const { return path_; }

  private:
    fs::path path_;
};

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

// A model of two tensors: "w" (4, 3) trained, "bias" (4) not (no moments).
std::vector<ParamEntry> model_entries() {
    return {{"w", Shape{4, 3}, 0, 12, true, true}, {"bias", Shape{4}, 12, 4, false, false}};
}

class Pieces : public ::testing::Test {
  protected:
    Pieces() : values_(12) { std::iota(values_.begin(), values_.end(), 1.0f); }
    // A file holding elements [begin, end) of w (parameters, and moments as -values), and, when
    // with_bias, the whole bias.
    std::string write(const std::string& name, int64_t begin, int64_t end, bool with_bias,
                      std::vector<int64_t> dims = {4, 3}) {
        for (size_t i = 0; i < values_.size(); ++i) negated_[i] = -values_[i];
        std::vector<CheckpointPiece> pieces = {
            {CheckpointPart::param, "w", dims, begin, end, values_.data() + begin},
            {CheckpointPart::m, "w", dims, begin, end, negated_.data() + begin},
            {CheckpointPart::v, "w", dims, begin, end, values_.data() + begin}};
        if (with_bias) pieces.push_back({CheckpointPart::param, "bias", {4}, 0, 4, bias_.data()});
        write_checkpoint_shard((dir_.path() / name).string(), pieces, {{"rank", name}});
        return name;
    }
    CheckpointTensors open(const std::vector<std::string>& files) {
        return CheckpointTensors::open(dir_.path(), files, model_entries());
    }

    TempDir dir_;
    std::vector<float> values_;
    std::vector<float> negated_ = std::vector<float>(12);
    std::vector<float> bias_ = {0.5f, 0.25f, 0.125f, 2.0f};
};

TEST_F(Pieces, RangesReadAcrossFiles) {
    // A ZeRO-like cut inside row 1 ([0, 5) and [5, 12)).
    const CheckpointTensors t = open({write("a", 0, 5, true), write("b", 5, 12, false)});
    std::vector<float> out(12);
    t.read(CheckpointPart::param, "w", 0, 12, out.data());
    EXPECT_EQ(out, values_);
    std::vector<float> middle(4);
    t.read(CheckpointPart::m, "w", 3, 4, middle.data());
    EXPECT_EQ(middle, (std::vector<float>{-4, -5, -6, -7}));
    std::vector<float> bias(4), bias_m(4, 9.0f);
    t.read(CheckpointPart::param, "bias", 0, 4, bias.data());
    EXPECT_EQ(bias, bias_);
    t.read(CheckpointPart::m, "bias", 0, 4, bias_m.data());  // never trained: zeros
    EXPECT_EQ(bias_m, (std::vector<float>(4, 0.0f)));
}

TEST_F(Pieces, WholeRowsAreStoredWithTheTensorsTrailingDims) {
    write("rows", 6, 12, true);
    const SafetensorsFile f = SafetensorsFile::open((dir_.path() / "rows").string());
    EXPECT_EQ(f.entry("w[6:12]").dims, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(f.entry("optimizer.m.w[6:12]").dims, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(f.entry("bias").dims, (std::vector<int64_t>{4}));
    write("cut", 5, 12, false);
    const SafetensorsFile g = SafetensorsFile::open((dir_.path() / "cut").string());
    EXPECT_EQ(g.entry("w[5:12]").dims, (std::vector<int64_t>{7}));
}

TEST_F(Pieces, MissingRangeIsNamed) {
    const std::string err = error_of([&] { open({write("a", 0, 5, true)}); });
    EXPECT_NE(err.find("elements [5, 12)"), std::string::npos) << err;
    EXPECT_NE(err.find("'w'"), std::string::npos) << err;
}

TEST_F(Pieces, OverlapNamesBothFiles) {
    const std::string err = error_of([&] {
        open({write("a", 0, 8, true), write("b", 6, 12, false)});
    });
    EXPECT_NE(err.find("overlap"), std::string::npos) << err;
    EXPECT_NE(err.find((dir_.path() / "a").string()), std::string::npos) << err;
    EXPECT_NE(err.find((dir_.path() / "b").string()), std::string::npos) << err;
}

TEST_F(Pieces, WrongGlobalShapeNamesFileAndTensor) {
    const std::string err = error_of([&] { open({write("a", 0, 12, true, {3, 4})}); });
    EXPECT_NE(err.find((dir_.path() / "a").string()), std::string::npos) << err;
    EXPECT_NE(err.find("'w'"), std::string::npos) << err;
    EXPECT_NE(err.find("(4, 3)"), std::string::npos) << err;
}

TEST_F(Pieces, TensorOfAnotherModelIsNamed) {
    const std::vector<float> x(2, 1.0f);
    write_checkpoint_shard((dir_.path() / "other").string(),
                           {{CheckpointPart::param, "layers.9.w", {2}, 0, 2, x.data()}}, {});
    const std::string err = error_of([&] {
        open({write("a", 0, 12, true), std::string("other")});
    });
    EXPECT_NE(err.find("layers.9.w"), std::string::npos) << err;
    EXPECT_NE(err.find("another model"), std::string::npos) << err;
}

}  // namespace
}  // namespace moetron
