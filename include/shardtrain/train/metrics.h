// What a run reports while it trains: one JSONL object per optimizer step and per evaluation (to
// log.metrics), one human-readable line every log.every steps (stdout), and a progress bar (ETA, tok/s, loss;
// train/progress_bar.h) that is drawn only when stdout is a terminal. Only rank 0 reports.
//
// JSONL records (one per line, keys in this order):
//   {"step": 12, "loss": 2.31, "lr": 0.001, "grad_norm": 0.53, "tokens_per_s": 12345.6, "ms": 45.2, "skipped": false,
//    "skipped_total": 0, "loss_scale": 1, "comm_exposed_ms": 0.8, "comm_cross_node_bytes": 0,
//    "mem_sharded_bytes": 3407872, "mem_gathered_peak_bytes": 1187840, "mem_peak_bytes": [431046656, 430964736],
//    "mfu": 0.41}
//   {"step": 100, "val_loss": 2.05}
// `step` counts completed optimizer steps (1-based), so the first record has step 1. skipped_total counts the
// skipped steps of the whole run, this one and those before a resume included. comm_exposed_ms is the part of ms
// the computation waited for communication (ModelBackend::take_exposed_comm_ms). mem_peak_bytes has one entry
// per rank, in rank order: each rank's peak memory so far (ModelBackend::peak_memory_bytes: the process's peak
// resident set on the CPU, device memory on a GPU). mfu is null on the CPU and on a GPU missing from the peak
// table (train/mfu.h). Non-finite numbers are written as null. A resumed run appends, so a file can hold a step
// twice; readers take the last record of a step (train/metrics_file.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/train/step_engine.h"

namespace st {

struct StepReport {
  int64_t step = 0;  // 1-based: steps completed
  StepStats stats;
  double tokens_per_s = 0;
  double ms = 0;
  double ckpt_ms = 0;  // after the step: the checkpoint save's time on the training thread (the snapshot, or with
                       // ckpt.async = false the whole save); 0 at a step without a save
  double ckpt_wait_ms = 0;  // of ckpt_ms: waiting for the previous save to commit first
  double comm_exposed_ms = 0;  // of ms: computation waiting for communication (ModelBackend::take_exposed_comm_ms)
  int64_t comm_cross_node_bytes = 0;  // this step's bytes between this rank and other nodes (CommCounters)
  int64_t mem_sharded_bytes = 0;        // this rank's param/grad/m/v shards (rank 0's, as logged)
  int64_t mem_gathered_peak_bytes = 0;  // peak of full-size gathered parameter and gradient buffers
  int64_t skipped_total = 0;            // skipped steps so far, this one included, across resumes
  std::vector<int64_t> mem_peak_bytes;  // per rank, in rank order (ModelBackend::peak_memory_bytes)
  bool on_gpu = false;                  // the human line shows MFU (a percentage or "unknown") on GPUs only
  std::optional<double> mfu;            // fraction of the devices' dense bf16 peak
};

class MetricsSink {
 public:
  // `path` empty: no JSONL. Opening a path that cannot be written is a bad-input error naming log.metrics; a
  // record that cannot be written (a full disk, ulimit -f) is a fault naming the file and the OS's error.
  // A resumed run appends to the file instead of truncating it.
  MetricsSink(const std::string& path, int64_t total_steps, int64_t every, bool enabled, bool append = false);

  void step(const StepReport& r);
  void eval(int64_t step, float val_loss);
  // Prints a line on its own, clearing the progress bar first.
  void line(const std::string& text);

 private:
  void clear_bar();
  void draw_bar(const StepReport& r);
  void flush_jsonl();

  std::string path_;
  std::ofstream jsonl_;
  int64_t total_steps_;
  int64_t every_;
  bool enabled_;
  bool tty_;
  bool bar_drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  int64_t first_step_ = -1;
  double tokens_ = 0, step_seconds_ = 0;  // this run's steps, for the bar's mean tok/s
};

}  // namespace st
