#include "shardtrain/comm/node_topology.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "env_guard.h"
#include "shardtrain/core/error.h"

namespace st {
namespace {

struct Expected {
  std::vector<int> node, local, size;
  int nodes;
};

void expect_topology(const std::vector<int64_t>& keys, const Expected& want) {
  for (int r = 0; r < static_cast<int>(keys.size()); ++r) {
    const NodeTopology t = node_topology_from_keys(keys, r);
    EXPECT_EQ(t.node_id, want.node[r]) << "rank " << r;
    EXPECT_EQ(t.local_rank, want.local[r]) << "rank " << r;
    EXPECT_EQ(t.local_size, want.size[r]) << "rank " << r;
    EXPECT_EQ(t.num_nodes, want.nodes) << "rank " << r;
  }
}

TEST(NodeTopologyTest, OneRank) { expect_topology({42}, {{0}, {0}, {1}, 1}); }

TEST(NodeTopologyTest, AllOnOneNode) { expect_topology({0, 0, 0, 0}, {{0, 0, 0, 0}, {0, 1, 2, 3}, {4, 4, 4, 4}, 1}); }

TEST(NodeTopologyTest, NodesAreNumberedByLowestRankNotByKey) {
  // Key 7 holds rank 0, so it is node 0 though 7 > 3; ranks interleave across the nodes.
  expect_topology({7, 3, 7, 3, 7}, {{0, 1, 0, 1, 0}, {0, 0, 1, 1, 2}, {3, 2, 3, 2, 3}, 2});
}

TEST(NodeTopologyTest, UnevenBlocksAndNegativeKeys) {
  expect_topology({-5, -5, 9, 9, 9, 0}, {{0, 0, 1, 1, 1, 2}, {0, 1, 0, 1, 2, 0}, {2, 2, 3, 3, 3, 1}, 3});
}

TEST(NodeTopologyTest, EveryRankItsOwnNode) { expect_topology({30, 20, 10}, {{0, 1, 2}, {0, 0, 0}, {1, 1, 1}, 3}); }

TEST(NodeTopologyTest, RankOutsideTheWorldIsAnError) {
  EXPECT_THROW(node_topology_from_keys({1, 2}, 2), Error);
  EXPECT_THROW(node_topology_from_keys({}, 0), Error);
}

TEST(NodeIdOverrideTest, UnsetOrEmptyMeansNoOverride) {
  testing::EnvGuard env;
  env.clear("SHARDTRAIN_NODE_ID");
  int64_t id = -77;
  EXPECT_FALSE(node_id_override(&id));
  env.set("SHARDTRAIN_NODE_ID", "");
  EXPECT_FALSE(node_id_override(&id));
  EXPECT_EQ(id, -77);
}

TEST(NodeIdOverrideTest, Integers) {
  testing::EnvGuard env;
  int64_t id = -1;
  env.set("SHARDTRAIN_NODE_ID", "12");
  EXPECT_TRUE(node_id_override(&id));
  EXPECT_EQ(id, 12);
  env.set("SHARDTRAIN_NODE_ID", "-3");
  EXPECT_TRUE(node_id_override(&id));
  EXPECT_EQ(id, -3);
}

TEST(NodeIdOverrideTest, NotAnIntegerIsBadInputNamingVariableAndValue) {
  testing::EnvGuard env;
  for (const std::string bad : {"node-a", "12x", " 1", "1.5", "99999999999999999999"}) {
    env.set("SHARDTRAIN_NODE_ID", bad);
    int64_t id = 0;
    try {
      node_id_override(&id);
      ADD_FAILURE() << "'" << bad << "' was accepted as " << id;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      const std::string msg = e.what();
      EXPECT_NE(msg.find("SHARDTRAIN_NODE_ID"), std::string::npos) << msg;
      EXPECT_NE(msg.find("'" + bad + "'"), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace st
