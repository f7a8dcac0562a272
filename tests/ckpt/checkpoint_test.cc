// Save, commit, resume and reshard, on the solo and fake communicators.
#include "shardtrain/ckpt/checkpoint.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "../common/temp_dir.h"
#include "../common/tiny_training.h"
#include "ckpt_test_util.h"
#include "shardtrain/ckpt/hf_export.h"
#include "shardtrain/ckpt/init_from.h"
#include "shardtrain/ckpt/lora_base.h"
#include "shardtrain/comm/fake_communicator.h"
#include "shardtrain/core/error.h"
#include "shardtrain/shard/sharded_model.h"
#include "shardtrain/train/step_engine.h"
#include "tiny_ckpt_test.h"

namespace fs = std::filesystem;

namespace st {
namespace {

using testing::TempDir;
using testing::Trace;

constexpr uint64_t kSeed = 11;  // the corpus of testing::corpus_batches

class CheckpointTest : public testing::TinyCkptTest {};

struct State {
  std::vector<float> losses;
  std::vector<std::vector<float>> param, m, v;  // full, per unit
  std::vector<std::vector<float>> frozen;       // the frozen segment as the model computes with it, per unit
};

std::vector<float> gather(ModelBackend& m, int unit, std::vector<float> UnitShard::*state) {
  const UnitShard& sh = m.shard(unit);
  std::vector<float> full(static_cast<size_t>(sh.slot * m.comm().world_size()));
  m.comm().all_gather((sh.*state).data(), sh.slot, full.data());
  full.resize(static_cast<size_t>(m.units()[static_cast<size_t>(unit)].numel));
  return full;
}

State snapshot(StepEngine& e, std::vector<float> losses) {
  State s;
  s.losses = std::move(losses);
  for (const UnitLayout& u : e.units()) {
    s.param.push_back(gather(e.sharded(), u.index, &UnitShard::param));
    s.m.push_back(gather(e.sharded(), u.index, &UnitShard::m));
    s.v.push_back(gather(e.sharded(), u.index, &UnitShard::v));
    s.frozen.push_back(e.sharded().gather_frozen(u.index));
  }
  return s;
}

// A fresh run's start, as the trainer makes it: the base read from init.from when there is one; and the checkpoint
// state of its step-`step` save, which names that base.
void start(const Config& c, StepEngine& e) {
  if (!c.init.from.empty()) init_from_weights(c.init.from, c.model, e.sharded());
}
CheckpointState state_at(const Config& c, const StepEngine& e, int64_t step) {
  CheckpointState cs;
  cs.step = step;
  cs.optimizer_updates = e.updates();
  if (c.model.lora.enabled()) cs.base = describe_lora_base(c.init.from);
  return cs;
}

// Straight through, or S steps, save, a fresh engine, load, S more: every bit equal.
State run(const Config& c, int world, bool with_resume) {
  State out;
  fake::spawn(world, [&](Communicator& comm) {
    Trace tr;  // the losses of every step, before and after the resume
    const int64_t half = c.train.steps / 2;
    StepEngine first(c, comm);
    start(c, first);
    if (!with_resume) {
      testing::train_steps(first, c, comm, kSeed, 0, c.train.steps, &tr);
      State s = snapshot(first, tr.losses);
      if (comm.rank() == 0) out = std::move(s);
      return;
    }
    testing::train_steps(first, c, comm, kSeed, 0, half, &tr);
    const std::string where = save_checkpoint(c, first.sharded(), state_at(c, first, half), comm);
    StepEngine second(c, comm);  // fresh init, then overwritten by the load (a LoRA base: read again from init.from)
    const CheckpointState back = load_checkpoint(where, c, second.sharded(), comm);
    EXPECT_EQ(back.step, half);
    second.set_updates(back.optimizer_updates);
    testing::train_steps(second, c, comm, kSeed, half, c.train.steps, &tr);
    State s = snapshot(second, tr.losses);
    if (comm.rank() == 0) out = std::move(s);
  });
  return out;
}

// The same config with LoRA adapters: its checkpoints hold the adapters and their moments; the base is the seed's.
Config with_lora(Config c) {
  c.model.lora.rank = 3;
  c.model.lora.alpha = 5;
  c.model.lora.targets = "qkv,fc_proj";
  return c;
}

// QLoRA: the adapters on an NF4 base read from init.from, a GPT-2 file of another seed's random model written at
// `path` (so that a base drawn from the run's own seed could not pass for it).
Config with_qlora(Config c, const std::string& path) {
  Config other = c;
  other.train.seed = c.train.seed + 1;
  testing::write_seed_model(other, path);
  c = with_lora(c);
  c.model.lora.base_dtype = LoraBase::kNf4;
  c.init.from = path;
  return c;
}

std::string describe(const Config& c) {
  if (!c.model.lora.enabled()) return "";
  return c.model.lora.base_dtype == LoraBase::kNf4 ? ", QLoRA" : ", LoRA";
}

TEST_F(CheckpointTest, ResumeIsBitExact) {
  for (const Config& c : {cfg_, with_lora(cfg_), with_qlora(cfg_, tmp_.file("base.h5"))}) {
    for (int world : {1, 2, 3}) {
      const std::string what = str_cat("world ", world, describe(c));
      const State straight = run(c, world, false);
      const State resumed = run(c, world, true);
      EXPECT_EQ(straight.losses, resumed.losses) << what;  // every bit
      EXPECT_EQ(straight.param, resumed.param) << what;
      EXPECT_EQ(straight.m, resumed.m) << what;
      EXPECT_EQ(straight.v, resumed.v) << what;
      EXPECT_EQ(straight.frozen, resumed.frozen) << what;
      fs::remove_all(c.ckpt.dir);
    }
  }
}

// Save at N ranks, load at M: the loaded state equals the saved one bit for bit, and so does a LoRA model's base.
TEST_F(CheckpointTest, ReshardsToAnyWorldSize) {
  const Config qlora = with_qlora(cfg_, tmp_.file("base.h5"));
  for (auto [from, to] : {std::pair{2, 3}, {3, 2}, {4, 1}, {1, 4}, {1, 3}, {3, 1}}) {
    for (const Config& cfg : {cfg_, with_lora(cfg_), qlora}) {
      State saved;
      std::string where;
      fake::spawn(from, [&](Communicator& comm) {
        StepEngine e(cfg, comm);
        start(cfg, e);
        Trace tr;
        testing::train_steps(e, cfg, comm, kSeed, 0, 3, &tr);
        const std::string w = save_checkpoint(cfg, e.sharded(), state_at(cfg, e, 3), comm);
        State s = snapshot(e, tr.losses);
        if (comm.rank() == 0) {
          saved = std::move(s);
          where = w;
        }
      });
      State loaded;
      fake::spawn(to, [&](Communicator& comm) {
        StepEngine e(cfg, comm);
        const CheckpointState cs = load_checkpoint(where, cfg, e.sharded(), comm);
        EXPECT_EQ(cs.step, 3);
        EXPECT_EQ(cs.optimizer_updates, 3);
        State s = snapshot(e, {});
        if (comm.rank() == 0) loaded = std::move(s);
      });
      EXPECT_EQ(saved.param, loaded.param) << from << " -> " << to << describe(cfg);
      EXPECT_EQ(saved.m, loaded.m) << from << " -> " << to << describe(cfg);
      EXPECT_EQ(saved.v, loaded.v) << from << " -> " << to << describe(cfg);
      EXPECT_EQ(saved.frozen, loaded.frozen) << from << " -> " << to << describe(cfg);
      fs::remove_all(cfg.ckpt.dir);
    }
  }
}

TEST_F(CheckpointTest, CommitWritesManifestLatestAndKeepsK) {
  Config c = cfg_;
  c.ckpt.keep = 2;
  SoloCommunicator comm;
  StepEngine e(c, comm);
  for (int64_t step : {1, 2, 3}) {
    CheckpointState cs;
    cs.step = step;
    save_checkpoint(c, e.sharded(), cs, comm, /*protect=*/(fs::path(c.ckpt.dir) / step_dir_name(1)).string());
  }
  // The newest 2 (steps 2 and 3) plus step 1, which is protected (resumed from).
  const std::vector<std::string> all = committed_checkpoints(c.ckpt.dir);
  ASSERT_EQ(all.size(), 3u);
  std::ifstream latest(fs::path(c.ckpt.dir) / "latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_00000003");
  CheckpointState cs;
  cs.step = 4;
  save_checkpoint(c, e.sharded(), cs, comm);
  const std::vector<std::string> after = committed_checkpoints(c.ckpt.dir);
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(fs::path(after[0]).filename(), "step_00000003");
  EXPECT_EQ(fs::path(after[1]).filename(), "step_00000004");
}

TEST_F(CheckpointTest, OneRankFailingCommitsNothingAndKeepsOlderCheckpoints) {
  fake::spawn(3, [&](Communicator& comm) {
    StepEngine e(cfg_, comm);
    CheckpointState cs;
    cs.step = 1;
    save_checkpoint(cfg_, e.sharded(), cs, comm);
    comm.barrier();
    if (comm.rank() == 0) setenv("SHARDTRAIN_FAULT", "ckpt_enospc:1", 1);
    comm.barrier();
    cs.step = 2;
    try {
      save_checkpoint(cfg_, e.sharded(), cs, comm);
      ADD_FAILURE() << "rank " << comm.rank() << ": the save of step 2 did not fail";
    } catch (const Error& err) {
      EXPECT_EQ(err.kind(), ErrorKind::kFault);
      EXPECT_NE(std::string(err.what()).find("rank(s) 1 failed"), std::string::npos) << err.what();
    }
  });
  const std::vector<std::string> all = committed_checkpoints(cfg_.ckpt.dir);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(fs::path(all[0]).filename(), "step_00000001");
  EXPECT_FALSE(fs::exists(fs::path(cfg_.ckpt.dir) / "step_00000002"));
  // The failed attempt's temporary directory is removed at the next start-up.
  clean_uncommitted(cfg_.ckpt.dir);
  int entries = 0;
  for (const auto& e : fs::directory_iterator(cfg_.ckpt.dir)) entries += e.is_directory() ? 1 : 0;
  EXPECT_EQ(entries, 1);
}

// Saves freshly initialized weights as step `step` from `world` fake ranks; returns the step directory.
std::string save_untrained(const Config& c, int world, int64_t step) {
  std::string where;
  fake::spawn(world, [&](Communicator& comm) {
    StepEngine e(c, comm);
    CheckpointState cs;
    cs.step = step;
    const std::string w = save_checkpoint(c, e.sharded(), cs, comm);
    if (comm.rank() == 0) where = w;
  });
  return where;
}

std::string load_error(const Config& c, const std::string& where) {
  SoloCommunicator comm;
  ShardedModel m(c, comm);
  try {
    load_checkpoint(where, c, m, comm);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
    return e.what();
  }
  return "";
}

TEST_F(CheckpointTest, BadCheckpointsAreRefusedNamingTheFileOrField) {
  const std::string where = save_untrained(cfg_, 2, 5);
  const fs::path rank1 = fs::path(where) / "rank_00001.h5";
  const std::string pristine = testing::read_bytes(rank1.string());
  auto write_rank1 = [&](const std::string& bytes) { testing::write_bytes(rank1.string(), bytes); };

  // A changed byte is named by the digest wherever it is: in the floats (found by the load's one pass), or in the
  // structure HDF5 parses before it (the superblock's signature, its last bytes).
  std::string msg;
  for (const size_t at : {pristine.size() / 2, size_t{0}, size_t{9}, pristine.size() - 1}) {
    std::string flipped = pristine;
    flipped[at] ^= 0x01;
    write_rank1(flipped);
    msg = load_error(cfg_, where);
    EXPECT_NE(msg.find(rank1.string() + ": SHA-256 mismatch"), std::string::npos) << "byte " << at << ": " << msg;
  }

  write_rank1(pristine.substr(0, pristine.size() - 100));
  msg = load_error(cfg_, where);
  EXPECT_NE(msg.find(rank1.string()), std::string::npos) << msg;

  fs::remove(rank1);
  msg = load_error(cfg_, where);
  EXPECT_NE(msg.find("rank_00001.h5"), std::string::npos) << msg;
  write_rank1(pristine);
  EXPECT_EQ(load_error(cfg_, where), "");

  Config other = cfg_;
  other.model.n_embd = 32;
  msg = load_error(other, where);
  EXPECT_NE(msg.find("model.n_embd"), std::string::npos) << msg;
  EXPECT_NE(msg.find("16"), std::string::npos) << msg;
  EXPECT_NE(msg.find("32"), std::string::npos) << msg;
}

TEST_F(CheckpointTest, ResumeResolution) {
  CkptConfig k;
  k.dir = cfg_.ckpt.dir;
  k.resume = "auto";
  EXPECT_FALSE(resolve_resume(k).has_value());                // nothing there yet: start fresh
  fs::create_directories(fs::path(k.dir) / "step_00000009");  // no manifest: uncommitted, ignored
  EXPECT_FALSE(resolve_resume(k).has_value());
  k.resume = (fs::path(k.dir) / "step_00000009").string();
  try {
    resolve_resume(k);
    ADD_FAILURE() << "an uncommitted directory was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("manifest.json"), std::string::npos) << e.what();
  }
  k.resume = tmp_.file("nope");
  try {
    resolve_resume(k);
    ADD_FAILURE() << "a missing directory was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find(k.resume), std::string::npos) << e.what();
  }
  k.resume = "none";
  EXPECT_FALSE(resolve_resume(k).has_value());
  // A `latest` that is a directory would make every save fail after committing: refused, resuming or not.
  fs::create_directories(fs::path(k.dir) / "latest");
  for (const char* resume : {"none", "auto"}) {
    k.resume = resume;
    try {
      resolve_resume(k);
      ADD_FAILURE() << "a directory at latest was accepted (ckpt.resume=" << resume << ")";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      EXPECT_NE(std::string(e.what()).find(k.dir + "/latest is a directory: it must be a file"), std::string::npos)
          << e.what();
    }
  }
}

// A problem only rank 1 can see (its own file) stops both ranks with rank 1's message, not rank 0 with a peer
// failure.
TEST_F(CheckpointTest, EveryRankThrowsTheProblemOneRankFound) {
  const std::string where = save_untrained(cfg_, 2, 3);
  const std::string rank1 = (fs::path(where) / "rank_00001.h5").string();
  std::string bytes = testing::read_bytes(rank1);
  bytes[bytes.size() / 2] ^= 0x01;
  testing::write_bytes(rank1, bytes);
  std::vector<std::string> messages(2);
  std::vector<int> kinds(2, -1);
  fake::spawn(2, [&](Communicator& comm) {
    StepEngine e(cfg_, comm);
    try {
      load_checkpoint(where, cfg_, e.sharded(), comm);
    } catch (const Error& err) {
      messages[static_cast<size_t>(comm.rank())] = err.what();
      kinds[static_cast<size_t>(comm.rank())] = static_cast<int>(err.kind());
    }
  });
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(kinds[r], static_cast<int>(ErrorKind::kBadInput)) << messages[r];
    EXPECT_NE(messages[r].find(rank1 + ": SHA-256 mismatch"), std::string::npos) << messages[r];
  }
}

}  // namespace
}  // namespace st
