// What `shardtrain generate` prints, as a Unix filter does, and when: generate_batch's sink (model/generation.h).
// Every rank runs it with the same tokens: it keeps each sequence's Completion (text/completion.h: its text, end
// tokens and stop strings, so every rank ends a sequence at the same token), and rank 0 prints, unbuffered:
//   kStream  one sequence, each token's text (or its id, comma-separated) as soon as it is sampled; the text that
//            could still start a stop string is held until the next token settles it; a newline at the end.
//   kLines   each result on one line once it and every result before it are done, in the prompts' order: its text
//            with backslash, newline and carriage return written as \\, \n and \r, or its ids comma-separated.
//   kJsonl   the same, each result a JSON object:
//            {"index": I, "text": TEXT or null (ids only), "token_ids": [...], "finish_reason": "length" | "stop",
//             "prompt_token_ids": [...]}
// A closed stdout (EPIPE: SIGPIPE is ignored) and a stop signal (SIGINT, SIGTERM, SIGUSR1: core/preempt.h) end every
// sequence at once: the sink throws GenerationStopped, after printing the token in progress (kStream) or the results
// it completed. Under mpirun the ranks agree on both, and check that they sampled rank 0's token, with one small
// all-reduce a token, so every rank stops after the same token.
//
//   GenerateOutput out(OutputForm::kLines, std::move(completions), prompts, n, comm);
//   const auto sink = [&](int s, int32_t t, int64_t i) { return out.on_token(s, t, i); };
//   try {
//     generate_batch(decoder, prompts, n, options, &stats, sink);
//   } catch (const GenerationStopped&) {}
//   out.finish();
//   if (out.stop_signal() != 0) return 128 + out.stop_signal();
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/text/completion.h"

enum class OutputForm { kStream, kLines, kJsonl };

// Thrown by GenerateOutput::on_token to end every sequence: a stop signal or a closed stdout.
struct GenerationStopped {};

// A result's text on one line: backslash, newline and carriage return written as \\, \n and \r.
std::string one_line(std::string_view text);

class GenerateOutput {
 public:
  // One Completion per sequence (kStream: exactly one), each given at most max_tokens tokens. Only rank 0 of `comm`
  // prints.
  GenerateOutput(OutputForm form, std::vector<st::Completion> completions, std::vector<std::vector<int32_t>> prompts,
                 int64_t max_tokens, st::Communicator& comm);

  // generate_batch's sink: token i of sequence `seq`, the same on every rank (collective when there are several).
  // Returns whether the sequence goes on; throws GenerationStopped to end them all. The test-only SHARDTRAIN_FAULT
  // points sigint and sigterm send this rank the signal once it has sampled token STEP (i + 1) of a sequence.
  bool on_token(int seq, int32_t token, int64_t i);

  // kStream: the text held back, then a newline (nothing once stdout is closed). The other forms printed each result
  // as it was done.
  void finish();

  int stop_signal() const { return stop_signal_; }            // the stop signal the ranks agreed on; 0: none
  bool stdout_closed() const { return closed_; }              // rank 0's stdout, as every rank learned it
  int64_t printed_tokens() const { return printed_tokens_; }  // kStream: tokens printed (or, off rank 0, agreed on)
  int64_t printed_results() const { return next_; }           // kLines, kJsonl: results printed

 private:
  void write(std::string_view s);
  // Every result done, from next_ on, in order.
  void print_done();
  std::string result_line(size_t seq) const;

  OutputForm form_;
  std::vector<st::Completion> completions_;
  std::vector<std::vector<int32_t>> prompts_;
  int64_t max_tokens_;
  st::Communicator& comm_;
  bool printer_;
  bool closed_ = false;
  int stop_signal_ = 0;
  int64_t printed_tokens_ = 0;
  size_t next_ = 0;             // the first result not printed
  std::vector<double> shared_;  // the all-reduce: each rank's token, sequence and signal, rank 0's closed stdout
};
