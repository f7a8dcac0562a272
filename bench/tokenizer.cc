// Encoding throughput of shardtrain's tokenizer (st::Tokenizer, include/shardtrain/text/tokenizer.h) on one text
// file, in MB/s of input: one thread encoding the whole text at once (Hugging Face's single-sentence encode), and
// `--threads` threads encoding it cut into documents of about --doc-bytes (a batch encode on those cores).
//
//   build/bench_tokenizer --tokenizer tokenizer.json --text /usr/share/common-licenses/GPL-3 [--iters 20]
//                         [--threads 0 (all cores)] [--doc-bytes 4096]
//
// Each row is the median of --iters timed runs after one untimed run (which fills the word caches, as a long run's
// steady state has them). bench/tokenizer_hf.js times Hugging Face tokenizers the same way on the same file.
#include "shardtrain/text/tokenizer.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "shardtrain/core/elapsed.h"
#include "shardtrain/core/stats.h"

namespace {

using Clock = std::chrono::steady_clock;

template <typename Fn>
double median_seconds(int iters, Fn fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(st::seconds_since(t0));
  }
  return st::median(std::move(t));
}

// The runs of a thread pool: the timer starts run k, each worker waits for it, encodes its share and reports back.
class Runs {
 public:
  explicit Runs(int workers) : workers_(workers) {}
  // Timer: starts the next run and waits until every worker has finished it.
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    ++started_;
    finished_ = 0;
    cv_.notify_all();
    cv_.wait(lock, [&] { return finished_ == workers_; });
  }
  // Worker: waits for run `k` (1, 2, ...) to start.
  void wait_start(uint64_t k) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return started_ >= k; });
  }
  // Worker: done with the current run.
  void finish() {
    std::lock_guard<std::mutex> lock(mu_);
    ++finished_;
    cv_.notify_all();
  }

 private:
  const int workers_;
  uint64_t started_ = 0;
  int finished_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
};

// `text` cut after the first newline at or past every `doc_bytes`.
std::vector<std::string_view> documents(std::string_view text, size_t doc_bytes) {
  std::vector<std::string_view> docs;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', std::min(text.size(), begin + doc_bytes));
    end = end == std::string_view::npos ? text.size() : end + 1;
    docs.push_back(text.substr(begin, end - begin));
    begin = end;
  }
  return docs;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string tokenizer_path, text_path;
    std::vector<char*> rest = st::bench::take_text_flag(argc, argv, "--tokenizer", &tokenizer_path);
    rest = st::bench::take_text_flag(static_cast<int>(rest.size()), rest.data(), "--text", &text_path);
    int iters = 20, threads = 0, doc_bytes = 4096;
    st::bench::parse_int_flags(static_cast<int>(rest.size()), rest.data(), "bench_tokenizer",
                               {{"--iters", &iters}, {"--threads", &threads}, {"--doc-bytes", &doc_bytes}});
    if (tokenizer_path.empty() || text_path.empty()) ST_BAD_INPUT("bench_tokenizer: --tokenizer and --text are needed");
    if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

    std::ifstream in(text_path, std::ios::binary);
    if (!in) ST_BAD_INPUT("bench_tokenizer: cannot read ", text_path);
    std::ostringstream buf;
    buf << in.rdbuf();
    const std::string text = buf.str();
    const double mb = static_cast<double>(text.size()) / 1e6;

    const auto t0 = Clock::now();
    const st::Tokenizer tok = st::Tokenizer::load(tokenizer_path);
    const double load_s = st::seconds_since(t0);

    std::vector<int32_t> ids;
    const double one = median_seconds(iters, [&] {
      ids.clear();
      tok.encode_into(text, true, &ids);
    });
    // The threads live through all runs, as an encoding job's workers do, so their word caches stay warm.
    const std::vector<std::string_view> docs = documents(text, static_cast<size_t>(doc_bytes));
    const int copies = std::max(1, threads * 4);  // each run keeps every thread busy for a while
    Runs runs(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        std::vector<int32_t> out;
        for (uint64_t k = 1; k <= static_cast<uint64_t>(iters) + 1; ++k) {
          runs.wait_start(k);
          for (size_t d = t; d < docs.size() * copies; d += threads) {
            out.clear();
            tok.encode_into(docs[d % docs.size()], true, &out);
          }
          runs.finish();
        }
      });
    }
    const double many = median_seconds(iters, [&] { runs.run(); });
    for (std::thread& th : pool) th.join();
    std::printf("tokenizer %s\ntext %s: %zu bytes, %zu tokens (%.2f bytes a token); load %.2f s\n",
                tokenizer_path.c_str(), text_path.c_str(), text.size(), ids.size(),
                static_cast<double>(text.size()) / static_cast<double>(ids.size()), load_s);
    std::printf("%-34s %10s\n", "case", "MB/s");
    std::printf("%-34s %10.1f\n", "1 thread, whole text", mb / one);
    std::printf("%-34s %10.1f\n",
                (std::to_string(threads) + " threads, " + std::to_string(docs.size() * copies) + " documents").c_str(),
                mb * copies / many);
    return 0;
  } catch (const st::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return st::exit_code_for(e.kind());
  }
}
