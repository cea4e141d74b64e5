#include "moetron/checkpoint/checkpoint_root.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>

#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/checkpoint/checkpoint_dir.h"
#include "moetron/checkpoint/checksum.h"
#include "moetron/core/error.h"
#include "moetron/core/user_error.h"

namespace moetron {

namespace fs = std::filesystem;

namespace {

constexpr size_t kRunIdDigits = 16;

// The whole of a small file, or nullopt when it cannot be read or is larger than max_bytes.
std::optional<std::string> read_small_file(const fs::path& path, uint64_t max_bytes) {
    try {
        UniqueFd fd = open_for_reading(path.string());
        const uint64_t size = file_size_bytes(fd.get(), path.string());
        if (size > max_bytes) return std::nullopt;
        std::string text(size, '\0');
        if (read_at(fd.get(), text.data(), size, 0, path.string()) != size) return std::nullopt;
        return text;
    } catch (const Error&) {
        return std::nullopt;
    }
}

}  // namespace

std::string new_run_id() {
    std::random_device device;  // a fresh identity per run: never derived from the seed
    const uint64_t high = device(), low = device();
    return fmt::format("{:016x}", (high << 32) ^ low);
}

bool is_run_id(std::string_view text) {
    return text.size() == kRunIdDigits && std::all_of(text.begin(), text.end(), [](char c) {
               return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
           });
}

std::optional<std::string> read_root_run_id(const fs::path& root) {
    const fs::path path = root / kRunIdFileName;
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(path, ec))) return std::nullopt;
    std::optional<std::string> text = read_small_file(path, 64);
    if (text && text->ends_with('\n')) text->pop_back();
    MT_USER_CHECK(text && is_run_id(*text),
                  "'{}' is damaged: it should hold the 16-hex-digit id of the run that owns the "
                  "checkpoint root",
                  path.string());
    return text;
}

std::optional<std::string> checkpoint_run_id(const fs::path& checkpoint_dir) {
    const std::optional<std::string> text =
        read_small_file(checkpoint_dir / kCheckpointStateFile, kMaxCheckpointStateBytes);
    if (!text) return std::nullopt;
    const nlohmann::json state = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!state.is_object() || !state.contains("run_id") || !state["run_id"].is_string())
        return std::nullopt;
    const std::string id = state["run_id"].get<std::string>();
    if (!is_run_id(id)) return std::nullopt;
    return id;
}

void claim_save_root(const fs::path& root, const SaveRootRequest& request) {
    MT_CHECK(is_run_id(request.run_id), "[checkpoint] '{}' is not a run id", request.run_id);
    const std::string where = fmt::format("{} '{}'", request.flag, root.string());
    std::error_code ec;
    const fs::file_status status = fs::status(root, ec);
    MT_USER_CHECK(!fs::exists(status) || fs::is_directory(status),
                  "{} is a file; a checkpoint root is a directory", where);
    const std::optional<std::string> owner = read_root_run_id(root);
    const std::vector<CheckpointDir> dirs = list_checkpoint_dirs(root);
    // A root without checkpoints has nothing to protect: any run may take it over (one whose
    // run failed before its first save, say).
    const bool ours = owner.has_value() && *owner == request.run_id;
    if (!ours && !dirs.empty() && !request.share) {
        const std::string whose =
            owner ? fmt::format("belongs to another run (run id {}; this run is {})", *owner,
                                request.run_id)
                  : fmt::format("already holds checkpoints of another run ({}, of unknown run)",
                                dirs.back().name);
        // What the user can do instead: a new root always; with train also continuing that run,
        // or the override.
        std::string advice = "write into a new directory";
        if (!request.override_flag.empty())
            advice = fmt::format(
                "continue that run with --resume {}, save into a new directory, or pass {} to "
                "save beside its checkpoints (this run never deletes them)",
                root.string(), request.override_flag);
        MT_USER_THROW("{} {}: the checkpoints of two runs must not mix. Instead, {}", where, whose,
                      advice);
    }
    // The newest by name, not `latest`: a crash between a commit and the pointer's update
    // leaves a complete checkpoint newer than `latest`.
    MT_USER_CHECK(dirs.empty() || dirs.back().step <= static_cast<uint64_t>(request.start_step),
                  "{} holds {}, newer than step {} where this run starts: saving there would move "
                  "`latest` back to an older history, and this run's save at that step would "
                  "fail after the compute. Resume from the newest checkpoint (--resume {}) or "
                  "save into a new directory",
                  where, dirs.back().name, request.start_step, (root / dirs.back().name).string());

    prepare_output_dir({request.flag, root});
    if (!ours && dirs.empty())
        replace_file_durably(root / kRunIdFileName, request.run_id + "\n", request.run_id);
    remove_stale_entries(root, request.run_id);
}

void refuse_output_in_checkpoint(const PathOption& output) {
    const fs::path parent = output.path.parent_path();
    const fs::path dir = parent.empty() ? fs::path(".") : parent;
    std::error_code ec;
    MT_USER_CHECK(!fs::exists(dir / kCheckpointIndexName, ec),
                  "{} '{}' lies in the checkpoint directory '{}': writing it would break that "
                  "checkpoint; choose a path outside it",
                  output.flag, output.path.string(), dir.string());
    const std::string name = output.path.filename().string();
    MT_USER_CHECK(
        (name != kLatestPointerName && name != kRunIdFileName) || list_checkpoint_dirs(dir).empty(),
        "{} '{}' would replace the `{}` file of the checkpoint root '{}'; choose another name",
        output.flag, output.path.string(), name, dir.string());
}

std::vector<std::string> remove_old_checkpoints(const fs::path& root, size_t keep,
                                                std::string_view run_id, int64_t saved_step) {
    MT_CHECK(keep >= 1, "[checkpoint] keeping {} checkpoints would delete the latest one", keep);
    MT_CHECK(is_run_id(run_id), "[checkpoint] '{}' is not a run id", run_id);
    // Reading the pointer first: a broken pointer stops retention before anything is deleted.
    const std::optional<std::string> latest = read_latest_pointer(root);
    std::vector<CheckpointDir> ours;  // oldest first
    for (const CheckpointDir& dir : list_checkpoint_dirs(root))
        if (dir.step <= static_cast<uint64_t>(saved_step) &&
            checkpoint_run_id(root / dir.name) == run_id)
            ours.push_back(dir);
    std::vector<std::string> deleted;
    size_t remaining = ours.size();
    for (const CheckpointDir& dir : ours) {
        if (remaining <= keep) break;
        if (latest && dir.name == *latest) continue;
        delete_checkpoint_dir(root, dir.name, run_id);
        deleted.push_back(dir.name);
        --remaining;
    }
    return deleted;
}

}  // namespace moetron
