// Durable, crash-safe file-system operations for checkpoints.
//
// A checkpoint directory appears all at once or not at all: it is written as
// DIR.moetron-tmp-<writer>, every file and directory in it is fsync'ed, it is renamed to DIR, and
// the parent is fsync'ed. The `latest` pointer file names the newest committed checkpoint and is
// replaced last (write a temporary, fsync, rename, fsync the parent), so after a crash at any
// moment `latest` names a complete checkpoint. Any other output file is written the same way
// (write_file_atomically): it holds its old content or its new one, never a part.
//
// <writer> names who writes: in a checkpoint root the run's id (checkpoint_root.h), anywhere
// else this process (this_process_writer). Leftovers of a crash (NAME.moetron-tmp-<writer>,
// NAME.moetron-deleting-<writer>) are invisible to readers; remove_stale_entries() removes those
// of one writer only, so neither a user's file that merely looks similar (report.tmp-2024) nor
// another run's staging is ever touched.
//
// Checkpoint directories are named step-<digits> (checkpoint_dir_name).
//
// The UniqueFd helpers at the top are the POSIX IO that the checkpoint files share: every call
// is checked, and errors name the file ("[io] ...").
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moetron/checkpoint/atomic_file.h"

namespace moetron {

// ---- POSIX file IO ----

// Owns a file descriptor. The destructor closes without checking; call close() where the result
// matters (after writing).
class UniqueFd {
  public:
    UniqueFd() = default;
    explicit UniqueFd(int fd) : fd_(fd) {}
    UniqueFd(UniqueFd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
    UniqueFd& operator=(UniqueFd&& other) noexcept;
    UniqueFd(const UniqueFd&) = delete;
    UniqueFd& operator=(const UniqueFd&) = delete;
    ~UniqueFd();

    int get() const { return fd_; }
    bool valid() const { return fd_ >= 0; }
    // Closes and checks the result (a delayed write error can surface here).
    void close(const std::string& path);

  private:
    int fd_ = -1;
};

// Opens a regular file for reading; the error says whether it is missing or not a file.
UniqueFd open_for_reading(const std::string& path);
// Creates (or truncates) a file for writing, mode 0644.
UniqueFd create_for_writing(const std::string& path);
// Size in bytes of an open file.
uint64_t file_size_bytes(int fd, const std::string& path);
// Writes all bytes, retrying short writes and EINTR.
void write_all(int fd, const void* data, size_t num_bytes, const std::string& path);
// Reads up to num_bytes at offset; returns fewer only at the end of the file.
size_t read_at(int fd, void* out, size_t num_bytes, uint64_t offset, const std::string& path);
void fsync_fd(int fd, const std::string& path);
void fsync_directory(const std::filesystem::path& dir);
// fsyncs every regular file and directory under root, root included.
void fsync_tree(const std::filesystem::path& root);

// ---- staging names ----

// This process as a writer ("pid<digits>"), for files outside checkpoint roots.
std::string this_process_writer();
// The staging name of a directory or file: NAME.moetron-tmp-<writer>, in the same directory.
// writer: lower-case letters and digits.
std::filesystem::path staging_path_for(const std::filesystem::path& final_path,
                                       std::string_view writer);
// The name a directory takes while it is deleted: NAME.moetron-deleting-<writer>.
std::filesystem::path deleting_path_for(const std::filesystem::path& final_path,
                                        std::string_view writer);

// ---- atomic files ----

// write_file_atomically (atomic_file.h) of content as the whole file.
void replace_file_durably(const std::filesystem::path& path, std::string_view content,
                          std::string_view writer);

// ---- atomic directories ----

// A directory under construction. The constructor creates final_dir's staging name (removing a
// leftover of the same name: the same writer's); commit() makes it final_dir. Destroyed
// uncommitted (an exception while writing), it removes the staging directory.
class StagedDir {
  public:
    StagedDir(std::filesystem::path final_dir, std::string_view writer);
    StagedDir(const StagedDir&) = delete;
    StagedDir& operator=(const StagedDir&) = delete;
    ~StagedDir();

    // Where to write the files.
    const std::filesystem::path& path() const { return staging_dir_; }
    const std::filesystem::path& final_path() const { return final_dir_; }
    // fsyncs everything under the staging directory, renames it to final_dir, fsyncs the parent.
    // Fails if final_dir exists (a checkpoint is never overwritten in place).
    void commit();
    bool committed() const { return committed_; }

  private:
    std::filesystem::path final_dir_;
    std::filesystem::path staging_dir_;
    bool committed_ = false;
};

// ---- checkpoint roots: naming, the latest pointer, retention ----

inline constexpr std::string_view kLatestPointerName = "latest";

// "step-00001200": zero-padded so that names sort like steps up to 10^8.
std::string checkpoint_dir_name(uint64_t step);
// The step of a checkpoint directory name, or nullopt for any other name (staging directories
// included).
std::optional<uint64_t> parse_checkpoint_dir_name(std::string_view name);

struct CheckpointDir {
    uint64_t step = 0;
    std::string name;
};
// Committed checkpoint directories under root, oldest step first. Empty if root does not exist.
std::vector<CheckpointDir> list_checkpoint_dirs(const std::filesystem::path& root);

// Points root/latest at root/<checkpoint_name> (which must exist), durably and atomically.
void write_latest_pointer(const std::filesystem::path& root, std::string_view checkpoint_name,
                          std::string_view writer);
// The checkpoint root/latest names; nullopt when there is no pointer yet. Throws when the pointer
// is malformed or names a directory that does not exist.
std::optional<std::string> read_latest_pointer(const std::filesystem::path& root);

// Removes what a crash of writer left behind under root: its staging directories and files
// (NAME.moetron-tmp-<writer>) and half-deleted checkpoints (NAME.moetron-deleting-<writer>).
// Nothing else: no other writer's entries, no name that only resembles these. Returns the names
// removed. For the writer, before it writes into root.
std::vector<std::string> remove_stale_entries(const std::filesystem::path& root,
                                              std::string_view writer);

// Deletes root/name: renames it to its deleting name first (atomic), so a crash mid-delete never
// leaves a partial directory under a checkpoint name, then removes it.
void delete_checkpoint_dir(const std::filesystem::path& root, const std::string& name,
                           std::string_view writer);

}  // namespace moetron
