// Token files on disk: moetron's own shard format (written by `moetron prepare`) and llm.c's
// .bin shards (read only), told apart by their first bytes.
//
// moetron token shard, version 1 (all integers little-endian):
//   offset  0  char[8]   magic "MTTOKENS"
//   offset  8  uint32    version = 1
//   offset 12  uint32    vocab_size of the tokenizer that wrote it (256: byte-level)
//   offset 16  uint64    num_tokens
//   offset 24  uint64    reserved, 0
//   offset 32  uint32    tokens[num_tokens]
// The file is exactly 32 + 4 * num_tokens bytes.
//
// llm.c shard (karpathy/llm.c, dev/data/data_common.py):
//   256 x int32 header: [0] magic, [1] version, [2] num_tokens, the rest 0; then the tokens:
//   magic 20240520, version 1: uint16 tokens (GPT-2 tokenizer)
//   magic 20240801, version 7: uint32 tokens (Llama 3 tokenizer)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moetron {

inline constexpr char kTokenShardMagic[8] = {'M', 'T', 'T', 'O', 'K', 'E', 'N', 'S'};
inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr size_t kTokenShardHeaderBytes = 32;
inline constexpr int32_t kLlmcMagicGpt2 = 20240520;
inline constexpr int32_t kLlmcMagicLlama3 = 20240801;
inline constexpr size_t kLlmcHeaderInts = 256;

struct TokenFile {
    std::vector<int32_t> tokens;
    std::string format;  // "moetron shard v1", "llm.c uint16 (GPT-2)", "llm.c uint32 (Llama 3)"
};

// Reads either format. Every token id is checked against vocab_size; any problem (missing,
// empty, unknown magic, unsupported version, truncated or oversized, token id >= vocab_size)
// throws moetron::Error naming the file and the problem.
TokenFile read_token_file(const std::string& path, int64_t vocab_size);

// Writes a moetron shard; token ids must lie in [0, vocab_size). Throws on any IO failure.
// Written atomically (atomic_file.h): path holds the old file or the whole new one.
void write_token_shard(const std::string& path, const int32_t* tokens, int64_t num_tokens,
                       int64_t vocab_size);

// Throws naming `source` and the first token id outside [0, vocab_size).
void check_token_ids(const int32_t* tokens, int64_t num_tokens, int64_t vocab_size,
                     const std::string& source);

}  // namespace moetron
