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
// Nothing is left half-written: each shard is written under a temporary name and renamed when complete, and on any
// error the shards already written are removed before the error propagates. Existing PREFIX_train_* / PREFIX_val_*
// files are refused up front (a shorter rerun would otherwise leave stale shards that a glob picks up).
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
};

// Runs the job; `progress` (may be empty) is called from the calling thread at most every 200 ms and once at
// the end. kBadInput names the file (and line) of a bad input.
TokenizeSummary run_tokenize(const TokenizeOptions& opts, const std::function<void(const TokenizeProgress&)>& progress);

}  // namespace st
