// A byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json`, giving the ids Hugging Face
// tokenizers gives, token for token (GPT-2, Llama 3, Qwen 2.5 and any tokenizer built the same way).
//
// What it reads (anything else is refused with kBadInput naming the file and the JSON field, expected vs actual):
//   model:          type "BPE" with vocab (ids 0..N-1, each once) and merges (merges as "a b" strings or ["a", "b"]
//                   pairs; each part and their concatenation must be in the vocab), ignore_merges (a pre-tokenized
//                   word that is itself in the vocab is one token), no dropout, no byte_fallback, no
//                   continuing_subword_prefix / end_of_word_suffix (null or ""). The vocab must hold the 256
//                   byte-level symbols, so unk_token is never used.
//   normalizer:     null, or NFC (as Hugging Face computes it, with the tables of Unicode 9.0: characters assigned
//                   later are left as they are)
//   pre_tokenizer:  ByteLevel (with use_regex: GPT-2's split pattern), or a Sequence of Split (a regex, behaviour
//                   Isolated, not inverted) followed by ByteLevel (use_regex false); add_prefix_space false
//   decoder:        ByteLevel
//   added_tokens:   matched in the input before anything else, leftmost-longest, as Hugging Face's AddedVocabulary:
//                   first the tokens with normalized false on the raw text, then, in the normalized text between
//                   them, those with normalized true; single_word, lstrip and rstrip as Hugging Face applies them.
//                   Each token's id must be the one Hugging Face assigns (its vocab id if the content is in the
//                   vocab, else the next id after the vocab, in file order); a token whose id collides is refused.
//   post_processor: null, ByteLevel, TemplateProcessing, RobertaProcessing, BertProcessing or a Sequence of them,
//                   and truncation / padding: all ignored. encode() never adds BOS/EOS or other special tokens
//                   (Hugging Face's add_special_tokens=false) and never truncates or pads; a caller that wants a
//                   separator appends added_token_id("<|endoftext|>") itself.
//
// The split regex runs on PCRE2 (Hugging Face runs it on Oniguruma). \s and \S are given Oniguruma's meaning
// (Unicode White_Space); what means something else in the two (\w \W \b \B \h \H \Q \E, inline options other than
// i and x) is refused naming the field. ^ and $ are line anchors, as in Oniguruma's Ruby syntax.
//
// Text in is UTF-8. Invalid UTF-8 is first replaced as Hugging Face's callers see it: each maximal invalid subpart
// becomes U+FFFD (what Rust's String::from_utf8_lossy and Node's Buffer.toString() do), so decode(encode(x)) == x
// holds for valid UTF-8 (that the normalizer leaves as it is) and not for invalid input.
//
// Thread safety: a loaded Tokenizer is immutable; encode() and decode() may run on many threads at once. Each thread
// keeps its own cache of recently encoded words (as Hugging Face's BPE cache, without a lock), about 8 MiB at most.
//
//   st::Tokenizer tok = st::Tokenizer::load("tokenizer.json");
//   std::vector<int32_t> ids = tok.encode("Hello world");          // added tokens in the text are recognised
//   std::string text = tok.decode(ids);
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace st {

// The largest tokenizer.json load() reads: the largest published ones (Llama 3, Qwen 2.5 and 3, Gemma) are under
// 20 MB, and a bound keeps a mistaken multi-GB file from being read into memory before it is refused.
inline constexpr int64_t kMaxTokenizerBytes = int64_t{64} << 20;

class Tokenizer {
 public:
  // Reads and checks `path`; kBadInput (naming `path` and the field) on anything it does not implement. Every
  // reader of a tokenizer (tokenize, generate, train's sample) loads it here. A path that is not a regular file (a
  // directory: naming the tokenizer.json it holds, if any; a FIFO, a device) or holds more than kMaxTokenizerBytes is
  // refused unread, naming it (with its size and the limit).
  static Tokenizer load(const std::string& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // The ids of `text`. With `added_tokens` true (Hugging Face's behaviour), the text of an added token (e.g.
  // "<|endoftext|>") becomes that token; false reads it as ordinary text (tiktoken's encode_ordinary), which is
  // what training data wants so that a document cannot inject separators. The result of false is Hugging Face's on
  // the same tokenizer.json with its added_tokens list emptied.
  std::vector<int32_t> encode(std::string_view text, bool added_tokens = true) const;
  // Appends to `out` instead (no allocation of a result vector).
  void encode_into(std::string_view text, bool added_tokens, std::vector<int32_t>* out) const;

  // The text of `ids` (ByteLevel decoding; added tokens decode to their content): the tokens' bytes concatenated,
  // with each maximal invalid UTF-8 subpart replaced by U+FFFD, which is Hugging Face's decode(ids, false).
  // Ids out of range: kBadInput.
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string decode(const int32_t* ids, size_t n) const;
  // One id's bytes before that replacement (a token can end inside a UTF-8 character): decode() of several ids is
  // the lossy copy of their bytes concatenated. Valid until the Tokenizer is destroyed. An id out of range: kBadInput.
  std::string_view token_bytes(int32_t id) const;

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
