// The property the checkpoint-slices fuzzer checks, shared by the libFuzzer target
// (fuzz_checkpoint_slices.cpp) and the corpus replay in test_checkpoint_slices_corpus.cpp.
//
// An input is one or two shard files, split at kNextShard; each is in the safetensors fuzzer's
// second form ("JSON header, NUL, data", see safetensors_check.h), so mutations of the header,
// and of the "slices" JSON inside its "__metadata__", keep the file's length prefix consistent.
// CheckpointTensors::open of those files against a fixed small model (fuzz_model_entries) either
// throws moetron::Error, or it opens, and then the slices describe every element of every part
// it must hold exactly once, and every read (of each part of each tensor whole, of flat ranges,
// of blocks and of ranges of blocks) returns exactly the bytes of a brute-force assembly: each
// array element placed by index arithmetic of its own, independent of block_runs. Anything else
// (another exception type, a crash, a sanitizer report) is a bug. A second kind of input
// (check_checkpoint_layout, below) writes the shards itself, in layouts the input chooses.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/safetensors_check.h"
#include "moetron/checkpoint/checkpoint_pieces.h"
#include "moetron/checkpoint/safetensors.h"
#include "moetron/core/error.h"

namespace moetron::fuzz {

// Between the two shard files of an input.
inline constexpr std::string_view kNextShard = "\n--next-shard--\n";

// The model the shards are checked against: a matrix, an expert-like 3-D tensor, and a
// non-trainable vector (its moments may be absent: they read as zeros).
inline std::vector<ParamEntry> fuzz_model_entries() {
    return {{"layers.0.attn.o_proj", Shape{6, 4}, 0, 24, true, true},
            {"layers.0.mlp.experts.gate_up", Shape{2, 3, 4}, 24, 24, true, true},
            {"layers.0.mlp.router.bias", Shape{5}, 48, 5, false, false}};
}

inline void require_slices(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "checkpoint slices property violated: %s\n", what);
        std::abort();
    }
}

// The shard files of an input, each already in safetensors file form.
inline std::vector<std::string> shard_files_of(const uint8_t* data, size_t size) {
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    std::vector<std::string_view> parts;
    const size_t split = input.find(kNextShard);
    if (split == std::string_view::npos) {
        parts.push_back(input);
    } else {
        parts.push_back(input.substr(0, split));
        parts.push_back(input.substr(split + kNextShard.size()));
    }
    std::vector<std::string> files;
    for (std::string_view part : parts)
        files.push_back(
            file_from_header_and_data(reinterpret_cast<const uint8_t*>(part.data()), part.size()));
    return files;
}

