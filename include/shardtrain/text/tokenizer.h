// A byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json`, giving the ids Hugging Face
// tokenizers gives, token for token (GPT-2, Llama 3, Qwen 2.5 and any tokenizer built the same way).
//
// What it reads (anything else is refused with kBadInput naming the file and the JSON field, expected vs actual):
//   model:         type "BPE" with vocab and merges (merges as "a b" strings or ["a", "b"] pairs), ignore_merges,
//                  no dropout, no unk_token use, no continuing_subword_prefix / end_of_word_suffix, no byte_fallback
//   normalizer:    null, or NFC
//   pre_tokenizer: ByteLevel (with use_regex: GPT-2's split pattern), or a Sequence of Split (a regex, behaviour
//                  Isolated, not inverted) followed by ByteLevel (use_regex false)
//   decoder:       ByteLevel
//   added_tokens:  matched in the input before anything else (longest first), as Hugging Face does
//
// Text in is UTF-8. Invalid UTF-8 is first replaced as Hugging Face's callers see it: each maximal invalid subpart
// becomes U+FFFD (what Rust's String::from_utf8_lossy and Node's Buffer.toString() do), so decode(encode(x)) == x
// holds for valid UTF-8 and not for invalid input.
//
// Thread safety: a loaded Tokenizer is immutable; encode() and decode() may run on many threads at once.
//
//   st::Tokenizer tok = st::Tokenizer::load("tokenizer.json");
//   std::vector<int32_t> ids = tok.encode("Hello world");          // added tokens in the text are recognised
//   std::string text = tok.decode(ids);
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace st {

class Tokenizer {
 public:
  // Reads and checks `path`; kBadInput (naming `path` and the field) on anything it does not implement.
  static Tokenizer load(const std::string& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // The ids of `text`. With `added_tokens` true (Hugging Face's behaviour), the text of an added token (e.g.
  // "<|endoftext|>") becomes that token; false reads it as ordinary text (tiktoken's encode_ordinary), which is
  // what training data wants so that a document cannot inject separators.
  std::vector<int32_t> encode(std::string_view text, bool added_tokens = true) const;
  // Appends to `out` instead (no allocation of a result vector).
  void encode_into(std::string_view text, bool added_tokens, std::vector<int32_t>* out) const;

  // The text of `ids` (ByteLevel decoding; added tokens decode to their content). Ids out of range: kBadInput.
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string decode(const int32_t* ids, size_t n) const;

  // One past the largest id (the model's vocabulary must be at least this).
  int32_t vocab_size() const;
  // The id of a token's exact content (a vocabulary entry in its byte-level spelling, or an added token), if any.
  std::optional<int32_t> token_id(std::string_view content) const;
  // The id of an added token, e.g. "<|endoftext|>"; kBadInput naming the tokenizer file if it has none.
  int32_t added_token_id(std::string_view content) const;
  // The path it was loaded from, for messages.
  const std::string& path() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace st
