// `shardtrain tokenize`: text files or JSONL in, llm.c token shards out, on every core.
//
// Inputs are read in the order given (each glob expanded and sorted) and streamed: memory stays bounded at any
// input size. A document is a whole text file, or one JSONL line (empty lines are skipped). Formats:
//   text     the file's bytes are one document
//   jsonl    {"text": "..."} a line (the field is text_field)
//   chat     {"messages": [{"role": ..., "content": ...}, ...]} a line, with a loss mask (conventions.h)
//   prompt   {"prompt": ..., "completion": ...} a line, with a loss mask
//   auto     jsonl for files ending in .jsonl or .json, text otherwise
//
// Output: PREFIX_train_000000.bin, PREFIX_train_000001.bin, ... of shard_tokens tokens each (the last one shorter),
// and PREFIX_val_*.bin the same way when val_fraction > 0, in llm.c's format: uint16 tokens for vocabularies up to
// 65,536, llm.c's uint32 variant above (docs/data-format.md). chat and prompt also write the loss mask beside each
// shard (NAME.mask). A document goes to validation when uniform(seed 0, its index) < val_fraction: the split depends
// only on the inputs, never on timing.
//
// Threads: one reader, `threads` encoders, and the caller's thread writing in input order, so the output is
// byte-identical for any thread count. A large text file is cut into pieces of about 1 MiB at a newline followed by
// an ASCII letter, where the split patterns of GPT-2, Llama 3 and Qwen 2.5 always end a pre-token, so the pieces
// encode to the tokens of the whole file.
//
// Only new files, and nothing that looks complete before it is: existing PREFIX_train_* / PREFIX_val_* files are
// refused up front (a shorter rerun would otherwise leave stale shards that a glob picks up), and so is an --out
// whose directory cannot be made or written (kBadInput naming --out). While the set is written the marker
// PREFIX.incomplete exists (data/llmc_format.h: readers refuse the shards of a set that has one); it is created
// first, exclusively (two runs on one PREFIX cannot meet), and removed last, which commits the set. Each shard is
// written under a temporary name and renamed when complete. On any error, and when `stop_requested` says so, the shards
// already written are removed, then the marker. A process killed outright leaves the marker: the next run names the
// leftovers as incomplete. An empty input file (0 bytes, or JSONL without a line) is refused, naming it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace st {

enum class InputFormat { kAuto, kText, kJsonl, kChat, kPrompt };
// "auto", "text", "jsonl", "chat", "prompt"; kBadInput naming --format otherwise.
InputFormat parse_input_format(const std::string& s);
const char* to_string(InputFormat f);

struct TokenizeOptions {
  std::string tokenizer;            // tokenizer.json
  std::string out_prefix;           // PREFIX: writes PREFIX_train_*.bin (its directory is created)
  std::vector<std::string> inputs;  // files or globs
  InputFormat format = InputFormat::kAuto;
  std::string text_field = "text";  // jsonl
  double val_fraction = 0;          // [0, 1)
  int64_t shard_tokens = 100'000'000;
  int threads = 0;                  // encoders; 0: one per core
  std::string separator;            // document separator (conventions.h); empty: the family's
};

struct TokenizeProgress {
  int64_t bytes_done = 0;
  int64_t bytes_total = 0;  // the inputs' sizes
  double elapsed_s = 0;
};

struct TokenizeSummary {
  int64_t documents = 0, val_documents = 0;
  int64_t tokens = 0, val_tokens = 0;  // separators and template tokens included
  int64_t trained_tokens = 0;          // tokens whose mask is 1 (chat, prompt); == tokens otherwise
  int64_t bytes = 0;                   // input bytes read
  int token_bits = 16;                 // 16 or 32
  std::string family;                  // conventions.h TokenFamily
  std::vector<std::string> train_shards, val_shards;
  double seconds = 0;
  bool stopped = false;  // `stop_requested` asked the job to stop: it removed what it had written (the rest is unset)
};

// Runs the job; `progress` (may be empty) is called from the calling thread at most every 200 ms and once at
// the end. kBadInput names the file (and line) of a bad input. `stop_requested` (may be empty) is polled from the
// calling thread (between documents and shards, and every 100 ms while it waits): true stops the job, which removes its
// output and returns with `stopped` set.
TokenizeSummary run_tokenize(const TokenizeOptions& opts, const std::function<void(const TokenizeProgress&)>& progress,
                             const std::function<bool()>& stop_requested = nullptr);

}  // namespace st
