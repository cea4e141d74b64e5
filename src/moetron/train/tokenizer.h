// Byte-level tokenizer: token = byte value, vocabulary 256. Lossless for any input (UTF-8 or
// not), needs no vocabulary file, and is what the tiny presets train on.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moetron {

inline constexpr int64_t kByteVocabSize = 256;

std::vector<int32_t> byte_encode(std::string_view text);
// Token ids must lie in [0, 256); throws naming the first one that does not.
std::string byte_decode(const int32_t* tokens, int64_t num_tokens);

}  // namespace moetron
