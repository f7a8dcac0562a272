#include "shardtrain/text/tokenize_job.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "shardtrain/core/elapsed.h"
#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/fault.h"
#include "shardtrain/core/new_file.h"
#include "shardtrain/core/rng.h"
#include "shardtrain/core/unique_fd.h"
#include "shardtrain/data/llmc_format.h"
#include "shardtrain/data/llmc_writer.h"
#include "shardtrain/data/path_glob.h"
#include "shardtrain/text/conventions.h"
#include "shardtrain/text/tokenizer.h"

namespace fs = std::filesystem;

namespace st {

InputFormat parse_input_format(const std::string& s) {
  for (InputFormat f : {InputFormat::kAuto, InputFormat::kText, InputFormat::kJsonl, InputFormat::kChat,
                        InputFormat::kPrompt})
    if (s == to_string(f)) return f;
  ST_BAD_INPUT("--format is \"", s, "\": expected auto, text, jsonl, chat or prompt");
}

const char* to_string(InputFormat f) {
  switch (f) {
    case InputFormat::kAuto: return "auto";
    case InputFormat::kText: return "text";
    case InputFormat::kJsonl: return "jsonl";
    case InputFormat::kChat: return "chat";
    case InputFormat::kPrompt: return "prompt";
  }
  return "?";
}

namespace {

constexpr size_t kPieceBytes = size_t{1} << 20;  // a text piece, and a batch of JSONL lines
constexpr size_t kReadBytes = size_t{4} << 20;
constexpr uint64_t kValSplitStream = 0x5641'4C53'504C'4954ull;  // "VALSPLIT"

// One unit of encoding work: part of a text file, or one JSONL line.
struct Piece {
  int64_t doc = 0;          // the document's index over all inputs
  bool first = true;        // the document's first piece (gets the separator)
  InputFormat format = InputFormat::kText;  // never kAuto
  std::string text;
  std::string where;        // "FILE" or "FILE:LINE", for errors
};

struct Batch {
  int64_t seq = 0;
  int64_t bytes = 0;
  std::vector<Piece> pieces;
};

struct DocTokens {
  int64_t doc = 0;
  EncodedDoc tokens;  // mask empty for text and jsonl
};

struct Encoded {
  int64_t bytes = 0;
  std::vector<DocTokens> docs;
  std::exception_ptr error;
};

// The index of the last position p in (0, s.size()) with s[p-1] == '\n' and s[p] an ASCII letter, or 0.
size_t last_safe_cut(const std::string& s) {
  for (size_t p = s.size() - 1; p > 0; --p) {
    const char c = s[p];
    if (s[p - 1] == '\n' && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) return p;
  }
  return 0;
}

InputFormat format_of(const std::string& path, InputFormat requested) {
  if (requested != InputFormat::kAuto) return requested;
  const std::string ext = fs::path(path).extension().string();
  return ext == ".jsonl" || ext == ".json" ? InputFormat::kJsonl : InputFormat::kText;
}

const nlohmann::json& string_field(const nlohmann::json& j, const char* key, const std::string& where,
                                   const std::string& what) {
  if (!j.is_object()) ST_BAD_INPUT(where, ": expected a JSON object ", what, ", got a ", j.type_name());
  const auto it = j.find(key);
  if (it == j.end()) {
    std::string keys;
    for (auto k = j.begin(); k != j.end(); ++k) keys += (keys.empty() ? "" : ", ") + k.key();
    ST_BAD_INPUT(where, ": no \"", key, "\" field ", what, " (its fields: ", keys.empty() ? "none" : keys, ")");
  }
  if (!it->is_string())
    ST_BAD_INPUT(where, ": \"", key, "\" is a ", it->type_name(), ", expected a string ", what);
  return *it;
}

nlohmann::json parse_line(const Piece& p) {
  try {
    return nlohmann::json::parse(p.text);
  } catch (const nlohmann::json::parse_error& e) {
    ST_BAD_INPUT(p.where, ": not a JSON object: ", e.what());
  }
}

void encode_piece(const Piece& p, const Conventions& conv, const std::string& text_field, DocTokens* out) {
  switch (p.format) {
    case InputFormat::kText:
      if (p.first && conv.separator() >= 0) out->tokens.ids.push_back(conv.separator());
      conv.tokenizer().encode_into(p.text, /*added_tokens=*/false, &out->tokens.ids);
      return;
    case InputFormat::kJsonl: {
      const nlohmann::json j = parse_line(p);
      conv.encode_text(string_field(j, text_field.c_str(), p.where, "(--text-field)").get_ref<const std::string&>(),
                       &out->tokens.ids);
      return;
    }
    case InputFormat::kChat: {
      const nlohmann::json j = parse_line(p);
      const auto it = j.is_object() ? j.find("messages") : j.end();
      if (it == j.end() || !it->is_array())
        ST_BAD_INPUT(p.where, ": expected {\"messages\": [{\"role\": ..., \"content\": ...}, ...]} (--format chat)");
      std::vector<ChatMessage> messages;
      for (size_t i = 0; i < it->size(); ++i) {
        const std::string what = "in messages[" + std::to_string(i) + "]";
        messages.push_back({string_field((*it)[i], "role", p.where, what).get<std::string>(),
                            string_field((*it)[i], "content", p.where, what).get<std::string>()});
      }
      conv.encode_chat(messages, p.where, &out->tokens);
      return;
    }
    case InputFormat::kPrompt: {
      const nlohmann::json j = parse_line(p);
      conv.encode_prompt(string_field(j, "prompt", p.where, "(--format prompt)").get_ref<const std::string&>(),
                         string_field(j, "completion", p.where, "(--format prompt)").get_ref<const std::string&>(),
                         &out->tokens);
      return;
    }
    case InputFormat::kAuto: break;
  }
  ST_CHECK(false, "a piece without a concrete format");
}

// Reads the inputs in order and cuts them into batches (the reader thread).
class Reader {
 public:
  Reader(std::vector<std::string> files, InputFormat format) : files_(std::move(files)), format_(format) {}

