#include "moetron/checkpoint/checkpoint_pieces.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/checkpoint/safetensors.h"
#include "moetron/core/error.h"
#include "moetron/core/strings.h"

namespace moetron {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string_view checkpoint_part_name(CheckpointPart part) {
    switch (part) {
        case CheckpointPart::param:
            return "param";
        case CheckpointPart::m:
            return "optimizer.m";
        case CheckpointPart::v:
            return "optimizer.v";
    }
    return "unknown";
}

std::string_view checkpoint_part_prefix(CheckpointPart part) {
    switch (part) {
        case CheckpointPart::param:
            return "";
        case CheckpointPart::m:
            return "optimizer.m.";
        case CheckpointPart::v:
            return "optimizer.v.";
    }
    return "";
}

namespace {

int64_t numel_of(const std::vector<int64_t>& dims) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
}

std::string piece_key(CheckpointPart part, std::string_view tensor) {
    std::string key(checkpoint_part_name(part));
    key.push_back('\0');
    key.append(tensor);
    return key;
}

bool covers_whole_tensor(const TensorBlock& block, const std::vector<int64_t>& global_dims) {
    if (block.whole()) return true;
    for (size_t d = 0; d < global_dims.size() && d < block.begin.size(); ++d)
        if (block.begin[d] != 0 || block.end[d] != global_dims[d]) return false;
    return block.begin.size() == global_dims.size();
}

// The shape a piece is stored with: the block's dimensions with fewer rows when it covers whole
// rows of the block (a slice of experts reads as (count, ...)), else flat.
std::vector<int64_t> stored_dims(const CheckpointPiece& p) {
    const std::vector<int64_t> block_dims = p.block.dims(p.global_dims);
    const int64_t n = p.end - p.begin;
    if (p.begin == 0 && n == numel_of(block_dims)) return block_dims;
    if (block_dims.size() >= 2) {
        const int64_t row = numel_of(block_dims) / block_dims[0];
        if (row > 0 && p.begin % row == 0 && n % row == 0) {
            std::vector<int64_t> dims = block_dims;
            dims[0] = n / row;
            return dims;
        }
    }
    return {n};
}

// "[0:64,32:64]"
std::string block_suffix(const TensorBlock& block) {
    std::string out = "[";
    for (size_t d = 0; d < block.begin.size(); ++d)
        out += fmt::format("{}{}:{}", d == 0 ? "" : ",", block.begin[d], block.end[d]);
    return out + "]";
}

// A slice's list of integers ("shape", "flat", a range of "block"). Only JSON integers that fit
// int64_t: nlohmann's get<int64_t> would convert a float (undefined past int64_t, e.g. 1e300),
// a boolean, or wrap an unsigned integer past int64_t.
std::vector<int64_t> integers_of(const json& list, const std::string& path,
                                 const std::string& array, std::string_view key) {
    MT_CHECK(list.is_array(), "[checkpoint] '{}': array '{}': \"{}\" is not a list of integers",
             path, array, key);
    std::vector<int64_t> out;
    for (const json& x : list) {
        const bool fits = x.is_number_integer() &&
                          !(x.is_number_unsigned() &&
                            x.get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()});
        MT_CHECK(fits, "[checkpoint] '{}': array '{}': \"{}\" holds {}, not an integer of 64 bits",
                 path, array, key, x.dump());
        out.push_back(x.get<int64_t>());
    }
    return out;
}

std::optional<CheckpointPart> part_from_name(std::string_view name) {
    for (CheckpointPart part : kCheckpointParts)
        if (checkpoint_part_name(part) == name) return part;
    return std::nullopt;
}

}  // namespace

std::vector<int64_t> TensorBlock::dims(const std::vector<int64_t>& global_dims) const {
    if (whole()) return global_dims;
    std::vector<int64_t> out(begin.size());
    for (size_t d = 0; d < begin.size(); ++d) out[d] = end[d] - begin[d];
    return out;
}

