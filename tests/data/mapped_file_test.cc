#include "shardtrain/data/mapped_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <string>

#include "data_test_util.h"

namespace st::testing {
namespace {

// The death tests fork from a process that may hold OpenMP threads: re-execute instead.
class MappedFileDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// Reads one byte through a pointer the compiler must not elide.
int read_byte(const uint8_t* p) { return *static_cast<const volatile uint8_t*>(p); }

TEST(MappedFile, MapsTheWholeFile) {
  TempDir dir;
  write_bytes(dir.file("a.bin"), "hello");
  const MappedFile f(dir.file("a.bin"));
  ASSERT_EQ(f.size(), 5);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.data()), 5), "hello");
}

TEST_F(MappedFileDeathTest, FileTruncatedUnderItsMappingExitsTwoNamingIt) {
  TempDir dir;
  const std::string path = dir.file("shard.bin");
  write_bytes(path, std::string(3 * 4096, 'x'));
  EXPECT_EXIT(
      {
        const MappedFile f(path);
        if (::truncate(path.c_str(), 0) != 0) std::abort();
        std::exit(read_byte(f.data() + 5000));
      },
      ::testing::ExitedWithCode(2),
      // The threadsafe style re-runs the test in the child, whose temporary directory has another name.
      "error: .*data file /.*/shard.bin changed while the job was reading it .*data files must not change while a "
      "job reads them");
}

TEST_F(MappedFileDeathTest, SigbusOutsideTheMappingsKeepsItsDefault) {
  TempDir dir;
  write_bytes(dir.file("a.bin"), std::string(4096, 'x'));
  // Sent by kill(2), with a mapping live (so that the handler is installed).
  EXPECT_EXIT(
      {
        const MappedFile f(dir.file("a.bin"));
        ::kill(::getpid(), SIGBUS);
        std::exit(read_byte(f.data()));
      },
      ::testing::KilledBySignal(SIGBUS), "");
  // A real fault in a mapping of another file.
  write_bytes(dir.file("other.bin"), std::string(3 * 4096, 'y'));
  EXPECT_EXIT(
      {
        const MappedFile f(dir.file("a.bin"));
        const int fd = ::open(dir.file("other.bin").c_str(), O_RDONLY);
        void* p = ::mmap(nullptr, 3 * 4096, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED || ::truncate(dir.file("other.bin").c_str(), 0) != 0) std::abort();
        std::exit(read_byte(static_cast<const uint8_t*>(p) + 5000));
      },
      ::testing::KilledBySignal(SIGBUS), "");
  // A mapping released: its range is no longer ours, even with another file mapped at the same address.
  EXPECT_EXIT(
      {
        const MappedFile keep(dir.file("a.bin"));
        void* gone = nullptr;
        {
          const MappedFile f(dir.file("other.bin"));
          gone = const_cast<uint8_t*>(f.data());
        }
        const int fd = ::open(dir.file("other.bin").c_str(), O_RDONLY);
        void* p = ::mmap(gone, 3 * 4096, PROT_READ, MAP_PRIVATE | MAP_FIXED_NOREPLACE, fd, 0);
        if (p != gone || ::truncate(dir.file("other.bin").c_str(), 0) != 0) std::abort();
        std::exit(read_byte(static_cast<const uint8_t*>(p) + 5000));
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

TEST_F(MappedFileDeathTest, MovedMappingStaysGuarded) {
  TempDir dir;
  const std::string path = dir.file("moved.bin");
  write_bytes(path, std::string(3 * 4096, 'x'));
  EXPECT_EXIT(
      {
        MappedFile a(path);
        const MappedFile b(std::move(a));
        if (::truncate(path.c_str(), 0) != 0) std::abort();
        std::exit(read_byte(b.data() + 5000));
      },
      ::testing::ExitedWithCode(2), "data file /.*/moved.bin changed while the job was reading it");
}

}  // namespace
}  // namespace st::testing
