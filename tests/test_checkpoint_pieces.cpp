// checkpoint/checkpoint_pieces: shard files of pieces of global tensors, written by hand, read back
// across file boundaries; blocks of tensor-parallel shards (row- and column-parallel, cut by
// ZeRO-1) read back under another TP split; gaps, overlaps, foreign tensors and wrong shapes are
// errors naming the file or the tensor and range. (Whole checkpoints of distributed runs are tested
// in tests/mpi/test_mpi_checkpoint.cpp.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "moetron/checkpoint/checkpoint_pieces.h"
#include "moetron/checkpoint/safetensors.h"
#include "moetron/core/error.h"
#include "temp_dir.h"

namespace moetron {
namespace {

using moetron::testing::error_of;
using moetron::testing::TempDir;

namespace fs = std::filesystem;

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

// ---- blocks (tensor-parallel shards) ----

TEST(BlockRuns, RowBlocksAreOneRunColumnBlocksOneRunPerRow) {
    const std::vector<int64_t> dims = {4, 6};
    // Rows [1, 3) of every column: contiguous.
    EXPECT_EQ(block_runs(dims, {{1, 0}, {3, 6}}, 0, 12).size(), 1u);
    EXPECT_EQ(block_runs(dims, {{1, 0}, {3, 6}}, 0, 12)[0].global_offset, 6);
    // Columns [3, 6) of every row (a row-parallel shard), elements [2, 7) of the 4 x 3 block: the
    // end of row 0, all of row 1, the start of row 2 (a ZeRO-1 cut).
    const std::vector<BlockRun> runs = block_runs(dims, {{0, 3}, {4, 6}}, 2, 7);
    ASSERT_EQ(runs.size(), 3u);
    EXPECT_EQ(runs[0].global_offset, 5);
    EXPECT_EQ(runs[0].block_offset, 2);
    EXPECT_EQ(runs[0].count, 1);
    EXPECT_EQ(runs[1].global_offset, 9);
    EXPECT_EQ(runs[1].block_offset, 3);
    EXPECT_EQ(runs[1].count, 3);
    EXPECT_EQ(runs[2].global_offset, 15);
    EXPECT_EQ(runs[2].block_offset, 6);
    EXPECT_EQ(runs[2].count, 1);
    // Experts [2, 4) of (4, 2, 3): one run; the whole tensor: one run.
    const std::vector<BlockRun> experts = block_runs({4, 2, 3}, {{2, 0, 0}, {4, 2, 3}}, 1, 12);
    ASSERT_EQ(experts.size(), 1u);
    EXPECT_EQ(experts[0].global_offset, 13);
    EXPECT_EQ(experts[0].count, 11);
    EXPECT_EQ(block_runs(dims, {}, 0, 24).size(), 1u);
}

TEST(BlockRuns, BlockOutsideTheTensorIsAnError) {
    EXPECT_NE(error_of([] {
                  block_runs({4, 6}, {{0, 4}, {4, 7}}, 0, 1);
              }).find("outside"),
              std::string::npos);
    EXPECT_NE(error_of([] {
                  block_runs({4, 6}, {{0}, {4}}, 0, 1);
              }).find("dimensions"),
              std::string::npos);
    EXPECT_NE(error_of([] {
                  block_runs({4, 6}, {{0, 0}, {4, 3}}, 0, 13);
              }).find("[0, 13)"),
              std::string::npos);
}

// "o" (4, 6) row-parallel (columns split) and "gu" (8, 2) column-parallel with two row blocks
// ([gate; up], model/params.h), written as tp2 shards, rank 1's cut by ZeRO-1 into two files.
class TensorParallelPieces : public ::testing::Test {
  protected:
    TensorParallelPieces() : o_(24), gu_(16) {
        std::iota(o_.begin(), o_.end(), 1.0f);
        std::iota(gu_.begin(), gu_.end(), 100.0f);
    }
    static std::vector<ParamEntry> entries() {
        return {{"o", Shape{4, 6}, 0, 24, true, true}, {"gu", Shape{8, 2}, 24, 16, true, true}};
    }
    // Rank r's local tensors, as a TP rank holds them.
    std::vector<float> local_o(int r) const {
        std::vector<float> out;
        for (int row = 0; row < 4; ++row)
            for (int col = 3 * r; col < 3 * r + 3; ++col) out.push_back(o_[row * 6 + col]);
        return out;
    }
    std::vector<float> local_gu(int r) const {
        std::vector<float> out;
        for (int block = 0; block < 2; ++block)
            for (int row = block * 4 + 2 * r; row < block * 4 + 2 * r + 2; ++row)
                for (int col = 0; col < 2; ++col) out.push_back(gu_[row * 2 + col]);
        return out;
    }
    static TensorBlock o_block(int r) { return {{0, 3 * r}, {4, 3 * r + 3}}; }
    static TensorBlock gu_block(int r, int block) {
        return {{block * 4 + 2 * r, 0}, {block * 4 + 2 * r + 2, 2}};
    }
    // Every part of local elements [begin, end) of rank r's "o" and "gu" in one file.
    void write(const std::string& name, int r, int64_t begin, int64_t end) {
        locals_.push_back(local_o(r));
        const std::vector<float>& o = locals_.back();
        locals_.push_back(local_gu(r));
        const std::vector<float>& gu = locals_.back();
        std::vector<CheckpointPiece> pieces;
        for (CheckpointPart part : kCheckpointParts) {
            pieces.push_back({part, "o", {4, 6}, begin, end, o.data() + begin, o_block(r)});
            for (int b = 0; b < 2; ++b) {  // the flat range [begin, end) of each 2 x 2 block
                const int64_t lo = std::max<int64_t>(begin - 4 * b, 0);
                const int64_t hi = std::min<int64_t>(end - 4 * b, 4);
                if (lo < hi)
                    pieces.push_back(
                        {part, "gu", {8, 2}, lo, hi, gu.data() + 4 * b + lo, gu_block(r, b)});
            }
        }
        write_checkpoint_shard((dir_.path() / name).string(), pieces, {});
        files_.push_back(name);
    }
    CheckpointTensors open() { return CheckpointTensors::open(dir_.path(), files_, entries()); }

