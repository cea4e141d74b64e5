#include "moetron/train/preset_path.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "moetron/core/error.h"
#include "moetron/core/user_error.h"

namespace moetron {

namespace {

namespace fs = std::filesystem;

fs::path kind_folder(PresetKind kind) {
    return fs::path("configs") / (kind == PresetKind::model ? "models" : "clusters");
}

std::string_view kind_flag(PresetKind kind) {
    return kind == PresetKind::model ? "--config" : "--cluster";
}

// The folders that may hold configs/, most specific first, without repeats.
std::vector<fs::path> search_roots() {
    std::vector<fs::path> roots;
    auto add = [&](const fs::path& root) {
        const fs::path normal = root.lexically_normal();
        if (std::find(roots.begin(), roots.end(), normal) == roots.end()) roots.push_back(normal);
    };
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);  // Linux: the running binary
    if (!ec) {
        fs::path dir = exe.parent_path();
        for (int up = 0; up <= 3 && !dir.empty(); ++up, dir = dir.parent_path()) {
            add(dir);
            if (dir == dir.root_path()) break;
        }
        add(exe.parent_path().parent_path() / "share" / "moetron");
    }
#ifdef MOETRON_CONFIGURED_SOURCE_DIR
    add(MOETRON_CONFIGURED_SOURCE_DIR);
#endif
    const fs::path cwd = fs::current_path(ec);
    if (!ec) add(cwd);
    return roots;
}

}  // namespace

std::vector<std::string> list_presets(PresetKind kind) {
    std::error_code ec;
    for (const fs::path& root : search_roots()) {
        std::vector<std::string> names;
        for (fs::directory_iterator it(root / kind_folder(kind), ec), end; !ec && it != end;
             it.increment(ec)) {
            if (it->path().extension() == ".toml") names.push_back(it->path().stem().string());
        }
        if (!names.empty()) {
            std::sort(names.begin(), names.end());
            return names;
        }
    }
    return {};
}

std::string find_preset(std::string_view name, PresetKind kind) {
    const fs::path relative = kind_folder(kind) / (std::string(name) + ".toml");
    std::vector<std::string> searched;
    std::error_code ec;
    for (const fs::path& root : search_roots()) {
        const fs::path candidate = root / relative;
        if (fs::is_regular_file(candidate, ec)) return candidate.string();
        searched.push_back((root / kind_folder(kind)).string());
    }
    const std::vector<std::string> known = list_presets(kind);
    if (!known.empty())
        MT_USER_THROW(
            "there is no {} preset '{}'; the presets are: {} (or pass a file with {} "
            "PATH)",
            kind == PresetKind::model ? "model" : "cluster", name, fmt::join(known, ", "),
            kind_flag(kind));
    MT_USER_THROW(
        "cannot find the {} preset '{}': no {} folder in any of\n  {}\npass a file with {} PATH",
        kind == PresetKind::model ? "model" : "cluster", name, kind_folder(kind).string(),
        fmt::join(searched, "\n  "), kind_flag(kind));
}

std::string resolve_preset_or_path(const std::string& path_or_name, PresetKind kind) {
    std::error_code ec;
    if (fs::exists(path_or_name, ec)) return path_or_name;
    const fs::path p(path_or_name);
    const bool bare_name = !path_or_name.empty() && !p.has_parent_path() && !p.has_extension();
    return bare_name ? find_preset(path_or_name, kind) : path_or_name;
}

}  // namespace moetron
