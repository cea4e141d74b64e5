#include "moetron/train/tokenizer.h"

#include "moetron/core/error.h"

namespace moetron {

std::vector<int32_t> byte_encode(std::string_view text) {
    std::vector<int32_t> tokens(text.size());
    for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
    return tokens;
}

std::string byte_decode(const int32_t* tokens, int64_t num_tokens) {
    std::string text(static_cast<size_t>(num_tokens), '\0');
    for (int64_t i = 0; i < num_tokens; ++i) {
        MT_CHECK(tokens[i] >= 0 && tokens[i] < kByteVocabSize,
                 "[tokenizer] token {} at position {} is not a byte (byte-level vocabulary is 256)",
                 tokens[i], i);
        text[static_cast<size_t>(i)] = static_cast<char>(tokens[i]);
    }
    return text;
}

}  // namespace moetron
