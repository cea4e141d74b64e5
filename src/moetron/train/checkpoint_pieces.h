// A checkpoint's tensors as pieces of global tensors, so that a checkpoint written under one
// parallel layout reads under any other (train/checkpoint.h has the directory format).
//
// Every stored array is a piece of one part (the fp32 parameters, AdamW's first or second moment)
// of one model tensor, named and shaped as in the unsharded model (the global name and shape).
// A piece holds the contiguous range [begin, end) of that tensor's row-major elements: a ZeRO-1
// shard cuts tensors anywhere, and a rank's routed experts [first, first + count) of a tensor of
// shape (E, ...) are the range [first * per_expert, (first + count) * per_expert).
//
// A shard file (one per rank) is a safetensors file whose "__metadata__" holds, under "slices",
// a JSON object describing each of its arrays:
//   {"<array name>": {"tensor": "layers.1.mlp.experts.gate_up", "part": "optimizer.m",
//                     "shape": [8, 64, 32], "flat": [4096, 8192]}, ...}
// Array names are the part's prefix ("", "optimizer.m.", "optimizer.v.") and the tensor's name,
// with "[begin:end]" appended when the piece is not the whole tensor; an array is stored with the
// tensor's trailing dimensions when the range covers whole rows, else flat. The single-process
// format (one model.safetensors, every tensor whole, no "slices") reads as pieces too.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "moetron/model/params.h"
#include "moetron/train/checksum.h"

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

// One piece to write: data holds end - begin floats (it must stay valid until the file is
// written).
struct CheckpointPiece {
    CheckpointPart part = CheckpointPart::param;
    std::string tensor;
    std::vector<int64_t> global_dims;
    int64_t begin = 0;
    int64_t end = 0;
    const float* data = nullptr;
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
    // tensor in the single-process format), F32, of the size its range says; its tensor is one of
    // entries, with the same global shape; no two pieces of a part of a tensor overlap; and the
    // pieces cover every parameter, and both moments of every trainable tensor (a non-trainable
    // tensor's moments may be absent: they are zeros).
    static CheckpointTensors open(const std::filesystem::path& dir,
                                  const std::vector<std::string>& files,
                                  const std::vector<ParamEntry>& entries);
    CheckpointTensors(CheckpointTensors&&) noexcept;
    CheckpointTensors& operator=(CheckpointTensors&&) noexcept;
    ~CheckpointTensors();

    // Elements [begin, begin + count) of part of tensor into out. Zeros for a moment that is not
    // stored (non-trainable tensors); any other gap is an error naming the tensor and the range.
    void read(CheckpointPart part, const std::string& tensor, int64_t begin, int64_t count,
              float* out) const;

  private:
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
};

}  // namespace moetron