  // Calls emit(batch) for each batch in order; returns false if emit asked to stop.
  void run(const std::function<bool(Batch&&)>& emit) {
    emit_ = &emit;
    for (const std::string& f : files_) {
      const InputFormat fmt = format_of(f, format_);
      std::ifstream in(f, std::ios::binary);
      if (!in) ST_BAD_INPUT("cannot open input ", f, ": ", errno_text());
      if (fmt == InputFormat::kText ? !read_text(in, f) : !read_lines(in, f, fmt)) return;
      if (in.bad()) ST_FAULT("reading input ", f, " failed: ", errno_text());
    }
    flush();
  }

 private:
  bool read_text(std::ifstream& in, const std::string& f) {
    const int64_t doc = next_doc_++;
    bool first = true;
    std::string pending;
    std::string block(kReadBytes, '\0');
    while (in) {
      in.read(block.data(), static_cast<std::streamsize>(block.size()));
      pending.append(block.data(), static_cast<size_t>(in.gcount()));
      while (pending.size() >= kPieceBytes) {
        const size_t cut = last_safe_cut(pending);
        if (cut == 0) break;  // no boundary yet: read on
        if (!add({doc, first, InputFormat::kText, pending.substr(0, cut), f})) return false;
        first = false;
        pending.erase(0, cut);
      }
    }
    if (!pending.empty() || first) return add({doc, first, InputFormat::kText, std::move(pending), f});
    return true;
  }

  bool read_lines(std::ifstream& in, const std::string& f, InputFormat fmt) {
    std::string line;
    int64_t n = 1, documents = 0;
    for (; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      ++documents;
      if (!add({next_doc_++, true, fmt, std::move(line), f + ":" + std::to_string(n)})) return false;
      line.clear();
    }
    if (documents == 0 && !in.bad())
      ST_BAD_INPUT("input ", f, " is empty: it holds no JSON line (", n - 1, " blank line(s)); nothing to tokenize");
    return true;
  }

  bool add(Piece&& p) {
    batch_.bytes += static_cast<int64_t>(p.text.size());
    batch_.pieces.push_back(std::move(p));
    if (static_cast<size_t>(batch_.bytes) >= kPieceBytes || batch_.pieces.size() >= 4096) return flush();
    return true;
  }

  bool flush() {
    if (batch_.pieces.empty()) return true;
    batch_.seq = seq_++;
    const bool go_on = (*emit_)(std::move(batch_));
    batch_ = Batch();
    return go_on;
  }

  std::vector<std::string> files_;
  InputFormat format_;
  const std::function<bool(Batch&&)>* emit_ = nullptr;
  Batch batch_;
  int64_t seq_ = 0;
  int64_t next_doc_ = 0;
};

// Thrown from the writing thread when `stop_requested` asks the job to stop; run_tokenize catches it.
struct Stopped {};

// One output stream (train or val): shards of shard_tokens tokens.
class ShardSeries {
 public:
  ShardSeries(std::string prefix, int64_t shard_tokens, int bits, bool masked, std::function<void()> check_stop)
      : prefix_(std::move(prefix)),
        shard_tokens_(shard_tokens),
        bits_(bits),
        masked_(masked),
        check_stop_(std::move(check_stop)) {}

