// Background saves: the snapshot's state is what gets committed, the commit waits for the agreement, and failures
// end the same way on every rank (ckpt.on_error).
#include "shardtrain/ckpt/checkpoint_saver.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

#include "../common/temp_dir.h"
#include "../common/tiny_training.h"
#include "tiny_ckpt_test.h"
#include "ckpt_test_util.h"
#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/comm/fake_communicator.h"
#include "shardtrain/train/step_engine.h"

namespace fs = std::filesystem;

namespace st {
namespace {

using testing::TempDir;
using testing::Trace;

constexpr uint64_t kSeed = 11;

class CheckpointSaverTest : public testing::TinyCkptTest {};

// What the trainer does after every step: one all-reduce of the saver's words.
void control_round(CheckpointSaver& saver, Communicator& comm) {
  std::vector<double> w(static_cast<size_t>(saver.control_words()));
  if (w.empty()) return;
  saver.put_control(w.data());
  comm.all_reduce(w.data(), static_cast<int64_t>(w.size()));
  saver.take_control(w.data());
}

CheckpointState state_at(int64_t step, StepEngine& e) {
  CheckpointState cs;
  cs.step = step;
  cs.optimizer_updates = e.updates();
  return cs;
}

// Every unit's param, m and v shards on this rank, concatenated.
std::vector<float> local_state(ModelBackend& m) {
  std::vector<float> out;
  for (const UnitLayout& u : m.units()) {
    const UnitShard& sh = m.shard(u.index);
    const auto n = static_cast<size_t>(sh.span.count);
    out.insert(out.end(), sh.param.begin(), sh.param.begin() + n);
    out.insert(out.end(), sh.m.begin(), sh.m.begin() + n);
    out.insert(out.end(), sh.v.begin(), sh.v.begin() + n);
  }
  return out;
}

TEST_F(CheckpointSaverTest, CommitsTheSnapshotWhileTrainingGoesOn) {
  cfg_.ckpt.async = true;
  fake::spawn(2, [&](Communicator& comm) {
    StepEngine e(cfg_, comm);
    Trace tr;
    testing::train_steps(e, cfg_, comm, kSeed, 0, 2, &tr);
    const std::vector<float> at_save = local_state(e.sharded());
    CheckpointSaver saver(cfg_, e.sharded(), comm);
    saver.save(state_at(2, e));
    // Nothing is committed before the ranks have agreed, however fast the writes were.
    EXPECT_TRUE(saver.pending());
    EXPECT_GT(saver.control_words(), 0);
    EXPECT_FALSE(fs::exists(fs::path(cfg_.ckpt.dir) / "step_00000002"));
    // Two more steps change every shard while the file is written.
    for (int64_t step = 2; step < 4; ++step) {
      testing::train_steps(e, cfg_, comm, kSeed, step, step + 1, &tr);
      control_round(saver, comm);
    }
    saver.drain();
    EXPECT_FALSE(saver.pending());
    EXPECT_EQ(saver.control_words(), 0);
    EXPECT_EQ(saver.last_committed(), (fs::path(cfg_.ckpt.dir) / "step_00000002").string());
    EXPECT_NE(local_state(e.sharded()), at_save);
    // The committed checkpoint holds the state of step 2, bit for bit.
    StepEngine fresh(cfg_, comm);
    const CheckpointState loaded = load_checkpoint(saver.last_committed(), cfg_, fresh.sharded(), comm);
    EXPECT_EQ(loaded.step, 2);
    EXPECT_EQ(testing::bits(local_state(fresh.sharded())), testing::bits(at_save));
  });
  EXPECT_EQ(read_file((fs::path(cfg_.ckpt.dir) / "latest").string()), "step_00000002\n");
}

TEST_F(CheckpointSaverTest, NextSaveWaitsForThePendingOne) {
  cfg_.ckpt.async = true;
  fake::spawn(3, [&](Communicator& comm) {
    StepEngine e(cfg_, comm);
    Trace tr;
    CheckpointSaver saver(cfg_, e.sharded(), comm);
    testing::train_steps(e, cfg_, comm, kSeed, 0, 1, &tr);
    saver.save(state_at(1, e));
    testing::train_steps(e, cfg_, comm, kSeed, 1, 2, &tr);
    saver.save(state_at(2, e));  // no control round in between: the first save commits here first
    EXPECT_EQ(saver.last_committed(), (fs::path(cfg_.ckpt.dir) / "step_00000001").string());
    saver.drain();
    EXPECT_EQ(saver.last_committed(), (fs::path(cfg_.ckpt.dir) / "step_00000002").string());
  });
  const std::vector<std::string> all = committed_checkpoints(cfg_.ckpt.dir);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(fs::path(all[1]).filename(), "step_00000002");
}

TEST_F(CheckpointSaverTest, SynchronousSaveIsCommittedOnReturn) {
  cfg_.ckpt.async = false;
  fake::spawn(2, [&](Communicator& comm) {
    StepEngine e(cfg_, comm);
    CheckpointSaver saver(cfg_, e.sharded(), comm);
    saver.save(state_at(0, e));
    EXPECT_FALSE(saver.pending());
    EXPECT_EQ(saver.control_words(), 0);
    EXPECT_TRUE(fs::exists(fs::path(cfg_.ckpt.dir) / "step_00000000" / "manifest.json"));
  });
}

TEST_F(CheckpointSaverTest, FailedWriteStopsEveryRankAndLeavesNothing) {
  cfg_.ckpt.async = true;
  cfg_.ckpt.on_error = CkptOnError::kStop;
  setenv("SHARDTRAIN_FAULT", "ckpt_enospc:1@3", 1);
  std::vector<std::string> messages(3);
  fake::spawn(3, [&](Communicator& comm) {
    StepEngine e(cfg_, comm);
    CheckpointSaver saver(cfg_, e.sharded(), comm);
    saver.save(state_at(3, e));
    messages[static_cast<size_t>(comm.rank())] = testing::fault_message([&] {
      // Steps of training go by (a round each) until every rank's write has ended: the same count on every rank.
      while (saver.pending()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        control_round(saver, comm);
      }
    });
    EXPECT_FALSE(saver.pending());
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(testing::contains(messages[static_cast<size_t>(r)],
                                  "checkpoint of step 3 not committed: rank(s) 1 failed to write"))
        << messages[static_cast<size_t>(r)];
  }
  EXPECT_TRUE(testing::contains(messages[1], "No space left on device")) << messages[1];
  // No step directory, committed or temporary, is left behind.
  for (const auto& entry : fs::directory_iterator(cfg_.ckpt.dir)) EXPECT_FALSE(entry.is_directory()) << entry.path();
}

TEST_F(CheckpointSaverTest, FailedWriteWithWarnTrainsOnAndSavesAgain) {
  cfg_.ckpt.async = true;
  cfg_.ckpt.on_error = CkptOnError::kWarn;
  setenv("SHARDTRAIN_FAULT", "ckpt_enospc:0@2", 1);
  fake::spawn(2, [&](Communicator& comm) {
    StepEngine e(cfg_, comm);
    CheckpointSaver saver(cfg_, e.sharded(), comm);
    saver.save(state_at(2, e));
    saver.drain();  // does not throw
    EXPECT_FALSE(saver.pending());
    EXPECT_EQ(saver.last_committed(), "");
    saver.save(state_at(4, e));
    saver.drain();
    EXPECT_EQ(saver.last_committed(), (fs::path(cfg_.ckpt.dir) / "step_00000004").string());
  });
  std::vector<std::string> dirs;
  for (const auto& entry : fs::directory_iterator(cfg_.ckpt.dir))
    if (entry.is_directory()) dirs.push_back(entry.path().filename().string());
  EXPECT_EQ(dirs, std::vector<std::string>{"step_00000004"});
}

TEST_F(CheckpointSaverTest, CommitFailureKeepsItsKindOnEveryRank) {
  cfg_.ckpt.async = true;
  std::vector<std::string> messages(2);
  fake::spawn(2, [&](Communicator& comm) {
    StepEngine e(cfg_, comm);
    CheckpointSaver saver(cfg_, e.sharded(), comm);
    saver.save(state_at(1, e));
    saver.drain();
    // A directory where `latest` goes: the step still commits, then replacing `latest` is refused as bad input.
    if (comm.rank() == 0) fs::create_directories(fs::path(cfg_.ckpt.dir) / "latest.d");
    comm.barrier();
    if (comm.rank() == 0) {
      fs::remove(fs::path(cfg_.ckpt.dir) / "latest");
      fs::rename(fs::path(cfg_.ckpt.dir) / "latest.d", fs::path(cfg_.ckpt.dir) / "latest");
    }
    comm.barrier();
    saver.save(state_at(2, e));
    messages[static_cast<size_t>(comm.rank())] = testing::bad_input_message([&] { saver.drain(); });
  });
  EXPECT_TRUE(testing::contains(messages[0], "rank 0 could not commit it: ")) << messages[0];
  EXPECT_TRUE(testing::contains(messages[0], "latest is a directory")) << messages[0];
  EXPECT_TRUE(testing::contains(messages[1], "checkpoint of step 2 not committed: rank 0 could not commit it"))
      << messages[1];
}

}  // namespace
}  // namespace st
