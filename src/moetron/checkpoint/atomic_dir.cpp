#include "moetron/checkpoint/atomic_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>

#include "moetron/core/error.h"

namespace moetron {

namespace fs = std::filesystem;

// ---- POSIX file IO ----

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
        if (fd_ >= 0) ::close(fd_);
        fd_ = other.fd_;
        other.fd_ = -1;
    }
    return *this;
}

UniqueFd::~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
}

void UniqueFd::close(const std::string& path) {
    if (fd_ < 0) return;
    const int rc = ::close(fd_);
    fd_ = -1;
    // On Linux the descriptor is released even when close reports EINTR; retrying would be wrong.
    MT_CHECK(rc == 0 || errno == EINTR, "[io] closing '{}' failed: {}", path,
             detail::errno_message());
}

UniqueFd open_for_reading(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        MT_CHECK(errno != ENOENT, "[io] '{}' does not exist", path);
        MT_THROW("[io] cannot open '{}' for reading: {}", path, detail::errno_message());
    }
    UniqueFd owned(fd);
    struct stat st {};
    MT_CHECK(::fstat(fd, &st) == 0, "[io] cannot stat '{}': {}", path, detail::errno_message());
    MT_CHECK(S_ISREG(st.st_mode), "[io] '{}' is not a regular file{}", path,
             S_ISDIR(st.st_mode) ? " (it is a directory)" : "");
    return owned;
}

UniqueFd create_for_writing(const std::string& path) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    MT_CHECK(fd >= 0, "[io] cannot create '{}': {}", path, detail::errno_message());
    return UniqueFd(fd);
}

uint64_t file_size_bytes(int fd, const std::string& path) {
    struct stat st {};
    MT_CHECK(::fstat(fd, &st) == 0, "[io] cannot stat '{}': {}", path, detail::errno_message());
    return static_cast<uint64_t>(st.st_size);
}

void write_all(int fd, const void* data, size_t num_bytes, const std::string& path) {
    const auto* bytes = static_cast<const char*>(data);
    size_t done = 0;
    while (done < num_bytes) {
        const ssize_t n = ::write(fd, bytes + done, num_bytes - done);
        if (n < 0 && errno == EINTR) continue;
        MT_CHECK(n > 0, "[io] writing '{}' failed after {} of {} bytes: {}", path, done, num_bytes,
                 n < 0 ? detail::errno_message() : std::string("no progress"));
        done += static_cast<size_t>(n);
    }
}

size_t read_at(int fd, void* out, size_t num_bytes, uint64_t offset, const std::string& path) {
    auto* bytes = static_cast<char*>(out);
    size_t done = 0;
    while (done < num_bytes) {
        const ssize_t n =
            ::pread(fd, bytes + done, num_bytes - done, static_cast<off_t>(offset + done));
        if (n < 0 && errno == EINTR) continue;
        MT_CHECK(n >= 0, "[io] reading '{}' at byte {} failed: {}", path, offset + done,
                 detail::errno_message());
        if (n == 0) break;  // end of file
        done += static_cast<size_t>(n);
    }
    return done;
}

void fsync_fd(int fd, const std::string& path) {
    int rc;
    do {
        rc = ::fsync(fd);
    } while (rc != 0 && errno == EINTR);
    MT_CHECK(rc == 0, "[io] fsync of '{}' failed: {}", path, detail::errno_message());
}

