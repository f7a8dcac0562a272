// Loss masks of llm.c shards (NAME.mask beside NAME.bin): reading, validation, data.loss_mask, the holdout split,
// and what the sampler makes of them (targets of kNoTarget, the counts of a step's targets).
#include <gtest/gtest.h>

#include <vector>

#include "data_test_util.h"
#include "shardtrain/data/data_split.h"
#include "shardtrain/data/llmc_source.h"
#include "shardtrain/data/sampler.h"
#include "shardtrain/data/source_factory.h"

namespace st {
namespace {

using testing::bad_input_message;
using testing::contains;
using testing::LlmcMask;
using testing::read_all;
using testing::TempDir;
using testing::write_bytes;
using testing::write_llmc;
using testing::write_llmc32;
using testing::write_mask;

std::vector<uint8_t> read_all_mask(const TokenSource& src) {
  std::vector<uint8_t> out(static_cast<size_t>(src.size()), 7);
  src.read_mask(0, src.size(), out.data());
  return out;
}

TEST(LossMask, MaskPathReplacesBinAndOtherwiseAppends) {
  EXPECT_EQ(mask_path_for("data/train_000.bin"), "data/train_000.mask");
  EXPECT_EQ(mask_path_for("x.bin.bin"), "x.bin.mask");
  EXPECT_EQ(mask_path_for("shard.tok"), "shard.tok.mask");
  EXPECT_EQ(mask_path_for(".bin"), ".bin.mask");
  EXPECT_EQ(llmc_token_bits(50257), 16);
  EXPECT_EQ(llmc_token_bits(65536), 16);
  EXPECT_EQ(llmc_token_bits(65537), 32);
  EXPECT_EQ(llmc_token_bits(151936), 32);
}

TEST(LossMask, MasksOfAGlobConcatenateLikeTheirTokens) {
  TempDir dir;
  write_llmc(dir.file("t_0.bin"), {1, 2, 3, 4});
  write_mask(dir.file("t_0.bin"), {0, 1, 1, 0});
  write_llmc32(dir.file("t_1.bin"), {70000, 5, 6});
  write_mask(dir.file("t_1.bin"), {1, 0, 1});
  auto src = open_llmc_source(dir.file("t_*.bin"), 70001);
  ASSERT_TRUE(src->has_loss_mask());
  EXPECT_EQ(read_all(*src), (std::vector<int32_t>{1, 2, 3, 4, 70000, 5, 6}));
  EXPECT_EQ(read_all_mask(*src), (std::vector<uint8_t>{0, 1, 1, 0, 1, 0, 1}));
  std::vector<uint8_t> part(3);
  src->read_mask(3, 3, part.data());  // across the boundary
  EXPECT_EQ(part, (std::vector<uint8_t>{0, 1, 0}));
  EXPECT_TRUE(contains(src->describe(), "loss masks: 4 targets")) << src->describe();
  // The data glob does not pick the masks up.
  EXPECT_EQ(src->num_files(), 2);
}

TEST(LossMask, OffReadsNoMaskEvenABrokenOne) {
  TempDir dir;
  write_llmc(dir.file("a.bin"), {1, 2, 3});
  LlmcMask bad{{1, 1, 1}};
  bad.magic = 1;
  write_bytes(dir.file("a.mask"), bad.bytes());
  auto src = open_llmc_source(dir.file("a.bin"), 256, "data.path", LossMaskMode::kOff);
  EXPECT_FALSE(src->has_loss_mask());
  EXPECT_EQ(read_all_mask(*src), (std::vector<uint8_t>{1, 1, 1}));
  // auto reads it, and refuses it.
  const std::string msg = bad_input_message([&] { open_llmc_source(dir.file("a.bin"), 256); });
  EXPECT_TRUE(contains(msg, "loss mask " + dir.file("a.mask") + ": bad magic at byte 0: expected 20261201")) << msg;
}

TEST(LossMask, NoMaskAnywhereReadsAsEveryTokenATarget) {
  TempDir dir;
  write_llmc(dir.file("a.bin"), {1, 2, 3});
  auto src = open_llmc_source(dir.file("a.bin"), 256);
  EXPECT_FALSE(src->has_loss_mask());
  EXPECT_EQ(read_all_mask(*src), (std::vector<uint8_t>{1, 1, 1}));
}

TEST(LossMask, AMissingMaskInAGlobIsRefusedNamingIt) {
  TempDir dir;
  for (const char* name : {"s_0.bin", "s_1.bin", "s_2.bin"}) write_llmc(dir.file(name), {1, 2});
  write_mask(dir.file("s_0.bin"), {1, 1});
  write_mask(dir.file("s_2.bin"), {1, 1});
  std::string msg = bad_input_message([&] { open_llmc_source(dir.file("s_*.bin"), 256); });
  EXPECT_TRUE(contains(msg, "data.path '" + dir.file("s_*.bin") + "': loss mask " + dir.file("s_1.mask") + " of " +
                                dir.file("s_1.bin") + " is missing, but " + dir.file("s_0.bin") + " has one"))
      << msg;
  // The first file without one and a later one with one: the same rule.
  std::filesystem::remove(dir.file("s_0.mask"));
  std::filesystem::remove(dir.file("s_2.mask"));
  write_mask(dir.file("s_1.bin"), {1, 1});
  msg = bad_input_message([&] { open_llmc_source(dir.file("s_*.bin"), 256, "data.val_path"); });
  EXPECT_TRUE(contains(msg, "data.val_path '")) << msg;
  EXPECT_TRUE(contains(msg, "loss mask " + dir.file("s_0.mask") + " of " + dir.file("s_0.bin") + " is missing")) << msg;
}

TEST(LossMask, AMaskOfTheWrongLengthIsRefused) {
  TempDir dir;
  write_llmc(dir.file("a.bin"), {1, 2, 3, 4});
  write_mask(dir.file("a.bin"), {1, 1, 1});  // its header says 3 tokens
  std::string msg = bad_input_message([&] { open_llmc_source(dir.file("a.bin"), 256); });
  EXPECT_TRUE(contains(msg, "loss mask " + dir.file("a.mask") +
                                ": the header at byte 8 says 3 tokens, but its token "
                                "shard " +
                                dir.file("a.bin") + " holds 4: expected 4, got 3"))
      << msg;

  LlmcMask truncated{{1, 1}};
  truncated.header_count = 4;  // says 4, holds 2
  write_bytes(dir.file("a.mask"), truncated.bytes());
  msg = bad_input_message([&] { open_llmc_source(dir.file("a.bin"), 256); });
  EXPECT_TRUE(contains(msg, "loss mask " + dir.file("a.mask") +
                                " is truncated: the header at byte 8 says 4 bytes, "
                                "i.e. bytes [1024, 1028), but the file is 1026 bytes: room for 2 bytes"))
      << msg;

  write_bytes(dir.file("a.mask"), LlmcMask{{1, 1, 1, 1}}.bytes() + std::string(3, '\1'));
  msg = bad_input_message([&] { open_llmc_source(dir.file("a.bin"), 256); });
  EXPECT_TRUE(contains(msg, "loss mask " + dir.file("a.mask") + " has 3 trailing bytes")) << msg;

  write_bytes(dir.file("a.mask"), LlmcMask{{}}.bytes().substr(0, 10));
  msg = bad_input_message([&] { open_llmc_source(dir.file("a.bin"), 256); });
  EXPECT_TRUE(contains(msg, "loss mask " + dir.file("a.mask") + " is 10 bytes, shorter than the 1024-byte header"))
      << msg;
}

TEST(LossMask, BadMagicVersionAndByteValuesNameFileAndOffset) {
  TempDir dir;
  write_llmc(dir.file("a.bin"), {1, 2, 3, 4});
  LlmcMask m{{1, 0, 1, 1}};
  m.version = 3;
  write_bytes(dir.file("a.mask"), m.bytes());
  std::string msg = bad_input_message([&] { open_llmc_source(dir.file("a.bin"), 256); });
  EXPECT_TRUE(contains(msg, "loss mask " + dir.file("a.mask") +
                                ": unsupported version at byte 4: expected 2 (or 1, which records no shard), got 3"))
      << msg;

  write_mask(dir.file("a.bin"), {1, 0, 2, 255});
  msg = bad_input_message([&] { open_llmc_source(dir.file("a.bin"), 256); });
  EXPECT_TRUE(contains(msg, "loss mask " + dir.file("a.mask") +
                                ": byte value 2 at byte 1026 (token index 2): "
                                "expected 0 (not a target) or 1 (a target)"))
      << msg;
}

TEST(LossMask, ABadByteFarIntoALargeMaskIsFoundByTheParallelScan) {
  TempDir dir;
  std::vector<uint16_t> tokens(3'000'001, 3);
  std::vector<uint8_t> mask(tokens.size(), 1);
  mask[17] = 0;
  mask[2'500'000] = 0;
  write_llmc(dir.file("big.bin"), tokens);
  write_mask(dir.file("big.bin"), mask);
  const MaskScan clean = scan_mask_file(dir.file("big.mask"), 1024, static_cast<int64_t>(mask.size()));
  EXPECT_EQ(clean.first_bad, -1);
  EXPECT_EQ(clean.targets, 3'000'001 - 2);
  EXPECT_TRUE(contains(open_llmc_source(dir.file("big.bin"), 256)->describe(), "loss masks: 2999999 targets"));

  mask[2'900'000] = 9;
  mask[1'100'000] = 4;  // the first bad byte, in the second 1 MiB chunk
  write_mask(dir.file("big.bin"), mask);
  EXPECT_EQ(scan_mask_file(dir.file("big.mask"), 1024, static_cast<int64_t>(mask.size())).first_bad, 1'100'000);
  const std::string msg = bad_input_message([&] { open_llmc_source(dir.file("big.bin"), 256); });
  EXPECT_TRUE(contains(msg, "byte value 4 at byte 1101024 (token index 1100000)")) << msg;
}

TEST(LossMask, MasksThatMarkNoTargetAreRefused) {
  TempDir dir;
  write_llmc(dir.file("a.bin"), {1, 2, 3});
  write_mask(dir.file("a.bin"), {0, 0, 0});
  const std::string msg = bad_input_message([&] { open_llmc_source(dir.file("a.bin"), 256); });
  EXPECT_TRUE(contains(msg, "mark none of its 3 tokens as a target")) << msg;
}

TEST(LossMask, TextHasNoMask) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), "hello");
  write_bytes(dir.file("a.txt.mask"), LlmcMask{{0, 0, 0, 0, 0}}.bytes());
  auto src = open_token_source(dir.file("a.txt"), DataFormat::kText, 256);
  EXPECT_FALSE(src->has_loss_mask());
}