std::vector<BlockRun> block_runs(const std::vector<int64_t>& global_dims, const TensorBlock& block,
                                 int64_t flat_begin, int64_t flat_end) {
    const size_t n = global_dims.size();
    MT_CHECK(block.whole() || (block.begin.size() == n && block.end.size() == n),
             "[checkpoint] a block of {} dimensions in a tensor of {}", block.begin.size(),
             dims_string(global_dims));
    for (size_t d = 0; d < block.begin.size(); ++d)
        MT_CHECK(
            0 <= block.begin[d] && block.begin[d] < block.end[d] && block.end[d] <= global_dims[d],
            "[checkpoint] block {} lies outside a tensor of {}", block_suffix(block),
            dims_string(global_dims));
    const std::vector<int64_t> extent = block.dims(global_dims);
    MT_CHECK(0 <= flat_begin && flat_begin <= flat_end && flat_end <= numel_of(extent),
             "[checkpoint] elements [{}, {}) of a block of {} elements", flat_begin, flat_end,
             numel_of(extent));
    std::vector<BlockRun> runs;
    if (flat_begin == flat_end) return runs;
    if (n == 0) return {{flat_begin, flat_begin, flat_end - flat_begin}};
    std::vector<int64_t> stride(n, 1);
    for (size_t d = n - 1; d-- > 0;) stride[d] = stride[d + 1] * global_dims[d + 1];
    const auto first = [&](size_t d) { return block.whole() ? 0 : block.begin[d]; };
    // A run spans dimensions [k, n): those after k are whole in the block, so contiguous.
    size_t k = n - 1;
    while (k > 0 && extent[k] == global_dims[k]) --k;
    const int64_t run = extent[k] * stride[k];
    for (int64_t j = flat_begin / run; j * run < flat_end; ++j) {
        int64_t outer = j, global = first(k) * stride[k];
        for (size_t d = k; d-- > 0;) {
            global += (first(d) + outer % extent[d]) * stride[d];
            outer /= extent[d];
        }
        const int64_t lo = std::max(flat_begin, j * run), hi = std::min(flat_end, (j + 1) * run);
        runs.push_back({global + (lo - j * run), lo, hi - lo});
    }
    return runs;
}

FileDigest write_checkpoint_shard(const std::string& path,
                                  const std::vector<CheckpointPiece>& pieces,
                                  const std::map<std::string, std::string>& metadata) {
    SafetensorsWriter writer;
    json slices = json::object();
    for (CheckpointPiece p : pieces) {
        if (covers_whole_tensor(p.block, p.global_dims)) p.block = {};
        try {
            block_runs(p.global_dims, p.block, p.begin, p.end);  // checks that it fits
        } catch (const Error& e) {
            MT_THROW("[checkpoint] piece [{}, {}) of block {} of the {} of '{}' does not fit: {}",
                     p.begin, p.end, block_suffix(p.block), checkpoint_part_name(p.part), p.tensor,
                     e.what());
        }
        if (p.begin == p.end) continue;
        std::string name = std::string(checkpoint_part_prefix(p.part)) + p.tensor;
        json slice = json{{"tensor", p.tensor},
                          {"part", checkpoint_part_name(p.part)},
                          {"shape", p.global_dims},
                          {"flat", {p.begin, p.end}}};
        if (!p.block.whole()) {
            name += block_suffix(p.block);
            json block = json::array();
            for (size_t d = 0; d < p.block.begin.size(); ++d)
                block.push_back({p.block.begin[d], p.block.end[d]});
            slice["block"] = block;
        }
        if (p.end - p.begin != numel_of(p.block.dims(p.global_dims)))
            name += fmt::format("[{}:{}]", p.begin, p.end);
        slices[name] = slice;
        writer.add(name, DType::f32, stored_dims(p), p.data);
    }
    for (const auto& [key, value] : metadata) writer.set_metadata(key, value);
    writer.set_metadata(kShardSlicesKey, slices.dump());
    return writer.write(path);
}

// ---- reading ----

struct CheckpointTensors::OpenFile {
    std::string path;
    UniqueFd fd;
};

CheckpointTensors::CheckpointTensors(CheckpointTensors&&) noexcept = default;
CheckpointTensors& CheckpointTensors::operator=(CheckpointTensors&&) noexcept = default;
CheckpointTensors::~CheckpointTensors() = default;

