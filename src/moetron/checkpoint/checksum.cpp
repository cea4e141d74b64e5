#include "moetron/checkpoint/checksum.h"

// xxHash compiled into this file (header-only mode): no link dependency, and the library's
// symbols stay private to this translation unit.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <charconv>
#include <filesystem>
#include <set>

#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/core/error.h"
#include "moetron/core/strings.h"

namespace moetron {

struct Xxh3Hasher::State {
    XXH3_state_t xxh;
};

Xxh3Hasher::Xxh3Hasher() : state_(std::make_unique<State>()) {
    MT_CHECK(XXH3_64bits_reset(&state_->xxh) == XXH_OK, "[checksum] XXH3 reset failed");
}
Xxh3Hasher::Xxh3Hasher(Xxh3Hasher&&) noexcept = default;
Xxh3Hasher& Xxh3Hasher::operator=(Xxh3Hasher&&) noexcept = default;
Xxh3Hasher::~Xxh3Hasher() = default;

void Xxh3Hasher::update(const void* data, size_t num_bytes) {
    MT_CHECK(state_ != nullptr, "[checksum] update() on a moved-from hasher");
    if (num_bytes == 0) return;
    MT_CHECK(XXH3_64bits_update(&state_->xxh, data, num_bytes) == XXH_OK,
             "[checksum] XXH3 update failed");
}

uint64_t Xxh3Hasher::digest() const {
    MT_CHECK(state_ != nullptr, "[checksum] digest() on a moved-from hasher");
    return XXH3_64bits_digest(&state_->xxh);
}

uint64_t xxh3_64(const void* data, size_t num_bytes) {
    return XXH3_64bits(data, num_bytes);
}

std::string xxh3_hex(uint64_t hash) {
    return fmt::format("{:016x}", hash);
}

std::optional<uint64_t> parse_xxh3_hex(std::string_view hex) {
    if (hex.size() != 16) return std::nullopt;
    uint64_t value = 0;
    const auto [end, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), value, 16);
    if (ec != std::errc() || end != hex.data() + hex.size()) return std::nullopt;
    return value;
}

FileDigest digest_file(const std::string& path) {
    UniqueFd fd = open_for_reading(path);
    constexpr size_t kChunkBytes = size_t{4} << 20;
    std::vector<char> chunk(kChunkBytes);
    Xxh3Hasher hasher;
    FileDigest digest;
    for (;;) {
        const size_t got = read_at(fd.get(), chunk.data(), chunk.size(), digest.num_bytes, path);
        hasher.update(chunk.data(), got);
        digest.num_bytes += got;
        if (got < chunk.size()) break;
    }
    digest.xxh3 = hasher.digest();
    return digest;
}

// ---- checkpoint index ----

namespace {

constexpr std::string_view kIndexFormat = "moetron-checkpoint-index";
constexpr uint64_t kIndexVersion = 1;
constexpr uint64_t kMaxIndexBytes = uint64_t{64} << 20;

// A name that stays inside the checkpoint directory whatever the index says.
bool is_plain_file_name(std::string_view name) {
    return !name.empty() && name != "." && name != ".." &&
           name.find_first_of(std::string_view("/\0", 2)) == std::string_view::npos;
}

// Integers parsed from text are unsigned when non-negative; built in code they may be signed.
std::optional<uint64_t> non_negative_integer(const nlohmann::json& value) {
    if (value.is_number_unsigned()) return value.get<uint64_t>();
    if (value.is_number_integer() && value.get<int64_t>() >= 0)
        return static_cast<uint64_t>(value.get<int64_t>());
    return std::nullopt;
}

void check_keys(const nlohmann::json& object, std::initializer_list<std::string_view> keys,
                const std::string& where) {
    for (const auto& [key, value] : object.items()) {
        bool known = false;
        for (std::string_view k : keys) known = known || key == k;
        MT_CHECK(known, "[checkpoint] {}: unexpected key {}", where, printable(key));
    }
    for (std::string_view k : keys)
        MT_CHECK(object.contains(k), "[checkpoint] {}: missing key '{}'", where, k);
}

}  // namespace

void CheckpointIndex::add(std::string name, const FileDigest& digest) {
    MT_CHECK(is_plain_file_name(name),
             "[checkpoint] index entry '{}' is not a plain file name inside the checkpoint", name);
    for (const File& f : files)
        MT_CHECK(f.name != name, "[checkpoint] file '{}' is already in the index", name);
    files.push_back({std::move(name), digest.num_bytes, digest.xxh3});
}

