// Reading a metrics JSONL back: series per key, the last record of a repeated step wins, and bad lines are
// reported with the file and line.
#include "shardtrain/train/metrics_file.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "../common/temp_dir.h"
#include "shardtrain/core/error.h"

namespace st {
namespace {

std::string write(const testing::TempDir& dir, const std::string& text) {
  const std::string path = dir.file("m.jsonl");
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// The message of the kBadInput error reading `text` throws ("" if it reads fine or throws something else).
std::string bad_input(const std::string& path) {
  try {
    read_metrics_series(path, {"loss"});
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kBadInput) return e.what();
  }
  return "";
}

TEST(MetricsFile, SeriesSkipMissingAndNullValues) {
  testing::TempDir dir;
  const std::string path = write(dir,
                                 "{\"step\": 1, \"loss\": 5.5, \"lr\": 0.001}\n"
                                 "\n"
                                 "{\"step\": 2, \"loss\": null, \"lr\": 0.002}\n"
                                 "{\"step\": 2, \"val_loss\": 4.25}\n"
                                 "{\"note\": \"no step: ignored\", \"loss\": 99}\n"
                                 "{\"step\": 3, \"loss\": 4}\n");
  const MetricsSeries m = read_metrics_series(path, {"loss", "val_loss", "lr", "tokens_per_s"});
  EXPECT_EQ(m.steps, 3);
  EXPECT_EQ(m.first_step, 1);
  EXPECT_EQ(m.last_step, 3);
  EXPECT_EQ(m.replaced_steps, 0);  // step 2's step record and eval record hold different keys
  ASSERT_EQ(m.series.at("loss").size(), 2u);
  EXPECT_EQ(m.series.at("loss")[0].step, 1);
  EXPECT_EQ(m.series.at("loss")[0].value, 5.5);
  EXPECT_EQ(m.series.at("loss")[1].step, 3);
  EXPECT_EQ(m.series.at("loss")[1].value, 4.0);
  ASSERT_EQ(m.series.at("val_loss").size(), 1u);
  EXPECT_EQ(m.series.at("val_loss")[0].step, 2);
  EXPECT_EQ(m.series.at("val_loss")[0].value, 4.25);
  ASSERT_EQ(m.series.at("lr").size(), 2u);
  EXPECT_EQ(m.series.at("lr")[1].value, 0.002);
  EXPECT_TRUE(m.series.at("tokens_per_s").empty());
}

TEST(MetricsFile, ResumedRunsRepeatedStepsTakeTheLastRecord) {
  testing::TempDir dir;
  // Steps 1-4 written, then a resume from the checkpoint at step 2 appends steps 3-5 again.
  const std::string path = write(dir,
                                 "{\"step\": 1, \"loss\": 6}\n{\"step\": 2, \"loss\": 5}\n"
                                 "{\"step\": 3, \"loss\": 4.5}\n{\"step\": 4, \"loss\": 4.4}\n"
                                 "{\"step\": 3, \"loss\": 4.6}\n{\"step\": 4, \"loss\": 4.3}\n{\"step\": 5, \"loss\": 4}\n");
  const MetricsSeries m = read_metrics_series(path, {"loss"});
  EXPECT_EQ(m.steps, 5);
  EXPECT_EQ(m.replaced_steps, 2);
  const std::vector<SeriesPoint>& loss = m.series.at("loss");
  ASSERT_EQ(loss.size(), 5u);
  const double want[] = {6, 5, 4.6, 4.3, 4};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(loss[i].step, static_cast<int64_t>(i + 1));
    EXPECT_EQ(loss[i].value, want[i]) << i;
  }
}

TEST(MetricsFile, MalformedLineNamesFileAndLine) {
  testing::TempDir dir;
  const std::string path = write(dir, "{\"step\": 1, \"loss\": 5}\n{\"step\": 2, \"loss\": 4\n");
  const std::string msg = bad_input(path);
  EXPECT_NE(msg.find(path + ":2: not a JSON object"), std::string::npos) << msg;
}

TEST(MetricsFile, NonObjectBadStepAndBadValueNameTheLine) {
  testing::TempDir dir;
  std::string msg = bad_input(write(dir, "{\"step\": 1}\n[1, 2]\n"));
  EXPECT_NE(msg.find("m.jsonl:2: expected a JSON object, got array"), std::string::npos) << msg;
  msg = bad_input(write(dir, "{\"step\": 1.5, \"loss\": 2}\n"));
  EXPECT_NE(msg.find("m.jsonl:1: \"step\" must be a non-negative integer, got 1.5"), std::string::npos) << msg;
  msg = bad_input(write(dir, "{\"step\": -1, \"loss\": 2}\n"));
  EXPECT_NE(msg.find("m.jsonl:1: \"step\" must be a non-negative integer, got -1"), std::string::npos) << msg;
  msg = bad_input(write(dir, "{\"step\": 1, \"loss\": 2}\n\n{\"step\": 2, \"loss\": \"2.0\"}\n"));
  EXPECT_NE(msg.find("m.jsonl:3: \"loss\" must be a number or null, got \"2.0\""), std::string::npos) << msg;
}

TEST(MetricsFile, EmptyFileOrNoStepsIsBadInput) {
  testing::TempDir dir;
  std::string msg = bad_input(write(dir, ""));
  EXPECT_NE(msg.find("m.jsonl has no records with a \"step\""), std::string::npos) << msg;
  msg = bad_input(write(dir, "{\"loss\": 1}\n\n"));
  EXPECT_NE(msg.find("m.jsonl has no records with a \"step\""), std::string::npos) << msg;
  msg = bad_input(dir.file("missing.jsonl"));
  EXPECT_NE(msg.find("cannot open metrics file " + dir.file("missing.jsonl")), std::string::npos) << msg;
}

}  // namespace
}  // namespace st
