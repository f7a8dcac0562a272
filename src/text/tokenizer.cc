// encode(): the text is made valid UTF-8, cut at added tokens, normalized, cut at added tokens again (those matched
// on normalized text), split by the pre-tokenizer's regex, and each piece is merged by BPE from its bytes. The
// byte-level spelling of Hugging Face's vocabulary exists only at load time: here every table is keyed by raw bytes,
// so the hot path never converts a character.
#include "shardtrain/text/tokenizer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <unordered_map>
#include <utility>

#include "added_tokens.h"
#include "bpe.h"
#include "byte_level.h"
#include "hash.h"
#include "nfc.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"
#include "split_regex.h"
#include "string_table.h"
#include "tokenizer_json.h"
#include "utf8.h"
#include "word_cache.h"

namespace st {
namespace {

using text::WordCache;

std::atomic<uint64_t> next_serial{1};

// A thread's word caches, one per tokenizer it has used lately (keyed by the tokenizer's serial number, which is
// never reused, so a cache cannot outlive its tokenizer's meaning). Few programs use more than one tokenizer; the
// least recently used of kSlots is replaced.
class ThreadCaches {
 public:
  WordCache& get(uint64_t serial) {
    ++clock_;
    Slot* oldest = &slots_[0];
    for (Slot& s : slots_) {
      if (s.serial == serial) {
        s.used = clock_;
        return *s.cache;
      }
      if (s.used < oldest->used) oldest = &s;
    }
    oldest->serial = serial;
    oldest->used = clock_;
    oldest->cache = std::make_unique<WordCache>();
    return *oldest->cache;
  }

 private:
  static constexpr int kSlots = 4;
  struct Slot {
    uint64_t serial = 0;
    uint64_t used = 0;
    std::unique_ptr<WordCache> cache;
  };
  std::array<Slot, kSlots> slots_;
  uint64_t clock_ = 0;
};

// Per-thread working memory of one encode() call.
struct Scratch {
  std::string lossy;
  std::string normalized;
  std::vector<int32_t> word;
  text::BpeScratch bpe;
};

ThreadCaches& thread_caches() {
  thread_local ThreadCaches c;
  return c;
}

Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

}  // namespace

struct Tokenizer::Impl {
  std::string path;
  uint64_t serial = next_serial.fetch_add(1);
  int32_t vocab_size = 0;

  std::array<int32_t, 256> byte_ids{};  // the token of each single byte
  text::MergeTable merges;
  bool ignore_merges = false;
  text::StringTable raw_vocab;  // raw bytes -> id, for ignore_merges
  text::StringTable spellings;  // byte-level spelling -> id, for token_id()
  bool nfc = false;
  std::unique_ptr<text::SplitRegex> split;
  text::AddedTokenMatcher raw_added;         // normalized false: matched on the text as given
  text::AddedTokenMatcher normalized_added;  // normalized true: matched on the normalized text
  std::unordered_map<std::string, int32_t> added_ids;

  std::string decode_bytes;            // every id's bytes, back to back
  std::vector<uint32_t> decode_start;  // id -> offset in decode_bytes; one more entry at the end

  struct Run {
    const Impl& tok;
    bool added_tokens;
    WordCache& cache;
    Scratch& scratch;
    std::vector<int32_t>* out;

    void encode(std::string_view text) {
      cut_at_added_tokens(tok.raw_added, text::utf8_lossy(text, &scratch.lossy),
                          [&](std::string_view s) { normalize(s); });
    }

    void normalize(std::string_view s) {
      if (tok.nfc) {
        if (s.size() > static_cast<size_t>(INT32_MAX)) {
          ST_BAD_INPUT(tok.path, ": a text of ", s.size(),
                       " bytes between added tokens is more than NFC normalization takes at once (2 GiB); expected "
                       "a shorter text");
        }
        s = text::nfc(s, &scratch.normalized);
      }
      cut_at_added_tokens(tok.normalized_added, s, [&](std::string_view t) { pre_tokenize(t); });
    }

