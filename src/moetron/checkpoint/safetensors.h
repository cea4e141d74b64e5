// safetensors files: our own reader and writer (the format of Hugging Face's safetensors).
//
// Layout: u64 little-endian header length N; N bytes of JSON
//   {"<tensor name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<value>", ...}}            (metadata optional)
// padded with spaces; then the data buffer. Offsets are relative to the start of the data buffer,
// row-major, little-endian. Known dtypes: F32, BF16, F64, I32, I64, U8.
//
// The reader validates the whole header before exposing any tensor, and rejects (with an error
// naming the file, the tensor and the problem): a file shorter than 8 bytes; a header length
// over 100 MB or past the end of the file; JSON that does not parse, is not an object, nests
// deeper than the format does, or repeats a key; an entry without exactly the keys dtype, shape
// and data_offsets, or with values of the wrong type; an unknown dtype; a negative or fractional
// dimension; a shape whose byte size overflows 64 bits or differs from end - begin; offsets
// reversed or past the data buffer; entries that overlap. The entries must also tile the data
// buffer exactly (sorted by offset: the first starts at 0, each starts where the previous ends,
// the last ends at the end of the file), as the reference implementation requires: a gap or
// trailing bytes mean a file that was not written by a safetensors writer or was damaged.
//
// The writer pads the header to a multiple of 8 bytes (so the data buffer is 8-aligned), writes
// tensors in the order they were added, hashes every byte it writes (XXH3-64, for the checkpoint
// index), and fsyncs the file before returning.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/checkpoint/checksum.h"
#include "moetron/core/dtype.h"
#include "moetron/core/tensor.h"

namespace moetron {

inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

struct SafetensorsEntry {
    std::string name;
    DType dtype = DType::f32;
    std::vector<int64_t> dims;
    uint64_t begin = 0;  // byte offsets in the data buffer, [begin, end)
    uint64_t end = 0;

    uint64_t num_bytes() const { return end - begin; }
    // As a TensorView shape; throws when the tensor has more than kMaxDims dimensions.
    Shape shape() const;
};

struct SafetensorsHeader {
    std::vector<SafetensorsEntry> tensors;  // sorted by begin
    std::map<std::string, std::string> metadata;
};

// Parses and validates the JSON header of a file whose data buffer holds data_num_bytes bytes.
// source names the file in errors. The reader's whole validation; exposed for tests and fuzzing.
SafetensorsHeader parse_safetensors_header(std::string_view json_text, uint64_t data_num_bytes,
                                           const std::string& source);

// "(2, 3)" for error messages.
std::string dims_string(std::span<const int64_t> dims);

class SafetensorsFile {
  public:
    // Opens and validates path; throws moetron::Error on any problem (see the top of this file).
    static SafetensorsFile open(const std::string& path);

    const std::string& path() const { return path_; }
    const std::vector<SafetensorsEntry>& tensors() const { return header_.tensors; }
    const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
    // Offset of the data buffer in the file: 8 + header length.
    uint64_t data_offset() const { return data_offset_; }

    // nullptr when absent.
    const SafetensorsEntry* find(std::string_view name) const;
    // Throws naming the file and the missing tensor.
    const SafetensorsEntry& entry(std::string_view name) const;

    // Reads tensor name into out (out_num_bytes long) after checking that its dtype and shape are
    // the expected ones; the error says expected vs found.
    void read(std::string_view name, DType expected_dtype, std::span<const int64_t> expected_dims,
              void* out, size_t out_num_bytes) const;
    // The same, with dtype, shape and destination taken from a CPU view.
    void read(std::string_view name, const TensorView& out) const;
    // The tensor's bytes as stored, whatever its dtype and shape; out_num_bytes must equal them.
    void read_bytes(const SafetensorsEntry& entry, void* out, size_t out_num_bytes) const;

  private:
    SafetensorsFile(std::string path, UniqueFd fd, SafetensorsHeader header, uint64_t data_offset);

    std::string path_;
    UniqueFd fd_;
    SafetensorsHeader header_;
    uint64_t data_offset_ = 0;
};

// Collects tensors (by pointer: the memory must stay valid until write) and writes one file.
class SafetensorsWriter {
  public:
    // Throws on a duplicate or reserved name, a negative dimension, or a size overflow.
    void add(std::string name, DType dtype, std::vector<int64_t> dims, const void* data);
    void add(std::string name, const TensorView& view);
    void set_metadata(std::string key, std::string value);

    // Writes path (created or truncated), fsyncs it, and returns its size and XXH3-64.
    FileDigest write(const std::string& path) const;
    // The header as written (JSON padded to a multiple of 8 bytes), without the length prefix.
    std::string header_text() const;

  private:
    struct Pending {
        std::string name;
        DType dtype;
        std::vector<int64_t> dims;
        const void* data;
        uint64_t num_bytes;
    };
    std::vector<Pending> tensors_;
    std::map<std::string, std::string> metadata_;
};

}  // namespace moetron
