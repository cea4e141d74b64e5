#include "moetron/train/token_shard.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "moetron/checkpoint/atomic_file.h"
#include "moetron/core/error.h"
#include "moetron/core/user_error.h"

namespace moetron {

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian and read without byte swapping");

namespace {

struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

FilePtr open_token_file(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    MT_USER_CHECK(fs::exists(path, ec), "[data] token file '{}' does not exist", path);
    MT_USER_CHECK(!fs::is_directory(path, ec), "[data] token file '{}' is a directory, not a file",
                  path);
    FilePtr f(std::fopen(path.c_str(), "rb"));
    MT_CHECK(f != nullptr, "[data] cannot open token file '{}': {}", path, detail::errno_message());
    return f;
}

void read_exact(std::FILE* f, void* out, size_t bytes, const std::string& path, const char* what) {
    const size_t got = std::fread(out, 1, bytes, f);
    MT_CHECK(got == bytes, "[data] '{}': reading {} failed after {} of {} bytes{}", path, what, got,
             bytes, std::ferror(f) ? fmt::format(" ({})", detail::errno_message()) : "");
}

// Reads num_tokens tokens of type T into an int32 vector, checking the byte count first.
template <class T>
std::vector<int32_t> read_tokens(std::FILE* f, uint64_t num_tokens, uint64_t file_bytes,
                                 uint64_t header_bytes, const std::string& path,
                                 const std::string& format) {
    const uint64_t payload = file_bytes - header_bytes;
    // Compared by division first: a corrupt count near 2^62 would wrap num_tokens * sizeof(T)
    // around to a small number that matches the file.
    MT_CHECK(
        num_tokens <= payload / sizeof(T),
        "[data] '{}' is truncated: its {} header promises {} tokens ({} bytes each) but only {} "
        "bytes follow the header",
        path, format, num_tokens, sizeof(T), payload);
    const uint64_t expected = num_tokens * sizeof(T);
    MT_CHECK(payload >= expected,
             "[data] '{}' is truncated: its {} header promises {} tokens ({} bytes) but only {} "
             "bytes follow the header",
             path, format, num_tokens, expected, payload);
    MT_CHECK(payload == expected,
             "[data] '{}' has {} extra bytes after the {} tokens its {} header promises: the "
             "header's token count does not match the file size",
             path, payload - expected, num_tokens, format);
    std::vector<int32_t> tokens(num_tokens);
    if constexpr (sizeof(T) == sizeof(int32_t)) {
        read_exact(f, tokens.data(), expected, path, "tokens");
        // Ids >= 2^31 turn negative here, and check_token_ids reports them as out of range.
    } else {
        std::vector<T> raw(num_tokens);
        read_exact(f, raw.data(), expected, path, "tokens");
        for (uint64_t i = 0; i < num_tokens; ++i) tokens[i] = static_cast<int32_t>(raw[i]);
    }
    return tokens;
}

}  // namespace

void check_token_ids(const int32_t* tokens, int64_t num_tokens, int64_t vocab_size,
                     const std::string& source) {
    for (int64_t i = 0; i < num_tokens; ++i) {
        if (tokens[i] < 0 || tokens[i] >= vocab_size) [[unlikely]] {
            MT_THROW(
                "[data] '{}': token id {} at position {} is outside the model's vocabulary "
                "[0, {}) (was the data tokenized for another model?)",
                source, static_cast<uint32_t>(tokens[i]), i, vocab_size);
        }
    }
}

bool is_token_file(const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) return false;
    char magic[8] = {};
    const size_t got = std::fread(magic, 1, sizeof magic, f);
    std::fclose(f);
    int32_t first = 0;
    if (got >= 4) std::memcpy(&first, magic, 4);
    return (got == sizeof magic && std::memcmp(magic, kTokenShardMagic, sizeof magic) == 0) ||
           (got >= 4 && (first == kLlmcMagicGpt2 || first == kLlmcMagicLlama3));
}

