#include "shardtrain/shard/comm_tuning.h"

#include <gtest/gtest.h>

#include "shardtrain/core/error.h"

namespace st {
namespace {

using Units = std::vector<int>;

TEST(ClassifyLink, NodesThenPeerToPeerThenNvlink) {
  EXPECT_EQ(classify_link(true, false, true), LinkKind::kNetwork);
  EXPECT_EQ(classify_link(true, true, false), LinkKind::kNetwork);
  EXPECT_EQ(classify_link(false, true, true), LinkKind::kPcie);  // NVLink present, NCCL_P2P_DISABLE set
  EXPECT_EQ(classify_link(false, false, false), LinkKind::kPcie);
  EXPECT_EQ(classify_link(false, false, true), LinkKind::kNvlink);
}

// What resolve_comm_tuning refuses d with (a kBadInput error's message); a failure, and "", if it accepts it.
std::string refusal(const DistConfig& d, LinkKind k, bool copy_engines) {
  try {
    resolve_comm_tuning(d, k, false, copy_engines);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "accepted on " << to_string(k) << (copy_engines ? "" : " without NCCL 2.28");
  return "";
}

TEST(CommTuning, DefaultsPerLinkKind) {
  EXPECT_EQ(default_comm_tuning(LinkKind::kNvlink).prefetch_depth, 1);
  EXPECT_EQ(default_comm_tuning(LinkKind::kPcie).prefetch_depth, 2);
  EXPECT_EQ(default_comm_tuning(LinkKind::kNetwork).prefetch_depth, 1);
  EXPECT_EQ(default_comm_tuning(LinkKind::kNetwork).bucket_bytes, 0);
  EXPECT_EQ(default_comm_tuning(LinkKind::kNvlink).reduce_scatter_ctas, 4);
  EXPECT_EQ(default_comm_tuning(LinkKind::kPcie).reduce_scatter_ctas, 0);
  EXPECT_EQ(default_comm_tuning(LinkKind::kNetwork).reduce_scatter_ctas, 0);
  EXPECT_TRUE(default_comm_tuning(LinkKind::kNvlink).copy_engine_gathers);
  EXPECT_FALSE(default_comm_tuning(LinkKind::kPcie).copy_engine_gathers);
  EXPECT_FALSE(default_comm_tuning(LinkKind::kNetwork).copy_engine_gathers);
}

TEST(CommTuning, CommEngine) {
  DistConfig d;  // auto: the copy engines on NVLink when NCCL has them
  EXPECT_TRUE(resolve_comm_tuning(d, LinkKind::kNvlink, false, /*copy_engines=*/true).copy_engine_gathers);
  CommTuning t = resolve_comm_tuning(d, LinkKind::kNvlink, false, /*copy_engines=*/false);
  EXPECT_FALSE(t.copy_engine_gathers);
  EXPECT_NE(t.why.find("gathers on NCCL's kernels (default for nvlink needs NCCL 2.28)"), std::string::npos) << t.why;
  t = resolve_comm_tuning(d, LinkKind::kPcie, false, true);
  EXPECT_FALSE(t.copy_engine_gathers);
  EXPECT_NE(t.why.find("gathers on NCCL's kernels (default for pcie)"), std::string::npos) << t.why;
  d.gather_engine = CommEngine::kSm;
  t = resolve_comm_tuning(d, LinkKind::kNvlink, false, true);
  EXPECT_FALSE(t.copy_engine_gathers);
  EXPECT_NE(t.why.find("gathers on NCCL's kernels (dist.gather_engine)"), std::string::npos) << t.why;
  d.gather_engine = CommEngine::kCopy;
  t = resolve_comm_tuning(d, LinkKind::kNvlink, false, true);
  EXPECT_TRUE(t.copy_engine_gathers);
  EXPECT_NE(t.why.find("gathers on the copy engines (dist.gather_engine)"), std::string::npos) << t.why;
  // Asked for where NCCL cannot: refused, naming the key, the link and the way out.
  for (LinkKind k : {LinkKind::kPcie, LinkKind::kNetwork}) {
    const std::string m = refusal(d, k, true);
    EXPECT_NE(m.find("dist.gather_engine = copy needs"), std::string::npos) << m;
    EXPECT_NE(m.find(std::string("its link is ") + to_string(k)), std::string::npos) << m;
  }
  const std::string m = refusal(d, LinkKind::kNvlink, /*copy_engines=*/false);
  EXPECT_NE(m.find("needs NCCL 2.28 or newer"), std::string::npos) << m;
}

// dist.reduce_engine: auto takes the copy engines over NVLink where NCCL has them (2.28+), NCCL's kernels elsewhere
// and beside an explicit CTA cap; copy leaves no CTA count to cap; refused off NVLink, without 2.28, or beside a cap.
TEST(CommTuning, ReduceEngine) {
  DistConfig d;
  CommTuning t = resolve_comm_tuning(d, LinkKind::kNvlink, false, /*copy_engines=*/true);
  EXPECT_TRUE(t.copy_engine_reduce_scatters);
  EXPECT_EQ(t.reduce_scatter_ctas, 0);
  EXPECT_NE(t.why.find("reduce-scatters on the copy engines (default for nvlink)"), std::string::npos) << t.why;
  t = resolve_comm_tuning(d, LinkKind::kNvlink, false, /*copy_engines=*/false);
  EXPECT_FALSE(t.copy_engine_reduce_scatters);
  EXPECT_EQ(t.reduce_scatter_ctas, 4);
  EXPECT_NE(t.why.find("reduce-scatters on NCCL's kernels (default for nvlink needs NCCL 2.28)"), std::string::npos)
      << t.why;
  for (LinkKind k : {LinkKind::kPcie, LinkKind::kNetwork}) {
    t = resolve_comm_tuning(d, k, false, /*copy_engines=*/true);
    EXPECT_FALSE(t.copy_engine_reduce_scatters) << to_string(k);
    EXPECT_NE(t.why.find(std::string("reduce-scatters on NCCL's kernels (default for ") + to_string(k) + ")"),
              std::string::npos)
        << t.why;
  }
  d.reduce_scatter_ctas = 1;  // auto beside a CTA cap: NCCL's kernels, capped
  t = resolve_comm_tuning(d, LinkKind::kNvlink, false, true);
  EXPECT_FALSE(t.copy_engine_reduce_scatters);
  EXPECT_EQ(t.reduce_scatter_ctas, 1);
  EXPECT_NE(t.why.find("reduce-scatters on NCCL's kernels (dist.reduce_scatter_ctas)"), std::string::npos) << t.why;
  EXPECT_NE(t.why.find("block reduce-scatters on at most 1 CTAs (dist.reduce_scatter_ctas)"), std::string::npos)
      << t.why;
  d.reduce_scatter_ctas = -1;
  d.reduce_engine = CommEngine::kCopy;
  t = resolve_comm_tuning(d, LinkKind::kNvlink, false, true);
  EXPECT_TRUE(t.copy_engine_reduce_scatters);
  EXPECT_EQ(t.reduce_scatter_ctas, 0);
  EXPECT_NE(t.why.find("reduce-scatters on the copy engines (dist.reduce_engine)"), std::string::npos) << t.why;
  EXPECT_EQ(t.why.find("block reduce-scatters on"), std::string::npos) << t.why;
  for (LinkKind k : {LinkKind::kPcie, LinkKind::kNetwork}) {
    const std::string m = refusal(d, k, true);
    EXPECT_NE(m.find("dist.reduce_engine = copy needs"), std::string::npos) << m;
    EXPECT_NE(m.find(std::string("its link is ") + to_string(k)), std::string::npos) << m;
  }
  std::string m = refusal(d, LinkKind::kNvlink, /*copy_engines=*/false);
  EXPECT_NE(m.find("dist.reduce_engine = copy needs NCCL 2.28 or newer"), std::string::npos) << m;
  d.reduce_scatter_ctas = 2;
  m = refusal(d, LinkKind::kNvlink, true);
  EXPECT_NE(m.find("dist.reduce_scatter_ctas (2) caps NCCL's reduce-scatter kernels"), std::string::npos) << m;
  d.reduce_engine = CommEngine::kSm;
  t = resolve_comm_tuning(d, LinkKind::kNvlink, false, true);
  EXPECT_FALSE(t.copy_engine_reduce_scatters);
  EXPECT_EQ(t.reduce_scatter_ctas, 2);
  EXPECT_NE(t.why.find("reduce-scatters on NCCL's kernels (dist.reduce_engine)"), std::string::npos) << t.why;
}

TEST(CommTuning, ConfigOverridesAndTheLogSaysWhere) {
  DistConfig d;
  CommTuning t = resolve_comm_tuning(d, LinkKind::kPcie, /*hybrid=*/false);
  EXPECT_EQ(t.prefetch_depth, 2);
  EXPECT_EQ(t.reduce_scatter_ctas, 0);
  EXPECT_EQ(t.why,
            "communication: prefetch depth 2 (default for pcie), gathers on NCCL's kernels (default for pcie), "
            "reduce-scatters on NCCL's kernels (default for pcie), block reduce-scatters on NCCL's choice of CTAs "
            "(default for pcie); sharding group link: pcie");
  d.prefetch_depth = 0;
  d.bucket_mb = 0.5;
  t = resolve_comm_tuning(d, LinkKind::kNvlink, /*hybrid=*/true);
  EXPECT_EQ(t.prefetch_depth, 0);
  EXPECT_EQ(t.bucket_bytes, 524288);
  EXPECT_EQ(t.reduce_scatter_ctas, 4);
  EXPECT_EQ(t.why,
            "communication: prefetch depth 0 (dist.prefetch_depth), all-reduce across nodes in buckets of 0.50 MiB "
            "(dist.bucket_mb), gathers on NCCL's kernels (default for nvlink needs NCCL 2.28), reduce-scatters on "
            "NCCL's kernels (default for nvlink needs NCCL 2.28), block reduce-scatters on at most 4 CTAs (default for "
            "nvlink); "
            "sharding group link: nvlink");
  d.bucket_mb = 0;
  EXPECT_NE(resolve_comm_tuning(d, LinkKind::kNvlink, true).why.find("buckets of one unit (dist.bucket_mb)"),
            std::string::npos);
  d.reduce_scatter_ctas = 0;  // NCCL's own choice, on any link
  t = resolve_comm_tuning(d, LinkKind::kNvlink, false);
  EXPECT_EQ(t.reduce_scatter_ctas, 0);
  EXPECT_NE(t.why.find("block reduce-scatters on NCCL's choice of CTAs (dist.reduce_scatter_ctas)"), std::string::npos)
      << t.why;
  d.reduce_scatter_ctas = 2;
  t = resolve_comm_tuning(d, LinkKind::kPcie, false);
  EXPECT_EQ(t.reduce_scatter_ctas, 2);
  EXPECT_NE(t.why.find("block reduce-scatters on at most 2 CTAs (dist.reduce_scatter_ctas)"), std::string::npos)
      << t.why;
}

TEST(ReplicaBuckets, ZeroBucketSendsEveryUnitAlone) {
  ReplicaBuckets b({10, 4, 4, 2}, 0);
  EXPECT_EQ(b.capacity(), 10);
  for (int u : {3, 2, 1, 0}) {
    const auto out = b.add(u);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].units, Units{u});
    EXPECT_EQ(out[0].offsets, std::vector<int64_t>{0});
  }
  EXPECT_EQ(b.pending_units(), 0);
}

TEST(ReplicaBuckets, FillsToTheBucketAndTheLastUnitFlushes) {
  // Backward order: the head (3), blocks 2 and 1, the embedding (0).
  ReplicaBuckets b({10, 4, 4, 2}, 6);
  EXPECT_EQ(b.capacity(), 10);
  EXPECT_TRUE(b.add(3).empty());  // 2 < 6
  const auto first = b.add(2);    // 2 + 4 = 6 >= 6
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].units, (Units{3, 2}));
  EXPECT_EQ(first[0].offsets, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(first[0].elements, 6);
  EXPECT_TRUE(b.add(1).empty());
  EXPECT_EQ(b.pending_units(), 1);
  EXPECT_EQ(b.joined_units(), 3);
  // Unit 0 (10) would overflow the capacity with unit 1 (4) inside: unit 1 goes out alone, then unit 0, the last.
  const auto last = b.add(0);
  ASSERT_EQ(last.size(), 2u);
  EXPECT_EQ(last[0].units, Units{1});
  EXPECT_EQ(last[1].units, Units{0});
  EXPECT_EQ(last[1].elements, 10);
  EXPECT_EQ(b.pending_units(), 0);
  EXPECT_EQ(b.joined_units(), 0);
  // The next step starts over.
  EXPECT_TRUE(b.add(3).empty());
}