void CheckpointIndex::add_file(const std::string& dir, const std::string& name) {
    MT_CHECK(is_plain_file_name(name),
             "[checkpoint] index entry '{}' is not a plain file name inside the checkpoint", name);
    add(name, digest_file((std::filesystem::path(dir) / name).string()));
}

nlohmann::json CheckpointIndex::to_json() const {
    nlohmann::json list = nlohmann::json::array();
    for (const File& f : files)
        list.push_back({{"name", f.name}, {"bytes", f.num_bytes}, {"xxh3", xxh3_hex(f.xxh3)}});
    return {{"format", kIndexFormat}, {"version", kIndexVersion}, {"files", std::move(list)}};
}

CheckpointIndex CheckpointIndex::from_json(const nlohmann::json& json, const std::string& source) {
    const std::string where = fmt::format("index '{}'", source);
    MT_CHECK(json.is_object(), "[checkpoint] {}: not a JSON object", where);
    check_keys(json, {"format", "version", "files"}, where);
    MT_CHECK(json["format"].is_string() && json["format"].get<std::string>() == kIndexFormat,
             "[checkpoint] {}: format is {}, expected \"{}\"", where, json["format"].dump(),
             kIndexFormat);
    MT_CHECK(non_negative_integer(json["version"]) == kIndexVersion,
             "[checkpoint] {}: version {} is not one this build reads ({})", where,
             json["version"].dump(), kIndexVersion);
    const nlohmann::json& list = json["files"];
    MT_CHECK(list.is_array(), "[checkpoint] {}: 'files' is not an array", where);
    CheckpointIndex index;
    for (size_t i = 0; i < list.size(); ++i) {
        const nlohmann::json& entry = list[i];
        const std::string entry_where = fmt::format("{} file #{}", where, i);
        MT_CHECK(entry.is_object(), "[checkpoint] {}: not a JSON object", entry_where);
        check_keys(entry, {"name", "bytes", "xxh3"}, entry_where);
        MT_CHECK(entry["name"].is_string(), "[checkpoint] {}: 'name' is not a string", entry_where);
        const std::optional<uint64_t> num_bytes = non_negative_integer(entry["bytes"]);
        MT_CHECK(num_bytes.has_value(), "[checkpoint] {}: 'bytes' is not a non-negative integer",
                 entry_where);
        MT_CHECK(entry["xxh3"].is_string(), "[checkpoint] {}: 'xxh3' is not a string", entry_where);
        const std::optional<uint64_t> hash = parse_xxh3_hex(entry["xxh3"].get<std::string>());
        MT_CHECK(hash.has_value(), "[checkpoint] {}: 'xxh3' {} is not 16 hex digits", entry_where,
                 entry["xxh3"].dump());
        index.add(entry["name"].get<std::string>(), {*num_bytes, *hash});
    }
    return index;
}

void CheckpointIndex::write(const std::string& path) const {
    const std::string text = to_json().dump(2) + "\n";
    UniqueFd fd = create_for_writing(path);
    write_all(fd.get(), text.data(), text.size(), path);
    fsync_fd(fd.get(), path);
    fd.close(path);
}

CheckpointIndex CheckpointIndex::read(const std::string& path) {
    UniqueFd fd = open_for_reading(path);
    const uint64_t size = file_size_bytes(fd.get(), path);
    MT_CHECK(size <= kMaxIndexBytes,
             "[checkpoint] index '{}' is {} bytes, more than the {} an "
             "index can be",
             path, size, kMaxIndexBytes);
    std::string text(size, '\0');
    MT_CHECK(read_at(fd.get(), text.data(), size, 0, path) == size,
             "[checkpoint] index '{}' shrank while it was read", path);
    nlohmann::json json;
    try {
        json = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        MT_THROW("[checkpoint] index '{}' is not valid JSON: {}", path, e.what());
    }
    return from_json(json, path);
}

void CheckpointIndex::verify(const std::string& dir) const {
    for (const File& f : files) {
        const std::string path = (std::filesystem::path(dir) / f.name).string();
        std::error_code ec;
        MT_CHECK(std::filesystem::exists(path, ec),
                 "[checkpoint] '{}' is listed in the checkpoint's index but missing", path);
        const FileDigest found = digest_file(path);
        MT_CHECK(found.num_bytes == f.num_bytes,
                 "[checkpoint] '{}' is corrupt: it is {} bytes, the index records {}", path,
                 found.num_bytes, f.num_bytes);
        MT_CHECK(found.xxh3 == f.xxh3,
                 "[checkpoint] '{}' is corrupt: its xxh3 checksum is {}, the index records {}",
                 path, xxh3_hex(found.xxh3), xxh3_hex(f.xxh3));
    }
}

}  // namespace moetron
