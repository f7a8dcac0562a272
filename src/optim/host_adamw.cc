#include "shardtrain/optim/host_adamw.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>

#include "shardtrain/core/error.h"
#include "shardtrain/core/format.h"
#include "shardtrain/core/log.h"

namespace st {

namespace {

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

std::string cpu_range(const std::vector<int>& cpus) {
  if (cpus.empty()) return "unpinned";
  const bool contiguous = cpus.back() - cpus.front() + 1 == static_cast<int>(cpus.size());
  if (contiguous) return str_cat("CPUs ", cpus.front(), "-", cpus.back());
  std::string s = "CPUs";
  for (int c : cpus) s += str_cat(" ", c);
  return s;
}

}  // namespace

HostAdamW::HostAdamW(const Options& o) : isa_(o.isa) {
  ST_CHECK(simd_isa_supported(isa_), "HostAdamW: this CPU cannot run ", to_string(isa_));
  ST_CHECK(o.local_size >= 1 && o.local_rank >= 0 && o.local_rank < o.local_size, "HostAdamW: local rank ",
           o.local_rank, " of ", o.local_size);
  const std::vector<int> all = allowed_cpus();
  const int per = static_cast<int>(all.size()) / o.local_size;
  // This rank's slice, minus its first CPU (the rank's own thread); too few CPUs to split: no pinning.
  std::vector<int> mine;
  if (per >= 2)
    mine.assign(all.begin() + o.local_rank * per + 1, all.begin() + (o.local_rank + 1) * per);
  const int n = o.threads > 0 ? o.threads : std::max<int>(1, static_cast<int>(mine.size()));
  std::vector<int> used;
  for (int i = 0; i < n; ++i) {
    const int cpu = mine.empty() ? -1 : mine[static_cast<size_t>(i) % mine.size()];
    if (cpu >= 0 && std::find(used.begin(), used.end(), cpu) == used.end()) used.push_back(cpu);
    workers_.emplace_back([this, cpu] { work(cpu); });
  }
  std::sort(used.begin(), used.end());
  describe_ = str_cat(n, n == 1 ? " thread" : " threads", used.empty() ? " (unpinned)" : " pinned to " + cpu_range(used),
                      ", ", to_string(isa_));
}

HostAdamW::~HostAdamW() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

int64_t HostAdamW::submit(Job job) {
  auto p = std::make_unique<Pending>();
  for (size_t r = 0; r < job.runs.size(); ++r)
    for (int64_t off = 0; off < job.runs[r].count; off += kTileElements)
      p->tiles.push_back(Tile{static_cast<int>(r), off, std::min(kTileElements, job.runs[r].count - off)});
  ST_CHECK(p->tiles.empty() || job.kind == HalfKind::kNone || job.out != nullptr,
           "HostAdamW: a rounded copy needs `out`");
  p->job = std::move(job);
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t ticket = next_ticket_++;
  if (p->tiles.empty()) return ticket;  // nothing to do: already finished
  pending_.emplace(ticket, std::move(p));
  work_cv_.notify_all();
  return ticket;
}

void HostAdamW::wait(int64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  ST_CHECK(ticket >= 0 && ticket < next_ticket_, "HostAdamW: wait for ticket ", ticket, " never issued");
  done_cv_.wait(lock, [&] { return pending_.count(ticket) == 0; });
}

void HostAdamW::wait_all() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_.empty(); });
}

void HostAdamW::run_tile(const Job& job, const Tile& t) const {
  const AdamWRun& r = job.runs[static_cast<size_t>(t.run)];
  const int64_t i = r.offset + t.offset;
  const AdamWArrays state{job.param, job.m, job.v, job.param_out ? job.param_out : job.param,
                         job.m_out ? job.m_out : job.m, job.v_out ? job.v_out : job.v};
  adamw_update_isa(isa_, state.offset(i), job.grad + i, t.count, r.params, job.kind,
                   job.out == nullptr ? nullptr : job.out + i);
}

void HostAdamW::work(int cpu) {
  if (cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);  // best effort: unpinned still works
  }
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    // The job with a tile left of the lowest priority value, the oldest among equals: jobs finish roughly in
    // that order, which is the order they are waited for (the next forward needs the first units first).
    // Gates are asked oldest first and at most one per pass: gradients land in the order they were copied, so
    // when the oldest has not, no later one has. One worker at a time polls; the others sleep until woken.
    Pending* p = nullptr;
    int64_t ticket = -1;
    bool gated = false;
    for (auto& [t, q] : pending_) {
      if (q->next >= q->tiles.size()) continue;
      if (!q->open && q->job.ready) {
        if (gated || !q->job.ready()) {
          gated = true;
          continue;
        }
        work_cv_.notify_all();  // a gate opened: every worker can take tiles of it
      }
      q->open = true;
      if (p == nullptr || q->job.priority < p->job.priority) {
        p = q.get();
        ticket = t;
      }
    }
    if (p == nullptr) {
      if (stop_) return;
      if (gated && !polling_) {
        polling_ = true;  // a gradient still on its way: this worker looks again soon
        work_cv_.wait_for(lock, std::chrono::microseconds(200));
        polling_ = false;
      } else {
        work_cv_.wait(lock);
      }
      continue;
    }
    const Tile tile = p->tiles[p->next++];
    lock.unlock();
    run_tile(p->job, tile);
    lock.lock();
    if (++p->finished == p->tiles.size()) {
      pending_.erase(ticket);
      done_cv_.notify_all();
    }
  }
}

}  // namespace st
