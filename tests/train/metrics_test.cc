// What a run reports: the JSONL records' exact keys and values, and the progress bar's text.
#include "shardtrain/train/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "../common/temp_dir.h"
#include "shardtrain/core/error.h"
#include "shardtrain/train/progress_bar.h"

namespace st {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

StepReport fake_report() {
  StepReport r;
  r.step = 7;
  r.stats.loss = 2.5f;
  r.stats.lr = 0.25f;
  r.stats.grad_norm = 0.5;
  r.stats.skipped = true;
  r.stats.loss_scale = 65536.0f;
  r.tokens_per_s = 1234.5;
  r.ms = 40.0;
  r.ckpt_ms = 2.5;
  r.ckpt_wait_ms = 1.25;
  r.comm_exposed_ms = 1.5;
  r.comm_cross_node_bytes = 4096;
  r.mem_sharded_bytes = 3407872;
  r.mem_gathered_peak_bytes = 1187840;
  r.skipped_total = 3;
  r.mem_peak_bytes = {431046656, 9007199254740993};  // 2^53 + 1: written as an exact integer
  r.mfu = 0.125;
  return r;
}

TEST(MetricsSink, StepRecordHasEveryKeyInOrder) {
  testing::TempDir dir;
  const std::string path = dir.file("m.jsonl");
  {
    MetricsSink sink(path, /*total_steps=*/10, /*every=*/1000, /*enabled=*/true);
    sink.step(fake_report());
    sink.eval(7, 2.0f);
  }
  EXPECT_EQ(read_all(path),
            "{\"step\": 7, \"loss\": 2.5, \"lr\": 0.25, \"grad_norm\": 0.5, \"tokens_per_s\": 1234.5, \"ms\": 40, \"ckpt_ms\": 2.5, \"ckpt_wait_ms\": 1.25, "
            "\"skipped\": true, \"skipped_total\": 3, \"loss_scale\": 65536, \"comm_exposed_ms\": 1.5, "
            "\"comm_cross_node_bytes\": 4096, \"mem_sharded_bytes\": 3407872, \"mem_gathered_peak_bytes\": 1187840, "
            "\"mem_peak_bytes\": [431046656, 9007199254740993], \"mfu\": 0.125}\n"
            "{\"step\": 7, \"val_loss\": 2}\n");
}

TEST(MetricsSink, NonFiniteIsNullAndNoRanksIsAnEmptyArray) {
  testing::TempDir dir;
  const std::string path = dir.file("m.jsonl");
  StepReport r = fake_report();
  r.stats.loss = std::numeric_limits<float>::quiet_NaN();
  r.stats.skipped = false;
  r.mfu.reset();
  r.mem_peak_bytes.clear();
  {
    MetricsSink sink(path, 10, 1000, true);
    sink.step(r);
  }
  const std::string text = read_all(path);
  EXPECT_NE(text.find("\"loss\": null,"), std::string::npos) << text;
  EXPECT_NE(text.find("\"skipped\": false, \"skipped_total\": 3,"), std::string::npos) << text;
  EXPECT_NE(text.find("\"mem_peak_bytes\": [], \"mfu\": null}"), std::string::npos) << text;
}

TEST(MetricsSink, AppendKeepsTheEarlierRecords) {
  testing::TempDir dir;
  const std::string path = dir.file("m.jsonl");
  { MetricsSink(path, 10, 1000, true).eval(5, 3.0f); }
  { MetricsSink(path, 10, 1000, true, /*append=*/true).eval(6, 2.0f); }
  EXPECT_EQ(read_all(path), "{\"step\": 5, \"val_loss\": 3}\n{\"step\": 6, \"val_loss\": 2}\n");
  { MetricsSink(path, 10, 1000, true).eval(1, 1.0f); }
  EXPECT_EQ(read_all(path), "{\"step\": 1, \"val_loss\": 1}\n");
}

TEST(MetricsSink, MakesTheFilesDirectoryAndSaysWhyItCannotOpen) {
  testing::TempDir dir;
  const std::string path = dir.file("runs/exp1/m.jsonl");
  { MetricsSink(path, 10, 1000, true).eval(2, 4.0f); }
  EXPECT_EQ(read_all(path), "{\"step\": 2, \"val_loss\": 4}\n");

  // A directory where the file should be: the error names the key, the path and the system's reason.
  try {
    MetricsSink(dir.file("runs"), 10, 1000, true);
    FAIL() << "opened a directory as the metrics file";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(
        std::string(e.what()).find("log.metrics: cannot open " + dir.file("runs") + " for writing: Is a directory"),
        std::string::npos)
        << e.what();
  }
  // A file where a directory should be.
  try {
    MetricsSink(dir.file("runs/exp1/m.jsonl/x.jsonl"), 10, 1000, true);
    FAIL() << "made a directory inside a file";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("log.metrics: cannot create the directory " + dir.file("runs/exp1/m.jsonl")),
              std::string::npos)
        << e.what();
  }
}

TEST(ProgressBar, ShowsEtaRateAndLoss) {
  // step, total, elapsed_s, steps_done, tokens_per_s, loss: resumed at step 100, 1.25 s a step, 480 steps left.
  const ProgressState s{120, 600, 25.0, 20, 12345.0, 2.3456f};
  EXPECT_EQ(progress_bar_text(s), "[######........................] 120/600 | ETA 10m00s | 12.3k tok/s | loss 2.3456");
}

TEST(ProgressBar, RateUnitsHoursAndEdges) {
  ProgressState s{1, 3, 4000.0, 1, 9999.4, 5.5f};
  EXPECT_EQ(progress_bar_text(s), "[##########....................] 1/3 | ETA 2h13m | 9999 tok/s | loss 5.5000");
  s.tokens_per_s = 583200.0;
  s.loss = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(progress_bar_text(s), "[##########....................] 1/3 | ETA 2h13m | 583.2k tok/s | loss nan");
  s.tokens_per_s = 12345678.0;
  s.loss = std::numeric_limits<float>::infinity();
  EXPECT_EQ(progress_bar_text(s), "[##########....................] 1/3 | ETA 2h13m | 12.35M tok/s | loss inf");
  s = ProgressState{0, 3, 0.0, 0, 0.0, 0.0f};  // nothing done yet: no ETA to give
  EXPECT_EQ(progress_bar_text(s), "[..............................] 0/3 | ETA -- | 0 tok/s | loss 0.0000");
  s.step = 3;
  s.steps_done = 3;
  EXPECT_EQ(progress_bar_text(s), "[##############################] 3/3 | ETA 0m00s | 0 tok/s | loss 0.0000");
}

TEST(ProgressBar, FormatDuration) {
  EXPECT_EQ(format_duration(0.4), "0m00s");
  EXPECT_EQ(format_duration(59.5), "1m00s");
  EXPECT_EQ(format_duration(3599.0), "59m59s");
  EXPECT_EQ(format_duration(3600.0), "1h00m");
  EXPECT_EQ(format_duration(-3.0), "0m00s");
}

}  // namespace
}  // namespace st