CheckpointTensors CheckpointTensors::open(const fs::path& dir,
                                          const std::vector<std::string>& files,
                                          const std::vector<ParamEntry>& entries) {
    std::unordered_map<std::string, const ParamEntry*> by_name;
    for (const ParamEntry& e : entries) by_name.emplace(e.name, &e);
    CheckpointTensors out;

    for (size_t f = 0; f < files.size(); ++f) {
        const std::string path = (dir / files[f]).string();
        const SafetensorsFile file = SafetensorsFile::open(path);
        json slices;
        const auto meta = file.metadata().find(kShardSlicesKey);
        if (meta != file.metadata().end()) {
            try {
                slices = json::parse(meta->second);
            } catch (const json::exception& e) {
                MT_THROW("[checkpoint] '{}': the \"{}\" metadata is not valid JSON: {}", path,
                         kShardSlicesKey, e.what());
            }
            MT_CHECK(slices.is_object(), "[checkpoint] '{}': \"{}\" is not a JSON object", path,
                     kShardSlicesKey);
            MT_CHECK(slices.size() == file.tensors().size(),
                     "[checkpoint] '{}' holds {} arrays but describes {} slices", path,
                     file.tensors().size(), slices.size());
        }
        for (const SafetensorsEntry& t : file.tensors()) {
            CheckpointPart part = CheckpointPart::param;
            std::string tensor;
            std::vector<int64_t> global_dims;
            TensorBlock block;
            int64_t begin = 0, end = 0;
            if (slices.is_object()) {
                MT_CHECK(slices.contains(t.name),
                         "[checkpoint] '{}': array '{}' has no slice in the \"{}\" metadata", path,
                         t.name, kShardSlicesKey);
                const json& s = slices.at(t.name);
                try {
                    const std::optional<CheckpointPart> p =
                        part_from_name(s.at("part").get<std::string>());
                    MT_CHECK(p.has_value(), "[checkpoint] '{}': array '{}' has an unknown part {}",
                             path, t.name, s.at("part").dump());
                    part = *p;
                    tensor = s.at("tensor").get<std::string>();
                    global_dims = integers_of(s.at("shape"), path, t.name, "shape");
                    const auto flat = integers_of(s.at("flat"), path, t.name, "flat");
                    MT_CHECK(flat.size() == 2,
                             "[checkpoint] '{}': array '{}': \"flat\" is not "
                             "[begin, end]",
                             path, t.name);
                    begin = flat[0];
                    end = flat[1];
                    if (s.contains("block")) {
                        MT_CHECK(s.at("block").is_array(),
                                 "[checkpoint] '{}': array '{}': \"block\" is not a list of "
                                 "[begin, end]",
                                 path, t.name);
                        for (const json& range : s.at("block")) {
                            const auto r = integers_of(range, path, t.name, "block");
                            MT_CHECK(r.size() == 2,
                                     "[checkpoint] '{}': array '{}': \"block\" is not a list of "
                                     "[begin, end]",
                                     path, t.name);
                            block.begin.push_back(r[0]);
                            block.end.push_back(r[1]);
                        }
                    }
                } catch (const json::exception& e) {
                    MT_THROW("[checkpoint] '{}': the slice of array '{}' is malformed: {}", path,
                             t.name, e.what());
                }
            } else {
                // The version 1 format: whole tensors under their (prefixed) names.
                std::string_view name = t.name;
                for (CheckpointPart p : {CheckpointPart::m, CheckpointPart::v}) {
                    if (name.starts_with(checkpoint_part_prefix(p))) {
                        part = p;
                        name.remove_prefix(checkpoint_part_prefix(p).size());
                    }
                }
                tensor = std::string(name);
                global_dims = t.dims;
                end = numel_of(t.dims);
            }
            const auto it = by_name.find(tensor);
            MT_CHECK(it != by_name.end(),
                     "[checkpoint] '{}': array {} holds tensor {}, not a parameter of this "
                     "model (a checkpoint of another model?)",
                     path, printable(t.name), printable(tensor));
            const ParamEntry& e = *it->second;
            const std::vector<int64_t> want(e.shape.dims.begin(),
                                            e.shape.dims.begin() + e.shape.ndim);
            MT_CHECK(t.dtype == DType::f32 && global_dims == want,
                     "[checkpoint] '{}': tensor {} is {} {} in the file, the model expects F32 "
                     "{}",
                     path, printable(t.name), dtype_name(t.dtype), dims_string(global_dims),
                     dims_string(want));
            std::vector<BlockRun> runs;
            try {
                runs = block_runs(global_dims, block, begin, end);
            } catch (const Error& e) {
                MT_THROW("[checkpoint] '{}': array '{}' does not describe a part of '{}': {}", path,
                         t.name, tensor, e.what());
            }
            MT_CHECK(
                begin < end && static_cast<uint64_t>(end - begin) * sizeof(float) == t.num_bytes(),
                "[checkpoint] '{}': array '{}' of {} bytes does not hold elements [{}, {}) of "
                "block {} of '{}'",
                path, t.name, t.num_bytes(), begin, end,
                block.whole() ? std::string("(whole)") : block_suffix(block), tensor);
            std::vector<Piece>& pieces = out.pieces_[piece_key(part, tensor)];
            const uint64_t first_byte = file.data_offset() + t.begin;
            for (const BlockRun& r : runs)
                pieces.push_back(
                    {f, first_byte + static_cast<uint64_t>(r.block_offset - begin) * sizeof(float),
                     r.global_offset, r.global_offset + r.count});
        }
        out.files_.push_back(std::make_unique<OpenFile>(OpenFile{path, open_for_reading(path)}));
    }

    for (const ParamEntry& e : entries)
        out.global_dims_.emplace(e.name, std::vector<int64_t>(e.shape.dims.begin(),
                                                              e.shape.dims.begin() + e.shape.ndim));
    // No overlaps; full coverage of every parameter and of the moments of trainable tensors.
    for (auto& [key, pieces] : out.pieces_)
        std::sort(pieces.begin(), pieces.end(),
                  [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
    for (const ParamEntry& e : entries) {
        for (CheckpointPart part : kCheckpointParts) {
            const auto it = out.pieces_.find(piece_key(part, e.name));
            if (it == out.pieces_.end() && part != CheckpointPart::param && !e.trainable) continue;
            int64_t covered = 0;
            const Piece* prev = nullptr;
            const std::vector<Piece> none;
            for (const Piece& p : it != out.pieces_.end() ? it->second : none) {
                MT_CHECK(prev == nullptr || p.begin >= prev->end,
                         "[checkpoint] '{}': two pieces of the {} of '{}' overlap at element {} "
                         "('{}' and '{}'): files of two checkpoints mixed?",
                         dir.string(), checkpoint_part_name(part), e.name, p.begin,
                         out.files_[prev->file]->path, out.files_[p.file]->path);
                MT_CHECK(p.begin == covered,
                         "[checkpoint] '{}': no file holds elements [{}, {}) of the {} of tensor "
                         "'{}' (a shard file missing from the checkpoint?)",
                         dir.string(), covered, p.begin, checkpoint_part_name(part), e.name);
                covered = p.end;
                prev = &p;
            }
            MT_CHECK(covered == e.numel,
                     "[checkpoint] '{}': no file holds elements [{}, {}) of the {} of tensor '{}' "
                     "(a shard file missing from the checkpoint?)",
                     dir.string(), covered, e.numel, checkpoint_part_name(part), e.name);
        }
    }
    return out;
}

const std::vector<CheckpointTensors::Piece>* CheckpointTensors::pieces_of(
    CheckpointPart part, const std::string& tensor) const {
    const auto it = pieces_.find(piece_key(part, tensor));
    return it == pieces_.end() ? nullptr : &it->second;
}

void CheckpointTensors::read(CheckpointPart part, const std::string& tensor, int64_t begin,
                             int64_t count, float* out) const {
    const std::vector<Piece>* pieces = pieces_of(part, tensor);
    if (pieces == nullptr && part != CheckpointPart::param) {
        std::memset(out, 0, static_cast<size_t>(count) * sizeof(float));  // never trained
        return;
    }
    MT_CHECK(pieces != nullptr, "[checkpoint] the checkpoint holds no {} of tensor '{}'",
             checkpoint_part_name(part), tensor);
    const int64_t end = begin + count;
    int64_t copied = 0;
    // The first piece that ends after begin; pieces are sorted and disjoint.
    auto it = std::upper_bound(pieces->begin(), pieces->end(), begin,
                               [](int64_t value, const Piece& p) { return value < p.end; });
    for (; it != pieces->end() && it->begin < end; ++it) {
        const int64_t lo = std::max(begin, it->begin), hi = std::min(end, it->end);
        const OpenFile& file = *files_[it->file];
        const size_t bytes = static_cast<size_t>(hi - lo) * sizeof(float);
        const uint64_t at = it->file_offset + static_cast<uint64_t>(lo - it->begin) * sizeof(float);
        MT_CHECK(read_at(file.fd.get(), out + (lo - begin), bytes, at, file.path) == bytes,
                 "[checkpoint] '{}' ended inside the {} of tensor '{}'", file.path,
                 checkpoint_part_name(part), tensor);
        copied += hi - lo;
    }
    MT_CHECK(copied == count,
             "[checkpoint] the checkpoint holds only {} of elements [{}, {}) of the {} of tensor "
             "'{}'",
             copied, begin, end, checkpoint_part_name(part), tensor);
}

void CheckpointTensors::read(CheckpointPart part, const std::string& tensor,
                             const TensorBlock& block, int64_t begin, int64_t count,
                             float* out) const {
    const auto dims = global_dims_.find(tensor);
    MT_CHECK(dims != global_dims_.end(), "[checkpoint] tensor '{}' is not a parameter of the model",
             tensor);
    for (const BlockRun& r : block_runs(dims->second, block, begin, begin + count))
        read(part, tensor, r.global_offset, r.count, out + (r.block_offset - begin));
}

}  // namespace moetron
