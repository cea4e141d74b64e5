// A checkpoint's tensors as pieces of global tensors, so that a checkpoint written under one
// parallel layout reads under any other (checkpoint_dir.h has the directory format).
//
// Every stored array is a piece of one part (the fp32 parameters, AdamW's first or second moment)
// of one model tensor, named and shaped as in the unsharded model (the global name and shape).
// A piece holds a block of the global tensor (per dimension a range [begin, end), as PyTorch
// DCP's offsets and lengths or safetensors slicing's t[b0:e0, b1:e1]; the whole tensor when
// absent) and, of that block's row-major elements, the contiguous range [begin, end):
//   - a rank's routed experts [first, first + count) of a tensor (E, ...) are the block
//     [first, first + count) x everything;
//   - a tensor-parallel shard (model/params.h's TensorParallelShard) is one block per run of
//     rows: a column-parallel shard holds rows [r*b, (r+1)*b) of each of its row blocks, a
//     row-parallel shard columns [r*c, (r+1)*c) of every row;
//   - a ZeRO-1 shard cuts the rank's local tensor anywhere: the flat range within each block.
//
// A shard file (one per rank) is a safetensors file whose "__metadata__" holds, under "slices",
// a JSON object describing each of its arrays:
//   {"<array name>": {"tensor": "layers.1.attn.o_proj", "part": "optimizer.m",
//                     "shape": [64, 128], "block": [[0, 64], [64, 128]], "flat": [0, 2048]}, ...}
// ("block" absent: the whole tensor, the form of checkpoints written before tensor parallelism.)
// Array names are the part's prefix ("", "optimizer.m.", "optimizer.v.") and the tensor's name,
// with "[b0:e0,b1:e1]" appended when the block is not the whole tensor and "[begin:end]" when the
// flat range is not the whole block; an array is stored with the block's dimensions when the
// range covers whole rows of the block (a slice of experts reads as (count, ...)), else flat. The
// version 1 format (one model.safetensors, every tensor whole, no "slices") reads as pieces
// too.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "moetron/checkpoint/checksum.h"
#include "moetron/model/params.h"

namespace moetron {

enum class CheckpointPart : uint8_t { param, m, v };
inline constexpr CheckpointPart kCheckpointParts[] = {CheckpointPart::param, CheckpointPart::m,
                                                      CheckpointPart::v};
// "param", "optimizer.m", "optimizer.v": the "part" of a slice.
std::string_view checkpoint_part_name(CheckpointPart part);
// "", "optimizer.m.", "optimizer.v.": what array names start with.
std::string_view checkpoint_part_prefix(CheckpointPart part);

// The metadata key of a shard file that describes its pieces.
inline constexpr const char* kShardSlicesKey = "slices";

// A block of a global tensor: per dimension d the range [begin[d], end[d]). Empty: the whole
// tensor.
struct TensorBlock {
    std::vector<int64_t> begin;
    std::vector<int64_t> end;

    bool whole() const { return begin.empty(); }
    // The block's dimensions (end - begin), or global_dims when whole.
    std::vector<int64_t> dims(const std::vector<int64_t>& global_dims) const;
    bool operator==(const TensorBlock&) const = default;
};

// A contiguous run of a block's elements in the global tensor.
struct BlockRun {
    int64_t global_offset = 0;  // row-major element index in the global tensor
    int64_t block_offset = 0;   // row-major element index in the block
    int64_t count = 0;
};
// The runs of elements [flat_begin, flat_end) of block (row-major in the block) inside a tensor of
// global_dims, in increasing order of both offsets. Throws when the block or the range does not
// fit the tensor.
std::vector<BlockRun> block_runs(const std::vector<int64_t>& global_dims, const TensorBlock& block,
                                 int64_t flat_begin, int64_t flat_end);

// One piece to write: elements [begin, end) of block of the part of tensor; data holds end - begin
// floats (it must stay valid until the file is written).
struct CheckpointPiece {
    CheckpointPart part = CheckpointPart::param;
    std::string tensor;
    std::vector<int64_t> global_dims;
    int64_t begin = 0;
    int64_t end = 0;
    const float* data = nullptr;
    TensorBlock block{};  // whole tensor when empty
};

// Writes pieces (empty ones skipped) as one shard file at path, with their "slices" and the given
// extra metadata; fsyncs it and returns its size and checksum.
FileDigest write_checkpoint_shard(const std::string& path,
                                  const std::vector<CheckpointPiece>& pieces,
                                  const std::map<std::string, std::string>& metadata);

// The pieces of a verified checkpoint directory, checked against a model's global tensors, and
// reads of any range of any tensor from wherever it is stored.
class CheckpointTensors {
  public:
    // files: the checkpoint's tensor files (model.safetensors, or its shard files). entries: the
    // model's tensors with their global shapes (ParamTable(model_param_specs(config))). Checks,
    // with errors naming the file and the tensor: every array is described (a slice, or a whole
    // tensor in the version 1 format), F32, of the size its range says; its tensor is one of
    // entries, with the same global shape; no two pieces of a part of a tensor overlap; and the
    // pieces cover every parameter, and both moments of every trainable tensor (a non-trainable
    // tensor's moments may be absent: they are zeros).
    static CheckpointTensors open(const std::filesystem::path& dir,
                                  const std::vector<std::string>& files,
                                  const std::vector<ParamEntry>& entries);
    CheckpointTensors(CheckpointTensors&&) noexcept;
    CheckpointTensors& operator=(CheckpointTensors&&) noexcept;
    ~CheckpointTensors();

    // Elements [begin, begin + count) of part of tensor (row-major, global) into out. Zeros for
    // a moment that is not stored (non-trainable tensors); any other gap is an error naming the
    // tensor and the range.
    void read(CheckpointPart part, const std::string& tensor, int64_t begin, int64_t count,
              float* out) const;
    // Elements [begin, begin + count) of block (row-major in the block) of part of tensor into
    // out, assembled from whichever pieces hold them (a shard of another tensor-parallel split).
    void read(CheckpointPart part, const std::string& tensor, const TensorBlock& block,
              int64_t begin, int64_t count, float* out) const;

  private:
    // A contiguous run of global elements [begin, end) stored contiguously in a file: a piece of
    // a column block (a row-parallel shard) splits into one run per row. Simple and exact; a
    // large model's row-parallel tensors would make millions of runs, fine for the tiny and
    // small models whose whole checkpoint every rank verifies (as it reads every checksum).
    struct Piece {
        size_t file = 0;
        uint64_t file_offset = 0;  // of the piece's first byte
        int64_t begin = 0;
        int64_t end = 0;
    };
    struct OpenFile;
    CheckpointTensors() = default;
    const std::vector<Piece>* pieces_of(CheckpointPart part, const std::string& tensor) const;

    std::vector<std::unique_ptr<OpenFile>> files_;
    // Per part and tensor, sorted by begin.
    std::unordered_map<std::string, std::vector<Piece>> pieces_;
    std::unordered_map<std::string, std::vector<int64_t>> global_dims_;  // by tensor name
};

}  // namespace moetron
