// libFuzzer target for the configuration path: model presets (TOML), Hugging Face config.json,
// [train] tables and command-line numbers; built by tests/fuzz/run_fuzz.sh. The property it
// checks lives in config_check.h, which the corpus replay test shares.
#include <cstddef>
#include <cstdint>

#include "fuzz/config_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    moetron::fuzz::check_config_input(data, size);
    return 0;
}
