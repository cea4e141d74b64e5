// Output paths, checked before any work: a command that could not write its result fails before
// it computes it, and an output never replaces one of the command's inputs.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace moetron {

// An option's value as the user gave it, for the messages: {"--out", "a.bin"}.
struct PathOption {
    std::string flag;
    std::filesystem::path path;
};

// Throws a UserError unless a file can be written at output.path: its directory exists and takes
// a new file (checked by creating and removing one), and output.path is not a directory.
void check_output_file(const PathOption& output);

// Creates output.path (and its parents) if needed; throws a UserError unless it is then a
// directory that takes a new file.
void prepare_output_dir(const PathOption& output);

// True when a and b name the same file: the same inode when both exist (so `./a.txt`, `a.txt`,
// a symlink and a hard link to it all match), else the same path once made absolute and
// normalized with symlinks resolved.
bool same_file(const std::filesystem::path& a, const std::filesystem::path& b);

// Throws a UserError when output names the same file as one of others: the command's inputs
// (writing would destroy one) or its other outputs (they would overwrite each other). Empty
// paths are ignored.
void refuse_same_file(const PathOption& output, const std::vector<PathOption>& others);

}  // namespace moetron
