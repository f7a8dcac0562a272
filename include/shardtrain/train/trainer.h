// The training loop: data, steps, evaluation, metrics and, for byte-level runs, a text sample at the end.
//
//   st::TrainSummary s = st::run_training(cfg);
#pragma once

#include <cstdint>
#include <string>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"

namespace st {

struct TrainSummary {
  int64_t steps = 0;          // optimizer steps taken (applied or skipped)
  int64_t skipped = 0;        // steps skipped for a non-finite loss or gradient norm
  float last_loss = 0;        // training loss of the last step
  float val_loss = 0;         // validation loss after the last step
  double median_tokens_per_s = 0;
  std::string sample;         // generated text (byte-level runs with train.sample_tokens > 0)
  bool preempted = false;     // stopped early by SIGTERM/SIGINT on some rank (core/preempt.h)
  std::string checkpoint;     // the checkpoint committed on preemption (empty without ckpt.dir)
  bool nothing_to_train = false;  // resumed at or past train.steps: no step ran, no loss to report
};

// Runs cfg.train.steps optimizer steps on every rank of `comm` (collective). Bad data or config is
// reported before the first step. Only rank 0 writes metrics, prints, and writes ckpt.export.
TrainSummary run_training(const Config& cfg, Communicator& comm);

}  // namespace st