namespace slices_detail {

// One part of one tensor as the brute force assembles it: values, and whether each is stored.
struct Assembled {
    std::vector<float> values;
    std::vector<uint8_t> stored;
};

inline size_t part_index(std::string_view name) {
    for (size_t i = 0; i < std::size(kCheckpointParts); ++i)
        if (checkpoint_part_name(kCheckpointParts[i]) == name) return i;
    require_slices(false, "an opened checkpoint's slice names a known part");
    return 0;
}

// Places element i (row-major in block, of extent dims) of an array at its global index.
inline int64_t global_index(const std::vector<int64_t>& global_dims,
                            const std::vector<int64_t>& block_begin,
                            const std::vector<int64_t>& extent, int64_t i) {
    std::vector<int64_t> index(extent.size());
    for (size_t d = extent.size(); d-- > 0;) {
        index[d] = i % extent[d];
        i /= extent[d];
    }
    int64_t global = 0;
    for (size_t d = 0; d < extent.size(); ++d)
        global = global * global_dims[d] + block_begin[d] + index[d];
    return global;
}

// The brute force: every array of every opened file, element by element. files are the opened
// paths; assembled is per entry, per part.
inline void assemble(const std::vector<std::string>& paths, const std::vector<ParamEntry>& entries,
                     std::vector<std::array<Assembled, 3>>& assembled) {
    using json = nlohmann::json;
    for (const std::string& path : paths) {
        const SafetensorsFile file = SafetensorsFile::open(path);
        const auto meta = file.metadata().find(kShardSlicesKey);
        const json slices = meta != file.metadata().end() ? json::parse(meta->second) : json();
        for (const SafetensorsEntry& t : file.tensors()) {
            std::vector<float> values(t.num_bytes() / sizeof(float));
            file.read_bytes(t, values.data(), t.num_bytes());
            size_t part = 0;
            std::string tensor;
            std::vector<int64_t> block_begin, extent;
            int64_t flat_begin = 0;
            if (slices.is_object()) {
                const json& s = slices.at(t.name);
                part = part_index(s.at("part").get<std::string>());
                tensor = s.at("tensor").get<std::string>();
                extent = s.at("shape").get<std::vector<int64_t>>();
                block_begin.assign(extent.size(), 0);
                flat_begin = s.at("flat").at(0).get<int64_t>();
                if (s.contains("block")) {
                    size_t d = 0;
                    for (const json& range : s.at("block")) {
                        require_slices(d < extent.size(), "a block has the tensor's rank");
                        block_begin[d] = range.at(0).get<int64_t>();
                        extent[d] = range.at(1).get<int64_t>() - block_begin[d];
                        ++d;
                    }
                    require_slices(d == extent.size(), "a block has the tensor's rank");
                }
            } else {
                std::string_view name = t.name;
                for (size_t p = 1; p < 3; ++p) {
                    if (name.starts_with(checkpoint_part_prefix(kCheckpointParts[p]))) {
                        part = p;
                        name.remove_prefix(checkpoint_part_prefix(kCheckpointParts[p]).size());
                    }
                }
                tensor = std::string(name);
                extent = t.dims;
                block_begin.assign(extent.size(), 0);
            }
            size_t e = 0;
            while (e < entries.size() && entries[e].name != tensor) ++e;
            require_slices(e < entries.size(), "an opened checkpoint holds only model tensors");
            const ParamEntry& entry = entries[e];
            const std::vector<int64_t> global_dims(entry.shape.dims.begin(),
                                                   entry.shape.dims.begin() + entry.shape.ndim);
            require_slices(extent.size() == global_dims.size(), "a slice has the tensor's rank");
            for (size_t d = 0; d < extent.size(); ++d)
                require_slices(block_begin[d] >= 0 && extent[d] > 0 &&
                                   block_begin[d] + extent[d] <= global_dims[d],
                               "a block lies inside its tensor");
            Assembled& a = assembled[e][part];
            for (size_t i = 0; i < values.size(); ++i) {
                const int64_t at = global_index(global_dims, block_begin, extent,
                                                flat_begin + static_cast<int64_t>(i));
                require_slices(at >= 0 && at < entry.numel, "an element lies inside its tensor");
                require_slices(!a.stored[at], "no element is stored twice");
                a.stored[at] = 1;
                a.values[at] = values[i];
            }
        }
    }
}

inline bool same_bits(const float* a, const float* b, size_t n) {
    return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// The blocks a read is tried with: the whole tensor spelled out, each dimension trimmed by one
// on both sides, and every dimension trimmed at once.
inline std::vector<TensorBlock> blocks_to_read(const std::vector<int64_t>& dims) {
    std::vector<TensorBlock> blocks;
    TensorBlock whole{std::vector<int64_t>(dims.size(), 0), dims};
    blocks.push_back(whole);
    TensorBlock all_trimmed = whole;
    for (size_t d = 0; d < dims.size(); ++d) {
        if (dims[d] < 3) continue;
        TensorBlock b = whole;
        b.begin[d] = 1;
        b.end[d] = dims[d] - 1;
        blocks.push_back(b);
        all_trimmed.begin[d] = 1;
        all_trimmed.end[d] = dims[d] - 1;
    }
    blocks.push_back(all_trimmed);
    return blocks;
}

// The expected elements of block (row-major in it) from the assembled global values.
inline std::vector<float> expected_block(const std::vector<int64_t>& dims, const TensorBlock& b,
                                         const std::vector<float>& global) {
    std::vector<int64_t> extent(dims.size());
    int64_t n = 1;
    for (size_t d = 0; d < dims.size(); ++d) n *= (extent[d] = b.end[d] - b.begin[d]);
    std::vector<float> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out[i] = global[global_index(dims, b.begin, extent, i)];
    return out;
}

}  // namespace slices_detail

// Returns true when the input's shards open (and the properties above hold), false when they
// were rejected with moetron::Error.
inline bool check_checkpoint_slices(const uint8_t* data, size_t size) {
    namespace sd = slices_detail;
    const std::vector<ParamEntry> entries = fuzz_model_entries();
    std::vector<MemoryFile> memory(2);
    std::vector<std::string> names, paths;
    const std::vector<std::string> files = shard_files_of(data, size);
    for (size_t f = 0; f < files.size(); ++f) {
        write_all(memory[f].fd(), files[f].data(), files[f].size(), memory[f].path());
        // The directory and file name of /proc/self/fd/N.
        names.push_back(memory[f].path().substr(std::strlen("/proc/self/fd/")));
        paths.push_back(memory[f].path());
    }
    std::vector<std::array<sd::Assembled, 3>> assembled(entries.size());
    try {
        const CheckpointTensors tensors = CheckpointTensors::open("/proc/self/fd", names, entries);
        for (size_t e = 0; e < entries.size(); ++e)
            for (sd::Assembled& a : assembled[e]) {
                a.values.assign(entries[e].numel, 0.0f);
                a.stored.assign(entries[e].numel, 0);
            }
        sd::assemble(paths, entries, assembled);
        for (size_t e = 0; e < entries.size(); ++e) {
            const ParamEntry& entry = entries[e];
            const std::vector<int64_t> dims(entry.shape.dims.begin(),
                                            entry.shape.dims.begin() + entry.shape.ndim);
            const int64_t n = entry.numel;
            for (size_t p = 0; p < 3; ++p) {
                const CheckpointPart part = kCheckpointParts[p];
                const sd::Assembled& a = assembled[e][p];
                const bool any = std::find(a.stored.begin(), a.stored.end(), 1) != a.stored.end();
                const bool all = std::find(a.stored.begin(), a.stored.end(), 0) == a.stored.end();
                require_slices(all || (!any && part != CheckpointPart::param && !entry.trainable),
                               "an opened checkpoint holds every element it must, once");
                // Whole, and the range without its first and last element.
                std::vector<float> got(static_cast<size_t>(n), -1.0f);
                tensors.read(part, entry.name, 0, n, got.data());
                require_slices(sd::same_bits(got.data(), a.values.data(), n),
                               "a whole tensor reads as its pieces' bytes");
                if (n > 2) {
                    std::vector<float> inner(static_cast<size_t>(n - 2), -1.0f);
                    tensors.read(part, entry.name, 1, n - 2, inner.data());
                    require_slices(sd::same_bits(inner.data(), a.values.data() + 1, n - 2),
                                   "a range reads as its pieces' bytes");
                }
                for (const TensorBlock& block : sd::blocks_to_read(dims)) {
                    const std::vector<float> want = sd::expected_block(dims, block, a.values);
                    const auto m = static_cast<int64_t>(want.size());
                    std::vector<float> got_block(want.size(), -1.0f);
                    tensors.read(part, entry.name, block, 0, m, got_block.data());
                    require_slices(sd::same_bits(got_block.data(), want.data(), want.size()),
                                   "a block reads as its pieces' bytes");
                    if (m > 2) {
                        std::vector<float> inner(want.size() - 2, -1.0f);
                        tensors.read(part, entry.name, block, 1, m - 2, inner.data());
                        require_slices(
                            sd::same_bits(inner.data(), want.data() + 1, want.size() - 2),
                            "a range of a block reads as its pieces' bytes");
                    }
                }
            }
        }
    } catch (const Error&) {
        // A read may throw only before anything was assembled: once open succeeded, every read
        // above lies inside the model's tensors and must succeed.
        require_slices(assembled.front()[0].values.empty(),
                       "reads of an opened checkpoint succeed");
        return false;
    }
    return true;
}

// The second kind of input, starting with kLayoutMark: its bytes choose how each part of each
// tensor is cut into pieces (blocks along one dimension, each block cut into flat ranges, each
// piece in one of two files), which write_checkpoint_shard writes. Such shards must open, pass
// the checks above, and read back as the values written. Mutations of a shard's JSON rarely keep
// it valid; this reaches the reads with layouts of every kind.
inline constexpr uint8_t kLayoutMark = '#';

namespace slices_detail {

class Choices {
  public:
    Choices(const uint8_t* data, size_t size) : data_(data), size_(size) {}
    // The next byte, or 0 past the end.
    unsigned next() { return at_ < size_ ? data_[at_++] : 0; }
    // Up to max_cuts distinct cut points in (0, n), sorted, with 0 and n around them.
    std::vector<int64_t> cuts(int64_t n, unsigned max_cuts) {
        std::vector<int64_t> out = {0, n};
        const unsigned count = next() % (max_cuts + 1);
        for (unsigned i = 0; i < count && n > 1; ++i) out.push_back(1 + next() % (n - 1));
        std::sort(out.begin(), out.end());
        out.erase(std::unique(out.begin(), out.end()), out.end());
        return out;
    }