void fsync_directory(const fs::path& dir) {
    const std::string name = dir.empty() ? std::string(".") : dir.string();
    const int fd = ::open(name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    MT_CHECK(fd >= 0, "[io] cannot open directory '{}' to fsync it: {}", name,
             detail::errno_message());
    UniqueFd owned(fd);
    fsync_fd(fd, name);
    owned.close(name);
}

void fsync_tree(const fs::path& root) {
    std::error_code ec;
    fs::recursive_directory_iterator it(root, ec), end;
    MT_CHECK(!ec, "[io] cannot list '{}': {}", root.string(), ec.message());
    for (; it != end; it.increment(ec)) {
        MT_CHECK(!ec, "[io] cannot list '{}': {}", root.string(), ec.message());
        const fs::file_status status = it->symlink_status(ec);
        MT_CHECK(!ec, "[io] cannot stat '{}': {}", it->path().string(), ec.message());
        if (fs::is_regular_file(status)) {
            const std::string path = it->path().string();
            UniqueFd fd = open_for_reading(path);
            fsync_fd(fd.get(), path);
            fd.close(path);
        } else if (fs::is_directory(status)) {
            fsync_directory(it->path());
        }
    }
    MT_CHECK(!ec, "[io] cannot list '{}': {}", root.string(), ec.message());
    fsync_directory(root);
}

// ---- atomic directories ----

namespace {

// "a/b/" and "a/./b" name the same directory as "a/b"; the staging name needs the last component.
fs::path without_trailing_separator(const fs::path& p) {
    fs::path clean = p.lexically_normal();
    if (!clean.has_filename() && clean.has_parent_path()) clean = clean.parent_path();
    return clean;
}

bool exists_no_follow(const fs::path& p) {
    std::error_code ec;
    return fs::exists(fs::symlink_status(p, ec));
}

constexpr std::string_view kStagingMarker = ".moetron-tmp-";
constexpr std::string_view kDeletingMarker = ".moetron-deleting-";

bool is_writer_token(std::string_view writer) {
    return !writer.empty() && std::all_of(writer.begin(), writer.end(), [](char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z');
    });
}

fs::path with_marker(const fs::path& final_path, std::string_view marker, std::string_view writer) {
    MT_CHECK(is_writer_token(writer), "[io] '{}' is not a writer name (lower-case letters, digits)",
             writer);
    const fs::path clean = without_trailing_separator(final_path);
    MT_CHECK(!clean.filename().empty(), "[io] '{}' names no file or directory",
             final_path.string());
    fs::path marked = clean;
    marked.replace_filename(clean.filename().string() + std::string(marker) + std::string(writer));
    return marked;
}

// NAME<marker><writer> with a non-empty NAME.
bool is_entry_of(std::string_view name, std::string_view marker, std::string_view writer) {
    const std::string suffix = std::string(marker) + std::string(writer);
    return name.size() > suffix.size() && name.ends_with(suffix);
}

}  // namespace

std::string this_process_writer() {
    return "pid" + std::to_string(::getpid());
}

fs::path staging_path_for(const fs::path& final_path, std::string_view writer) {
    return with_marker(final_path, kStagingMarker, writer);
}

fs::path deleting_path_for(const fs::path& final_path, std::string_view writer) {
    return with_marker(final_path, kDeletingMarker, writer);
}

// ---- atomic files ----

void write_file_atomically(const fs::path& path,
                           const std::function<void(const std::string& staging_path)>& write,
                           std::string_view writer) {
    const fs::path staging =
        staging_path_for(path, writer.empty() ? this_process_writer() : std::string(writer));
    const std::string name = staging.string();
    try {
        write(name);
        UniqueFd fd = open_for_reading(name);  // write need not have fsync'ed
        fsync_fd(fd.get(), name);
        fd.close(name);
        MT_CHECK(::rename(name.c_str(), path.c_str()) == 0, "[io] renaming '{}' to '{}' failed: {}",
                 name, path.string(), detail::errno_message());
    } catch (...) {
        std::error_code ignored;  // the first error is the one to report
        fs::remove(staging, ignored);
        throw;
    }
    fsync_directory(path.parent_path());
}

void replace_file_durably(const fs::path& path, std::string_view content, std::string_view writer) {
    write_file_atomically(
        path,
        [&](const std::string& staging) {
            UniqueFd fd = create_for_writing(staging);
            write_all(fd.get(), content.data(), content.size(), staging);
            fd.close(staging);
        },
        writer);
}

// ---- atomic directories ----

StagedDir::StagedDir(fs::path final_dir, std::string_view writer)
    : final_dir_(without_trailing_separator(final_dir)),
      staging_dir_(staging_path_for(final_dir_, writer)) {
    MT_CHECK(!final_dir_.filename().empty(), "[checkpoint] '{}' is not a directory name",
             final_dir.string());
    MT_CHECK(!exists_no_follow(final_dir_),
             "[checkpoint] '{}' already exists; a checkpoint directory is never overwritten",
             final_dir_.string());
    std::error_code ec;
    const fs::path parent = final_dir_.parent_path();
    if (!parent.empty() && !fs::exists(parent, ec)) {
        fs::create_directories(parent, ec);
        MT_CHECK(!ec, "[checkpoint] cannot create '{}': {}", parent.string(), ec.message());
        fsync_directory(parent.parent_path());
    }
    fs::remove_all(staging_dir_, ec);  // a leftover of an earlier process with our pid
    MT_CHECK(!ec, "[checkpoint] cannot remove the leftover '{}': {}", staging_dir_.string(),
             ec.message());
    fs::create_directory(staging_dir_, ec);
    MT_CHECK(!ec, "[checkpoint] cannot create '{}': {}", staging_dir_.string(), ec.message());
}

StagedDir::~StagedDir() {
    if (committed_) return;
    std::error_code ec;
    fs::remove_all(staging_dir_, ec);  // best effort: remove_stale_entries catches what is left
}

void StagedDir::commit() {
    MT_CHECK(!committed_, "[checkpoint] '{}' was already committed", final_dir_.string());
    fsync_tree(staging_dir_);
    MT_CHECK(!exists_no_follow(final_dir_),
             "[checkpoint] '{}' appeared while it was being written; not overwriting it",
             final_dir_.string());
    MT_CHECK(::rename(staging_dir_.c_str(), final_dir_.c_str()) == 0,
             "[checkpoint] renaming '{}' to '{}' failed: {}", staging_dir_.string(),
             final_dir_.string(), detail::errno_message());
    committed_ = true;
    fsync_directory(final_dir_.parent_path());
}

// ---- checkpoint roots ----

std::string checkpoint_dir_name(uint64_t step) {
    return fmt::format("step-{:08d}", step);
}

std::optional<uint64_t> parse_checkpoint_dir_name(std::string_view name) {
    constexpr std::string_view kPrefix = "step-";
    if (!name.starts_with(kPrefix)) return std::nullopt;
    const std::string_view digits = name.substr(kPrefix.size());
    if (digits.empty()) return std::nullopt;
    uint64_t step = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
    if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
    return step;
}

std::vector<CheckpointDir> list_checkpoint_dirs(const fs::path& root) {
    std::vector<CheckpointDir> dirs;
    std::error_code ec;
    if (!fs::exists(root, ec)) return dirs;
    for (fs::directory_iterator it(root, ec), end; it != end; it.increment(ec)) {
        MT_CHECK(!ec, "[checkpoint] cannot list '{}': {}", root.string(), ec.message());
        const std::string name = it->path().filename().string();
        const std::optional<uint64_t> step = parse_checkpoint_dir_name(name);
        if (step && it->is_directory(ec)) dirs.push_back({*step, name});
    }
    MT_CHECK(!ec, "[checkpoint] cannot list '{}': {}", root.string(), ec.message());
    std::sort(dirs.begin(), dirs.end(), [](const CheckpointDir& a, const CheckpointDir& b) {
        return a.step != b.step ? a.step < b.step : a.name < b.name;
    });
    return dirs;
}

void write_latest_pointer(const fs::path& root, std::string_view checkpoint_name,
                          std::string_view writer) {
    MT_CHECK(parse_checkpoint_dir_name(checkpoint_name).has_value(),
             "[checkpoint] '{}' is not a checkpoint directory name (step-<digits>)",
             checkpoint_name);
    const fs::path target = root / checkpoint_name;
    std::error_code ec;
    MT_CHECK(fs::is_directory(target, ec),
             "[checkpoint] cannot point '{}' at '{}': no such checkpoint directory",
             (root / kLatestPointerName).string(), target.string());
    replace_file_durably(root / kLatestPointerName, std::string(checkpoint_name) + "\n", writer);
}

std::optional<std::string> read_latest_pointer(const fs::path& root) {
    const fs::path pointer = root / kLatestPointerName;
    if (!exists_no_follow(pointer)) return std::nullopt;
    const std::string path = pointer.string();
    UniqueFd fd = open_for_reading(path);
    constexpr size_t kMaxPointerBytes = 256;
    const uint64_t size = file_size_bytes(fd.get(), path);
    MT_CHECK(size <= kMaxPointerBytes,
             "[checkpoint] '{}' is {} bytes; a latest pointer holds one directory name", path,
             size);
    std::string content(size, '\0');
    MT_CHECK(read_at(fd.get(), content.data(), size, 0, path) == size,
             "[checkpoint] '{}' shrank while it was read", path);
    if (content.ends_with('\n')) content.pop_back();
    MT_CHECK(parse_checkpoint_dir_name(content).has_value(),
             "[checkpoint] '{}' is corrupt: it should hold a name like step-00001000", path);
    std::error_code ec;
    MT_CHECK(fs::is_directory(root / content, ec),
             "[checkpoint] '{}' names checkpoint '{}', which does not exist in '{}'", path, content,
             root.string());
    return content;
}

std::vector<std::string> remove_stale_entries(const fs::path& root, std::string_view writer) {
    MT_CHECK(is_writer_token(writer), "[io] '{}' is not a writer name", writer);
    std::vector<std::string> removed;
    std::error_code ec;
    if (!fs::exists(root, ec)) return removed;
    std::vector<fs::path> stale;
    for (fs::directory_iterator it(root, ec), end; it != end; it.increment(ec)) {
        MT_CHECK(!ec, "[checkpoint] cannot list '{}': {}", root.string(), ec.message());
        const std::string name = it->path().filename().string();
        if (is_entry_of(name, kStagingMarker, writer) || is_entry_of(name, kDeletingMarker, writer))
            stale.push_back(it->path());
    }
    MT_CHECK(!ec, "[checkpoint] cannot list '{}': {}", root.string(), ec.message());
    std::sort(stale.begin(), stale.end());
    for (const fs::path& p : stale) {
        fs::remove_all(p, ec);
        MT_CHECK(!ec, "[checkpoint] cannot remove the leftover '{}': {}", p.string(), ec.message());
        removed.push_back(p.filename().string());
    }
    if (!removed.empty()) fsync_directory(root);
    return removed;
}

void delete_checkpoint_dir(const fs::path& root, const std::string& name, std::string_view writer) {
    const fs::path victim = root / name;
    const fs::path dying = deleting_path_for(victim, writer);
    MT_CHECK(::rename(victim.c_str(), dying.c_str()) == 0,
             "[checkpoint] renaming '{}' to '{}' for deletion failed: {}", victim.string(),
             dying.string(), detail::errno_message());
    fsync_directory(root);
    std::error_code ec;
    fs::remove_all(dying, ec);
    MT_CHECK(!ec, "[checkpoint] cannot delete '{}': {}", dying.string(), ec.message());
}

}  // namespace moetron
