// Who owns a checkpoint root, and what a run may do in one.
//
// A run has an identity, a run id of 16 random hex digits: a fresh trainer draws one, a resumed
// trainer continues the one of the checkpoint it resumed from (state.json's "run_id"). A
// checkpoint root belongs to the run that created it: ROOT/run-id holds that run's id, written
// when the root is claimed (before the run's first step). The rules, each enforced here:
//
//   - A run saves only into a root that is its own or holds no checkpoints (claim_save_root; a
//     root without checkpoints has nothing to protect, and the run takes it over). Saving into a
//     root that holds another run's checkpoints, or checkpoints of unknown origin, needs an
//     explicit override (train --share-save-root); the root then stays its owner's.
//   - A run never saves into a root that holds a checkpoint newer than the step it starts from:
//     `latest` would move back, and a later save would collide with the newer step.
//   - Retention (remove_old_checkpoints) deletes only checkpoints this run wrote (state.json's
//     run_id is this run's) and never one newer than the step just saved, nor the one `latest`
//     names. Checkpoints of other runs and of versions before run ids are never deleted.
//   - Staging entries carry the run id (atomic_dir.h), so a run removes its own crash leftovers
//     and never another run's staging or a user's file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moetron/checkpoint/output_paths.h"

namespace moetron {

inline constexpr std::string_view kRunIdFileName = "run-id";

// 16 random lower-case hex digits.
std::string new_run_id();
bool is_run_id(std::string_view text);

// The run id in root/run-id; nullopt when root has none (a new root, or one written before run
// ids). Throws when the file is not a run id.
std::optional<std::string> read_root_run_id(const std::filesystem::path& root);

// The run id in a checkpoint directory's state.json; nullopt when it has none or the file cannot
// be read as one (retention then leaves the directory alone).
std::optional<std::string> checkpoint_run_id(const std::filesystem::path& checkpoint_dir);

// What a save into a root must respect.
struct SaveRootRequest {
    std::string run_id;           // the saving run's
    int64_t start_step = 0;       // the step the run starts from (a resume's step, else 0)
    bool share = false;           // save beside another run's checkpoints (the override)
    std::string flag = "--save";  // how the user named the root, for the messages
    // How the user asks for share (train: --share-save-root; the user may also resume the
    // owner's run); "" for a command that has neither (import).
    std::string override_flag;
};

// Throws a UserError, before any work, when the run may not save into root: root is a file, it
// holds checkpoints of another run (or of unknown origin) and share is off, or it holds a
// checkpoint newer than start_step. Then claims root: creates it if needed, writes root/run-id
// when root holds no checkpoints, and removes this run's own crash leftovers. Failing to create
// root or write into it is reported here too, not at the first save.
void claim_save_root(const std::filesystem::path& root, const SaveRootRequest& request);

// Throws a UserError when writing the file output.path would damage a checkpoint: a file inside
// a checkpoint directory (its index would no longer match), or a root's `latest` or run-id.
void refuse_output_in_checkpoint(const PathOption& output);

// After run_id saved checkpoint saved_step into root: deletes run_id's checkpoints older than
// the newest keep of them (those at steps <= saved_step), never the one `latest` names, never
// another run's or an unknown one's, never one newer than saved_step. Returns the names deleted,
// oldest first.
std::vector<std::string> remove_old_checkpoints(const std::filesystem::path& root, size_t keep,
                                                std::string_view run_id, int64_t saved_step);

}  // namespace moetron
