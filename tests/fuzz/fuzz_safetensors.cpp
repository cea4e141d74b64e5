// libFuzzer target for the safetensors reader and writer; built by tests/fuzz/run_fuzz.sh.
// The property it checks lives in safetensors_check.h, which the corpus replay test shares.
#include <cstddef>
#include <cstdint>

#include "fuzz/safetensors_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    moetron::fuzz::check_both_forms(data, size);
    return 0;
}
