#include "shardtrain/optim/host_adamw.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "shardtrain/core/error.h"
#include "shardtrain/core/rng.h"

namespace st {
namespace {

std::vector<float> random_vector(int64_t n, uint64_t stream, float scale, bool non_negative = false) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float u = static_cast<float>(uniform_at(3, stream, static_cast<uint64_t>(i)) * 2.0 - 1.0) * scale;
    x[static_cast<size_t>(i)] = non_negative ? u * u : u;
  }
  return x;
}

struct Shard {
  std::vector<float> p, m, v, g;
  std::vector<uint16_t> out;
  Shard(int64_t n, uint64_t s)
      : p(random_vector(n, s, 0.05f)), m(random_vector(n, s + 1, 0.01f)), v(random_vector(n, s + 2, 0.1f, true)),
        g(random_vector(n, s + 3, 1.0f)), out(static_cast<size_t>(n), 0) {}
};

// Two runs per shard with different settings, as adamw_runs gives for a unit whose span crosses a tensor boundary.
std::vector<AdamWRun> two_runs(int64_t n, int64_t step) {
  AdamWParams a;
  a.lr = 1e-3f;
  a.step = step;
  a.grad_scale = 0.8f;
  AdamWParams b = a;
  b.weight_decay = 0.1f;
  const int64_t cut = n / 3;
  return {AdamWRun{0, cut, a}, AdamWRun{cut, n - cut, b}};
}

// Many jobs of uneven sizes (several tiles, less than one tile, empty), queued at once on 4 threads and waited
// for out of order: every shard ends bit-identical to the scalar reference, and so does its bf16 copy.
TEST(HostAdamW, JobsOnThreadsMatchTheReference) {
  HostAdamW::Options o;
  o.threads = 4;
  HostAdamW engine(o);
  EXPECT_EQ(engine.threads(), 4);
  const std::vector<int64_t> sizes = {3 * HostAdamW::kTileElements + 17, 5, 0, HostAdamW::kTileElements, 1000};
  std::vector<Shard> want, got;
  for (size_t j = 0; j < sizes.size(); ++j) {
    want.emplace_back(sizes[j], 10 * j);
    got.emplace_back(sizes[j], 10 * j);
  }
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<int64_t> tickets;
    for (size_t j = 0; j < sizes.size(); ++j) {
      Shard& s = got[j];
      tickets.push_back(engine.submit(
          HostAdamW::Job{s.p.data(), s.m.data(), s.v.data(), s.g.data(), two_runs(sizes[j], step), HalfKind::kBF16,
                         s.out.data()}));
      for (const AdamWRun& r : two_runs(sizes[j], step))
        adamw_update(want[j].p.data() + r.offset, want[j].m.data() + r.offset, want[j].v.data() + r.offset,
                     want[j].g.data() + r.offset, r.count, r.params);
    }
    for (size_t j = sizes.size(); j-- > 0;) engine.wait(tickets[j]);
  }
  for (size_t j = 0; j < sizes.size(); ++j) {
    SCOPED_TRACE(::testing::Message() << "job " << j << " of " << sizes[j]);
    EXPECT_EQ(got[j].p, want[j].p);
    EXPECT_EQ(got[j].m, want[j].m);
    EXPECT_EQ(got[j].v, want[j].v);
    for (size_t i = 0; i < got[j].out.size(); ++i) ASSERT_EQ(got[j].out[i], round_to_bf16(want[j].p[i])) << i;
  }
}

// Optimizer offload's speculative step: a job gated on its gradient's arrival does not start before the gate opens,
// writes beside the state it reads (which stays as it was), and gives the in-place job's bits.
TEST(HostAdamW, AGatedOutOfPlaceJobWaitsForItsGateAndLeavesItsInputs) {
  HostAdamW::Options o;
  o.threads = 2;
  HostAdamW engine(o);
  const int64_t n = 2 * HostAdamW::kTileElements + 5;
  const Shard before(n, 77);
  Shard src = before, dst(n, 5), in_place = before;
  std::atomic<bool> landed{false};
  HostAdamW::Job job{src.p.data(), src.m.data(), src.v.data(), src.g.data(), two_runs(n, 4), HalfKind::kBF16,
                     dst.out.data()};
  job.param_out = dst.p.data();
  job.m_out = dst.m.data();
  job.v_out = dst.v.data();
  job.priority = 3;
  job.ready = [&] { return landed.load(); };
  const std::vector<float> dst_before = dst.p;
  const int64_t t = engine.submit(std::move(job));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(dst.p, dst_before) << "the job ran before its gate opened";
  landed = true;
  engine.wait(t);
  engine.wait(engine.submit(HostAdamW::Job{in_place.p.data(), in_place.m.data(), in_place.v.data(), in_place.g.data(),
                                           two_runs(n, 4), HalfKind::kBF16, in_place.out.data()}));
  EXPECT_EQ(dst.p, in_place.p);
  EXPECT_EQ(dst.m, in_place.m);
  EXPECT_EQ(dst.v, in_place.v);
  EXPECT_EQ(dst.out, in_place.out);
  EXPECT_EQ(src.p, before.p);
  EXPECT_EQ(src.m, before.m);
  EXPECT_EQ(src.v, before.v);
}

// wait_all with nothing queued returns; a ticket that was never issued is an error, not a hang.
TEST(HostAdamW, WaitingIsBoundedAndChecked) {
  HostAdamW engine(HostAdamW::Options{});
  engine.wait_all();
  EXPECT_THROW(engine.wait(0), Error);
  const int64_t t = engine.submit(HostAdamW::Job{});
  engine.wait(t);  // an empty job is finished at once
  EXPECT_GE(engine.threads(), 1);
  EXPECT_NE(engine.describe().find(to_string(engine.isa())), std::string::npos);
}

}  // namespace
}  // namespace st
