#include "shardtrain/ckpt/resume_data.h"

#include "shardtrain/core/error.h"

namespace st {
namespace {

const char* bool_text(bool b) { return b ? "true" : "false"; }

std::string order_text(const DataOrder& o) {
  return o.shuffle ? str_cat("shuffled with train.seed ", o.seed) : std::string("in file order (data.shuffle false)");
}

}  // namespace

std::vector<std::string> check_data_order(const DataOrder& saved, int64_t step, const DataOrder& run, bool allow_change,
                                          const std::string& where) {
  ST_CHECK(run.train_windows > 0 && run.global_batch > 0 && step >= 0, "run windows ", run.train_windows,
           ", global_batch ", run.global_batch, ", step ", step);
  std::vector<std::string> changes;  // "key: checkpoint's value vs this run's"
  if (saved.global_batch != run.global_batch)
    changes.push_back(str_cat("train.global_batch is ", saved.global_batch, " in the checkpoint, ", run.global_batch,
                              " in this run"));
  if (saved.shuffle != run.shuffle)
    changes.push_back(str_cat("data.shuffle is ", bool_text(saved.shuffle), " in the checkpoint, ",
                              bool_text(run.shuffle), " in this run"));
  // The seed orders shuffled data only; with data.shuffle false on both sides it changes nothing read.
  if ((saved.shuffle || run.shuffle) && saved.seed != run.seed)
    changes.push_back(str_cat("train.seed is ", saved.seed, " in the checkpoint, ", run.seed, " in this run"));
  if (saved.train_windows > 0 && saved.train_windows != run.train_windows)
    changes.push_back(str_cat("the training data holds ", saved.train_windows, " windows in the checkpoint, ",
                              run.train_windows,
                              " in this run (data.path, data.val_path or data.val_holdout changed)"));
  if (!changes.empty() && !allow_change) {
    std::string list;
    for (const std::string& c : changes) list += (list.empty() ? "" : "; ") + c;
    ST_BAD_INPUT(where, ": resuming would change the data order: ", list,
                 ". The run would skip or repeat data. Resume with the checkpoint's values, or set "
                 "ckpt.allow_data_change = true to continue in this run's order");
  }

  std::vector<std::string> lines;
  for (const std::string& c : changes) lines.push_back("ckpt.allow_data_change: " + c);
  const int64_t consumed = step * saved.global_batch;  // the checkpoint's data cursor
  const int64_t next = step * run.global_batch;
  const int64_t windows = run.train_windows;
  lines.push_back(str_cat("data: the checkpoint trained on global sequences [0, ", consumed, ") (step ", step, " x ",
                          saved.global_batch, "), ", order_text(saved), "; this run continues at step ", step + 1,
                          " from global sequence ", next, " = epoch ", next / windows, ", position ", next % windows,
                          " of ", windows, " windows, ", order_text(run)));
  const bool same_order = saved.shuffle == run.shuffle && (!run.shuffle || saved.seed == run.seed) &&
                          (saved.train_windows == 0 || saved.train_windows == run.train_windows);
  if (!same_order) {
    lines.push_back(
        "data: the order itself changed: which windows the checkpoint had seen does not carry over, so "
        "until the end of the epoch some windows repeat and others are skipped");
  } else if (next > consumed) {
    lines.push_back(str_cat("data: global sequences [", consumed, ", ", next, ") of the order are skipped"));
  } else if (next < consumed) {
    lines.push_back(str_cat("data: global sequences [", next, ", ", consumed, ") of the order are trained on again"));
  }
  if (saved.train_windows == 0)
    lines.push_back(str_cat(where,
                            " does not record its training data's window count (written by a build that "
                            "did not record it): a change of the training data itself is not detected"));
  return lines;
}

}  // namespace st
