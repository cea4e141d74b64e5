// The property the token-shard fuzzer checks, shared by the libFuzzer target
// (fuzz_token_shard.cpp) and the corpus replay in test_fuzz_corpora.cpp.
//
// Any byte string read as a token file (moetron shard or llm.c .bin) is either rejected with
// moetron::Error, or it reads, and then every token id lies in [0, vocab) and the file is exactly
// its header and the tokens its format promises (32 + 4 n bytes for a moetron shard, 1024 + 2 n
// or 4 n for llm.c's). Anything else (another exception type such as std::bad_alloc from a
// wrapped size, a crash, a sanitizer report) is a bug.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz/memory_file.h"
#include "moetron/core/error.h"
#include "moetron/train/token_shard.h"

namespace moetron::fuzz {

inline constexpr int64_t kTokenShardFuzzVocab = 50304;  // GPT-2's, padded as llm.c pads it

inline void require_token_shard(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "token-shard property violated: %s\n", what);
        std::abort();
    }
}

// True when the input read as a token file (and the properties above hold), false when it was
// rejected with moetron::Error.
inline bool check_token_shard_bytes(const uint8_t* data, size_t size) {
    MemoryFile input;
    write_all(input.fd(), data, size, input.path());
    TokenFile file;
    try {
        file = read_token_file(input.path(), kTokenShardFuzzVocab);
    } catch (const Error&) {
        return false;
    }
    for (int32_t t : file.tokens)
        require_token_shard(t >= 0 && t < kTokenShardFuzzVocab, "a token id outside the vocab");
    const uint64_t n = file.tokens.size();
    const uint64_t expected_bytes = file.format == "moetron shard v1"       ? 32 + 4 * n
                                    : file.format == "llm.c uint16 (GPT-2)" ? 1024 + 2 * n
                                                                            : 1024 + 4 * n;
    require_token_shard(expected_bytes == size, "the token count does not match the file size");
    return true;
}

}  // namespace moetron::fuzz
