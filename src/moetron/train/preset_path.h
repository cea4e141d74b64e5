// Finds a bundled model preset (configs/models/NAME.toml) without being told where the source
// tree is, so `moetron train` works from any directory: the presets are looked up beside the
// running executable and up to three folders above it (build/moetron, build/bench/..., an
// installed bin/), then under the current directory.
#pragma once

#include <string>
#include <string_view>

namespace moetron {

// The path of configs/models/<name>.toml; throws listing the folders searched and telling the
// user to pass --config when none holds it.
std::string find_preset(std::string_view name);

}  // namespace moetron
