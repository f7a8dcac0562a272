#include "shardtrain/data/llmc_writer.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <vector>

#include "data_test_util.h"
#include "shardtrain/data/llmc_format.h"
#include "shardtrain/data/llmc_source.h"

namespace st {
namespace {

using testing::contains;
using testing::read_all;
using testing::read_bytes;
using testing::TempDir;

int32_t header_int(const std::string& bytes, int i) {
  int32_t v;
  std::memcpy(&v, bytes.data() + 4 * i, 4);
  return v;
}

// Runs fn, which must throw st::Error of `kind`; returns its message.
std::string error_of(ErrorKind kind, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "nothing was thrown";
  return "";
}

TEST(LlmcShardWriter, Writes16BitShardsTheReaderReadsBack) {
  TempDir dir;
  const std::vector<int32_t> tokens = {0, 1, 65535, 50256, 7};
  LlmcShardWriter w(dir.file("a.bin"), 16, /*with_mask=*/false);
  w.write(tokens.data(), 2);
  w.write(tokens.data() + 2, 3);
  EXPECT_EQ(w.tokens(), 5);
  EXPECT_EQ(dir.entries().size(), 1u) << "only the temporary exists before close()";
  EXPECT_FALSE(std::filesystem::exists(dir.file("a.bin")));
  w.close();
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"a.bin"}));
  const std::string bytes = read_bytes(dir.file("a.bin"));
  ASSERT_EQ(bytes.size(), 1024u + 10u);
  EXPECT_EQ(header_int(bytes, 0), 20240520);
  EXPECT_EQ(header_int(bytes, 1), 1);
  EXPECT_EQ(header_int(bytes, 2), 5);
  EXPECT_EQ(std::filesystem::status(dir.file("a.bin")).permissions() & std::filesystem::perms::all,
            std::filesystem::perms(0644));
  auto src = open_llmc_source(dir.file("a.bin"), 65536);
  EXPECT_EQ(read_all(*src), tokens);
  EXPECT_FALSE(src->has_loss_mask());
}

TEST(LlmcShardWriter, Writes32BitShardsWithMasksAcrossManyBuffers) {
  TempDir dir;
  // 700k tokens: 2.8 MB of uint32, several of the writer's 1 MiB buffers, written in uneven calls.
  const int64_t n = 700'000;
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  std::vector<uint8_t> mask(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<int32_t>((i * 7919) % 151936);
    mask[i] = static_cast<uint8_t>((i / 3) % 2);
  }
  LlmcShardWriter w(dir.file("q_000.bin"), llmc_token_bits(151936), /*with_mask=*/true);
  EXPECT_EQ(w.token_bits(), 32);
  EXPECT_EQ(w.mask_path(), dir.file("q_000.mask"));
  for (int64_t lo = 0; lo < n; lo += 123'457) {
    const int64_t m = std::min<int64_t>(123'457, n - lo);
    w.write(tokens.data() + lo, mask.data() + lo, m);
  }
  w.close();
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"q_000.bin", "q_000.mask"}));
  const std::string shard = read_bytes(dir.file("q_000.bin")), m = read_bytes(dir.file("q_000.mask"));
  EXPECT_EQ(header_int(shard, 0), 20240801);
  EXPECT_EQ(header_int(shard, 1), 7);
  EXPECT_EQ(header_int(shard, 2), n);
  EXPECT_EQ(header_int(m, 0), 20261201);
  EXPECT_EQ(header_int(m, 1), kLlmcMaskVersion);
  EXPECT_EQ(header_int(m, 2), n);
  auto src = open_llmc_source(dir.file("q_*.bin"), 151936);
  ASSERT_TRUE(src->has_loss_mask());
  EXPECT_EQ(read_all(*src), tokens);
  std::vector<uint8_t> back(static_cast<size_t>(n));
  src->read_mask(0, n, back.data());
  EXPECT_EQ(back, mask);
}

