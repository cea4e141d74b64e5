#include "moetron/checkpoint/hf_tokenizer.h"

#include <nlohmann/json.hpp>
#include <string>

#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/core/error.h"

namespace moetron {

namespace {

using json = nlohmann::json;

// Every byte value is a token: the byte-level tokenizer's ids (train/tokenizer.h) are the bytes.
constexpr int kByteValues = 256;

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others (control
// characters, space, a few more) for the code points from 256 on, in byte order.
char32_t byte_level_char(int byte) {
    const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
                           (byte >= 0xAE && byte <= 0xFF);
    if (printable) return static_cast<char32_t>(byte);
    int rank = 0;  // how many non-printable bytes come before this one
    for (int b = 0; b < byte; ++b) {
        const bool p = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        if (!p) ++rank;
    }
    return static_cast<char32_t>(256 + rank);
}

std::string utf8(char32_t c) {  // code points below 0x800 are all this table holds
    std::string s;
    if (c < 0x80) {
        s.push_back(static_cast<char>(c));
    } else {
        s.push_back(static_cast<char>(0xC0 | (c >> 6)));
        s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
    return s;
}

json byte_level(bool use_regex) {
    return {{"type", "ByteLevel"},
            {"add_prefix_space", false},
            {"trim_offsets", false},
            {"use_regex", use_regex}};
}

// Each file replaces a previous export's atomically (atomic_dir.h).
void write_json(const std::filesystem::path& path, const json& j) {
    replace_file_durably(path, j.dump(2) + "\n", this_process_writer());
}

}  // namespace

json hf_byte_tokenizer_json() {
    json vocab = json::object();
    for (int b = 0; b < kByteValues; ++b) vocab[utf8(byte_level_char(b))] = b;
    return {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", json::array()},
            {"normalizer", nullptr},
            {"pre_tokenizer", byte_level(false)},  // no splitting: every byte is a token
            {"post_processor", nullptr},
            {"decoder", byte_level(false)},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"vocab", vocab},
              {"merges", json::array()}}}};
}

void write_hf_byte_tokenizer(const std::filesystem::path& out_dir, int64_t model_max_length) {
    write_json(out_dir / "tokenizer.json", hf_byte_tokenizer_json());
    write_json(out_dir / "tokenizer_config.json", {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                                   {"model_max_length", model_max_length},
                                                   {"clean_up_tokenization_spaces", false}});
}

}  // namespace moetron
