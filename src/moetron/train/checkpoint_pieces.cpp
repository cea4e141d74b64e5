#include "moetron/train/checkpoint_pieces.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

#include "moetron/core/error.h"
#include "moetron/train/atomic_dir.h"
#include "moetron/train/safetensors.h"

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

// The shape a piece is stored with: the tensor's trailing dimensions when it covers whole rows
// (a slice of experts reads as (count, ...)), else flat.
std::vector<int64_t> stored_dims(const CheckpointPiece& p) {
    const int64_t n = p.end - p.begin;
    if (p.begin == 0 && n == numel_of(p.global_dims)) return p.global_dims;
    if (p.global_dims.size() >= 2) {
        const int64_t row = numel_of(p.global_dims) / p.global_dims[0];
        if (row > 0 && p.begin % row == 0 && n % row == 0) {
            std::vector<int64_t> dims = p.global_dims;
            dims[0] = n / row;
            return dims;
        }
    }
    return {n};
}

std::optional<CheckpointPart> part_from_name(std::string_view name) {
    for (CheckpointPart part : kCheckpointParts)
        if (checkpoint_part_name(part) == name) return part;
    return std::nullopt;
}

}  // namespace

FileDigest write_checkpoint_shard(const std::string& path,
                                  const std::vector<CheckpointPiece>& pieces,
                                  const std::map<std::string, std::string>& metadata) {
    SafetensorsWriter writer;
    json slices = json::object();
    for (const CheckpointPiece& p : pieces) {
        const int64_t numel = numel_of(p.global_dims);
        MT_CHECK(0 <= p.begin && p.begin <= p.end && p.end <= numel,
                 "[checkpoint] piece [{}, {}) of {} of '{}' lies outside its {} elements", p.begin,
                 p.end, checkpoint_part_name(p.part), p.tensor, numel);
        if (p.begin == p.end) continue;
        std::string name = std::string(checkpoint_part_prefix(p.part)) + p.tensor;
        if (p.end - p.begin != numel) name += fmt::format("[{}:{}]", p.begin, p.end);
        slices[name] = json{{"tensor", p.tensor},
                            {"part", checkpoint_part_name(p.part)},
                            {"shape", p.global_dims},
                            {"flat", {p.begin, p.end}}};
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
                    global_dims = s.at("shape").get<std::vector<int64_t>>();
                    const auto flat = s.at("flat").get<std::vector<int64_t>>();
                    MT_CHECK(flat.size() == 2,
                             "[checkpoint] '{}': array '{}': \"flat\" is not "
                             "[begin, end]",
                             path, t.name);
                    begin = flat[0];
                    end = flat[1];
                } catch (const json::exception& e) {
                    MT_THROW("[checkpoint] '{}': the slice of array '{}' is malformed: {}", path,
                             t.name, e.what());
                }
            } else {
                // The single-process format: whole tensors under their (prefixed) names.
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
                     "[checkpoint] '{}': tensor '{}' is not a parameter of this model (a "
                     "checkpoint of another model?)",
                     path, t.name);
            const ParamEntry& e = *it->second;
            const std::vector<int64_t> want(e.shape.dims.begin(),
                                            e.shape.dims.begin() + e.shape.ndim);
            MT_CHECK(t.dtype == DType::f32 && global_dims == want,
                     "[checkpoint] '{}': tensor '{}' is {} {} in the file, the model expects F32 "
                     "{}",
                     path, t.name, dtype_name(t.dtype), dims_string(global_dims),
                     dims_string(want));
            MT_CHECK(0 <= begin && begin < end && end <= e.numel &&
                         static_cast<uint64_t>(end - begin) * sizeof(float) == t.num_bytes(),
                     "[checkpoint] '{}': array '{}' of {} bytes does not hold elements [{}, {}) of "
                     "the {} of '{}'",
                     path, t.name, t.num_bytes(), begin, end, e.numel, tensor);
            const std::string key = piece_key(part, tensor);
            out.pieces_[key].push_back({f, file.data_offset() + t.begin, begin, end});
        }
        out.files_.push_back(std::make_unique<OpenFile>(OpenFile{path, open_for_reading(path)}));
    }

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

}  // namespace moetron
