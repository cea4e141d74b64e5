// Checksums of checkpoint files: XXH3-64 (xxHash), streaming, printed as 16 lowercase hex
// digits; and the checkpoint index, a JSON list of the files in a checkpoint directory with
// their sizes and checksums, which verify() recomputes to catch any flipped or missing byte.
//
// Index file (index.json):
//   {"format": "moetron-checkpoint-index", "version": 1,
//    "files": [{"name": "model.safetensors", "bytes": 1234, "xxh3": "0123456789abcdef"}, ...]}
// Names are plain file names inside the checkpoint directory (no '/', not "." or "..").
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moetron {

// Incremental XXH3-64: update() any number of times, digest() at any point.
class Xxh3Hasher {
  public:
    Xxh3Hasher();
    Xxh3Hasher(Xxh3Hasher&&) noexcept;
    Xxh3Hasher& operator=(Xxh3Hasher&&) noexcept;
    ~Xxh3Hasher();

    void update(const void* data, size_t num_bytes);
    uint64_t digest() const;

  private:
    struct State;
    std::unique_ptr<State> state_;
};

uint64_t xxh3_64(const void* data, size_t num_bytes);
// 16 lowercase hex digits, most significant first (the canonical XXH3 spelling).
std::string xxh3_hex(uint64_t hash);
// Inverse of xxh3_hex: exactly 16 hex digits (either case), else nullopt.
std::optional<uint64_t> parse_xxh3_hex(std::string_view hex);

struct FileDigest {
    uint64_t num_bytes = 0;
    uint64_t xxh3 = 0;
    bool operator==(const FileDigest&) const = default;
};
// Reads the whole file in chunks; errors name the file.
FileDigest digest_file(const std::string& path);

inline constexpr std::string_view kCheckpointIndexName = "index.json";

struct CheckpointIndex {
    struct File {
        std::string name;
        uint64_t num_bytes = 0;
        uint64_t xxh3 = 0;
        bool operator==(const File&) const = default;
    };
    std::vector<File> files;

    // Throws on an unsafe or duplicate name.
    void add(std::string name, const FileDigest& digest);
    // Digests dir/name and adds it.
    void add_file(const std::string& dir, const std::string& name);

    nlohmann::json to_json() const;
    // source names the index in errors (its path).
    static CheckpointIndex from_json(const nlohmann::json& json, const std::string& source);
    // Writes path with fsync (inside a staging directory, which StagedDir commits atomically).
    void write(const std::string& path) const;
    static CheckpointIndex read(const std::string& path);

    // Recomputes size and checksum of every listed file under dir; throws naming the first file
    // that is missing, has another size, or another checksum.
    void verify(const std::string& dir) const;
};

}  // namespace moetron
