#include "shardtrain/train/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "shardtrain/core/elapsed.h"
#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/train/progress_bar.h"

namespace st {
namespace {

// JSON has no NaN/Infinity literals; non-finite values are written as null.
std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", x);
  return buf;
}

std::string json_int_array(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

}  // namespace

MetricsSink::MetricsSink(const std::string& path, int64_t total_steps, int64_t every, bool enabled, bool append)
    : total_steps_(total_steps), every_(every), enabled_(enabled), tty_(enabled && isatty(STDOUT_FILENO) == 1) {
  if (enabled_ && !path.empty()) {
    // Like ckpt.dir, the file's directory is made when missing (runs/exp1/metrics.jsonl).
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (ec)
      ST_BAD_INPUT("log.metrics: cannot create the directory ", parent.string(), " of ", path, ": ", ec.message());
    path_ = path;
    jsonl_.open(path, std::ios::out | (append ? std::ios::app : std::ios::trunc));
    if (!jsonl_) ST_BAD_INPUT("log.metrics: cannot open ", path, " for writing: ", errno_text());
  }
  start_ = std::chrono::steady_clock::now();
}

void MetricsSink::step(const StepReport& r) {
  if (!enabled_) return;
  if (first_step_ < 0) {
    first_step_ = r.step - 1;
    start_ = std::chrono::steady_clock::now() - std::chrono::microseconds(static_cast<int64_t>(r.ms * 1e3));
  }
  if (jsonl_.is_open()) {
    jsonl_ << "{\"step\": " << r.step << ", \"loss\": " << json_number(r.stats.loss)
           << ", \"lr\": " << json_number(r.stats.lr) << ", \"grad_norm\": " << json_number(r.stats.grad_norm)
           << ", \"tokens_per_s\": " << json_number(r.tokens_per_s) << ", \"ms\": " << json_number(r.ms)
           << ", \"ckpt_ms\": " << json_number(r.ckpt_ms) << ", \"ckpt_wait_ms\": " << json_number(r.ckpt_wait_ms)
           << ", \"skipped\": " << (r.stats.skipped ? "true" : "false") << ", \"skipped_total\": " << r.skipped_total
           << ", \"loss_scale\": " << json_number(r.stats.loss_scale)
           << ", \"comm_exposed_ms\": " << json_number(r.comm_exposed_ms)
           << ", \"comm_cross_node_bytes\": " << r.comm_cross_node_bytes
           << ", \"mem_sharded_bytes\": " << r.mem_sharded_bytes
           << ", \"mem_gathered_peak_bytes\": " << r.mem_gathered_peak_bytes
           << ", \"mem_peak_bytes\": " << json_int_array(r.mem_peak_bytes)
           << ", \"mfu\": " << (r.mfu ? json_number(*r.mfu) : std::string("null")) << "}\n";
    flush_jsonl();
  }
  if (r.step % every_ == 0 || r.step == total_steps_ || r.stats.skipped) {
    char mfu[32] = "";
    if (r.on_gpu && r.mfu)
      std::snprintf(mfu, sizeof(mfu), " | mfu %4.1f%%", 100.0 * *r.mfu);
    else if (r.on_gpu)
      std::snprintf(mfu, sizeof(mfu), " | mfu unknown");
    char buf[288];
    std::snprintf(buf, sizeof(buf), "step %6lld/%lld | loss %.4f | lr %.2e | norm %.4f | %9.0f tok/s | %7.1f ms%s%s",
                  static_cast<long long>(r.step), static_cast<long long>(total_steps_), r.stats.loss, r.stats.lr,
                  r.stats.grad_norm, r.tokens_per_s, r.ms, mfu,
                  r.stats.no_targets ? " | SKIPPED (no target)"
                  : r.stats.skipped  ? " | SKIPPED (non-finite)"
                                     : "");
    line(buf);
  }
  tokens_ += r.tokens_per_s * r.ms * 1e-3;
  step_seconds_ += r.ms * 1e-3;
  draw_bar(r);
}

void MetricsSink::eval(int64_t step, float val_loss) {
  if (!enabled_) return;
  if (jsonl_.is_open()) {
    jsonl_ << "{\"step\": " << step << ", \"val_loss\": " << json_number(val_loss) << "}\n";
    flush_jsonl();
  }
  char buf[128];
  std::snprintf(buf, sizeof(buf), "step %6lld/%lld | val_loss %.4f", static_cast<long long>(step),
                static_cast<long long>(total_steps_), val_loss);
  line(buf);
}

void MetricsSink::flush_jsonl() {
  errno = 0;
  jsonl_.flush();
  // The stream keeps no error text: errno is the failed write(2)'s (EFBIG, ENOSPC).
  if (!jsonl_) ST_FAULT("log.metrics: cannot write ", path_, ": ", errno != 0 ? errno_text() : "write failed");
}

void MetricsSink::line(const std::string& text) {
  if (!enabled_) return;
  clear_bar();
  std::fprintf(stdout, "%s\n", text.c_str());
  std::fflush(stdout);
}

void MetricsSink::clear_bar() {
  if (!bar_drawn_) return;
  std::fputs("\r\033[K", stdout);
  bar_drawn_ = false;
}

void MetricsSink::draw_bar(const StepReport& r) {
  if (!tty_ || r.step >= total_steps_) return;
  ProgressState p;
  p.step = r.step;
  p.total = total_steps_;
  p.elapsed_s = seconds_since(start_);
  p.steps_done = r.step - first_step_;
  p.tokens_per_s = step_seconds_ > 0 ? tokens_ / step_seconds_ : 0.0;
  p.loss = r.stats.loss;
  std::fprintf(stdout, "\r%s", progress_bar_text(p).c_str());
  std::fflush(stdout);
  bar_drawn_ = true;
}

}  // namespace st
