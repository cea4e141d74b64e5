// libFuzzer target for the token-file reader (moetron shards and llm.c .bin); built by
// tests/fuzz/run_fuzz.sh. The property it checks lives in token_shard_check.h, which the corpus
// replay test shares.
#include <cstddef>
#include <cstdint>

#include "fuzz/token_shard_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    moetron::fuzz::check_token_shard_bytes(data, size);
    return 0;
}