TEST(LossMask, HoldoutSliceKeepsTheMaskAndValPathDecidesForItself) {
  TempDir dir;
  std::vector<uint16_t> tokens(100);
  std::vector<uint8_t> mask(100);
  for (int i = 0; i < 100; ++i) {
    tokens[i] = static_cast<uint16_t>(i);
    mask[i] = static_cast<uint8_t>(i % 3 == 0);
  }
  write_llmc(dir.file("train.bin"), tokens);
  write_mask(dir.file("train.bin"), mask);
  DataConfig cfg;
  cfg.format = DataFormat::kLlmc;
  cfg.path = dir.file("train.bin");
  cfg.val_holdout = 0.2;
  DataSplit split = open_data(cfg, 256, 8);
  ASSERT_TRUE(split.val->has_loss_mask());
  const std::vector<uint8_t> val = read_all_mask(*split.val);
  EXPECT_EQ(val, std::vector<uint8_t>(mask.begin() + 80, mask.end()));
  EXPECT_EQ(read_all_mask(*split.train), std::vector<uint8_t>(mask.begin(), mask.begin() + 80));

  write_llmc(dir.file("val.bin"), std::vector<uint16_t>(tokens.begin(), tokens.begin() + 20));
  cfg.val_path = dir.file("val.bin");
  split = open_data(cfg, 256, 8);
  EXPECT_TRUE(split.train->has_loss_mask());
  EXPECT_FALSE(split.val->has_loss_mask());

  cfg.loss_mask = LossMaskMode::kOff;
  split = open_data(cfg, 256, 8);
  EXPECT_FALSE(split.train->has_loss_mask());
}

