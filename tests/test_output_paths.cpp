// checkpoint/output_paths: an output path is checked before any work (its directory exists and
// takes files, it is not a directory), and an output naming an input, however spelled, is refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "expect_contains.h"
#include "moetron/checkpoint/output_paths.h"
#include "moetron/core/user_error.h"
#include "temp_dir.h"

namespace moetron {
namespace {

using moetron::testing::error_of;
using moetron::testing::TempDir;

namespace fs = std::filesystem;

void write_text(const fs::path& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    ASSERT_TRUE(out.good()) << path;
}

// Makes dir the working directory for the scope (tests of relative spellings).
class InDirectory {
  public:
    explicit InDirectory(const fs::path& dir) : previous_(fs::current_path()) {
        fs::current_path(dir);
    }
    ~InDirectory() { fs::current_path(previous_); }

  private:
    fs::path previous_;
};

TEST(OutputPaths, SameFileHowEverSpelled) {
    TempDir dir;
    write_text(dir.path() / "a.txt", "text");
    fs::create_symlink(dir.path() / "a.txt", dir.path() / "link.txt");
    fs::create_hard_link(dir.path() / "a.txt", dir.path() / "hard.txt");
    fs::create_directory(dir.path() / "sub");
    const InDirectory in(dir.path());
    EXPECT_TRUE(same_file("a.txt", "./a.txt"));
    EXPECT_TRUE(same_file("a.txt", dir.path() / "a.txt"));
    EXPECT_TRUE(same_file("sub/../a.txt", "a.txt"));
    EXPECT_TRUE(same_file("link.txt", "a.txt"));
    EXPECT_TRUE(same_file("hard.txt", "a.txt"));
    EXPECT_TRUE(same_file("new.bin", "./sub/../new.bin")) << "neither exists yet";
    EXPECT_FALSE(same_file("a.txt", "b.txt"));
    EXPECT_FALSE(same_file("a.txt", ""));
}

TEST(OutputPaths, RefusedOutputNamesBothOptions) {
    TempDir dir;
    write_text(dir.path() / "a.txt", "text");
    const InDirectory in(dir.path());
    const std::string e = error_of([] {
        refuse_same_file({"--out", "./a.txt"}, {{"--text", "a.txt"}});
    });
    EXPECT_CONTAINS(e, "--out './a.txt' is the same file as --text 'a.txt'");
    EXPECT_EQ(e.find(".cpp"), std::string::npos) << "a user's mistake, not a bug: " << e;
    EXPECT_NO_THROW(refuse_same_file({"--out", "a.bin"}, {{"--text", "a.txt"}, {"--data", ""}}));
}

TEST(OutputPaths, OutputFileChecks) {
    TempDir dir;
    write_text(dir.path() / "file", "x");
    EXPECT_NO_THROW(check_output_file({"--out", dir.path() / "new.bin"}));
    EXPECT_NO_THROW(check_output_file({"--out", dir.path() / "file"}));  // replaced later
    EXPECT_CONTAINS(error_of([&] { check_output_file({"--out", dir.path()}); }), "is a directory");
    EXPECT_CONTAINS(error_of([&] {
                        check_output_file({"--out", dir.path() / "no" / "x.bin"});
                    }),
                    "does not exist");
    EXPECT_CONTAINS(error_of([&] {
                        check_output_file({"--out", dir.path() / "file" / "x"});
                    }),
                    "is not a directory");
    EXPECT_CONTAINS(error_of([] {
                        check_output_file({"--out", "/proc/moetron-x.bin"});
                    }),
                    "cannot create files in '/proc'");
    // The check leaves nothing behind.
    EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

TEST(OutputPaths, OutputDirectoryIsCreatedOrRefused) {
    TempDir dir;
    write_text(dir.path() / "file", "x");
    prepare_output_dir({"--out", dir.path() / "a" / "b"});
    EXPECT_TRUE(fs::is_directory(dir.path() / "a" / "b"));
    EXPECT_CONTAINS(error_of([&] {
                        prepare_output_dir({"--out", dir.path() / "file"});
                    }),
                    "is a file, not a directory");
    EXPECT_CONTAINS(error_of([] {
                        prepare_output_dir({"--out", "/proc"});
                    }),
                    "cannot create files in '/proc'");
}

}  // namespace
}  // namespace moetron
