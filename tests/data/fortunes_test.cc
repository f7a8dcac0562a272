#include "shardtrain/data/fortunes.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "data_test_util.h"
#include "shardtrain/data/source_factory.h"

namespace st {
namespace {

using testing::bad_input_message;
using testing::contains;
using testing::read_all;
using testing::TempDir;
using testing::write_bytes;

// Sets SHARDTRAIN_FORTUNES_DIR for one test and restores the previous value.
class FortunesDirGuard {
 public:
  explicit FortunesDirGuard(const std::string& dir) {
    if (const char* old = std::getenv(kVar)) old_ = old;
    ::setenv(kVar, dir.c_str(), 1);
  }
  ~FortunesDirGuard() {
    if (old_) {
      ::setenv(kVar, old_->c_str(), 1);
    } else {
      ::unsetenv(kVar);
    }
  }

 private:
  static constexpr const char* kVar = "SHARDTRAIN_FORTUNES_DIR";
  std::optional<std::string> old_;
};

// A directory laid out like Debian's: text files, their .dat indexes and .u8 symlinks, plus traps.
void make_corpus(const TempDir& dir) {
  namespace fs = std::filesystem;
  write_bytes(dir.file("zeta"), "ZZ\n%\n");
  write_bytes(dir.file("alpha"), "AAA\n%\n");
  write_bytes(dir.file("Mid"), "M\n");
  write_bytes(dir.file("alpha.dat"), std::string("\x00\x00\x00\x02", 4));
  write_bytes(dir.file("zeta.dat"), "index");
  fs::create_symlink("alpha", dir.file("alpha.u8"));
  fs::create_symlink("zeta", dir.file("zeta.u8"));
  fs::create_symlink("zeta.dat", dir.file("sneaky"));   // a symlink to an index: excluded
  fs::create_symlink("missing", dir.file("dangling"));  // points nowhere: excluded
  fs::create_symlink("alpha", dir.file("alpha2"));      // a second name for alpha: counted once, as alpha
  write_bytes(dir.file("empty"), "");                   // nothing to read: excluded
  fs::create_directory(dir.file("off"));                // subdirectories are not entered
  write_bytes(dir.file("off/offensive"), "XXXX");
}

TEST(Fortunes, TakesTopLevelTextFilesSortedByNameAndSkipsDatU8) {
  TempDir dir;
  make_corpus(dir);
  EXPECT_EQ(fortunes_files(dir.str()),
            (std::vector<std::string>{dir.file("Mid"), dir.file("alpha"), dir.file("zeta")}));

  FortunesDirGuard guard(dir.str());
  auto src = open_token_source("@fortunes", DataFormat::kText, 256);
  std::vector<int32_t> got = read_all(*src);
  EXPECT_EQ(std::string(got.begin(), got.end()), "M\nAAA\n%\nZZ\n%\n");
  EXPECT_EQ(src->size(), 13);
  EXPECT_EQ(src->vocab_size(), 256);
  EXPECT_TRUE(contains(src->describe(), dir.str())) << src->describe();
}

TEST(Fortunes, MissingDirectoryNamesPackageAndInstallCommand) {
  TempDir dir;
  const std::string missing = dir.file("no_such_dir");
  FortunesDirGuard guard(missing);
  const std::string msg = bad_input_message([] { open_token_source("@fortunes", DataFormat::kText, 256); });
  EXPECT_TRUE(contains(msg, "`fortunes`")) << msg;
  EXPECT_TRUE(contains(msg, "apt-get install fortunes")) << msg;
  EXPECT_TRUE(contains(msg, missing)) << msg;
  EXPECT_TRUE(contains(msg, "does not exist")) << msg;
}

TEST(Fortunes, DirectoryWithOnlyIndexesNamesPackage) {
  TempDir dir;
  write_bytes(dir.file("a.dat"), "x");
  write_bytes(dir.file("a.u8"), "y");
  FortunesDirGuard guard(dir.str());
  const std::string msg = bad_input_message([] { open_token_source("@fortunes", DataFormat::kText, 256); });
  EXPECT_TRUE(contains(msg, "`fortunes`")) << msg;
  EXPECT_TRUE(contains(msg, "apt-get install fortunes")) << msg;
  EXPECT_TRUE(contains(msg, "holds no fortune text files")) << msg;
}

TEST(Fortunes, NeedsTextFormat) {
  const std::string msg = bad_input_message([] { open_token_source("@fortunes", DataFormat::kLlmc, 50257); });
  EXPECT_TRUE(contains(msg, "data.format=text")) << msg;
}

TEST(Fortunes, SystemCorpusWhenInstalled) {
  const std::string dir = "/usr/share/games/fortunes";
  if (!std::filesystem::exists(dir + "/fortunes")) GTEST_SKIP() << "Debian package `fortunes` is not installed";
  const std::vector<std::string> files = fortunes_files(dir);
  ASSERT_GE(files.size(), 2u);
  for (const std::string& f : files) {
    EXPECT_FALSE(f.size() >= 4 && f.compare(f.size() - 4, 4, ".dat") == 0) << f;
    EXPECT_FALSE(f.size() >= 3 && f.compare(f.size() - 3, 3, ".u8") == 0) << f;
  }
  EXPECT_TRUE(std::is_sorted(files.begin(), files.end()));
}

}  // namespace
}  // namespace st
