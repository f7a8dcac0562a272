#include "shardtrain/comm/watchdog.h"

#include <algorithm>
#include <future>
#include <tuple>
#include <utility>

#include "shardtrain/comm/mpi_session.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/log.h"

namespace st {
namespace {

// The message is logged already (expire()).
void end_job_with_fault(const std::string&) { MpiSession::abort(kExitFault); }

// Runs `hook` on its own thread and waits at most `grace_s` for it: an abort that hangs as well (a wedged
// driver) must not keep the job alive. A hook that overstays is abandoned, still running.
void run_bounded(const std::function<void()>& hook, double grace_s) {
  auto task = std::make_shared<std::packaged_task<void()>>(hook);
  std::future<void> finished = task->get_future();
  std::thread([task] { (*task)(); }).detach();
  if (finished.wait_for(std::chrono::duration<double>(grace_s)) != std::future_status::ready) {
    ST_LOG_ERROR("watchdog: an abort hook did not return within ", grace_s, " s; going on without it");
    return;
  }
  try {
    finished.get();
  } catch (const std::exception& e) {
    ST_LOG_ERROR("watchdog: an abort hook failed: ", e.what());
  }
}

}  // namespace

Watchdog::Watchdog(double timeout_s, int rank, ExpiryAction on_expiry, double poll_s)
    : timeout_s_(timeout_s),
      rank_(rank),
      on_expiry_(on_expiry ? std::move(on_expiry) : ExpiryAction(end_job_with_fault)),
      poll_s_(poll_s > 0 ? poll_s : std::min(1.0, timeout_s / 10)) {
  if (enabled()) {
    deadline_thread_ = std::thread([this] { every_poll(&Watchdog::check_deadline); });
    probe_thread_ = std::thread([this] { every_poll(&Watchdog::poll_async); });
  }
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread* t : {&deadline_thread_, &probe_thread_})
    if (t->joinable()) t->join();
}

int Watchdog::channel(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  channels_.emplace_back();
  channels_.back().name = name;
  return static_cast<int>(channels_.size()) - 1;
}

uint64_t Watchdog::begin(int channel, const char* op, int64_t count) {
  return begin_async(channel, op, count, nullptr);
}

uint64_t Watchdog::begin_async(int channel, const char* op, int64_t count, std::function<bool()> done) {
  std::lock_guard<std::mutex> lock(mu_);
  Channel& c = channels_.at(static_cast<size_t>(channel));
  const uint64_t seq = c.next_seq++;
  if (enabled()) {
    c.open.emplace(seq, Op{seq, op, count, Clock::now(),
                           done ? std::make_shared<std::function<bool()>>(std::move(done)) : nullptr});
  } else {  // no deadline: only the numbering
    c.last_done_seq = seq;
    c.last_done_op = op;
  }
  return seq;
}

void Watchdog::mark_done(Channel& c, const Op& op) {
  if (op.seq > c.last_done_seq) {
    c.last_done_seq = op.seq;
    c.last_done_op = op.op;
  }
}

void Watchdog::end(int channel, uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  Channel& c = channels_.at(static_cast<size_t>(channel));
  const auto it = c.open.find(seq);
  if (it == c.open.end()) return;
  mark_done(c, it->second);
  c.open.erase(it);
}

int Watchdog::add_abort_hook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  hooks_.emplace(next_hook_, std::move(hook));
  return next_hook_++;
}

void Watchdog::remove_abort_hook(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  hooks_.erase(id);
}

std::string Watchdog::last_completed(int channel) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Channel& c = channels_.at(static_cast<size_t>(channel));
  return c.last_done_op ? str_cat("#", c.last_done_seq, " ", c.last_done_op) : std::string("none");
}

size_t Watchdog::outstanding() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const Channel& c : channels_) n += c.open.size();
  return n;
}

void Watchdog::poll_async() {
  // The probes run without the lock: a CUDA call can block behind another thread's (a cudaFree waiting for a
  // stuck kernel), and the deadline check must still see the op as open and fire.
  std::vector<std::tuple<size_t, uint64_t, std::shared_ptr<std::function<bool()>>>> probes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t ci = 0; ci < channels_.size(); ++ci)
      for (const auto& [seq, op] : channels_[ci].open)
        if (op.done) probes.emplace_back(ci, seq, op.done);
  }
  std::vector<std::pair<size_t, uint64_t>> finished;
  for (const auto& [ci, seq, probe] : probes)
    if ((*probe)()) finished.emplace_back(ci, seq);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [ci, seq] : finished) {
    Channel& c = channels_[ci];
    const auto it = c.open.find(seq);
    if (it == c.open.end()) continue;
    mark_done(c, it->second);
    c.open.erase(it);
  }
}

void Watchdog::check_deadline() {
  std::string message;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (fired_ || !enabled()) return;
    const Clock::time_point now = Clock::now();
    const Channel* late_channel = nullptr;
    const Op* late = nullptr;
    for (const Channel& c : channels_) {
      for (const auto& [seq, op] : c.open) {
        if (!late || op.start < late->start) {
          late = &op;
          late_channel = &c;
        }
      }
    }
    if (!late || std::chrono::duration<double>(now - late->start).count() <= timeout_s_) return;
    fired_ = true;
    const double waited = std::chrono::duration<double>(now - late->start).count();
    message = str_cat("watchdog: rank ", rank_, ": ", late->op, " #", late->seq, " on communicator '",
                      late_channel->name, "' (count ", late->count, ") has not completed after ",
                      static_cast<int64_t>(waited), " s (dist.timeout_s = ", timeout_s_, "); last completed there: ",
                      late_channel->last_done_op
                          ? str_cat("#", late_channel->last_done_seq, " ", late_channel->last_done_op)
                          : std::string("none"),
                      ". A peer rank is dead, stopped or hung: aborting the communicators and exiting with code ",
                      kExitFault, " (fault: resume from the last checkpoint)");
  }
  expire(message);
}

void Watchdog::check_now() {
  poll_async();
  check_deadline();
}

void Watchdog::expire(const std::string& message) {
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, hook] : hooks_) hooks.push_back(hook);
  }
  ST_LOG_ERROR(message);
  for (const auto& hook : hooks) run_bounded(hook, abort_grace_s_);
  on_expiry_(message);
}

void Watchdog::every_poll(void (Watchdog::*pass)()) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    wake_.wait_for(lock, std::chrono::duration<double>(poll_s_), [this] { return stop_; });
    if (stop_) break;
    lock.unlock();
    (this->*pass)();
    lock.lock();
  }
}

}  // namespace st