    // Passes the stretches of `s` between the added tokens of `added` to next(), the tokens to the output; with
    // added tokens off, all of `s` to next().
    template <typename Next>
    void cut_at_added_tokens(const text::AddedTokenMatcher& added, std::string_view s, Next&& next) {
      if (added_tokens) {
        added.split(s, next, [&](int32_t id) { out->push_back(id); });
      } else {
        next(s);
      }
    }

    void pre_tokenize(std::string_view s) {
      tok.split->split(s, [&](std::string_view word) { encode_word(word); });
    }

    void encode_word(std::string_view word) {
      if (word.size() == 1) {
        out->push_back(tok.byte_ids[static_cast<unsigned char>(word[0])]);
        return;
      }
      const uint64_t hash = text::hash_bytes(word.data(), word.size());
      int n = 0;
      if (const int32_t* ids = cache.find(word, hash, &n)) {
        out->insert(out->end(), ids, ids + n);
        return;
      }
      if (tok.ignore_merges) {
        const int32_t id = tok.raw_vocab.find(word);
        if (id >= 0) {
          out->push_back(id);
          cache.insert(word, hash, &id, 1);
          return;
        }
      }
      std::vector<int32_t>& ids = scratch.word;
      ids.resize(word.size());
      for (size_t i = 0; i < word.size(); ++i) ids[i] = tok.byte_ids[static_cast<unsigned char>(word[i])];
      n = text::bpe_merge(tok.merges, ids.data(), static_cast<int>(ids.size()), &scratch.bpe);
      out->insert(out->end(), ids.data(), ids.data() + n);
      cache.insert(word, hash, ids.data(), n);
    }
  };
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::string& path) {
  text::TokenizerSpec spec = text::read_tokenizer_json(path);
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  const auto n_vocab = static_cast<int32_t>(spec.vocab.size());

  // Raw bytes of every vocab entry. An entry whose spelling leaves the byte-level alphabet can never come out of
  // the encoder; it decodes to its own UTF-8, as Hugging Face's ByteLevel decoder does.
  std::vector<std::string> raw(spec.vocab.size());
  std::vector<bool> byte_level(spec.vocab.size());
  for (int32_t id = 0; id < n_vocab; ++id) {
    byte_level[id] = text::byte_level_decode(spec.vocab[id], &raw[id]);
    if (!byte_level[id]) raw[id] = spec.vocab[id];
  }
  std::vector<int32_t> ids(spec.vocab.size());
  for (int32_t id = 0; id < n_vocab; ++id) ids[id] = id;
  impl->spellings = text::StringTable(spec.vocab, ids);
  for (int b = 0; b < 256; ++b) {
    impl->byte_ids[b] = impl->spellings.find(text::byte_level_encode(std::string(1, static_cast<char>(b))));
  }
  impl->ignore_merges = spec.ignore_merges;
  if (spec.ignore_merges) {
    // Only entries in the alphabet: the others are not byte strings the encoder can look up.
    std::vector<std::string> keys;
    std::vector<int32_t> key_ids;
    for (int32_t id = 0; id < n_vocab; ++id) {
      if (!byte_level[id]) continue;
      keys.push_back(raw[id]);
      key_ids.push_back(id);
    }
    impl->raw_vocab = text::StringTable(keys, key_ids);
  }
  impl->merges = text::MergeTable(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const text::TokenizerSpec::Merge& m = spec.merges[rank];
    impl->merges.insert(m.left, m.right, static_cast<uint32_t>(rank), m.merged);
  }
  impl->nfc = spec.nfc;
  impl->split = std::make_unique<text::SplitRegex>(spec.split_pattern, spec.split_field);

  // Added tokens: the two tries, and decoding.
  std::vector<std::string> raw_patterns, normalized_patterns;
  std::vector<text::AddedToken> raw_tokens, normalized_tokens;
  int32_t max_id = n_vocab - 1;
  for (const text::AddedToken& t : spec.added) {
    impl->added_ids.emplace(t.content, t.id);
    max_id = std::max(max_id, t.id);
    if (t.normalized) {
      std::string buf;
      const std::string pattern(spec.nfc ? text::nfc(t.content, &buf) : std::string_view(t.content));
      if (std::find(normalized_patterns.begin(), normalized_patterns.end(), pattern) != normalized_patterns.end()) {
        ST_BAD_INPUT(path, ": field added_tokens: \"", excerpt(t.content),
                     "\" normalizes to the text of another added token with normalized true; expected distinct "
                     "tokens");
      }
      normalized_patterns.push_back(pattern);
      normalized_tokens.push_back(t);
    } else {
      raw_patterns.push_back(t.content);
      raw_tokens.push_back(t);
    }
  }
  impl->raw_added = text::AddedTokenMatcher(raw_patterns, raw_tokens);
  impl->normalized_added = text::AddedTokenMatcher(normalized_patterns, normalized_tokens);
  impl->vocab_size = max_id + 1;

  // Decoding, as Hugging Face's decode(ids, false): an added token's content (it shadows a vocab entry of the same
  // id), else the vocab entry; then ByteLevel's decode of that text: its bytes when every character is in the
  // alphabet, else its UTF-8 as it is.
  std::vector<std::string> by_id(impl->vocab_size);
  for (int32_t id = 0; id < n_vocab; ++id) by_id[id] = std::move(raw[id]);
  for (const text::AddedToken& t : spec.added) {
    if (!text::byte_level_decode(t.content, &by_id[t.id])) by_id[t.id] = t.content;
  }
  impl->decode_start.reserve(impl->vocab_size + 1);
  for (const std::string& b : by_id) {
    impl->decode_start.push_back(static_cast<uint32_t>(impl->decode_bytes.size()));
    impl->decode_bytes += b;
  }
  impl->decode_start.push_back(static_cast<uint32_t>(impl->decode_bytes.size()));
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool added_tokens) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 16);
  encode_into(text, added_tokens, &out);
  return out;
}