TEST(ReplicaBuckets, OneBucketForTheWholeModel) {
  ReplicaBuckets b({10, 4, 4, 2}, 1000);
  EXPECT_EQ(b.capacity(), 1000);
  EXPECT_TRUE(b.add(3).empty());
  EXPECT_TRUE(b.add(2).empty());
  EXPECT_TRUE(b.add(1).empty());
  const auto out = b.add(0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].units, (Units{3, 2, 1, 0}));
  EXPECT_EQ(out[0].offsets, (std::vector<int64_t>{0, 2, 6, 10}));
  EXPECT_EQ(out[0].elements, 20);
}

TEST(ReplicaBuckets, EveryUnitGoesOutOnceInEveryOrder) {
  const std::vector<int64_t> sizes = {7, 0, 3, 5, 1, 9};
  for (int64_t bucket : {0, 1, 4, 8, 12, 100}) {
    ReplicaBuckets b(sizes, bucket);
    std::vector<int> seen(sizes.size(), 0);
    for (int u : {5, 4, 3, 2, 1, 0})
      for (const auto& out : b.add(u)) {
        EXPECT_LE(out.elements, b.capacity());
        int64_t offset = 0;
        for (size_t i = 0; i < out.units.size(); ++i) {
          EXPECT_EQ(out.offsets[i], offset);
          offset += sizes[static_cast<size_t>(out.units[i])];
          ++seen[static_cast<size_t>(out.units[i])];
        }
        EXPECT_EQ(out.elements, offset);
      }
    EXPECT_EQ(seen, std::vector<int>(sizes.size(), 1)) << "bucket " << bucket;
  }
}

TEST(ReplicaBuckets, AUnitTwiceInAStepThrowsAndDropStartsOver) {
  ReplicaBuckets b({4, 4, 4}, 100);
  EXPECT_TRUE(b.add(2).empty());
  EXPECT_THROW(b.add(2), Error);
  b.drop();
  EXPECT_EQ(b.pending_units(), 0);
  EXPECT_TRUE(b.add(2).empty());
}

}  // namespace
}  // namespace st
