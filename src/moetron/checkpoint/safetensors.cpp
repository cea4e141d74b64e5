#include "moetron/checkpoint/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <limits>
#include <optional>
#include <set>

#include "moetron/core/error.h"
#include "moetron/core/strings.h"

namespace moetron {

static_assert(std::endian::native == std::endian::little,
              "safetensors files are little-endian and read without byte swapping");

namespace {

using nlohmann::json;

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr std::array kKnownDTypes = {DType::f32, DType::bf16, DType::f64,
                                     DType::i32, DType::i64,  DType::u8};
// Root object (0) > tensor entry or metadata (1) > shape / data_offsets array (2) > numbers.
constexpr int kMaxContainerDepth = 2;

// Unsigned JSON integer that fits int64 (shape dimension) or uint64 (offset); nullopt otherwise.
std::optional<uint64_t> unsigned_value(const json& value, uint64_t max_value) {
    if (!value.is_number_unsigned()) return std::nullopt;
    const auto v = value.get<uint64_t>();
    if (v > max_value) return std::nullopt;
    return v;
}

std::optional<DType> dtype_from_safetensors_name(std::string_view name) {
    for (DType t : kKnownDTypes)
        if (dtype_name(t) == name) return t;
    return std::nullopt;
}

// Parses with two guards the DOM parser lacks: nesting depth (a 100 MB header of '[' must not
// exhaust the stack) and repeated keys (nlohmann keeps the last one silently).
json parse_guarded(std::string_view text, const std::string& source) {
    std::vector<std::set<std::string>> open_objects;
    auto guard = [&](int depth, json::parse_event_t event, json& parsed) {
        switch (event) {
            case json::parse_event_t::object_start:
            case json::parse_event_t::array_start:
                MT_CHECK(depth <= kMaxContainerDepth,
                         "[safetensors] '{}': the header nests JSON deeper than a safetensors "
                         "header does",
                         source);
                if (event == json::parse_event_t::object_start) open_objects.emplace_back();
                break;
            case json::parse_event_t::object_end:
                open_objects.pop_back();
                break;
            case json::parse_event_t::key: {
                const auto& key = parsed.get_ref<const std::string&>();
                MT_CHECK(open_objects.back().insert(key).second,
                         "[safetensors] '{}': the header repeats the key {}", source,
                         printable(key));
                break;
            }
            default:
                break;
        }
        return true;
    };
    try {
        return json::parse(text.begin(), text.end(), guard);
    } catch (const json::exception& e) {
        MT_THROW("[safetensors] '{}': the header is not valid JSON: {}", source,
                 printable(e.what(), 400));
    }
}

SafetensorsEntry parse_entry(const std::string& name, const json& value, uint64_t data_num_bytes,
                             const std::string& source) {
    const std::string where = fmt::format("[safetensors] '{}': tensor {}", source, printable(name));
    MT_CHECK(value.is_object(), "{}: its entry is a JSON {}, not an object", where,
             value.type_name());
    for (const auto& [key, unused] : value.items()) {
        MT_CHECK(key == "dtype" || key == "shape" || key == "data_offsets",
                 "{}: unexpected key {} (an entry has dtype, shape and data_offsets)", where,
                 printable(key));
    }
    for (const char* key : {"dtype", "shape", "data_offsets"})
        MT_CHECK(value.contains(key), "{}: missing key '{}'", where, key);

    SafetensorsEntry entry;
    entry.name = name;
    const json& dtype = value["dtype"];
    MT_CHECK(dtype.is_string(), "{}: dtype is a JSON {}, not a string", where, dtype.type_name());
    const std::optional<DType> known = dtype_from_safetensors_name(dtype.get<std::string>());
    MT_CHECK(known.has_value(),
             "{}: unsupported dtype {} (this reader knows F32, BF16, F64, I32, I64, U8)", where,
             printable(dtype.get<std::string>()));
    entry.dtype = *known;

    const json& shape = value["shape"];
    MT_CHECK(shape.is_array(), "{}: shape is a JSON {}, not an array", where, shape.type_name());
    // The product of the non-zero dimensions must fit int64 even when a zero makes the tensor
    // empty: Shape::numel() multiplies in any order.
    uint64_t nonzero_numel = 1;
    bool overflow = false;
    bool has_zero_dim = false;
    for (const json& dim : shape) {
        const std::optional<uint64_t> d =
            unsigned_value(dim, static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
        MT_CHECK(d.has_value(), "{}: shape {} has the dimension {}, not a non-negative integer",
                 where, printable(shape.dump()), printable(dim.dump()));
        entry.dims.push_back(static_cast<int64_t>(*d));
        if (*d == 0)
            has_zero_dim = true;
        else
            overflow = overflow || __builtin_mul_overflow(nonzero_numel, *d, &nonzero_numel);
    }
    uint64_t num_bytes = 0;
    overflow = overflow ||
               nonzero_numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
               __builtin_mul_overflow(nonzero_numel, dtype_size_bytes(entry.dtype), &num_bytes);
    MT_CHECK(!overflow, "{}: shape {} of {} overflows 64-bit element and byte counts", where,
             dims_string(entry.dims), dtype_name(entry.dtype));
    if (has_zero_dim) num_bytes = 0;

    const json& offsets = value["data_offsets"];
    MT_CHECK(offsets.is_array() && offsets.size() == 2,
             "{}: data_offsets is {}, not an array [begin, end]", where, printable(offsets.dump()));
    const std::optional<uint64_t> begin = unsigned_value(offsets[0], UINT64_MAX);
    const std::optional<uint64_t> end = unsigned_value(offsets[1], UINT64_MAX);
    MT_CHECK(begin && end, "{}: data_offsets {} are not non-negative integers", where,
             printable(offsets.dump()));
    MT_CHECK(*begin <= *end, "{}: data_offsets [{}, {}] end before they begin", where, *begin,
             *end);
    MT_CHECK(*end <= data_num_bytes,
             "{}: data_offsets [{}, {}] reach past the end of the data buffer ({} bytes; is the "
             "file truncated?)",
             where, *begin, *end, data_num_bytes);
    entry.begin = *begin;
    entry.end = *end;
    MT_CHECK(num_bytes == entry.num_bytes(),
             "{}: shape {} of {} is {} bytes but data_offsets [{}, {}] hold {} bytes", where,
             dims_string(entry.dims), dtype_name(entry.dtype), num_bytes, *begin, *end,
             entry.num_bytes());
    return entry;
}

// Sorted by offset, the tensors must cover [0, data_num_bytes) with no overlap and no gap.
void check_tiling(const std::vector<SafetensorsEntry>& tensors, uint64_t data_num_bytes,
                  const std::string& source) {
    uint64_t covered_to = 0;
    const SafetensorsEntry* previous = nullptr;
    for (const SafetensorsEntry& t : tensors) {
        if (t.begin < covered_to) {
            MT_THROW("[safetensors] '{}': tensor {} [{}, {}) overlaps tensor {} [{}, {})", source,
                     printable(t.name), t.begin, t.end, printable(previous->name), previous->begin,
                     previous->end);
        }
        MT_CHECK(t.begin == covered_to,
                 "[safetensors] '{}': bytes [{}, {}) of the data buffer belong to no tensor "
                 "(before tensor {})",
                 source, covered_to, t.begin, printable(t.name));
        covered_to = t.end;
        previous = &t;
    }
    MT_CHECK(covered_to == data_num_bytes,
             "[safetensors] '{}': the data buffer has {} bytes after the last tensor{} ends: not "
             "a safetensors file as written, or two files joined",
             source, data_num_bytes - covered_to,
             previous ? fmt::format(" {}", printable(previous->name)) : std::string());
}

}  // namespace

std::string dims_string(std::span<const int64_t> dims) {
    std::string s = "(";
    for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + (dims.size() == 1 ? ",)" : ")");
}

Shape SafetensorsEntry::shape() const {
    MT_CHECK(dims.size() <= static_cast<size_t>(kMaxDims),
             "[safetensors] tensor {} has {} dimensions; views hold at most {}", printable(name),
             dims.size(), kMaxDims);
    Shape s;
    for (int64_t d : dims) s.dims[s.ndim++] = d;
    return s;
}

SafetensorsHeader parse_safetensors_header(std::string_view json_text, uint64_t data_num_bytes,
                                           const std::string& source) {
    const json root = parse_guarded(json_text, source);
    MT_CHECK(root.is_object(), "[safetensors] '{}': the header is a JSON {}, not an object", source,
             root.type_name());
    SafetensorsHeader header;
    for (const auto& [key, value] : root.items()) {
        if (key == kMetadataKey) {
            MT_CHECK(value.is_object(),
                     "[safetensors] '{}': __metadata__ is a JSON {}, not an object of strings",
                     source, value.type_name());
            for (const auto& [meta_key, meta_value] : value.items()) {
                MT_CHECK(meta_value.is_string(),
                         "[safetensors] '{}': __metadata__ entry {} is a JSON {}, not a string",
                         source, printable(meta_key), meta_value.type_name());
                header.metadata.emplace(meta_key, meta_value.get<std::string>());
            }
            continue;
        }
        header.tensors.push_back(parse_entry(key, value, data_num_bytes, source));
    }
    std::sort(header.tensors.begin(), header.tensors.end(),
              [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                  if (a.begin != b.begin) return a.begin < b.begin;
                  if (a.end != b.end) return a.end < b.end;
                  return a.name < b.name;
              });
    check_tiling(header.tensors, data_num_bytes, source);
    return header;
}

// ---- reader ----

SafetensorsFile::SafetensorsFile(std::string path, UniqueFd fd, SafetensorsHeader header,
                                 uint64_t data_offset)
    : path_(std::move(path)),
      fd_(std::move(fd)),
      header_(std::move(header)),
      data_offset_(data_offset) {}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
    UniqueFd fd = open_for_reading(path);
    const uint64_t file_bytes = file_size_bytes(fd.get(), path);
    MT_CHECK(file_bytes >= 8,
             "[safetensors] '{}' is {} bytes: too short for a safetensors file (its header "
             "length alone is 8 bytes)",
             path, file_bytes);
    uint64_t header_bytes = 0;
    MT_CHECK(read_at(fd.get(), &header_bytes, 8, 0, path) == 8,
             "[safetensors] '{}' shrank while it was read", path);
    MT_CHECK(header_bytes <= kSafetensorsMaxHeaderBytes,
             "[safetensors] '{}': header length {} is over the format's limit of {} bytes (not a "
             "safetensors file?)",
             path, header_bytes, kSafetensorsMaxHeaderBytes);
    MT_CHECK(header_bytes <= file_bytes - 8,
             "[safetensors] '{}': header length {} reaches past the end of the {}-byte file (is "
             "it truncated?)",
             path, header_bytes, file_bytes);
    std::string text(header_bytes, '\0');
    MT_CHECK(read_at(fd.get(), text.data(), header_bytes, 8, path) == header_bytes,
             "[safetensors] '{}' shrank while it was read", path);
    const uint64_t data_offset = 8 + header_bytes;
    SafetensorsHeader header = parse_safetensors_header(text, file_bytes - data_offset, path);
    return SafetensorsFile(path, std::move(fd), std::move(header), data_offset);
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
    for (const SafetensorsEntry& e : header_.tensors)
        if (e.name == name) return &e;
    return nullptr;
}

const SafetensorsEntry& SafetensorsFile::entry(std::string_view name) const {
    const SafetensorsEntry* e = find(name);
    MT_CHECK(e != nullptr, "[safetensors] '{}' has no tensor {} ({} tensors in the file)", path_,
             printable(name), header_.tensors.size());
    return *e;
}

void SafetensorsFile::read(std::string_view name, DType expected_dtype,
                           std::span<const int64_t> expected_dims, void* out,
                           size_t out_num_bytes) const {
    const SafetensorsEntry& e = entry(name);
    MT_CHECK(e.dtype == expected_dtype,
             "[safetensors] '{}': tensor {} is {} in the file, expected {}", path_, printable(name),
             dtype_name(e.dtype), dtype_name(expected_dtype));
    MT_CHECK(std::equal(e.dims.begin(), e.dims.end(), expected_dims.begin(), expected_dims.end()),
             "[safetensors] '{}': tensor {} has shape {} in the file, expected {}", path_,
             printable(name), dims_string(e.dims), dims_string(expected_dims));
    read_bytes(e, out, out_num_bytes);
}

void SafetensorsFile::read(std::string_view name, const TensorView& out) const {
    MT_CHECK(out.device == Device::cpu,
             "[safetensors] reading tensor {} from '{}': the destination must be a CPU view",
             printable(name), path_);
    read(name, out.dtype, std::span<const int64_t>(out.shape.dims.data(), out.shape.ndim), out.data,
         out.size_bytes());
}

void SafetensorsFile::read_bytes(const SafetensorsEntry& e, void* out, size_t out_num_bytes) const {
    MT_CHECK(out_num_bytes == e.num_bytes(),
             "[safetensors] '{}': tensor {} is {} bytes, the destination {} bytes", path_,
             printable(e.name), e.num_bytes(), out_num_bytes);
    if (e.num_bytes() == 0) return;
    MT_CHECK(out != nullptr, "[safetensors] '{}': tensor {}: null destination", path_,
             printable(e.name));
    const size_t got = read_at(fd_.get(), out, e.num_bytes(), data_offset_ + e.begin, path_);
    MT_CHECK(got == e.num_bytes(),
             "[safetensors] '{}': the file ends inside tensor {} (byte {} of {}): it was "
             "truncated after it was opened",
             path_, printable(e.name), got, e.num_bytes());
}

// ---- writer ----

void SafetensorsWriter::add(std::string name, DType dtype, std::vector<int64_t> dims,
                            const void* data) {
    MT_CHECK(name != kMetadataKey, "[safetensors] '{}' is reserved for metadata, not a tensor name",
             name);
    for (const Pending& t : tensors_)
        MT_CHECK(t.name != name, "[safetensors] tensor {} was added twice", printable(name));
    uint64_t num_bytes = dtype_size_bytes(dtype);
    for (int64_t d : dims) {
        MT_CHECK(d >= 0, "[safetensors] tensor {}: negative dimension in {}", printable(name),
                 dims_string(dims));
        MT_CHECK(!__builtin_mul_overflow(num_bytes, static_cast<uint64_t>(d), &num_bytes),
                 "[safetensors] tensor {}: shape {} overflows 64 bits of bytes", printable(name),
                 dims_string(dims));
    }
    MT_CHECK(data != nullptr || num_bytes == 0, "[safetensors] tensor {}: null data pointer",
             printable(name));
    tensors_.push_back({std::move(name), dtype, std::move(dims), data, num_bytes});
}

void SafetensorsWriter::add(std::string name, const TensorView& view) {
    MT_CHECK(view.device == Device::cpu, "[safetensors] tensor {}: only CPU views can be written",
             printable(name));
    add(std::move(name), view.dtype,
        std::vector<int64_t>(view.shape.dims.begin(), view.shape.dims.begin() + view.shape.ndim),
        view.data);
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
    metadata_[std::move(key)] = std::move(value);
}

std::string SafetensorsWriter::header_text() const {
    nlohmann::ordered_json root = nlohmann::ordered_json::object();
    if (!metadata_.empty()) root[std::string(kMetadataKey)] = metadata_;
    uint64_t offset = 0;
    for (const Pending& t : tensors_) {
        nlohmann::ordered_json offsets =
            nlohmann::ordered_json::array({offset, offset + t.num_bytes});
        root[t.name] = {{"dtype", dtype_name(t.dtype)},
                        {"shape", t.dims},
                        {"data_offsets", std::move(offsets)}};
        offset += t.num_bytes;
    }
    std::string text;
    try {
        text = root.dump();
    } catch (const nlohmann::json::exception& e) {
        MT_THROW("[safetensors] a tensor name or metadata string cannot be written: {}", e.what());
    }
    // Spaces are JSON whitespace: padding keeps the data buffer 8-byte aligned.
    text.append((8 - text.size() % 8) % 8, ' ');
    return text;
}

FileDigest SafetensorsWriter::write(const std::string& path) const {
    const std::string header = header_text();
    const uint64_t header_bytes = header.size();
    MT_CHECK(header_bytes <= kSafetensorsMaxHeaderBytes,
             "[safetensors] '{}': the header would be {} bytes, over the format's limit of {}",
             path, header_bytes, kSafetensorsMaxHeaderBytes);
    UniqueFd fd = create_for_writing(path);
    Xxh3Hasher hasher;
    uint64_t written = 0;
    auto emit = [&](const void* data, size_t num_bytes) {
        hasher.update(data, num_bytes);
        write_all(fd.get(), data, num_bytes, path);
        written += num_bytes;
    };
    emit(&header_bytes, 8);
    emit(header.data(), header.size());
    // Hash and write in chunks so each chunk is hashed while it is still in cache.
    constexpr size_t kChunkBytes = size_t{4} << 20;
    for (const Pending& t : tensors_) {
        const auto* bytes = static_cast<const char*>(t.data);
        for (uint64_t done = 0; done < t.num_bytes; done += kChunkBytes)
            emit(bytes + done, std::min<uint64_t>(kChunkBytes, t.num_bytes - done));
    }
    fsync_fd(fd.get(), path);
    fd.close(path);
    return {written, hasher.digest()};
}

}  // namespace moetron