TokenFile read_token_file(const std::string& path, int64_t vocab_size) {
    FilePtr f = open_token_file(path);
    std::error_code ec;
    const uint64_t file_bytes = std::filesystem::file_size(path, ec);
    MT_CHECK(!ec, "[data] cannot get the size of '{}': {}", path, ec.message());
    MT_USER_CHECK(
        file_bytes > 0,
        "[data] token file '{}' is empty (0 bytes); expected a moetron token shard (make one "
        "with `moetron prepare --text FILE --out FILE`) or an llm.c .bin shard",
        path);

    char magic[8] = {};
    const size_t magic_bytes = std::min<uint64_t>(sizeof magic, file_bytes);
    read_exact(f.get(), magic, magic_bytes, path, "the magic");

    TokenFile result;
    if (magic_bytes == sizeof magic && std::memcmp(magic, kTokenShardMagic, sizeof magic) == 0) {
        MT_CHECK(file_bytes >= kTokenShardHeaderBytes,
                 "[data] '{}' is truncated: {} bytes, shorter than the {}-byte moetron shard "
                 "header",
                 path, file_bytes, kTokenShardHeaderBytes);
        uint32_t version = 0, shard_vocab = 0;
        uint64_t num_tokens = 0, reserved = 0;
        read_exact(f.get(), &version, 4, path, "the version");
        read_exact(f.get(), &shard_vocab, 4, path, "the vocab size");
        read_exact(f.get(), &num_tokens, 8, path, "the token count");
        read_exact(f.get(), &reserved, 8, path, "the header");
        MT_USER_CHECK(version == kTokenShardVersion,
                      "[data] '{}' is a moetron shard of version {}; this build reads version {}",
                      path, version, kTokenShardVersion);
        result.format = "moetron shard v1";
        result.tokens = read_tokens<uint32_t>(f.get(), num_tokens, file_bytes,
                                              kTokenShardHeaderBytes, path, result.format);
    } else {
        int32_t first = 0;
        if (magic_bytes >= 4) std::memcpy(&first, magic, 4);
        MT_USER_CHECK(magic_bytes >= 4 && (first == kLlmcMagicGpt2 || first == kLlmcMagicLlama3),
                      "[data] '{}' is not a token file: it starts neither with moetron's magic "
                      "\"MTTOKENS\" nor with llm.c's magic {} or {} (a text file? tokenize it with "
                      "`moetron prepare --text FILE --out FILE`, or pass it with --text)",
                      path, kLlmcMagicGpt2, kLlmcMagicLlama3);
        const uint64_t header_bytes = kLlmcHeaderInts * sizeof(int32_t);
        MT_CHECK(file_bytes >= header_bytes,
                 "[data] '{}' is truncated: {} bytes, shorter than llm.c's {}-byte header", path,
                 file_bytes, header_bytes);
        std::vector<int32_t> header(kLlmcHeaderInts);
        std::memcpy(header.data(), magic, sizeof magic);
        read_exact(f.get(), header.data() + 2, header_bytes - sizeof magic, path, "the header");
        const int32_t version = header[1];
        MT_CHECK(header[2] >= 0, "[data] '{}': llm.c header holds a negative token count {}", path,
                 header[2]);
        const auto num_tokens = static_cast<uint64_t>(header[2]);
        if (first == kLlmcMagicGpt2) {
            MT_CHECK(version == 1,
                     "[data] '{}': llm.c GPT-2 shard (magic {}) of version {}; only version 1 "
                     "(uint16 tokens) exists",
                     path, first, version);
            result.format = "llm.c uint16 (GPT-2)";
            result.tokens = read_tokens<uint16_t>(f.get(), num_tokens, file_bytes, header_bytes,
                                                  path, result.format);
        } else {
            MT_CHECK(version == 7,
                     "[data] '{}': llm.c Llama 3 shard (magic {}) of version {}; only version 7 "
                     "(uint32 tokens) exists",
                     path, first, version);
            result.format = "llm.c uint32 (Llama 3)";
            result.tokens = read_tokens<uint32_t>(f.get(), num_tokens, file_bytes, header_bytes,
                                                  path, result.format);
        }
    }
    check_token_ids(result.tokens.data(), static_cast<int64_t>(result.tokens.size()), vocab_size,
                    path);
    return result;
}

namespace {

// The shard's bytes into a new file at path (write_token_shard stages and renames it).
void write_token_shard_file(const std::string& path, const int32_t* tokens, int64_t num_tokens,
                            int64_t vocab_size) {
    FilePtr f(std::fopen(path.c_str(), "wb"));
    MT_CHECK(f != nullptr, "[data] cannot create token shard '{}': {}", path,
             detail::errno_message());
    const uint32_t version = kTokenShardVersion;
    const auto vocab = static_cast<uint32_t>(vocab_size);
    const auto count = static_cast<uint64_t>(num_tokens);
    const uint64_t reserved = 0;
    auto write = [&](const void* data, size_t bytes) {
        MT_CHECK(std::fwrite(data, 1, bytes, f.get()) == bytes, "[data] writing '{}' failed: {}",
                 path, detail::errno_message());
    };
    write(kTokenShardMagic, sizeof kTokenShardMagic);
    write(&version, 4);
    write(&vocab, 4);
    write(&count, 8);
    write(&reserved, 8);
    write(tokens, static_cast<size_t>(num_tokens) * sizeof(int32_t));  // ids >= 0: same bits
    MT_CHECK(std::fflush(f.get()) == 0, "[data] writing '{}' failed: {}", path,
             detail::errno_message());
    MT_CHECK(std::fclose(f.release()) == 0, "[data] closing '{}' failed: {}", path,
             detail::errno_message());
}

}  // namespace

void write_token_shard(const std::string& path, const int32_t* tokens, int64_t num_tokens,
                       int64_t vocab_size) {
    MT_CHECK(vocab_size > 0 && vocab_size <= INT32_MAX,
             "[data] vocab_size {} does not fit a token shard", vocab_size);
    check_token_ids(tokens, num_tokens, vocab_size, path);
    write_file_atomically(path, [&](const std::string& staging) {
        write_token_shard_file(staging, tokens, num_tokens, vocab_size);
    });
}

}  // namespace moetron
