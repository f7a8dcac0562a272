// Bad uint32 shards and bad loss masks given to `shardtrain train`: each run ends before step 1 with exit code 2 and an
// error line that names the file, the field or byte offset, and the expected and actual values.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "../common/run_shardtrain.h"
#include "../common/temp_dir.h"
#include "../data/data_test_util.h"
#include "shardtrain/data/llmc_writer.h"

namespace st::testing {
namespace {

// 3000 tokens 0, 1, 2, ... (mod 256) as a uint32 shard, and a mask keeping every other one.
std::vector<uint32_t> tokens32() {
  std::vector<uint32_t> t(3000);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint32_t>(i % 256);
  return t;
}
std::vector<uint8_t> every_other() {
  std::vector<uint8_t> m(3000);
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<uint8_t>(i % 2);
  return m;
}

// The run on `pattern`: its output, with the exit code checked to be 2 and no step taken.
std::string refused(const std::string& pattern) {
  const CliResult r = run_shardtrain("train --data.format=llmc --data.path=" + pattern + " --train.steps=2", "exec");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(r.output.find("step "), std::string::npos) << r.output;
  return r.output;
}

bool has(const std::string& output, const std::string& what) { return output.find(what) != std::string::npos; }

// Each case writes a.bin and a.mask into an empty directory; the run on a.bin must be refused with `expected` (where
// DIR stands for the directory) in its output.
struct BadCase {
  const char* what;
  std::function<void(const TempDir&)> write;
  std::string expected;
};

std::string with_dir(std::string text, const TempDir& dir) {
  for (size_t at; (at = text.find("DIR/")) != std::string::npos;) text.replace(at, 3, dir.str());
  return text;
}

TEST(LossMaskShard, BadShardsAndMasksNameFileFieldExpectedAndActual) {
  const std::vector<BadCase> cases = {
      {"a uint32 shard with the uint16 version",
       [](const TempDir& d) {
         LlmcShard32 s{tokens32()};
         s.version = 1;
         write_bytes(d.file("a.bin"), s.bytes());
       },
       "llm.c data file DIR/a.bin: unsupported version at byte 4: expected 7 (the version of magic 20240801, uint32 "
       "tokens), got 1"},
      {"a mask with a token shard's magic",
       [](const TempDir& d) {
         write_bytes(d.file("a.bin"), LlmcShard32{tokens32()}.bytes());
         LlmcMask m{every_other()};
         m.magic = 20240520;
         write_bytes(d.file("a.mask"), m.bytes());
       },
       "loss mask DIR/a.mask: bad magic at byte 0: expected 20261201 (an llm.c loss mask), got 20240520"},
      {"a mask one token short",
       [](const TempDir& d) {
         write_bytes(d.file("a.bin"), LlmcShard32{tokens32()}.bytes());
         std::vector<uint8_t> shorter = every_other();
         shorter.resize(2999);
         write_bytes(d.file("a.mask"), LlmcMask{shorter}.bytes());
       },
       "loss mask DIR/a.mask: the header at byte 8 says 2999 tokens, but its token shard DIR/a.bin holds 3000: "
       "expected 3000, got 2999"},
      {"a mask byte of 3",
       [](const TempDir& d) {
         write_bytes(d.file("a.bin"), LlmcShard32{tokens32()}.bytes());
         std::vector<uint8_t> bad = every_other();
         bad[1234] = 3;
         write_bytes(d.file("a.mask"), LlmcMask{bad}.bytes());
       },
       "loss mask DIR/a.mask: byte value 3 at byte 2258 (token index 1234): expected 0 (not a target) or 1 (a "
       "target)"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    TempDir dir;
    c.write(dir);
    const std::string out = refused(dir.file("a.bin"));
    EXPECT_TRUE(has(out, with_dir(c.expected, dir))) << out;
  }
}

// data.loss_mask=off reads no mask: the same broken mask trains.
TEST(LossMaskShard, OffIgnoresABrokenMask) {
  TempDir dir;
  write_bytes(dir.file("a.bin"), LlmcShard32{tokens32()}.bytes());
  write_bytes(dir.file("a.mask"), "not a mask");
  const CliResult r = run_shardtrain("train --data.format=llmc --data.path=" + dir.file("a.bin") +
                                         " --data.loss_mask=off --train.steps=2 --train.eval_batches=1 "
                                         "--train.sample_tokens=0 --model.seq_len=16 --train.micro_batch=2 "
                                         "--train.global_batch=2",
                                     "OMP_NUM_THREADS=1 exec");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "step      2/2")) << r.output;
}

// A mask is tied to its shard by a record of the shard's content in its header, not by length alone: shard b's mask
// put beside shard a, of the same length, is refused naming both files.
TEST(LossMaskShard, AMaskOfAnotherShardOfTheSameLengthIsRefusedNamingBoth) {
  TempDir dir;
  std::vector<int32_t> a(3000), b(3000);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<int32_t>(i % 256);
    b[i] = static_cast<int32_t>((i * 7 + 3) % 256);
  }
  const std::vector<uint8_t> mask = every_other();
  for (const auto& [name, tokens] : {std::pair{"a.bin", a}, std::pair{"b.bin", b}}) {
    LlmcShardWriter w(dir.file(name), 32, /*with_mask=*/true);
    w.write(tokens.data(), mask.data(), static_cast<int64_t>(tokens.size()));
    w.close();
  }
  std::filesystem::copy_file(dir.file("b.mask"), dir.file("a.mask"), std::filesystem::copy_options::overwrite_existing);
  const std::string out = refused(dir.file("a.bin"));
  EXPECT_TRUE(has(out, "loss mask " + dir.file("a.mask") + " belongs to another shard")) << out;
  EXPECT_TRUE(has(out, "its token shard " + dir.file("a.bin"))) << out;
}

// A mask of format version 1 records no shard: it is read, with a warning naming it.
TEST(LossMaskShard, AVersion1MaskIsReadWithAWarning) {
  TempDir dir;
  write_bytes(dir.file("a.bin"), LlmcShard32{tokens32()}.bytes());
  write_bytes(dir.file("a.mask"), LlmcMask{every_other()}.bytes());
  const CliResult r = run_shardtrain("train --data.format=llmc --data.path=" + dir.file("a.bin") +
                                         " --train.steps=1 --train.eval_batches=1 --train.sample_tokens=0 "
                                         "--model.seq_len=16 --train.micro_batch=2 --train.global_batch=2",
                                     "OMP_NUM_THREADS=1 exec");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "loss mask " + dir.file("a.mask") +
                                " is format version 1, which records no token shard: it is tied to " +
                                dir.file("a.bin") + " by its length only"))
      << r.output;
}

}  // namespace
}  // namespace st::testing
