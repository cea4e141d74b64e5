#include "moetron/train/data_source.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "moetron/core/error.h"
#include "moetron/core/user_error.h"
#include "moetron/train/synthetic_data.h"
#include "moetron/train/token_shard.h"
#include "moetron/train/tokenizer.h"

namespace moetron {

namespace {

void check_byte_vocab(int64_t vocab_size, const char* what) {
    MT_USER_CHECK(vocab_size >= kByteVocabSize,
                  "[data] {} is byte-level (256 token ids) but the model's vocab_size is {}; use a "
                  "config with vocab_size >= 256 or pass pre-tokenized data with --data",
                  what, vocab_size);
}

}  // namespace

TokenData load_token_file_data(const std::string& path, int64_t vocab_size) {
    TokenFile file = read_token_file(path, vocab_size);
    TokenData data;
    data.description = fmt::format("{} ({}, {} tokens)", path, file.format, file.tokens.size());
    data.tokens = std::move(file.tokens);
    data.source = path;
    return data;
}

TokenData load_text_file_data(const std::string& path, int64_t vocab_size) {
    check_byte_vocab(vocab_size, "--text");
    std::error_code ec;
    MT_USER_CHECK(std::filesystem::is_regular_file(path, ec),
                  "[data] text file '{}' does not exist", path);
    std::ifstream in(path, std::ios::binary);
    MT_USER_CHECK(in.good(), "[data] cannot open text file '{}': {}", path,
                  detail::errno_message());
    std::ostringstream buffer;
    buffer << in.rdbuf();
    MT_USER_CHECK(!in.bad(), "[data] error reading text file '{}'", path);
    const std::string text = buffer.str();
    MT_USER_CHECK(!text.empty(), "[data] text file '{}' is empty", path);
    TokenData data;
    data.tokens = byte_encode(text);
    data.source = path;
    data.description = fmt::format("{} (text, byte-level, {} tokens)", path, data.tokens.size());
    return data;
}

TokenData make_synthetic_data(int64_t vocab_size, uint64_t seed, int64_t num_bytes) {
    check_byte_vocab(vocab_size, "the synthetic dataset");
    SyntheticText text = generate_synthetic_text(num_bytes, seed);
    TokenData data;
    data.tokens = byte_encode(text.text);
    data.source = "synthetic";
    data.entropy_nats_per_token = text.entropy_nats_per_byte;
    data.description = fmt::format(
        "built-in synthetic text ({} bytes from a word grammar; its entropy, the best reachable "
        "loss, is {:.3f} nats/byte)",
        num_bytes, text.entropy_nats_per_byte);
    return data;
}

}  // namespace moetron