  void append(const EncodedDoc& d) {
    for (size_t at = 0; at < d.ids.size();) {
      if (!writer_) open();
      const size_t n = std::min(d.ids.size() - at, static_cast<size_t>(shard_tokens_ - in_shard_));
      if (masked_)
        writer_->write(d.ids.data() + at, d.mask.data() + at, static_cast<int64_t>(n));
      else
        writer_->write(d.ids.data() + at, static_cast<int64_t>(n));
      at += n;
      in_shard_ += static_cast<int64_t>(n);
      tokens_ += static_cast<int64_t>(n);
      if (in_shard_ == shard_tokens_) close();
    }
  }
  void finish() {
    if (writer_) close();
  }
  // Removes what was written (the error path).
  void discard() noexcept {
    writer_.reset();  // a writer destroyed before close() removes its temporary files
    for (const std::string& p : done_) {
      std::error_code ec;
      fs::remove(p, ec);
      if (masked_) fs::remove(mask_path_for(p), ec);
    }
    done_.clear();
  }
  const std::vector<std::string>& shards() const { return done_; }
  int64_t tokens() const { return tokens_; }

 private:
  void open() {
    check_stop_();
    char name[32];
    std::snprintf(name, sizeof name, "_%06zu.bin", done_.size());
    path_ = prefix_ + name;
    writer_ = std::make_unique<LlmcShardWriter>(path_, bits_, masked_);
    in_shard_ = 0;
  }
  void close() {
    writer_->close();
    writer_.reset();
    done_.push_back(path_);
    // The test seam: a run stopped at a known point, for a signal to land in the middle of it.
    if (fault_injected("tokenize_sigstop", 0, static_cast<int64_t>(done_.size()))) ::raise(SIGSTOP);
  }

  std::string prefix_;
  int64_t shard_tokens_;
  int bits_;
  bool masked_;
  std::function<void()> check_stop_;
  std::unique_ptr<LlmcShardWriter> writer_;
  std::string path_;
  int64_t in_shard_ = 0, tokens_ = 0;
  std::vector<std::string> done_;
};

// Refuses an output set that is there already: the files of a finished run, or the leftovers (marker, shards,
// temporaries) of one that was killed.
void refuse_existing_outputs(const std::string& prefix) {
  const fs::path p(prefix);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string stem = p.filename().string();
  if (stem.empty()) ST_BAD_INPUT("--out ", prefix, " names a directory: give a file prefix such as ", prefix, "data");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  const std::string marker = incomplete_marker_for_prefix(prefix);
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    for (const char* split : {"_train_", "_val_"})
      if (name.rfind(stem + split, 0) == 0) found.push_back(e.path().string());
  }
  std::sort(found.begin(), found.end());
  if (path_exists(marker)) {
    std::string list;
    for (size_t i = 0; i < found.size() && i < 5; ++i) list += (i ? ", " : "") + found[i];
    if (found.size() > 5) list += str_cat(", ... (", found.size(), " files)");
    ST_BAD_INPUT("--out ", prefix, ": ", marker,
                 " exists: a tokenize run on this prefix was interrupted (or is still running), and its output is "
                 "incomplete",
                 found.empty() ? std::string() : ": " + list,
                 "; remove them and the marker, then run again (or choose another prefix)");
  }
  if (!found.empty())
    ST_BAD_INPUT("--out ", prefix, ": ", found.front(),
                 " exists; remove the earlier output or choose another prefix (a shorter rerun would leave its stale "
                 "shards behind)");
}

// Makes --out's directory; kBadInput naming --out when it cannot be made (a file in the way, a read-only file
// system, no permission).
void make_output_dir(const std::string& prefix) {
  const fs::path parent = fs::path(prefix).parent_path();
  if (parent.empty()) return;
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (!ec && fs::is_directory(parent, ec)) return;
  for (fs::path up = parent; !up.empty(); up = up.parent_path()) {
    std::error_code e;
    const fs::file_status st = fs::status(up, e);
    if (fs::exists(st) && !fs::is_directory(st))
      ST_BAD_INPUT("--out ", prefix, ": ", up.string(), " is a file, not a directory");
    if (up == up.parent_path()) break;
  }
  ST_BAD_INPUT("--out ", prefix, ": cannot create its directory ", parent.string(), ": ",
               ec ? ec.message() : std::string("it is not a directory"));
}

// Makes a change to the directory entries beside `path` durable.
void fsync_directory_of(const std::string& path) {
  const fs::path dir = fs::path(path).parent_path();
  UniqueFd dfd(::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dfd || ::fsync(dfd.get()) != 0) ST_FAULT("cannot fsync the directory of ", path, ": ", errno_text());
}

// The set's marker (llmc_format.h): created exclusively, written and made durable before the first shard.
void create_marker(const std::string& prefix) {
  const std::string marker = incomplete_marker_for_prefix(prefix);
  UniqueFd fd(::open(marker.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd) {
    const int err = errno;
    if (err == EEXIST)
      ST_BAD_INPUT("--out ", prefix, ": ", marker, " appeared: another tokenize run is writing this prefix");
    if (err == ENOSPC || err == EIO || err == EDQUOT) ST_FAULT("cannot create ", marker, ": ", errno_text(err));
    ST_BAD_INPUT("--out ", prefix, ": cannot create ", marker, ": ", errno_text(err));
  }
  const std::string text =
      str_cat("shardtrain tokenize (pid ", ::getpid(), ") is writing ", prefix, "_train_*.bin and ", prefix,
              "_val_*.bin; while this file exists, the set is incomplete\n");
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) || ::fsync(fd.get()) != 0 ||
      fd.close() != 0) {
    const int err = errno;
    ::unlink(marker.c_str());
    ST_FAULT("cannot write ", marker, ": ", errno_text(err));
  }
  fsync_directory_of(marker);
}

