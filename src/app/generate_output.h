// What `shardtrain generate` prints, token by token, as a Unix filter does: each token goes to stdout as soon as every
// rank has sampled it (text through a TextStream, which holds an unfinished UTF-8 character until it completes, or
// ids, comma-separated), unbuffered. A closed stdout (EPIPE: SIGPIPE is ignored) and a stop signal (SIGINT, SIGTERM,
// SIGUSR1: core/preempt.h's interrupt handlers) end the generation; under mpirun the ranks agree on both with one
// small all-reduce a token, so every rank stops after the same token, and there they also check that they sampled
// rank 0's token.
//
//   TokenOutput out(codec ? codec->stream() : nullptr, comm);
//   generate_tokens(decoder, prompt, n, options, &stats, [&](int32_t t, int64_t i) { return out.on_token(t, i); });
//   out.finish();
//   if (out.stop_signal() != 0) return 128 + out.stop_signal();
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/data/text_codec.h"

class TokenOutput {
 public:
  // `text`: the stream of the prompt's codec (text out), or null (ids out). Only rank 0 of `comm` prints.
  TokenOutput(std::unique_ptr<st::TextStream> text, st::Communicator& comm);

  // A generate_tokens sink: token i, the same on every rank (collective when there are several). Prints it unless
  // stdout is closed, and returns false to stop: after a stop signal on any rank (the token is printed first), or once
  // stdout is closed. The test-only SHARDTRAIN_FAULT points sigint and sigterm send this rank the signal once it has
  // sampled token STEP (i + 1).
  bool on_token(int32_t token, int64_t i);

  // The end of the output: the text held back, then a newline (nothing once stdout is closed).
  void finish();

  int stop_signal() const { return stop_signal_; }  // the stop signal the ranks agreed on; 0: none
  bool stdout_closed() const { return closed_; }    // rank 0's stdout, as every rank learned it
  int64_t printed() const { return printed_; }      // tokens printed (or, off rank 0, agreed on)

 private:
  void write(std::string_view s);

  std::unique_ptr<st::TextStream> text_;
  st::Communicator& comm_;
  bool printer_;
  bool closed_ = false;
  int stop_signal_ = 0;
  int64_t printed_ = 0;
  std::vector<double> shared_;  // the all-reduce: each rank's token, each rank's signal, rank 0's closed stdout
};
