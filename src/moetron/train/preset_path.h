// Finds the bundled configs (configs/models/NAME.toml, configs/clusters/NAME.toml) without being
// told where they are, so `moetron train --config tiny` works from any directory and from any
// build or install location. Searched in order:
//   - beside the running executable and up to three folders above it (a build directory inside
//     the checkout: build/moetron, build/tests/..., build/bench/...);
//   - <executable>/../share/moetron (an installed tree: PREFIX/bin/moetron and
//     PREFIX/share/moetron/configs, as `cmake --install` lays it out);
//   - the source tree the binary was built from, recorded at configure time (a build directory
//     elsewhere, e.g. `cmake -S . -B /elsewhere`), when it still exists;
//   - the current directory.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace moetron {

enum class PresetKind { model, cluster };

// The path of the bundled preset `name` of that kind; a user error listing the presets there
// are (and the folders searched) when none is called so.
std::string find_preset(std::string_view name, PresetKind kind = PresetKind::model);

// What a --config or --cluster argument names: an existing file or directory is taken as it is;
// a bare name without a folder or an extension (`tiny`, `gb300-nvl72`) is a bundled preset;
// anything else is returned unchanged so that opening it reports the missing file.
std::string resolve_preset_or_path(const std::string& path_or_name, PresetKind kind);

// The names of the bundled presets of that kind (sorted), from the first folder that has any.
std::vector<std::string> list_presets(PresetKind kind);

}  // namespace moetron
