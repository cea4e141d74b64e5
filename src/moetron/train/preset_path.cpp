#include "moetron/train/preset_path.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "moetron/core/error.h"

namespace moetron {

std::string find_preset(std::string_view name) {
    namespace fs = std::filesystem;
    const fs::path relative = fs::path("configs") / "models" / (std::string(name) + ".toml");
    std::vector<fs::path> roots;
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);  // Linux: the running binary
    if (!ec) {
        fs::path dir = exe.parent_path();
        for (int up = 0; up <= 3 && !dir.empty(); ++up, dir = dir.parent_path()) {
            roots.push_back(dir);
            if (dir == dir.root_path()) break;
        }
    }
    roots.push_back(fs::current_path(ec));
    std::vector<std::string> searched;
    for (const fs::path& root : roots) {
        const std::string candidate = (root / relative).lexically_normal().string();
        if (fs::is_regular_file(candidate, ec)) return candidate;
        if (std::find(searched.begin(), searched.end(), candidate) == searched.end())
            searched.push_back(candidate);
    }
    MT_THROW(
        "[config] cannot find the '{}' preset; looked for:\n  {}\npass a model config with "
        "--config PATH",
        name, fmt::join(searched, "\n  "));
}

}  // namespace moetron