void Tokenizer::encode_into(std::string_view text, bool added_tokens, std::vector<int32_t>* out) const {
  Impl::Run run{*impl_, added_tokens, thread_caches().get(impl_->serial), thread_scratch(), out};
  run.encode(text);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const { return decode(ids.data(), ids.size()); }

std::string_view Tokenizer::token_bytes(int32_t id) const {
  const Impl& t = *impl_;
  if (id < 0 || id >= t.vocab_size)
    ST_BAD_INPUT(t.path, ": cannot decode id ", id, ": expected an id in 0..", t.vocab_size - 1);
  return std::string_view(t.decode_bytes).substr(t.decode_start[id], t.decode_start[id + 1] - t.decode_start[id]);
}

std::string Tokenizer::decode(const int32_t* ids, size_t n) const {
  const Impl& t = *impl_;
  std::string bytes;
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= t.vocab_size) {
      ST_BAD_INPUT(t.path, ": cannot decode id ", id, " at position ", i, ": expected an id in 0..", t.vocab_size - 1);
    }
    bytes.append(token_bytes(id));
  }
  std::string lossy;
  const std::string_view valid = text::utf8_lossy(bytes, &lossy);
  return valid.data() == bytes.data() ? bytes : lossy;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::token_id(std::string_view content) const {
  const auto it = impl_->added_ids.find(std::string(content));
  if (it != impl_->added_ids.end()) return it->second;
  const int32_t id = impl_->spellings.find(content);
  if (id >= 0) return id;
  return std::nullopt;
}

int32_t Tokenizer::added_token_id(std::string_view content) const {
  const auto it = impl_->added_ids.find(std::string(content));
  if (it == impl_->added_ids.end()) {
    std::string known;
    for (const auto& [c, id] : impl_->added_ids) {
      if (known.size() > 200) {
        known += ", ...";
        break;
      }
      known += (known.empty() ? "" : ", ") + c;
    }
    ST_BAD_INPUT(impl_->path, " has no added token \"", excerpt(content),
                 "\" (its added tokens: ", known.empty() ? "none" : known, ")");
  }
  return it->second;
}

const std::string& Tokenizer::path() const { return impl_->path; }

}  // namespace st