TEST(LlmcShardWriter, ValuesThatDoNotFitAreRefusedAndLeaveNothing) {
  TempDir dir;
  const std::vector<int32_t> wide = {1, 65536};
  std::string msg = error_of(ErrorKind::kBadInput, [&] {
    LlmcShardWriter w(dir.file("a.bin"), 16, false);
    w.write(wide.data(), 2);
  });
  EXPECT_TRUE(contains(msg, "llm.c shard " + dir.file("a.bin") +
                                ": token 65536 at index 1 does not fit a 16-bit "
                                "shard: expected 0 <= token < 65536"))
      << msg;
  const std::vector<int32_t> negative = {-1};
  msg = error_of(ErrorKind::kBadInput, [&] {
    LlmcShardWriter w(dir.file("a.bin"), 32, false);
    w.write(negative.data(), 1);
  });
  EXPECT_TRUE(contains(msg, "token -1 at index 0 does not fit a 32-bit shard")) << msg;
  const std::vector<int32_t> ok = {1, 2};
  const std::vector<uint8_t> bad_mask = {1, 2};
  msg = error_of(ErrorKind::kBadInput, [&] {
    LlmcShardWriter w(dir.file("a.bin"), 16, true);
    w.write(ok.data(), bad_mask.data(), 2);
  });
  EXPECT_TRUE(contains(msg, "mask byte 2 at index 1: expected 0 (not a target) or 1 (a target)")) << msg;
  msg = error_of(ErrorKind::kBadInput, [&] { LlmcShardWriter(dir.file("a.bin"), 16, false).close(); });
  EXPECT_TRUE(contains(msg, "closed with no token written")) << msg;
  msg = error_of(ErrorKind::kBadInput, [&] { LlmcShardWriter(dir.file("a.bin"), 8, false); });
  EXPECT_TRUE(contains(msg, "token width 8 bits: expected 16 or 32")) << msg;
  EXPECT_TRUE(dir.entries().empty());
}

TEST(LlmcShardWriter, DestroyedWithoutCloseLeavesNothing) {
  TempDir dir;
  const std::vector<int32_t> tokens(1000, 3);
  const std::vector<uint8_t> mask(1000, 1);
  {
    LlmcShardWriter w(dir.file("a.bin"), 16, true);
    w.write(tokens.data(), mask.data(), 1000);
    EXPECT_EQ(dir.entries().size(), 2u);  // the two temporaries
  }
  EXPECT_TRUE(dir.entries().empty());
}

TEST(LlmcShardWriter, AMissingDirectoryIsBadInputNamingIt) {
  TempDir dir;
  const std::string msg =
      error_of(ErrorKind::kBadInput, [&] { LlmcShardWriter(dir.file("no/such/a.bin"), 16, false); });
  EXPECT_TRUE(contains(msg, "llm.c shard " + dir.file("no/such/a.bin") + ": cannot create a file in " +
                                dir.file("no/such") + ": No such file or directory"))
      << msg;
}

// Only new files: an existing shard, and a mask at the mask path of a shard written without one (it would be read
// as that shard's), are refused and kept.
TEST(LlmcShardWriter, ExistingFilesAreRefusedAndKept) {
  TempDir dir;
  const std::vector<int32_t> tokens = {1, 2, 3};
  const std::vector<uint8_t> mask = {0, 1, 1};
  LlmcShardWriter a(dir.file("s.bin"), 16, true);
  a.write(tokens.data(), mask.data(), 3);
  a.close();
  const std::string shard = read_bytes(dir.file("s.bin")), old_mask = read_bytes(dir.file("s.mask"));
  std::string msg = error_of(ErrorKind::kBadInput, [&] { LlmcShardWriter(dir.file("s.bin"), 16, true); });
  EXPECT_TRUE(contains(msg, "llm.c shard " + dir.file("s.bin") + ": exists")) << msg;
  std::filesystem::remove(dir.file("s.bin"));
  msg = error_of(ErrorKind::kBadInput, [&] { LlmcShardWriter(dir.file("s.bin"), 16, false); });
  EXPECT_TRUE(contains(msg, dir.file("s.mask") + " exists, and would be read as the loss mask of this shard")) << msg;
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"s.mask"}));
  EXPECT_TRUE(read_bytes(dir.file("s.mask")) == old_mask);
}

// A file that appears under the final name while the shard is written is not replaced: close() refuses, keeps it,
// and leaves nothing of its own.
TEST(LlmcShardWriter, AFileThatAppearsMeanwhileIsNotReplaced) {
  TempDir dir;
  const std::vector<int32_t> tokens = {1, 2, 3};
  LlmcShardWriter w(dir.file("s.bin"), 16, false);
  w.write(tokens.data(), 3);
  testing::write_bytes(dir.file("s.bin"), "someone else's");
  const std::string msg = error_of(ErrorKind::kBadInput, [&] { w.close(); });
  EXPECT_TRUE(contains(msg, dir.file("s.bin") + " appeared while the shard was written; nothing was replaced")) << msg;
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"s.bin"}));
  EXPECT_EQ(read_bytes(dir.file("s.bin")), "someone else's");
}

