// libFuzzer target for the sharded-checkpoint reader (CheckpointTensors); built by
// tests/fuzz/run_fuzz.sh. The property it checks lives in checkpoint_slices_check.h, which the
// corpus replay test shares.
#include <cstddef>
#include <cstdint>

#include "fuzz/checkpoint_slices_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    moetron::fuzz::check_checkpoint_input(data, size);
    return 0;
}
