#include "shardtrain/ckpt/unit_read_ahead.h"

#include <chrono>

#include "shardtrain/core/elapsed.h"
#include "shardtrain/core/error.h"

namespace st {
namespace {

// What the sink throws to end the read when the read-ahead is being destroyed: caught by the thread alone.
struct Stopped {};

}  // namespace

UnitReadAhead::UnitReadAhead(Read read) : thread_([this, read = std::move(read)] { run(read); }) {}

UnitReadAhead::~UnitReadAhead() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void UnitReadAhead::run(const Read& read) {
  const UnitSink queue = [this](int unit, std::vector<float>& values) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [this] { return ready_.empty() || stopping_; });
    if (stopping_) throw Stopped{};
    ready_.emplace_back(unit, std::move(values));
    values = std::move(spare_);  // the read's next unit fills a buffer the taker left, if it left one
    spare_ = std::vector<float>();
    lock.unlock();
    changed_.notify_all();
  };
  std::exception_ptr error;
  try {
    read(queue);
  } catch (const Stopped&) {
    // drain will not come (or has thrown): nothing to hand on
  } catch (...) {
    error = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = true;
    error_ = error;
  }
  changed_.notify_all();
}

void UnitReadAhead::drain(const UnitSink& take) {
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    if (ready_.empty() && !ended_) {
      const auto since = std::chrono::steady_clock::now();
      changed_.wait(lock, [this] { return !ready_.empty() || ended_; });
      waited_ += seconds_since(since);
    }
    if (ready_.empty()) {  // the read ended, and every unit it gave is taken
      if (error_) std::rethrow_exception(error_);
      return;
    }
    std::pair<int, std::vector<float>> unit = std::move(ready_.front());
    ready_.pop_front();
    lock.unlock();
    changed_.notify_all();
    take(unit.first, unit.second);
    if (unit.second.capacity() > 0) {
      lock.lock();
      if (unit.second.capacity() > spare_.capacity()) spare_ = std::move(unit.second);
    }
  }
}

}  // namespace st
