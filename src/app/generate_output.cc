#include "generate_output.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <string>

#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/fault.h"
#include "shardtrain/core/preempt.h"

TokenOutput::TokenOutput(std::unique_ptr<st::TextStream> text, st::Communicator& comm)
    : text_(std::move(text)), comm_(comm), printer_(comm.rank() == 0), shared_(2 * comm.world_size() + 1) {
  // A reader that goes away (`| head`) must show as EPIPE from write(2), not kill the process with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
}

void TokenOutput::write(std::string_view s) {
  if (!printer_ || closed_) return;
  while (!s.empty()) {
    const ssize_t n = ::write(STDOUT_FILENO, s.data(), s.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EPIPE) {
      closed_ = true;
      return;
    }
    if (n < 0) ST_FAULT("generate: writing the generated tokens to stdout failed: ", st::errno_text());
    s.remove_prefix(static_cast<size_t>(n));
  }
}

bool TokenOutput::on_token(int32_t token, int64_t i) {
  const int rank = comm_.rank(), world = comm_.world_size();
  if (st::fault_injected("sigint", rank, i + 1)) std::raise(SIGINT);
  if (st::fault_injected("sigterm", rank, i + 1)) std::raise(SIGTERM);
  int signal = st::stop_signal();
  if (world > 1) {
    std::fill(shared_.begin(), shared_.end(), 0.0);
    shared_[rank] = token;
    shared_[world + rank] = signal;
    shared_[2 * world] = closed_ ? 1.0 : 0.0;
    comm_.all_reduce(shared_.data(), static_cast<int64_t>(shared_.size()));
    signal = 0;  // the first signalled rank's, so that every rank exits with the same code
    for (int r = 0; r < world; ++r) {
      ST_CHECK(shared_[r] == shared_[0], "rank ", r, " generated token ", shared_[r], " at index ", i,
               " where rank 0 generated ", shared_[0],
               " (the same weights, prompt and seed must give the same tokens)");
      if (signal == 0) signal = static_cast<int>(shared_[world + r]);
    }
    closed_ = shared_[2 * world] != 0;
  }
  if (closed_) return false;
  write(text_ ? text_->push(token) : (i > 0 ? "," : "") + std::to_string(token));
  if (!closed_) ++printed_;
  if (signal != 0) {
    stop_signal_ = signal;
    return false;
  }
  // One rank stops at once on a closed stdout; several learn it at the next token's all-reduce.
  return world > 1 || !closed_;
}

void TokenOutput::finish() {
  if (text_) write(text_->finish());
  write("\n");
}