// Removes the marker (committing the set, or after its shards were removed) and makes that durable.
void remove_marker(const std::string& prefix) {
  const std::string marker = incomplete_marker_for_prefix(prefix);
  if (::unlink(marker.c_str()) != 0) ST_FAULT("cannot remove ", marker, ": ", errno_text());
  fsync_directory_of(marker);
}

}  // namespace

TokenizeSummary run_tokenize(const TokenizeOptions& opts, const std::function<void(const TokenizeProgress&)>& progress,
                             const std::function<bool()>& stop_requested) {
  const auto t0 = std::chrono::steady_clock::now();
  if (opts.out_prefix.empty()) ST_BAD_INPUT("tokenize needs --out PREFIX");
  if (opts.inputs.empty()) ST_BAD_INPUT("tokenize needs at least one INPUT (a file or a glob)");
  if (!(opts.val_fraction >= 0 && opts.val_fraction < 1))
    ST_BAD_INPUT("--val-fraction is ", opts.val_fraction, ": expected a number in [0, 1)");
  if (opts.shard_tokens < 1) ST_BAD_INPUT("--shard-tokens is ", opts.shard_tokens, ": expected at least 1");
  if (opts.threads < 0) ST_BAD_INPUT("--threads is ", opts.threads, ": expected 0 (one per core) or more");

  std::vector<std::string> files;
  for (const std::string& in : opts.inputs)
    for (std::string& f : expand_data_path(in, "input")) files.push_back(std::move(f));
  int64_t total_bytes = 0;
  for (const std::string& f : files) {
    const int64_t bytes = static_cast<int64_t>(fs::file_size(f));
    if (bytes == 0) ST_BAD_INPUT("input ", f, " is empty (0 bytes): nothing to tokenize");
    total_bytes += bytes;
  }

  TokenizeSummary sum;
  const auto stop_now = [&] { return stop_requested && stop_requested(); };
  const Tokenizer tok = Tokenizer::load(opts.tokenizer);
  const Conventions conv(tok, opts.separator);
  refuse_existing_outputs(opts.out_prefix);
  make_output_dir(opts.out_prefix);
  if (stop_now()) {
    sum.stopped = true;
    return sum;
  }
  create_marker(opts.out_prefix);

  sum.token_bits = llmc_token_bits(tok.vocab_size());
  sum.family = to_string(conv.family());
  const bool masked = opts.format == InputFormat::kChat || opts.format == InputFormat::kPrompt;
  const auto check_stop = [&] {
    if (stop_now()) throw Stopped{};
  };
  ShardSeries train(opts.out_prefix + "_train", opts.shard_tokens, sum.token_bits, masked, check_stop);
  ShardSeries val(opts.out_prefix + "_val", opts.shard_tokens, sum.token_bits, masked, check_stop);

  const int threads = opts.threads > 0 ? opts.threads : std::max(1u, std::thread::hardware_concurrency());
  const int64_t max_in_flight = 4 * threads;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<Batch> todo;
  std::map<int64_t, Encoded> done;
  int64_t produced = 0, written = 0;
  bool reader_finished = false, stop = false;
  std::exception_ptr reader_error;

  std::thread reader([&] {
    try {
      Reader(files, opts.format).run([&](Batch&& b) {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || produced - written < max_in_flight; });
        if (stop) return false;
        todo.push_back(std::move(b));
        ++produced;
        cv.notify_all();
        return true;
      });
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      reader_error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu);
    reader_finished = true;
    cv.notify_all();
  });

  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w)
    workers.emplace_back([&] {
      for (;;) {
        Batch b;
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stop || !todo.empty() || reader_finished; });
          if (stop || todo.empty()) return;
          b = std::move(todo.front());
          todo.pop_front();
        }
        Encoded e;
        e.bytes = b.bytes;
        try {
          for (const Piece& p : b.pieces) {
            DocTokens d;
            d.doc = p.doc;
            encode_piece(p, conv, opts.text_field, &d);
            e.docs.push_back(std::move(d));
          }
        } catch (...) {
          e.error = std::current_exception();
        }
        std::lock_guard<std::mutex> lock(mu);
        done.emplace(b.seq, std::move(e));
        cv.notify_all();
      }
    });

  const auto shut_down = [&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
      cv.notify_all();
    }
    reader.join();
    for (std::thread& t : workers) t.join();
  };

  double last_report = -1;
  int64_t bytes_done = 0, last_doc = -1;
  try {
    for (;;) {
      Encoded e;
      {
        std::unique_lock<std::mutex> lock(mu);
        const auto ready = [&] { return done.count(written) || (reader_finished && produced == written); };
        while (!cv.wait_for(lock, std::chrono::milliseconds(100), ready)) {
          lock.unlock();
          check_stop();
          lock.lock();
        }
        if (!done.count(written)) break;  // everything read has been written
        e = std::move(done[written]);
        done.erase(written);
        ++written;
        cv.notify_all();
      }
      if (e.error) std::rethrow_exception(e.error);
      for (const DocTokens& d : e.docs) {
        check_stop();
        const bool is_val = opts.val_fraction > 0 && uniform_at(0, kValSplitStream, d.doc) < opts.val_fraction;
        (is_val ? val : train).append(d.tokens);
        if (d.doc != last_doc) {
          ++sum.documents;
          if (is_val) ++sum.val_documents;
          last_doc = d.doc;
        }
        sum.trained_tokens += masked ? std::count(d.tokens.mask.begin(), d.tokens.mask.end(), uint8_t{1})
                                     : static_cast<int64_t>(d.tokens.ids.size());
      }
      bytes_done += e.bytes;
      if (progress && seconds_since(t0) - last_report >= 0.2) {
        last_report = seconds_since(t0);
        progress({bytes_done, total_bytes, last_report});
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      if (reader_error) std::rethrow_exception(reader_error);
    }
    if (opts.val_fraction > 0 && sum.val_documents == 0)
      ST_BAD_INPUT("--val-fraction ", opts.val_fraction, " chose none of the ", sum.documents,
                   " documents for validation (a document is a text file or a JSONL line): give more documents, a "
                   "larger fraction, or --val-fraction 0");
    if (train.tokens() == 0) ST_BAD_INPUT("the inputs hold no document for training (", files.size(), " file(s))");
    train.finish();
    val.finish();
    check_stop();  // the last moment a stop undoes the run: once the marker goes, the set is committed
    remove_marker(opts.out_prefix);
  } catch (const Stopped&) {
    shut_down();
    train.discard();
    val.discard();
    remove_marker(opts.out_prefix);
    sum.stopped = true;
    return sum;
  } catch (...) {
    shut_down();
    train.discard();
    val.discard();
    try {
      remove_marker(opts.out_prefix);
    } catch (const Error&) {
      // The job's own error is the one to report; a marker that stays names the set as incomplete.
    }
    throw;
  }
  shut_down();
  sum.tokens = train.tokens() + val.tokens();
  sum.val_tokens = val.tokens();
  sum.bytes = bytes_done;
  sum.train_shards = train.shards();
  sum.val_shards = val.shards();
  sum.seconds = seconds_since(t0);
  if (progress) progress({bytes_done, total_bytes, sum.seconds});
  return sum;
}

}  // namespace st
