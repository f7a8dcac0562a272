#include "shardtrain/ckpt/file_io.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ckpt_test_util.h"
#include "shardtrain/ckpt/digest.h"
#include "shardtrain/ckpt/file_read.h"
#include "shardtrain/ckpt/file_write.h"

namespace st {
namespace {

using testing::bad_input_message;
using testing::contains;
using testing::error_message;
using testing::expect_fault_past_file_size_limit;
using testing::fault_message;
using testing::on_tmpfs;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kIoBytes = 16 * kMiB;  // the read and write size of file_io.cc

// `size` bytes of a xorshift stream: no zero runs, different for each seed.
std::string varied_bytes(size_t size, uint64_t seed) {
  std::string out(size, '\0');
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (char& c : out) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x >> 56);
  }
  return out;
}

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256, FileOfOneMillionAMatchesTheNistVector) {
  TempDir dir;
  write_bytes(dir.file("a"), std::string(1000000, 'a'));
  EXPECT_EQ(sha256_file(dir.file("a")), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Sizes across and between 1 MiB boundaries must agree with the one-shot hash.
TEST(Sha256, FileLargerThanOneChunkEqualsHashOfItsBytes) {
  TempDir dir;
  for (size_t size : {size_t{0}, size_t{1} << 20, (size_t{1} << 20) + 1, (size_t{3} << 20) + 12345}) {
    std::string bytes(size, '\0');
    uint32_t x = 12345;
    for (char& c : bytes) {
      x = x * 1664525u + 1013904223u;
      c = static_cast<char>(x >> 24);
    }
    const std::string path = dir.file("blob_" + std::to_string(size));
    write_bytes(path, bytes);
    EXPECT_EQ(sha256_file(path), sha256_hex(bytes.data(), bytes.size())) << size;
    EXPECT_EQ(file_size(path), static_cast<int64_t>(size));
  }
}

// The file is hashed in 16 MiB reads, each hashed while the next is read.
TEST(Sha256, FileAcrossTheReadSizeEqualsHashOfItsBytes) {
  TempDir dir;
  for (size_t size : {kIoBytes - 1, kIoBytes, kIoBytes + 1, 2 * kIoBytes + 12345}) {
    const std::string bytes = varied_bytes(size, size);
    const std::string path = dir.file("blob_" + std::to_string(size));
    write_bytes(path, bytes);
    EXPECT_EQ(sha256_file(path), sha256_hex(bytes.data(), bytes.size())) << size;
  }
}

TEST(Sha256, MissingFileIsBadInputNamingThePath) {
  TempDir dir;
  const std::string msg = bad_input_message([&] { sha256_file(dir.file("absent.h5")); });
  EXPECT_TRUE(contains(msg, dir.file("absent.h5"))) << msg;
  EXPECT_TRUE(contains(msg, "No such file or directory")) << msg;
}

// Known digests, computed independently by Python's hashlib:
//   h = sha256(); [h.update(sha256(data[i:i + p]).digest()) for i in range(0, len(data), p)]; h.hexdigest()
TEST(Digest, KnownVectors) {
  EXPECT_EQ(digest_hex("abc", 3, 4096), "4f8b42c22dd3729b519ba6f68d2da7cc5b2d606d05daed5ad5128cc03e6c6358");
  EXPECT_EQ(digest_hex("", 0, 4096), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string a(10000, 'a');  // pieces of 4096, 4096 and 1808 bytes
  EXPECT_EQ(digest_hex(a.data(), a.size(), 4096), "7066272a7c980edc7755dfc35591070ab25212163bcbc8e0b5ba8e6d28cee231");
  TempDir dir;
  write_bytes(dir.file("a"), std::string(1000000, 'a'));
  EXPECT_EQ(file_digest(dir.file("a"), kDigestPieceBytes),
            "80d1189477563e1b5206b2749f1afe4807e5705e8bd77887a60187a712156688");
  // Without pieces it is the SHA-256 of the whole file.
  EXPECT_EQ(file_digest(dir.file("a"), 0), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_EQ(digest_hex("abc", 3, 0), sha256_hex("abc", 3));
}

// The digest by its definition, from sha256_hex alone: the SHA-256 of the pieces' digests, concatenated.
std::string digest_by_definition(const std::string& bytes, size_t piece) {
  std::string digests;
  for (size_t at = 0; at < bytes.size(); at += piece) {
    const std::string hex = sha256_hex(bytes.data() + at, std::min(piece, bytes.size() - at));
    for (size_t i = 0; i < hex.size(); i += 2) digests += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  return sha256_hex(digests.data(), digests.size());
}

// Every way to take a digest agrees with the definition: from memory (pieces on several threads), from a file
// (pieces read side by side; a piece larger than one 16 MiB read takes several), and as a stream fed in sizes that
// cross piece boundaries. Sizes: empty, below, at and across a piece, and many pieces.
TEST(Digest, MemoryFileAndStreamAgreeWithTheDefinition) {
  TempDir dir;
  struct Case {
    size_t size, piece;
  };
  for (const Case c :
       {Case{0, 4096}, Case{1, 4096}, Case{4095, 4096}, Case{4096, 4096}, Case{4097, 4096}, Case{37 * 4096 + 5, 4096},
        Case{3 * kMiB + 7, kMiB}, Case{2 * kIoBytes + 3 * kMiB + 5, 2 * kIoBytes}}) {
    SCOPED_TRACE(::testing::Message() << c.size << " bytes in pieces of " << c.piece);
    const std::string bytes = varied_bytes(c.size, c.size + 7);
    const std::string expected = digest_by_definition(bytes, c.piece);
    const int64_t piece = static_cast<int64_t>(c.piece);
    EXPECT_EQ(digest_hex(bytes.data(), bytes.size(), piece), expected);
    const std::string path = dir.file("blob");
    write_bytes(path, bytes);
    EXPECT_EQ(file_digest(path, piece), expected);
    for (size_t feed : {size_t{1000}, c.piece, c.piece + 1}) {
      DigestStream stream(piece);
      for (size_t at = 0; at < bytes.size(); at += feed)
        stream.update(bytes.data() + at, std::min(feed, bytes.size() - at));
      EXPECT_EQ(stream.hex(), expected) << "fed " << feed << " bytes at a time";
    }
  }
  DigestStream whole(0);
  whole.update("ab", 2);
  whole.update("c", 1);
  EXPECT_EQ(whole.hex(), sha256_hex("abc", 3));
}

// One changed byte in any piece changes the digest.
TEST(Digest, OneChangedByteChangesIt) {
  std::string bytes = varied_bytes(5 * 4096, 9);
  const std::string before = digest_hex(bytes.data(), bytes.size(), 4096);
  for (size_t at : {size_t{0}, size_t{4096 * 2 + 17}, bytes.size() - 1}) {
    bytes[at] ^= 1;
    EXPECT_NE(digest_hex(bytes.data(), bytes.size(), 4096), before) << at;
    bytes[at] ^= 1;
  }
  EXPECT_EQ(digest_hex(bytes.data(), bytes.size(), 4096), before);
}

TEST(Digest, MissingFileIsBadInputNamingThePath) {
  TempDir dir;
  for (int64_t piece : {int64_t{0}, kDigestPieceBytes}) {
    const std::string msg = bad_input_message([&] { file_digest(dir.file("absent.h5"), piece); });
    EXPECT_TRUE(contains(msg, dir.file("absent.h5"))) << msg;
    EXPECT_TRUE(contains(msg, "No such file or directory")) << msg;
  }
}

// digest_and_read's bytes land in `out` with a guard byte on each side; this checks them against the file's bytes.
struct Wanted {
  size_t offset, bytes;
  std::string out = std::string(bytes + 2, '#');
  WantedBytes view() { return {static_cast<int64_t>(offset), static_cast<int64_t>(bytes), out.data() + 1}; }
  bool holds(const std::string& file) const {
    return out.front() == '#' && out.back() == '#' && out.compare(1, bytes, file, offset, bytes) == 0;
  }
};

// One pass copies every wanted range and returns the digest, whatever the piece size: pieces inside one 16 MiB
// buffer, pieces that cross buffers (5 MiB + 3), a piece longer than one 64 MiB read, and the whole file (0). The
// file takes four 64 MiB reads, one more than the pass holds at once, so a buffer is reused; the ranges start and end
// inside, at and across buffers and reads, and overlap.
TEST(DigestAndRead, CopiesTheWantedRangesAndDigestsTheFileInOnePass) {
  TempDir dir;
  const size_t read = 4 * kIoBytes;
  const std::string bytes = varied_bytes(3 * read + 5 * kMiB + 12345, 21);
  const std::string path = dir.file("blob");
  write_bytes(path, bytes);
  for (const size_t piece : {kIoBytes, 5 * kMiB + 3, read + kIoBytes + 1, size_t{0}}) {
    SCOPED_TRACE(::testing::Message() << "pieces of " << piece);
    std::vector<Wanted> wanted = {{0, 0},
                                  {0, 1},
                                  {kIoBytes - 3, 10},
                                  {read - 5, 10},
                                  {1000, read + kIoBytes},
                                  {1007, 100},
                                  {bytes.size() - 17, 17},
                                  {bytes.size() - 1, 1}};
    std::vector<WantedBytes> views;
    for (Wanted& w : wanted) views.push_back(w.view());
    const std::string expected =
        piece == 0 ? sha256_hex(bytes.data(), bytes.size()) : digest_by_definition(bytes, piece);
    EXPECT_EQ(digest_and_read(path, static_cast<int64_t>(piece), views), expected);
    for (const Wanted& w : wanted) EXPECT_TRUE(w.holds(bytes)) << w.offset << " + " << w.bytes;
  }
}

// A pass in parts copies every call's ranges and returns the one-pass digest: ranges that end inside a piece (the
// rest of the piece is carried to the next call), that start inside the carried bytes, that lie wholly inside them,
// that go back before them (read again) and that span several pieces; a call with nothing new; pieces of 16 MiB and of
// 5 MiB + 3.
TEST(FilePassInParts, CopiesEachCallsRangesAndDigestsTheFileOnce) {
  TempDir dir;
  const std::string bytes = varied_bytes(3 * kIoBytes + 12345, 22);
  const std::string path = dir.file("blob");
  write_bytes(path, bytes);
  for (const size_t piece : {kIoBytes, 5 * kMiB + 3}) {
    SCOPED_TRACE(::testing::Message() << "pieces of " << piece);
    std::vector<std::vector<Wanted>> calls = {{{0, 1}, {10, 100}},
                                              {{50, 20}, {kIoBytes - 7, 30}},
                                              {{kIoBytes + 1, 5}},
                                              {{3, 4}},
                                              {{kIoBytes + 100, 2 * kIoBytes}, {2 * kIoBytes, 9}},
                                              {{bytes.size() - 1, 1}, {bytes.size(), 0}}};
    FilePassInParts pass(path, static_cast<int64_t>(piece));
    for (std::vector<Wanted>& call : calls) {
      std::vector<WantedBytes> views;
      for (Wanted& w : call) views.push_back(w.view());
      pass.read(views);
      for (const Wanted& w : call) EXPECT_TRUE(w.holds(bytes)) << w.offset << " + " << w.bytes;
    }
    EXPECT_EQ(pass.finish(), digest_by_definition(bytes, piece));
  }
  FilePassInParts short_pass(path, kDigestPieceBytes);  // finish() alone reads the whole file
  EXPECT_EQ(short_pass.finish(), file_digest(path, kDigestPieceBytes));
  FilePassInParts past(path, kDigestPieceBytes);
  Wanted beyond{bytes.size() - 2, 3};
  const std::string msg = bad_input_message([&] { past.read({beyond.view()}); });
  EXPECT_TRUE(contains(msg, path)) << msg;
}

// Files smaller than one buffer, down to empty, read in one short read.
TEST(DigestAndRead, SmallFiles) {
  TempDir dir;
  for (const size_t size : {size_t{0}, size_t{1}, size_t{4097}, 3 * kMiB + 7}) {
    SCOPED_TRACE(::testing::Message() << size << " bytes");
    const std::string bytes = varied_bytes(size, size + 3);
    const std::string path = dir.file("blob_" + std::to_string(size));
    write_bytes(path, bytes);
    std::vector<Wanted> wanted = {{0, size}, {size / 2, size - size / 2}};
    std::vector<WantedBytes> views;
    for (Wanted& w : wanted) views.push_back(w.view());
    EXPECT_EQ(digest_and_read(path, 4096, views), digest_by_definition(bytes, 4096));
    for (const Wanted& w : wanted) EXPECT_TRUE(w.holds(bytes)) << w.offset << " + " << w.bytes;
  }
}

// A range past the end of the file is refused before anything is read: the message names the path, the range and
// the file's size.
TEST(DigestAndRead, ARangePastTheEndIsBadInputAndNothingIsCopied) {
  TempDir dir;
  const std::string path = dir.file("blob");
  write_bytes(path, varied_bytes(5000, 1));
  Wanted inside{0, 100}, past{4990, 20};
  const std::string msg = bad_input_message([&] { digest_and_read(path, 4096, {inside.view(), past.view()}); });
  EXPECT_TRUE(contains(msg, path + ": bytes [4990, 5010) are wanted from a file of 5000 bytes")) << msg;
  EXPECT_EQ(inside.out, std::string(102, '#'));
  const std::string missing = bad_input_message([&] { digest_and_read(dir.file("absent.h5"), 4096, {}); });
  EXPECT_TRUE(contains(missing, dir.file("absent.h5") + " to hash it: No such file or directory")) << missing;
}

// Ranges below, at and across the 16 MiB read size, from offsets inside the file; a range past its end is a fault
// naming the path and the byte where the file ended.
TEST(ReadAt, ReadsTheRangeAndNamesAnEarlyEnd) {
  TempDir dir;
  const std::string bytes = varied_bytes(2 * kIoBytes + 5000, 11);
  const std::string path = dir.file("blob");
  write_bytes(path, bytes);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  for (const auto& [offset, n] : std::vector<std::pair<size_t, size_t>>{
           {0, 0}, {0, 1}, {7, 4096}, {3, kIoBytes}, {kIoBytes - 1, 2}, {17, 2 * kIoBytes + 4983}}) {
    std::string out(n + 2, '#');
    read_at(fd, path, static_cast<int64_t>(offset), static_cast<int64_t>(n), out.data() + 1);
    EXPECT_TRUE(out.substr(1, n) == bytes.substr(offset, n)) << offset << " + " << n;
    EXPECT_EQ(out.front(), '#');
    EXPECT_EQ(out.back(), '#');
  }
  std::string out(kIoBytes, '\0');
  const std::string msg =
      fault_message([&] { read_at(fd, path, static_cast<int64_t>(bytes.size()) - 10, 20, out.data()); });
  EXPECT_TRUE(contains(msg, "read of " + path + " at byte " + std::to_string(bytes.size()) + ": the file ended early"))
      << msg;
  ::close(fd);
}

TEST(WriteFileAtomic, WritesReplacesAndLeavesNoTmpFile) {
  TempDir dir;
  const std::string path = dir.file("latest");
  write_file_atomic(path, "step_00000100\n");
  EXPECT_EQ(read_file(path), "step_00000100\n");
  write_file_atomic(path, std::string("step_2\0x", 8));  // shorter, with a NUL: fully replaced
  EXPECT_EQ(read_file(path), std::string("step_2\0x", 8));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"latest"});
}

TEST(WriteFileAtomic, MissingDirectoryIsAFaultNamingThePathAndErrno) {
  TempDir dir;
  const std::string path = dir.file("no_such_dir/latest");
  const std::string msg = fault_message([&] { write_file_atomic(path, "x"); });
  EXPECT_TRUE(contains(msg, path + ".tmp-")) << msg;
  EXPECT_TRUE(contains(msg, "No such file or directory")) << msg;
  EXPECT_EQ(dir.entries(), std::vector<std::string>{});
}

TEST(ReadFile, MissingFileOrDirectoryIsBadInputNamingThePath) {
  TempDir dir;
  std::string msg = bad_input_message([&] { read_file(dir.file("manifest.json")); });
  EXPECT_TRUE(contains(msg, dir.file("manifest.json"))) << msg;
  EXPECT_TRUE(contains(msg, "No such file or directory")) << msg;
  msg = bad_input_message([&] { read_file(dir.str()); });
  EXPECT_TRUE(contains(msg, dir.str())) << msg;
  EXPECT_TRUE(contains(msg, "directory")) << msg;
}

TEST(FileSize, MissingFileIsBadInputNamingThePath) {
  TempDir dir;
  write_bytes(dir.file("seven"), "1234567");
  EXPECT_EQ(file_size(dir.file("seven")), 7);
  const std::string msg = bad_input_message([&] { file_size(dir.file("gone")); });
  EXPECT_TRUE(contains(msg, dir.file("gone"))) << msg;
}

TEST(FsyncPath, FilesAndDirectoriesSucceedMissingIsAFault) {
  TempDir dir;
  write_bytes(dir.file("f"), "x");
  EXPECT_NO_THROW(fsync_path(dir.file("f")));
  EXPECT_NO_THROW(fsync_path(dir.str()));
  const std::string msg = fault_message([&] { fsync_path(dir.file("gone")); });
  EXPECT_TRUE(contains(msg, dir.file("gone"))) << msg;
  EXPECT_TRUE(contains(msg, "No such file or directory")) << msg;
}

// Writes a file of `size` varied bytes, overwrites three pieces of it (given out of order, one empty) and checks
// the result: the pieces at their offsets, every other byte as it was, the length and digest returned equal to
// the file's, for digest pieces of 4 KiB (many pieces, hashed on several threads) and of the writers' size.
void expect_overwrite_places_pieces(const std::string& path, size_t size) {
  for (int64_t digest_piece : {int64_t{4096}, kDigestPieceBytes}) {
    SCOPED_TRACE(::testing::Message() << path << " of " << size << " bytes, digest pieces of " << digest_piece);
    std::string expected = varied_bytes(size, 1);
    write_bytes(path, expected);
    const std::string middle = varied_bytes(size / 3, 2), last = varied_bytes(std::min<size_t>(3, size), 3);
    const std::vector<PlacedBytes> pieces = {
        {static_cast<int64_t>(size - last.size()), last.data(), static_cast<int64_t>(last.size())},
        {static_cast<int64_t>(size / 2), nullptr, 0},
        {static_cast<int64_t>(size / 6), middle.data(), static_cast<int64_t>(middle.size())},
    };
    expected.replace(size / 6, middle.size(), middle);
    expected.replace(size - last.size(), last.size(), last);

    const WrittenFile w = overwrite_file(path, pieces, digest_piece);
    EXPECT_EQ(w.bytes, static_cast<int64_t>(size));
    EXPECT_EQ(w.digest, digest_hex(expected.data(), expected.size(), digest_piece));
    EXPECT_EQ(w.digest, file_digest(path, digest_piece));
    EXPECT_EQ(file_size(path), static_cast<int64_t>(size));
    EXPECT_TRUE(read_bytes(path) == expected);  // not EXPECT_EQ: a mismatch would print megabytes
  }
}

// Sizes below, at and across the 16 MiB write size, with and without a last partial 4 KiB block (written
// without O_DIRECT); the largest runs several writes at once and its middle piece crosses a write boundary.
TEST(OverwriteFile, PlacesThePiecesKeepsTheRestAndReturnsLengthAndDigest) {
  TempDir dir;
  for (size_t size : {size_t{0}, size_t{1}, size_t{4096}, size_t{5000}, kIoBytes, 3 * kIoBytes + 12345})
    expect_overwrite_places_pieces(dir.file("f_" + std::to_string(size)), size);
}

// Groups acquired one at a time write the bytes and digest overwrite_file writes for the same pieces: each group's
// memory exists only between its acquire and release (the test frees it there), groups end inside, at and across
// 16 MiB writes and digest pieces, one group is empty, and the file's bytes between them are kept.
TEST(OverwriteFileInGroups, WritesWhatOverwriteFileWritesHoldingOneGroupAtATime) {
  TempDir dir;
  const size_t size = 3 * kIoBytes + 12345;
  const std::string original = varied_bytes(size, 5);
  // [offset, bytes) of each group's one piece, in file order, with gaps between some.
  const std::vector<std::pair<size_t, size_t>> groups = {
      {100, 5000}, {5100, kIoBytes}, {kIoBytes + 6000, 0}, {kIoBytes + 6000, kIoBytes + 7}, {3 * kIoBytes, 12000}};
  for (int64_t digest_piece : {int64_t{4096}, kDigestPieceBytes}) {
    SCOPED_TRACE(::testing::Message() << "digest pieces of " << digest_piece);
    std::string expected = original;
    for (size_t g = 0; g < groups.size(); ++g)
      expected.replace(groups[g].first, groups[g].second, varied_bytes(groups[g].second, 10 + g));
    const std::string path = dir.file("f");
    write_bytes(path, original);
    std::vector<std::string> live(groups.size());
    int held = 0, most_held = 0, released = 0;
    const WrittenFile w = overwrite_file_in_groups(
        path, static_cast<int64_t>(groups.size()),
        [&](int64_t g) {
          const auto [offset, bytes] = groups[static_cast<size_t>(g)];
          live[static_cast<size_t>(g)] = varied_bytes(bytes, 10 + static_cast<uint64_t>(g));
          most_held = std::max(most_held, ++held);
          return std::vector<PlacedBytes>{
              {static_cast<int64_t>(offset), live[static_cast<size_t>(g)].data(), static_cast<int64_t>(bytes)}};
        },
        [&](int64_t g) {
          std::string().swap(live[static_cast<size_t>(g)]);  // what the writer still reads of it is gone
          --held;
          ++released;
        },
        digest_piece);
    EXPECT_EQ(most_held, 1);
    EXPECT_EQ(released, static_cast<int>(groups.size()));
    EXPECT_EQ(w.bytes, static_cast<int64_t>(size));
    EXPECT_EQ(w.digest, digest_hex(expected.data(), expected.size(), digest_piece));
    EXPECT_EQ(w.digest, file_digest(path, digest_piece));
    EXPECT_TRUE(read_bytes(path) == expected);
  }
}

// On a tmpfs the writes go through the page cache or, on Linux >= 6.6, direct.
TEST(OverwriteFile, WorksOnTmpfs) {
  if (!on_tmpfs("/dev/shm")) GTEST_SKIP() << "/dev/shm is not a tmpfs here";
  TempDir dir("/dev/shm");
  for (size_t size : {size_t{5000}, 2 * kIoBytes + 100})
    expect_overwrite_places_pieces(dir.file("f_" + std::to_string(size)), size);
}

// Past RLIMIT_FSIZE write(2) stops at the limit, then fails with EFBIG: a fault naming the path, the OS's text and
// the byte. The limit is not a multiple of 512, so a direct write there is refused (EINVAL) and the write starts
// over through the page cache, which reaches the same byte.
TEST(OverwriteFile, AWritePastTheFileSizeLimitIsAFaultNamingThePathAndTheByte) {
  TempDir dir;
  const std::string path = dir.file("big");
  write_bytes(path, varied_bytes(kMiB + 100, 4));
  const std::string piece = varied_bytes(kMiB, 5);
  expect_fault_past_file_size_limit(256 * 1024 + 100, path + ": File too large (at byte 262244 of 1048676)", [&] {
    overwrite_file(path, {{0, piece.data(), static_cast<int64_t>(piece.size())}}, kDigestPieceBytes);
  });
}

TEST(OverwriteFile, AMissingFileIsAFaultNamingThePathAndErrno) {
  TempDir dir;
  const std::string msg = fault_message([&] { overwrite_file(dir.file("gone"), {}, kDigestPieceBytes); });
  EXPECT_TRUE(contains(msg, "cannot open " + dir.file("gone") + " to write it: No such file or directory")) << msg;
}

// Overlapping pieces, or one past the end, are the caller's bug.
TEST(OverwriteFile, OverlappingOrOutsidePiecesAreAnInternalError) {
  TempDir dir;
  const std::string path = dir.file("f");
  write_bytes(path, std::string(100, 'x'));
  const std::string bytes(60, 'y');
  std::string msg = error_message(ErrorKind::kInternal, [&] {
    overwrite_file(path, {{50, bytes.data(), 10}, {0, bytes.data(), 60}}, kDigestPieceBytes);
  });
  EXPECT_TRUE(contains(msg, path + ": 10 bytes at 50 overlap the previous piece (ending at 60)")) << msg;
  msg = error_message(ErrorKind::kInternal, [&] { overwrite_file(path, {{41, bytes.data(), 60}}, kDigestPieceBytes); });
  EXPECT_TRUE(contains(msg, path + ": 60 bytes at 41 overlap the previous piece (ending at 0) or pass the end of the "
                                   "100-byte file"))
      << msg;
  EXPECT_EQ(read_bytes(path), std::string(100, 'x'));
}

}  // namespace
}  // namespace st