// A stream of tokens 0, 1, 2, ... with mask byte i = (i % 4 != 1).
class MaskedIota final : public TokenSource {
 public:
  explicit MaskedIota(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  void read(int64_t offset, int64_t count, int32_t* out) const override {
    for (int64_t k = 0; k < count; ++k) out[k] = static_cast<int32_t>(offset + k);
  }
  std::string describe() const override { return "masked iota"; }
  int vocab_size() const override { return 1 << 30; }
  bool has_loss_mask() const override { return true; }
  void read_mask(int64_t offset, int64_t count, uint8_t* out) const override {
    for (int64_t k = 0; k < count; ++k) out[k] = (offset + k) % 4 != 1;
  }

 private:
  int64_t n_;
};

TEST(LossMask, SamplerMarksMaskedTargetsAndCountsEveryRanksTargets) {
  const MaskedIota src(1000);
  const int T = 10, world = 3;
  const int64_t B = 2, accum = 2;
  for (bool shuffle : {false, true}) {
    for (int64_t step : {0, 7}) {
      int64_t counted = 0;
      int64_t expected_step_targets = -1;
      for (int rank = 0; rank < world; ++rank) {
        const Sampler s(src, {T, B, rank, world, accum, 1234, shuffle});
        if (rank == 0) expected_step_targets = s.step_targets(step);
        EXPECT_EQ(s.step_targets(step), expected_step_targets) << "every rank computes the same count";
        for (int64_t micro = 0; micro < accum; ++micro) {
          std::vector<int32_t> in(B * T), tgt(B * T);
          s.fill(step, micro, in.data(), tgt.data());
          for (int64_t i = 0; i < B * T; ++i) {
            const int32_t token = in[i] + 1;  // the unmasked target
            if (token % 4 == 1) {
              EXPECT_EQ(tgt[i], kNoTarget) << "position " << i;
            } else {
              EXPECT_EQ(tgt[i], token) << "position " << i;
              ++counted;
            }
          }
        }
      }
      EXPECT_EQ(counted, expected_step_targets) << "shuffle " << shuffle << " step " << step;
      EXPECT_LT(counted, B * T * world * accum);
    }
  }
}

TEST(LossMask, EvalTargetsCountEveryRanksEvalBatches) {
  const MaskedIota src(305);  // 30 windows of T = 10: eval wraps around
  const int T = 10, world = 2;
  const int64_t B = 4, batches = 5;
  int64_t counted = 0;
  for (int rank = 0; rank < world; ++rank) {
    const Sampler s(src, {T, B, rank, world, 1, 0, false});
    for (int64_t i = 0; i < batches; ++i) {
      std::vector<int32_t> in(B * T), tgt(B * T);
      s.fill_eval(i, in.data(), tgt.data());
      for (int32_t t : tgt) counted += t >= 0;
    }
  }
  for (int rank = 0; rank < world; ++rank)
    EXPECT_EQ(Sampler(src, {T, B, rank, world, 1, 0, false}).eval_targets(batches), counted) << "rank " << rank;
  EXPECT_LT(counted, batches * B * world * T);
}

TEST(LossMask, WithoutAMaskEveryPositionIsATarget) {
  TempDir dir;
  std::vector<uint16_t> tokens(200, 5);
  write_llmc(dir.file("a.bin"), tokens);
  auto src = open_llmc_source(dir.file("a.bin"), 256);
  const Sampler s(*src, {10, 3, 1, 2, 4, 0, true});
  EXPECT_EQ(s.step_targets(5), 10 * 3 * 2 * 4);
  EXPECT_EQ(s.eval_targets(2), 2 * 3 * 2 * 10);
}

}  // namespace
}  // namespace st