  private:
    const uint8_t* data_;
    size_t size_;
    size_t at_ = 0;
};

// The value written at global index i of a part: distinct across parts and elements.
inline float layout_value(size_t part, int64_t i) {
    return static_cast<float>(1000 * static_cast<int64_t>(part + 1) + i) * 0.25f;
}

// A file's bytes in the fuzzer's form ("JSON header, NUL, data").
inline std::string fuzz_form_of(const MemoryFile& file) {
    const uint64_t size = file_size_bytes(file.fd(), file.path());
    std::string bytes(size, '\0');
    require_slices(read_at(file.fd(), bytes.data(), size, 0, file.path()) == size,
                   "a written shard reads back");
    uint64_t header_bytes = 0;
    std::memcpy(&header_bytes, bytes.data(), 8);
    return bytes.substr(8, header_bytes) + '\0' + bytes.substr(8 + header_bytes);
}

}  // namespace slices_detail

inline void check_checkpoint_layout(const uint8_t* data, size_t size) {
    namespace sd = slices_detail;
    sd::Choices choose(data, size);
    const std::vector<ParamEntry> entries = fuzz_model_entries();
    std::vector<CheckpointPiece> pieces[2];
    std::vector<std::vector<float>> keep;
    keep.reserve(1024);
    for (const ParamEntry& e : entries) {
        const std::vector<int64_t> dims(e.shape.dims.begin(), e.shape.dims.begin() + e.shape.ndim);
        for (size_t p = 0; p < 3; ++p) {
            if (p > 0 && !e.trainable && choose.next() % 2 == 0) continue;  // zeros, not stored
            const size_t d = choose.next() % dims.size();
            const std::vector<int64_t> rows = choose.cuts(dims[d], 2);
            for (size_t r = 0; r + 1 < rows.size(); ++r) {
                TensorBlock block{std::vector<int64_t>(dims.size(), 0), dims};
                block.begin[d] = rows[r];
                block.end[d] = rows[r + 1];
                const std::vector<int64_t> extent = block.dims(dims);
                int64_t n = 1;
                for (int64_t x : extent) n *= x;
                const std::vector<int64_t> flat = choose.cuts(n, 2);
                for (size_t f = 0; f + 1 < flat.size(); ++f) {
                    std::vector<float>& values = keep.emplace_back();
                    for (int64_t i = flat[f]; i < flat[f + 1]; ++i)
                        values.push_back(
                            sd::layout_value(p, sd::global_index(dims, block.begin, extent, i)));
                    pieces[choose.next() % 2].push_back({kCheckpointParts[p], e.name, dims, flat[f],
                                                         flat[f + 1], values.data(), block});
                }
            }
        }
    }
    MemoryFile files[2];
    std::string input;
    for (int f = 0; f < 2; ++f) {
        write_checkpoint_shard(files[f].path(), pieces[f], {});
        input += (f == 0 ? "" : std::string(kNextShard)) + sd::fuzz_form_of(files[f]);
    }
    require_slices(
        check_checkpoint_slices(reinterpret_cast<const uint8_t*>(input.data()), input.size()),
        "shards written by write_checkpoint_shard open");
    // And they hold the values written.
    const CheckpointTensors tensors =
        CheckpointTensors::open("/proc/self/fd",
                                {files[0].path().substr(std::strlen("/proc/self/fd/")),
                                 files[1].path().substr(std::strlen("/proc/self/fd/"))},
                                entries);
    for (const ParamEntry& e : entries)
        for (size_t p = 0; p < 3; ++p) {
            std::vector<float> got(static_cast<size_t>(e.numel));
            tensors.read(kCheckpointParts[p], e.name, 0, e.numel, got.data());
            for (int64_t i = 0; i < e.numel; ++i) {
                const bool zero = got[i] == 0.0f && p > 0 && !e.trainable;
                require_slices(zero || got[i] == sd::layout_value(p, i),
                               "a checkpoint reads back the values written");
            }
        }
}

// Either kind of input; returns whether the shards opened (a layout's always do).
inline bool check_checkpoint_input(const uint8_t* data, size_t size) {
    if (size == 0 || data[0] != kLayoutMark) return check_checkpoint_slices(data, size);
    check_checkpoint_layout(data + 1, size - 1);
    return true;
}

}  // namespace moetron::fuzz
