// A metrics JSONL file (train/metrics.h) read back as numeric series against step, for `shardtrain plot`.
//
//   MetricsSeries s = read_metrics_series("run.jsonl", {"loss", "val_loss", "lr"});
//   for (const SeriesPoint& p : s.series["loss"]) ...   // ascending step, one point per step
//
// Rules:
//   * One JSON object per line; blank lines are skipped. A line that is not a JSON object is bad input
//     (kBadInput) naming "FILE:LINE" and the parser's complaint.
//   * A record belongs to the step in its "step" key, a non-negative integer (anything else there is bad input
//     naming FILE:LINE). Records without "step" are ignored.
//   * A record without one of the keys, or with null there (a non-finite value), is skipped for that series
//     only. A key that holds something other than a number or null is bad input naming FILE:LINE and the key.
//   * Repeated steps: a resumed run appends to the file, so the steps after its checkpoint appear twice (or
//     more). The last record of a step wins, which is the run that went on, and each series is one continuous
//     line of one point per step.
//   * A file without any record that has a step (empty, or not a metrics file) is bad input naming the file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace st {

struct SeriesPoint {
  int64_t step = 0;
  double value = 0;
};

struct MetricsSeries {
  std::map<std::string, std::vector<SeriesPoint>> series;  // every key asked for, possibly empty
  int64_t steps = 0;                                        // distinct steps with a record
  int64_t first_step = 0, last_step = 0;
  int64_t replaced_steps = 0;  // steps with a value that a later record replaced (a resume repeats steps)
};

MetricsSeries read_metrics_series(const std::string& path, const std::vector<std::string>& keys);

}  // namespace st