    TempDir dir_;
    std::vector<float> o_, gu_;
    std::deque<std::vector<float>> locals_;
    std::vector<std::string> files_;
};

TEST_F(TensorParallelPieces, Tp2ShardsReadWholeAndAsAnotherSplit) {
    write("rank0", 0, 0, 12);
    write("rank1-zero0", 1, 0, 5);  // a ZeRO-1 cut inside row 1 of the block
    write("rank1-zero1", 1, 5, 12);
    const CheckpointTensors t = open();
    std::vector<float> o(24), gu(16);
    t.read(CheckpointPart::param, "o", 0, 24, o.data());
    t.read(CheckpointPart::v, "gu", 0, 16, gu.data());
    EXPECT_EQ(o, o_);
    EXPECT_EQ(gu, gu_);
    // Row-parallel at tp3: columns [2r, 2r + 2) of every row.
    for (int r = 0; r < 3; ++r) {
        std::vector<float> got(8), want;
        t.read(CheckpointPart::m, "o", TensorBlock{{0, 2 * r}, {4, 2 * r + 2}}, 0, 8, got.data());
        for (int row = 0; row < 4; ++row)
            for (int col = 2 * r; col < 2 * r + 2; ++col) want.push_back(o_[row * 6 + col]);
        EXPECT_EQ(got, want) << "tp3 rank " << r;
    }
    // Column-parallel at tp4 (one row of each [gate; up] block), a ZeRO-1 part of it.
    std::vector<float> row(1);
    t.read(CheckpointPart::param, "gu", TensorBlock{{5, 0}, {6, 2}}, 1, 1, row.data());
    EXPECT_EQ(row[0], gu_[5 * 2 + 1]);
    // A rank's tp2 block of "o" as rows: the rows split instead of the columns.
    std::vector<float> rows(12);
    t.read(CheckpointPart::param, "o", TensorBlock{{2, 0}, {4, 6}}, 0, 12, rows.data());
    EXPECT_EQ(rows, std::vector<float>(o_.begin() + 12, o_.end()));
}

TEST_F(TensorParallelPieces, BlocksAreStoredWithTheirShapeAndNamed) {
    write("rank0", 0, 0, 12);
    write("rank1-zero0", 1, 0, 6);
    const SafetensorsFile f = SafetensorsFile::open((dir_.path() / "rank0").string());
    EXPECT_EQ(f.entry("o[0:4,0:3]").dims, (std::vector<int64_t>{4, 3}));
    EXPECT_EQ(f.entry("optimizer.m.gu[4:6,0:2]").dims, (std::vector<int64_t>{2, 2}));
    const SafetensorsFile g = SafetensorsFile::open((dir_.path() / "rank1-zero0").string());
    EXPECT_EQ(g.entry("o[0:4,3:6][0:6]").dims, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(g.entry("gu[6:8,0:2][0:2]").dims, (std::vector<int64_t>{1, 2}));
}

TEST_F(TensorParallelPieces, MissingPartOfABlockIsNamed) {
    write("rank0", 0, 0, 12);
    write("rank1-zero0", 1, 0, 5);
    const std::string err = error_of([&] { open(); });
    // Element 5 of rank 1's block of "o" (row 1, column 5) is global element 11.
    EXPECT_NE(err.find("elements [11, "), std::string::npos) << err;
    EXPECT_NE(err.find("'o'"), std::string::npos) << err;
}

TEST_F(TensorParallelPieces, OverlappingBlocksOfTwoSplitsAreAnError) {
    write("rank0", 0, 0, 12);
    write("rank1", 1, 0, 12);
    const std::vector<float> x(8, 1.0f);  // columns [2, 4): a tp3 rank's, from another checkpoint
    write_checkpoint_shard((dir_.path() / "other").string(),
                           {{CheckpointPart::param, "o", {4, 6}, 0, 8, x.data(), {{0, 2}, {4, 4}}}},
                           {});
    files_.push_back("other");
    const std::string err = error_of([&] { open(); });
    EXPECT_NE(err.find("overlap"), std::string::npos) << err;
    EXPECT_NE(err.find((dir_.path() / "other").string()), std::string::npos) << err;
}

}  // namespace
}  // namespace moetron
