#include "generate_output.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/fault.h"
#include "shardtrain/core/preempt.h"

std::string one_line(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else
      out += c;
  }
  return out;
}

GenerateOutput::GenerateOutput(OutputForm form, std::vector<st::Completion> completions,
                               std::vector<std::vector<int32_t>> prompts, int64_t max_tokens, st::Communicator& comm)
    : form_(form),
      completions_(std::move(completions)),
      prompts_(std::move(prompts)),
      max_tokens_(max_tokens),
      comm_(comm),
      printer_(comm.rank() == 0),
      shared_(3 * comm.world_size() + 1) {
  ST_CHECK(completions_.size() == prompts_.size(), completions_.size(), " completions for ", prompts_.size(),
           " prompts");
  ST_CHECK(form_ != OutputForm::kStream || completions_.size() == 1, "a stream of ", completions_.size(), " sequences");
  // A reader that goes away (`| head`) must show as EPIPE from write(2), not kill the process with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
}

void GenerateOutput::write(std::string_view s) {
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

std::string GenerateOutput::result_line(size_t seq) const {
  const st::Completion& c = completions_[seq];
  if (form_ == OutputForm::kJsonl) {
    nlohmann::ordered_json j;
    j["index"] = seq;
    j["text"] = c.has_text() ? nlohmann::ordered_json(c.text()) : nlohmann::ordered_json(nullptr);
    j["token_ids"] = c.ids();
    j["finish_reason"] = st::to_string(c.finish_reason());
    j["prompt_token_ids"] = prompts_[seq];
    // A stop string may cut a character that the stop string itself splits: such bytes are replaced, not refused.
    return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  }
  if (c.has_text()) return one_line(c.text()) + "\n";
  std::string ids;
  for (const int32_t t : c.ids()) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  return ids + "\n";
}

void GenerateOutput::print_done() {
  while (!closed_ && next_ < completions_.size() && completions_[next_].finished()) {
    write(result_line(next_));
    if (!closed_) ++next_;
  }
}

bool GenerateOutput::on_token(int seq, int32_t token, int64_t i) {
  const int rank = comm_.rank(), world = comm_.world_size();
  if (st::fault_injected("sigint", rank, i + 1)) std::raise(SIGINT);
  if (st::fault_injected("sigterm", rank, i + 1)) std::raise(SIGTERM);
  int signal = st::stop_signal();
  if (world > 1) {
    std::fill(shared_.begin(), shared_.end(), 0.0);
    shared_[rank] = token;
    shared_[world + rank] = seq;
    shared_[2 * world + rank] = signal;
    shared_[3 * world] = closed_ ? 1.0 : 0.0;
    comm_.all_reduce(shared_.data(), static_cast<int64_t>(shared_.size()));
    signal = 0;  // the first signalled rank's, so that every rank exits with the same code
    for (int r = 0; r < world; ++r) {
      ST_CHECK(shared_[r] == shared_[0] && shared_[world + r] == shared_[world], "rank ", r, " generated token ",
               shared_[r], " at index ", i, " of sequence ", shared_[world + r], " where rank 0 generated ", shared_[0],
               " of sequence ", shared_[world], " (the same weights, prompts and seed must give the same tokens)");
      if (signal == 0) signal = static_cast<int>(shared_[2 * world + r]);
    }
    closed_ = shared_[3 * world] != 0;
  }
  if (closed_) throw GenerationStopped{};
  st::Completion& c = completions_.at(static_cast<size_t>(seq));
  std::string piece = c.push(token);
  if (i + 1 == max_tokens_) piece += c.finish();
  if (form_ == OutputForm::kStream) {
    write(c.has_text() ? piece : (i > 0 ? "," : "") + std::to_string(token));
    if (!closed_) ++printed_tokens_;
  } else {
    print_done();
  }
  if (signal != 0) {
    stop_signal_ = signal;
    throw GenerationStopped{};
  }
  // One rank stops at once on a closed stdout; several learn it at the next token's all-reduce.
  if (closed_ && world == 1) throw GenerationStopped{};
  return !c.finished();
}

void GenerateOutput::finish() {
  if (form_ != OutputForm::kStream) return;
  write(completions_[0].finish());
  write("\n");
}
