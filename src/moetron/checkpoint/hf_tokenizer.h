// A Hugging Face tokenizer for moetron's byte-level models, whose token ids are the raw bytes
// of the text (train/tokenizer.h): tokenizer.json (the `tokenizers` library's format) and
// tokenizer_config.json, so that transformers' AutoTokenizer encodes text to exactly those ids
// and decodes generated ids back to text.
//
// tokenizer.json is a BPE model without merges over 256 tokens, one per byte, behind the
// ByteLevel pre-tokenizer and decoder (GPT-2's byte-to-character table, which turns every byte
// into one printable character): token id b is byte b. The models have no special tokens (no
// BOS, EOS or padding were trained), so none are declared.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>

namespace moetron {

// tokenizer.json's content.
nlohmann::json hf_byte_tokenizer_json();

// Writes out_dir/tokenizer.json and out_dir/tokenizer_config.json.
void write_hf_byte_tokenizer(const std::filesystem::path& out_dir, int64_t model_max_length);

}  // namespace moetron
