#include "shardtrain/data/llmc_source.h"

#include <gtest/gtest.h>

#include <numeric>

#include "data_test_util.h"

namespace st {
namespace {

using testing::bad_input_message;
using testing::contains;
using testing::LlmcShard;
using testing::LlmcShard32;
using testing::read_all;
using testing::TempDir;
using testing::write_bytes;
using testing::write_llmc;
using testing::write_llmc32;

std::vector<uint16_t> iota_tokens(int n, uint16_t first) {
  std::vector<uint16_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(LlmcSource, ReadsAGlobOfShardsAsOneStreamAcrossBoundaries) {
  TempDir dir;
  write_llmc(dir.file("train_000.bin"), iota_tokens(5, 0));  // tokens 0..4
  write_llmc(dir.file("train_001.bin"), iota_tokens(3, 5));  // tokens 5..7
  write_llmc(dir.file("train_002.bin"), iota_tokens(8, 8));  // tokens 8..15
  auto src = open_llmc_source(dir.file("train_*.bin"), 50257);

  EXPECT_EQ(src->size(), 16);
  EXPECT_EQ(src->num_files(), 3);
  EXPECT_EQ(src->file_start(1), 5);
  EXPECT_EQ(src->file_start(2), 8);
  EXPECT_EQ(src->vocab_size(), 50257);
  std::vector<int32_t> all = read_all(*src);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(all[i], i) << "token " << i;

  // A read spanning all three shards.
  std::vector<int32_t> part(7, -1);
  src->read(3, 7, part.data());
  EXPECT_EQ(part, (std::vector<int32_t>{3, 4, 5, 6, 7, 8, 9}));
  // A read that ends exactly at a boundary, and one that starts at it.
  src->read(5, 3, part.data());
  EXPECT_EQ(std::vector<int32_t>(part.begin(), part.begin() + 3), (std::vector<int32_t>{5, 6, 7}));
  src->read(15, 1, part.data());
  EXPECT_EQ(part[0], 15);
  EXPECT_TRUE(contains(src->describe(), "3 files, 16 tokens")) << src->describe();
}

TEST(LlmcSource, ReadsFullUint16Range) {
  TempDir dir;
  write_llmc(dir.file("a.bin"), {0, 1, 65535, 40000});
  auto src = open_llmc_source(dir.file("a.bin"), 65536);
  EXPECT_EQ(read_all(*src), (std::vector<int32_t>{0, 1, 65535, 40000}));
}

TEST(LlmcSource, ReadsUint32ShardsExactlyAboveTheUint16Range) {
  TempDir dir;
  // Qwen 2.5's vocabulary: 151936 tokens; its largest id and ids on both sides of 2^16.
  const std::vector<uint32_t> tokens = {0, 65535, 65536, 65537, 128255, 151935, 100000, 7};
  write_llmc32(dir.file("q.bin"), tokens);
  auto src = open_llmc_source(dir.file("q.bin"), 151936);
  EXPECT_EQ(src->size(), 8);
  EXPECT_EQ(src->file_width(0), TokenWidth::kU32);
  EXPECT_EQ(read_all(*src), (std::vector<int32_t>{0, 65535, 65536, 65537, 128255, 151935, 100000, 7}));
  std::vector<int32_t> part(3);
  src->read(4, 3, part.data());
  EXPECT_EQ(part, (std::vector<int32_t>{128255, 151935, 100000}));
  EXPECT_TRUE(contains(src->describe(), "1 file, 8 tokens, uint32")) << src->describe();
}

TEST(LlmcSource, Uint32TokenAtOrAboveVocabNamesValueAndByte) {
  TempDir dir;
  write_llmc32(dir.file("l.bin"), {5, 128255, 128256, 200000});  // Llama 3: vocab 128256
  const std::string msg = bad_input_message([&] { open_llmc_source(dir.file("l.bin"), 128256); });
  EXPECT_TRUE(contains(msg, dir.file("l.bin"))) << msg;
  EXPECT_TRUE(contains(msg, "token 128256 at byte 1032 (token index 2) is >= model.vocab_size 128256")) << msg;
}

TEST(LlmcSource, OneGlobMayMixUint16AndUint32Shards) {
  TempDir dir;
  write_llmc(dir.file("a.bin"), {1, 2, 3});
  write_llmc32(dir.file("b.bin"), {70000, 4});
  write_llmc(dir.file("c.bin"), {5});
  auto src = open_llmc_source(dir.file("*.bin"), 70001);
  EXPECT_EQ(read_all(*src), (std::vector<int32_t>{1, 2, 3, 70000, 4, 5}));
  EXPECT_EQ(src->file_width(0), TokenWidth::kU16);
  EXPECT_EQ(src->file_width(1), TokenWidth::kU32);
  std::vector<int32_t> part(3);
  src->read(2, 3, part.data());  // across both boundaries of the uint32 shard
  EXPECT_EQ(part, (std::vector<int32_t>{3, 70000, 4}));
  EXPECT_TRUE(contains(src->describe(), "3 files, 6 tokens, 2 uint16 and 1 uint32")) << src->describe();
}

TEST(LlmcSource, MagicAndVersionMustBeOneOfTheTwoPairs) {
  TempDir dir;
  LlmcShard32 wide{{1, 2}};
  wide.version = 1;  // the uint16 version under the uint32 magic
  write_bytes(dir.file("w.bin"), wide.bytes());
  std::string msg = bad_input_message([&] { open_llmc_source(dir.file("w.bin"), 256); });
  EXPECT_TRUE(contains(msg, dir.file("w.bin"))) << msg;
  EXPECT_TRUE(contains(msg,
                       "unsupported version at byte 4: expected 7 (the version of magic 20240801, uint32 "
                       "tokens), got 1"))
      << msg;

  LlmcShard narrow{{1, 2}};
  narrow.version = 7;  // the uint32 version under the uint16 magic
  write_bytes(dir.file("n.bin"), narrow.bytes());
  msg = bad_input_message([&] { open_llmc_source(dir.file("n.bin"), 256); });
  EXPECT_TRUE(contains(msg,
                       "unsupported version at byte 4: expected 1 (the version of magic 20240520, uint16 "
                       "tokens), got 7"))
      << msg;
}

TEST(LlmcSource, Uint32SizeIsCheckedInFourByteTokens) {
  TempDir dir;
  LlmcShard32 s{{1, 2, 3}};
  s.header_count = 5;  // bytes [1024, 1044), the file is 1036 bytes
  write_bytes(dir.file("t.bin"), s.bytes());
  const std::string msg = bad_input_message([&] { open_llmc_source(dir.file("t.bin"), 256); });
  EXPECT_TRUE(contains(msg,
                       "byte 8 says 5 tokens, i.e. bytes [1024, 1044), but the file is 1036 bytes: room for 3 "
                       "tokens"))
      << msg;
}

TEST(LlmcSource, GlobOrderIsBytewiseSortedNotCreationOrder) {
  TempDir dir;
  write_llmc(dir.file("c9.bin"), {9});
  write_llmc(dir.file("b.bin"), {2});
  write_llmc(dir.file("c10.bin"), {10});
  write_llmc(dir.file("a.bin"), {1});
  write_llmc(dir.file("B.bin"), {0});  // uppercase sorts before lowercase bytewise
  auto src = open_llmc_source(dir.file("*.bin"), 256);
  EXPECT_EQ(read_all(*src), (std::vector<int32_t>{0, 1, 2, 10, 9}));
  EXPECT_EQ(src->file_path(0), dir.file("B.bin"));
  EXPECT_EQ(src->file_path(4), dir.file("c9.bin"));
}

TEST(LlmcSource, BadMagicNamesFileExpectedGotAndByte0) {
  TempDir dir;
  LlmcShard s{{1, 2, 3}};
  s.magic = 12345;
  write_bytes(dir.file("bad.bin"), s.bytes());
  const std::string msg = bad_input_message([&] { open_llmc_source(dir.file("bad.bin"), 256); });
  EXPECT_TRUE(contains(msg, dir.file("bad.bin"))) << msg;
  EXPECT_TRUE(contains(msg, "at byte 0")) << msg;
  EXPECT_TRUE(contains(msg, "expected 20240520 (uint16 tokens) or 20240801 (uint32 tokens), got 12345")) << msg;
}

TEST(LlmcSource, BadVersionNamesByte4) {
  TempDir dir;
  LlmcShard s{{1, 2, 3}};
  s.version = 2;
  write_bytes(dir.file("v2.bin"), s.bytes());
  const std::string msg = bad_input_message([&] { open_llmc_source(dir.file("v2.bin"), 256); });
  EXPECT_TRUE(contains(msg, dir.file("v2.bin"))) << msg;
  EXPECT_TRUE(contains(msg, "at byte 4")) << msg;
  EXPECT_TRUE(contains(msg, "expected 1")) << msg;
  EXPECT_TRUE(contains(msg, "got 2")) << msg;
}

TEST(LlmcSource, TruncatedFileNamesHeaderCountAndRoom) {
  TempDir dir;
  LlmcShard s{iota_tokens(7, 0)};
  s.header_count = 10;  // says 10 tokens (ends at byte 1044) but holds 7 (file is 1038 bytes)
  write_bytes(dir.file("trunc.bin"), s.bytes());
  const std::string msg = bad_input_message([&] { open_llmc_source(dir.file("trunc.bin"), 256); });
  EXPECT_TRUE(contains(msg, dir.file("trunc.bin"))) << msg;
  EXPECT_TRUE(contains(msg, "truncated")) << msg;
  EXPECT_TRUE(contains(msg, "byte 8 says 10 tokens")) << msg;
  EXPECT_TRUE(contains(msg, "bytes [1024, 1044)")) << msg;
  EXPECT_TRUE(contains(msg, "1038 bytes")) << msg;
  EXPECT_TRUE(contains(msg, "room for 7 tokens")) << msg;
}

TEST(LlmcSource, OddTruncationCountsWholeTokens) {
  TempDir dir;
  std::string bytes = LlmcShard{iota_tokens(4, 0)}.bytes();
  bytes.pop_back();  // 1031 bytes: 3.5 tokens of room
  write_bytes(dir.file("odd.bin"), bytes);
  const std::string msg = bad_input_message([&] { open_llmc_source(dir.file("odd.bin"), 256); });
  EXPECT_TRUE(contains(msg, "1031 bytes")) << msg;
  EXPECT_TRUE(contains(msg, "room for 3 tokens")) << msg;
}

TEST(LlmcSource, TrailingBytesAreRefused) {
  TempDir dir;
  write_bytes(dir.file("long.bin"), LlmcShard{iota_tokens(4, 0)}.bytes() + std::string(6, '\0'));
  const std::string msg = bad_input_message([&] { open_llmc_source(dir.file("long.bin"), 256); });
  EXPECT_TRUE(contains(msg, dir.file("long.bin"))) << msg;
  EXPECT_TRUE(contains(msg, "6 trailing bytes")) << msg;
  EXPECT_TRUE(contains(msg, "end at byte 1032")) << msg;
  EXPECT_TRUE(contains(msg, "1038 bytes")) << msg;
}

TEST(LlmcSource, FileShorterThanHeader) {
  TempDir dir;
  write_bytes(dir.file("short.bin"), LlmcShard{{}}.bytes().substr(0, 100));
  const std::string msg = bad_input_message([&] { open_llmc_source(dir.file("short.bin"), 256); });
  EXPECT_TRUE(contains(msg, dir.file("short.bin"))) << msg;
  EXPECT_TRUE(contains(msg, "is 100 bytes, shorter than the 1024-byte header")) << msg;
}

TEST(LlmcSource, EmptyFileAndZeroTokenFile) {
  TempDir dir;
  write_bytes(dir.file("empty.bin"), "");
  std::string msg = bad_input_message([&] { open_llmc_source(dir.file("empty.bin"), 256); });
  EXPECT_TRUE(contains(msg, dir.file("empty.bin"))) << msg;
  EXPECT_TRUE(contains(msg, "is empty (0 bytes)")) << msg;

  write_llmc(dir.file("zero.bin"), {});
  msg = bad_input_message([&] { open_llmc_source(dir.file("zero.bin"), 256); });
  EXPECT_TRUE(contains(msg, dir.file("zero.bin"))) << msg;
  EXPECT_TRUE(contains(msg, "byte 8 says 0 tokens")) << msg;
}

TEST(LlmcSource, TokenAtOrAboveVocabNamesValueVocabFileAndByte) {
  TempDir dir;
  write_llmc(dir.file("s0.bin"), {1, 2, 3});
  // Bad tokens at index 3 and 5 of the second shard: the first one is reported, at byte 1024 + 2*3.
  write_llmc(dir.file("s1.bin"), {4, 5, 50256, 50257, 7, 60000});
  const std::string msg = bad_input_message([&] { open_llmc_source(dir.file("s*.bin"), 50257); });
  EXPECT_TRUE(contains(msg, dir.file("s1.bin"))) << msg;
  EXPECT_FALSE(contains(msg, dir.file("s0.bin"))) << msg;
  EXPECT_TRUE(contains(msg, "token 50257 at byte 1030")) << msg;
  EXPECT_TRUE(contains(msg, "token index 3")) << msg;
  EXPECT_TRUE(contains(msg, "model.vocab_size 50257")) << msg;

  // vocab_size - 1 is the largest valid token.
  write_llmc(dir.file("ok.bin"), {50256, 0});
  EXPECT_EQ(open_llmc_source(dir.file("ok.bin"), 50257)->size(), 2);
}

TEST(LlmcSource, GlobMatchingNothingNamesPattern) {
  TempDir dir;
  const std::string pattern = dir.file("nothing_*.bin");
  const std::string msg = bad_input_message([&] { open_llmc_source(pattern, 256); });
  EXPECT_TRUE(contains(msg, "'" + pattern + "' matches no file")) << msg;
}

TEST(LlmcSource, MissingPlainFileIsNamed) {
  TempDir dir;
  const std::string path = dir.file("missing.bin");
  const std::string msg = bad_input_message([&] { open_llmc_source(path, 256); });
  EXPECT_TRUE(contains(msg, "'" + path + "' does not exist")) << msg;
}

TEST(LlmcSource, DirectoryMatchIsRefused) {
  TempDir dir;
  std::filesystem::create_directory(dir.file("d.bin"));
  const std::string msg = bad_input_message([&] { open_llmc_source(dir.file("*.bin"), 256); });
  EXPECT_TRUE(contains(msg, dir.file("d.bin") + "', which is not a regular file")) << msg;
}

TEST(FindFirstTokenAtLeast, FindsTheFirstOverManyChunks) {
  std::vector<uint16_t> t(1'000'003, 7);
  EXPECT_EQ(find_first_token_at_least(t.data(), static_cast<int64_t>(t.size()), 8), -1);
  t[900'000] = 100;
  t[700'001] = 8;
  t[1'000'002] = 9;
  EXPECT_EQ(find_first_token_at_least(t.data(), static_cast<int64_t>(t.size()), 8), 700'001);
  EXPECT_EQ(find_first_token_at_least(t.data(), static_cast<int64_t>(t.size()), 9), 900'000);
  EXPECT_EQ(find_first_token_at_least(t.data(), static_cast<int64_t>(t.size()), 101), -1);
  EXPECT_EQ(find_first_token_at_least(t.data(), static_cast<int64_t>(t.size()), 7), 0);
  EXPECT_EQ(find_first_token_at_least(t.data(), static_cast<int64_t>(t.size()), 65536), -1);
  EXPECT_EQ(find_first_token_at_least(t.data(), 0, 1), -1);
}

TEST(FindFirstTokenAtLeast, Uint32InMemoryAndInFile) {
  std::vector<uint32_t> t(700'001, 65536);
  t[400'000] = 151935;
  t[650'000] = 151936;
  EXPECT_EQ(find_first_token_at_least(t.data(), static_cast<int64_t>(t.size()), 151936), 650'000);
  EXPECT_EQ(find_first_token_at_least(t.data(), static_cast<int64_t>(t.size()), 100000), 400'000);
  EXPECT_EQ(find_first_token_at_least(t.data(), static_cast<int64_t>(t.size()), 151937), -1);
  TempDir dir;
  write_llmc32(dir.file("big.bin"), t);  // three 256 Ki-token chunks of the in-file scan
  const int64_t n = static_cast<int64_t>(t.size());
  EXPECT_EQ(find_first_token_at_least_in_file(dir.file("big.bin"), 1024, n, 151936, TokenWidth::kU32), 650'000);
  EXPECT_EQ(find_first_token_at_least_in_file(dir.file("big.bin"), 1024, n, 65537, TokenWidth::kU32), 400'000);
  EXPECT_EQ(find_first_token_at_least_in_file(dir.file("big.bin"), 1024, n, 151937, TokenWidth::kU32), -1);
}

TEST(FindFirstTokenAtLeast, InFileScansChunksAndReportsTheFirstBadToken) {
  TempDir dir;
  std::vector<uint16_t> t(1'200'001, 3);  // three 512 Ki-token chunks, the last one short
  t[1'100'000] = 9;
  t[600'000] = 500;  // in the second chunk
  write_llmc(dir.file("big.bin"), t);
  const int64_t n = static_cast<int64_t>(t.size());
  EXPECT_EQ(find_first_token_at_least_in_file(dir.file("big.bin"), 1024, n, 9), 600'000);
  EXPECT_EQ(find_first_token_at_least_in_file(dir.file("big.bin"), 1024, n, 501), -1);
  EXPECT_EQ(find_first_token_at_least_in_file(dir.file("big.bin"), 1024, n, 4), 600'000);
  EXPECT_EQ(find_first_token_at_least_in_file(dir.file("big.bin"), 1024, n, 3), 0);

  const std::string msg = bad_input_message([&] { open_llmc_source(dir.file("big.bin"), 256); });
  EXPECT_TRUE(contains(msg, "token 500 at byte 1201024")) << msg;  // 1024 + 2 * 600000
  EXPECT_TRUE(contains(msg, dir.file("big.bin"))) << msg;
}

}  // namespace
}  // namespace st
