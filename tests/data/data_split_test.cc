#include "shardtrain/data/data_split.h"

#include <gtest/gtest.h>

#include "data_test_util.h"
#include "shardtrain/data/slice_source.h"
#include "shardtrain/data/source_factory.h"

namespace st {
namespace {

using testing::bad_input_message;
using testing::contains;
using testing::read_all;
using testing::TempDir;
using testing::write_bytes;
using testing::write_llmc;

std::string bytes_0_to(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>(i % 256));
  return s;
}

TEST(DataSplit, HoldoutTakesTheLastFractionForValidation) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), bytes_0_to(1000));
  DataConfig cfg;
  cfg.path = dir.file("a.txt");
  cfg.format = DataFormat::kText;
  cfg.val_holdout = 0.1;
  DataSplit d = open_data(cfg, 256, 16);
  EXPECT_EQ(d.train->size(), 900);
  EXPECT_EQ(d.val->size(), 100);
  std::vector<int32_t> val = read_all(*d.val);
  EXPECT_EQ(val.front(), 900 % 256);
  EXPECT_EQ(val.back(), 999 % 256);
  std::vector<int32_t> train = read_all(*d.train);
  EXPECT_EQ(train.back(), 899 % 256);
  EXPECT_EQ(d.val->vocab_size(), 256);
  EXPECT_TRUE(contains(d.val->describe(), "tokens [900, 1000)")) << d.val->describe();
}

TEST(DataSplit, HoldoutIsFloorOfFraction) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), bytes_0_to(1001));
  DataConfig cfg;
  cfg.path = dir.file("a.txt");
  cfg.val_holdout = 0.05;  // 50.05 -> 50
  DataSplit d = open_data(cfg, 256, 8);
  EXPECT_EQ(d.val->size(), 50);
  EXPECT_EQ(d.train->size(), 951);
}

TEST(DataSplit, HoldoutOfLlmcShardsAcrossABoundary) {
  TempDir dir;
  std::vector<uint16_t> a(60), b(40);
  for (int i = 0; i < 60; ++i) a[i] = static_cast<uint16_t>(i);
  for (int i = 0; i < 40; ++i) b[i] = static_cast<uint16_t>(60 + i);
  write_llmc(dir.file("s0.bin"), a);
  write_llmc(dir.file("s1.bin"), b);
  DataConfig cfg;
  cfg.path = dir.file("s*.bin");
  cfg.format = DataFormat::kLlmc;
  cfg.val_holdout = 0.25;
  DataSplit d = open_data(cfg, 1000, 8);
  EXPECT_EQ(d.train->size(), 75);
  EXPECT_EQ(d.val->size(), 25);
  EXPECT_EQ(read_all(*d.val).front(), 75);
  EXPECT_EQ(read_all(*d.train)[74], 74);
}

TEST(DataSplit, TooLittleDataForAWindowNamesAllNumbers) {
  TempDir dir;
  write_bytes(dir.file("small.txt"), bytes_0_to(100));
  DataConfig cfg;
  cfg.path = dir.file("small.txt");
  cfg.val_holdout = 0.05;
  const std::string msg = bad_input_message([&] { open_data(cfg, 256, 64); });
  EXPECT_TRUE(contains(msg, dir.file("small.txt"))) << msg;
  EXPECT_TRUE(contains(msg, "holds 100 tokens")) << msg;
  EXPECT_TRUE(contains(msg, "train = 95 and val = 5")) << msg;
  EXPECT_TRUE(contains(msg, "model.seq_len + 1 = 65")) << msg;
}

TEST(DataSplit, HoldoutOutsideOpenUnitIntervalIsRefused) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), bytes_0_to(1000));
  DataConfig cfg;
  cfg.path = dir.file("a.txt");
  cfg.val_holdout = 0.0;
  EXPECT_TRUE(contains(bad_input_message([&] { open_data(cfg, 256, 8); }), "data.val_holdout must be in (0, 1)"));
  cfg.val_holdout = 1.0;
  EXPECT_TRUE(contains(bad_input_message([&] { open_data(cfg, 256, 8); }), "got 1"));
}

TEST(DataSplit, SeparateValPathUsesWholeFiles) {
  TempDir dir;
  write_bytes(dir.file("train.txt"), bytes_0_to(300));
  write_bytes(dir.file("val.txt"), "0123456789");
  DataConfig cfg;
  cfg.path = dir.file("train.txt");
  cfg.val_path = dir.file("val.txt");
  DataSplit d = open_data(cfg, 256, 8);
  EXPECT_EQ(d.train->size(), 300);
  EXPECT_EQ(d.val->size(), 10);
  EXPECT_EQ(read_all(*d.val).front(), '0');

  const std::string msg = bad_input_message([&] { open_data(cfg, 256, 16); });
  EXPECT_TRUE(contains(msg, "data.val_path '" + dir.file("val.txt") + "' holds 10 tokens")) << msg;
  EXPECT_TRUE(contains(msg, "model.seq_len + 1 = 17")) << msg;
}

TEST(SliceSource, ReadsThroughWithOffset) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), "abcdefghij");
  std::shared_ptr<const TokenSource> all = open_token_source(dir.file("a.txt"), DataFormat::kText, 256);
  SliceSource s(all, 3, 7);
  EXPECT_EQ(s.size(), 4);
  EXPECT_EQ(read_all(s), (std::vector<int32_t>{'d', 'e', 'f', 'g'}));
  std::vector<int32_t> two(2);
  s.read(2, 2, two.data());
  EXPECT_EQ(two, (std::vector<int32_t>{'f', 'g'}));
  EXPECT_THROW(s.read(3, 2, two.data()), Error);  // past the slice's end, though inside the parent
}

}  // namespace
}  // namespace st