// The mask records the shard's content hash: LlmcContentHash of the token bytes, whatever pieces they came in.
TEST(LlmcShardWriter, TheMaskRecordsTheShardsContentHash) {
  TempDir dir;
  std::vector<int32_t> tokens(1001);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7919) % 60000);
  const std::vector<uint8_t> mask(tokens.size(), 1);
  LlmcShardWriter w(dir.file("s.bin"), 16, true);
  for (size_t at = 0; at < tokens.size();) {  // pieces of odd lengths: words straddle write() calls
    const size_t n = std::min<size_t>(tokens.size() - at, 3 + at % 5);
    w.write(tokens.data() + at, mask.data() + at, static_cast<int64_t>(n));
    at += n;
  }
  w.close();
  const std::string shard = read_bytes(dir.file("s.bin")), m = read_bytes(dir.file("s.mask"));
  LlmcContentHash h;
  h.update(shard.data() + kLlmcHeaderBytes, shard.size() - kLlmcHeaderBytes);
  EXPECT_EQ(header_int(m, 1), kLlmcMaskVersion);
  EXPECT_EQ(static_cast<uint32_t>(header_int(m, 3)), static_cast<uint32_t>(h.value()));
  EXPECT_EQ(static_cast<uint32_t>(header_int(m, 4)), static_cast<uint32_t>(h.value() >> 32));
}

// The hash of docs/data-format.md's Python code, in pieces of any size and summed over pieces.
TEST(LlmcContentHash, IsTheDocumentedHashInAnyPieces) {
  EXPECT_EQ(LlmcContentHash().value(), 0u);  // no word, and mix(0) = 0
  LlmcContentHash whole;
  whole.update("abcdefghijk", 11);
  EXPECT_EQ(whole.value(), 8771532169255424598ull);  // content_hash(b"abcdefghijk") in Python
  LlmcContentHash bytewise;
  for (const char c : std::string("abcdefghijk")) bytewise.update(&c, 1);
  EXPECT_EQ(bytewise.value(), whole.value());
  const auto* p = reinterpret_cast<const uint8_t*>("abcdefghijk");
  EXPECT_EQ(
      LlmcContentHash::finish(LlmcContentHash::hash_words(p, 8, 0) + LlmcContentHash::hash_words(p + 8, 3, 1), 11),
      whole.value());
  LlmcContentHash other;
  other.update("abcdefghijl", 11);
  EXPECT_NE(other.value(), whole.value());
  LlmcContentHash swapped;
  swapped.update("ijkabcdefgh", 11);
  EXPECT_NE(swapped.value(), whole.value());
}

// A write that fails half way (the file size limit, RLIMIT_FSIZE: EFBIG, as a full disk gives ENOSPC) throws kFault
// naming the shard and leaves no file: not under the final names, and no temporary. Run in a child process, whose
// limit and SIGXFSZ disposition do not touch the test runner.
TEST(LlmcShardWriter, AWriteErrorThrowsNamingThePathAndLeavesNoFile) {
  TempDir dir;
  const std::string path = dir.file("big.bin");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);  // write(2) then fails with EFBIG instead of the process being killed
    const rlimit limit{256 * 1024, 256 * 1024};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(10);
    const std::vector<int32_t> tokens(1'000'000, 5);
    const std::vector<uint8_t> mask(1'000'000, 1);
    try {
      LlmcShardWriter w(path, 32, true);
      w.write(tokens.data(), mask.data(), 1'000'000);
      w.close();
    } catch (const Error& e) {
      const std::string msg = e.what();
      const bool named = msg.find("llm.c shard " + path) != std::string::npos &&
                         msg.find("File too large") != std::string::npos &&
                         msg.find("nothing was left under " + path) != std::string::npos;
      if (!named) std::fprintf(stderr, "unexpected message: %s\n", msg.c_str());
      ::_exit(e.kind() == ErrorKind::kFault && named ? 0 : 11);
    }
    ::_exit(12);  // nothing was thrown
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: setrlimit failed, 11: wrong error, 12: no error";
  EXPECT_TRUE(dir.entries().empty()) << dir.entries().size() << " entries, e.g. " << dir.entries()[0];
}

}  // namespace
}  // namespace st
