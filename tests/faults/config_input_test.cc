// A hostile --config and hostile values: what is not a regular file, what is too large, given twice, not finite,
// out of range, binary or huge. Each run must end at once with exit code 2 and a message that names the file or key,
// shows the value escaped and cut to a line, and says what was expected.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../common/run_shardtrain.h"
#include "../common/temp_dir.h"
#include "../data/data_test_util.h"

namespace st::testing {
namespace {

// The "error: ..." line of a run's output (the last one, if several).
std::string error_line(const std::string& output) {
  const auto at = output.rfind("error: ");
  if (at == std::string::npos) return "";
  return output.substr(at, output.find('\n', at) - at);
}

// Output bytes a terminal would obey: every control character other than a line break.
bool has_control_bytes(const std::string& output) {
  for (char c : output) {
    const auto b = static_cast<unsigned char>(c);
    if ((b < 0x20 && c != '\n') || b == 0x7F) return true;
  }
  return false;
}

TEST(ConfigInput, FifoIsRefusedWithoutWaitingForAWriter) {
  TempDir dir;
  const std::string fifo = dir.file("config.ini");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const CliResult r = run_bounded("train --config " + fifo);
  EXPECT_EQ(r.code, 2) << r.output;  // 124: timeout(1) ended a run blocked in open(2)
  EXPECT_NE(error_line(r.output).find("config file '" + fifo + "' is a FIFO"), std::string::npos) << r.output;
}

TEST(ConfigInput, CharacterDeviceIsRefusedUnread) {
  const CliResult r = run_bounded("train --config /dev/zero");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(error_line(r.output).find("config file '/dev/zero' is a character device, not a regular file"),
            std::string::npos)
      << r.output;
}

TEST(ConfigInput, FileOverOneMiBIsRefusedUnread) {
  TempDir dir;
  const std::string huge = dir.file("huge.ini");
  // 17 GiB, sparse: nothing is written, and a run that read it would need 17 GiB of memory.
  write_bytes(huge, "");
  ASSERT_EQ(::truncate(huge.c_str(), int64_t{17} << 30), 0);
  const CliResult r = run_bounded("train --config " + huge);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(error_line(r.output).find("config file '" + huge +
                                      "' is 18253611008 bytes (17.00 GiB), over the 1.00 MiB limit for a config file"),
            std::string::npos)
      << r.output;

  // At the limit a file is read (its unknown key is the error); one byte past it is not.
  const std::string key = "[train]\nstepz = 1\n";
  const std::string at_limit = dir.file("at_limit.ini");
  write_bytes(at_limit, key + "#" + std::string((1 << 20) - key.size() - 2, '-') + "\n");
  const CliResult ok = run_bounded("train --config " + at_limit);
  EXPECT_EQ(ok.code, 2) << ok.output;
  EXPECT_NE(error_line(ok.output).find("at_limit.ini:2: unknown key 'train.stepz'"), std::string::npos) << ok.output;
  const std::string past = dir.file("past.ini");
  write_bytes(past, key + "#" + std::string((1 << 20) - key.size() - 1, '-') + "\n");
  const CliResult over = run_bounded("train --config " + past);
  EXPECT_EQ(over.code, 2) << over.output;
  EXPECT_NE(error_line(over.output).find("is 1048577 bytes, over the 1.00 MiB limit"), std::string::npos)
      << over.output;
}

TEST(ConfigInput, ConfigGivenTwiceIsRefused) {
  TempDir dir;
  write_bytes(dir.file("a.ini"), "[train]\nsteps = 1\n");
  write_bytes(dir.file("b.ini"), "[train]\nsteps = 2\n");
  for (const std::string& args : {"--config " + dir.file("a.ini") + " --config " + dir.file("b.ini"),
                                  "--config=" + dir.file("a.ini") + " --config=" + dir.file("b.ini")}) {
    for (const char* command : {"train ", "topo "}) {
      const CliResult r = run_bounded(command + args);
      EXPECT_EQ(r.code, 2) << command << args << "\n" << r.output;
      EXPECT_NE(error_line(r.output).find("--config given twice ('" + dir.file("a.ini") + "', then '" +
                                          dir.file("b.ini") + "')"),
                std::string::npos)
          << r.output;
    }
  }
}

TEST(ConfigInput, EveryFloatingPointKeyRefusesInfAndNan) {
  const std::vector<std::string> keys = {"optim.lr",           "optim.min_lr",
                                         "optim.weight_decay", "optim.beta1",
                                         "optim.beta2",        "optim.eps",
                                         "optim.grad_clip",    "optim.offload_fraction",
                                         "data.val_holdout",   "dist.max_gpu_mem_gib",
                                         "dist.timeout_s",     "dist.rendezvous_timeout_s",
                                         "dist.bucket_mb"};
  for (const std::string& key : keys) {
    for (const std::string value : {"inf", "-inf", "nan", "infinity"}) {
      const CliResult r = run_bounded("train --" + key + "=" + value);
      EXPECT_EQ(r.code, 2) << key << "=" << value << "\n" << r.output;
      EXPECT_NE(error_line(r.output).find("command line: bad value '" + value + "' for " + key +
                                          " (expected a finite number)"),
                std::string::npos)
          << r.output;
    }
  }
  TempDir dir;
  write_bytes(dir.file("wd.ini"), "[optim]\nlr = 1e-3\nweight_decay = inf\n");
  const CliResult file = run_bounded("train --config " + dir.file("wd.ini"));
  EXPECT_EQ(file.code, 2) << file.output;
  EXPECT_NE(error_line(file.output).find("wd.ini:3: bad value 'inf' for optim.weight_decay (expected a finite number)"),
            std::string::npos)
      << file.output;
}

TEST(ConfigInput, FiniteValuesPastAKeysRangeAreRefused) {
  const CliResult timeout = run_bounded("train --dist.timeout_s=1e300");
  EXPECT_EQ(timeout.code, 2) << timeout.output;
  EXPECT_NE(error_line(timeout.output).find("dist.timeout_s must be in [0, 1e8] (0: no deadline) (got 1e+300)"),
            std::string::npos)
      << timeout.output;
  const CliResult mem = run_bounded("train --dist.max_gpu_mem_gib=1e30");
  EXPECT_EQ(mem.code, 2) << mem.output;
  EXPECT_NE(error_line(mem.output).find("dist.max_gpu_mem_gib must be in [0, 1048576]"), std::string::npos)
      << mem.output;
  const CliResult lr = run_bounded("train --optim.lr=1e39");
  EXPECT_EQ(lr.code, 2) << lr.output;
  EXPECT_NE(error_line(lr.output).find("bad value '1e39' for optim.lr (out of range [-3.4028235e+38, 3.4028235e+38])"),
            std::string::npos)
      << lr.output;
}

TEST(ConfigInput, OutOfRangeIntegerSaysSoWithTheRange) {
  const CliResult r = run_bounded("train --model.n_layer=99999999999");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(
      error_line(r.output).find("bad value '99999999999' for model.n_layer (out of range [-2147483648, 2147483647])"),
      std::string::npos)
      << r.output;
  const CliResult seed = run_bounded("train --train.seed=-1");
  EXPECT_EQ(seed.code, 2) << seed.output;
  EXPECT_NE(error_line(seed.output).find("bad value '-1' for train.seed (out of range [0, 18446744073709551615])"),
            std::string::npos)
      << seed.output;
  // Not a number at all: still what a value must look like.
  const CliResult word = run_bounded("train --train.steps=many");
  EXPECT_NE(error_line(word.output).find("bad value 'many' for train.steps (expected an integer)"), std::string::npos)
      << word.output;
}

TEST(ConfigInput, LongValueIsCutInTheMessage) {
  const std::string value(100000, '7');  // a command-line argument may hold at most 128 KiB
  const CliResult cli = run_bounded("train --train.steps=" + value + "x");
  EXPECT_EQ(cli.code, 2) << cli.output.substr(0, 2000);
  EXPECT_NE(error_line(cli.output).find("bad value '" + value.substr(0, 80) + "... (100001 bytes)' for train.steps"),
            std::string::npos)
      << cli.output.substr(0, 2000);
  EXPECT_LT(cli.output.size(), 2000u) << cli.output.substr(0, 2000);

  TempDir dir;
  write_bytes(dir.file("long.ini"), "[data]\npath = " + std::string(900000, 'p') + "\n");
  const CliResult file = run_bounded("train --config " + dir.file("long.ini"));
  EXPECT_EQ(file.code, 2) << file.output.substr(0, 2000);
  EXPECT_NE(error_line(file.output)
                .find("data.path is 900000 bytes, longer than a path can be (4095): '" + std::string(80, 'p') +
                      "... (900000 bytes)'"),
            std::string::npos)
      << file.output.substr(0, 2000);
  EXPECT_LT(file.output.size(), 2000u) << file.output.substr(0, 2000);
}

TEST(ConfigInput, BinaryConfigIsShownEscaped) {
  TempDir dir;
  std::string bytes = "\x1b[2J\x07\x01\x02\xff\xfe\x80 junk";
  for (int i = 0; i < 200; ++i) bytes.push_back(static_cast<char>(i % 7 == 0 ? 0x9b : 0x1b));
  write_bytes(dir.file("bin.ini"), bytes);
  const CliResult r = run_bounded("train --config " + dir.file("bin.ini"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_FALSE(has_control_bytes(r.output)) << r.output;
  EXPECT_NE(error_line(r.output).find("bin.ini:1: malformed line '\\x1b[2J\\x07\\x01\\x02\\xff\\xfe\\x80 junk\\x9b"),
            std::string::npos)
      << r.output;
  EXPECT_NE(error_line(r.output).find("... (" + std::to_string(bytes.size()) + " bytes)'"), std::string::npos)
      << r.output;
}

TEST(ConfigInput, ControlCharactersInAStringValueAreRefusedEscaped) {
  const CliResult r = run_bounded("train '--data.path=runs/\x1b]0;owned\x07.bin'");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_FALSE(has_control_bytes(r.output)) << r.output;
  EXPECT_NE(error_line(r.output).find("data.path ('runs/\\x1b]0;owned\\x07.bin') cannot be written to INI"),
            std::string::npos)
      << r.output;
}

// An llm.c shard of `tokens` tokens 0, 1, 2, ... (mod 256).
std::string llmc_shard(int tokens) {
  LlmcShard shard;
  for (int i = 0; i < tokens; ++i) shard.tokens.push_back(static_cast<uint16_t>(i % 256));
  return shard.bytes();
}

TEST(ConfigInput, ValidationDataErrorsNameDataValPath) {
  TempDir dir;
  for (const char* format : {"text", "llmc"}) {
    write_bytes(dir.file("train.txt"), format == std::string("text") ? std::string(4096, 'a') : llmc_shard(4096));
    const CliResult r = run_bounded(std::string("train --train.steps=1 --data.format=") + format + " --data.path=" +
                                    dir.file("train.txt") + " --data.val_path=" + dir.file("missing.bin"));
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(error_line(r.output).find("data.val_path file '" + dir.file("missing.bin") + "' does not exist"),
              std::string::npos)
        << format << "\n"
        << r.output;
    const CliResult glob = run_bounded(std::string("train --train.steps=1 --data.format=") + format + " --data.path=" +
                                       dir.file("train.txt") + " '--data.val_path=" + dir.file("val_*.bin") + "'");
    EXPECT_NE(error_line(glob.output).find("data.val_path pattern '" + dir.file("val_*.bin") + "' matches no file"),
              std::string::npos)
        << format << "\n"
        << glob.output;
  }
}

}  // namespace
}  // namespace st::testing
