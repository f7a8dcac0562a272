// Node-local checkpoint directories with peer replicas (ckpt.replicas = 1): the ring, the agreement on the checkpoint
// to resume, the restore plan, file transfers, the directory locks, and a save / wipe / resume round trip on a fake
// world of 2 nodes x 2 ranks. Real processes under mpirun: tests/faults/ckpt_replicas_test.py.
#include "shardtrain/ckpt/replica_resume.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "../common/tiny_training.h"
#include "ckpt_test_util.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/digest.h"
#include "shardtrain/ckpt/dir_lock.h"
#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/ckpt/file_transfer.h"
#include "shardtrain/ckpt/node_local.h"
#include "shardtrain/comm/fake_communicator.h"
#include "shardtrain/core/error.h"

namespace fs = std::filesystem;

namespace st {
namespace {

using testing::bad_input_message;
using testing::contains;
using testing::TempDir;

// An error's text without the process prefix ("[host] ") that every message carries.
std::string text_of(const std::string& message) {
  const size_t at = message.find("] ");
  return at == std::string::npos ? message : message.substr(at + 2);
}

// ranks_per_node ranks on each of `nodes` nodes, in rank order.
NodeLayout layout_of(std::vector<int> sizes) {
  NodeLayout l;
  l.nodes = static_cast<int>(sizes.size());
  int rank = 0;
  for (int n = 0; n < l.nodes; ++n) {
    l.ranks.emplace_back();
    for (int i = 0; i < sizes[static_cast<size_t>(n)]; ++i, ++rank) {
      l.node_of.push_back(n);
      l.local_of.push_back(i);
      l.ranks.back().push_back(rank);
    }
  }
  return l;
}

TEST(NodeLocal, DirectoriesRingAndLayoutChecks) {
  EXPECT_EQ(node_ckpt_dir("ck/node{node}/x{node}", 12), "ck/node12/x12");
  EXPECT_EQ(node_ckpt_dir("ck/shared", 3), "ck/shared");
  // 3 nodes x 2: rank 0's file goes to the last node's local rank 0 (rank 4), and rank 0 keeps node 1's (rank 2).
  const NodeLayout l = layout_of({2, 2, 2});
  EXPECT_EQ(l.holder_of(0), 4);
  EXPECT_EQ(l.source_of(0), 2);
  EXPECT_EQ(l.holder_of(3), 1);
  EXPECT_EQ(l.source_of(5), 1);
  EXPECT_EQ(l.describe_node(1), "node 1 (ranks 2-3)");
  check_replica_layout(l);
  EXPECT_EQ(text_of(bad_input_message([] { check_replica_layout(layout_of({4})); })),
            "ckpt.replicas=1 keeps each node's checkpoint files on the next node's disk, but this run has one node (4 "
            "rank(s)): a replica on the same disk protects nothing. Use ckpt.replicas=0 (the default) on one machine");
  const std::string uneven = bad_input_message([] { check_replica_layout(layout_of({2, 1, 2})); });
  EXPECT_TRUE(contains(uneven, "every node needs the same number of ranks: node 0 has 2, node 1 has 1, node 2 has 2"))
      << uneven;
}

// A node's copy of a 4-file save of `step` that holds `held`.
StepHolding holding(int64_t step, std::vector<int> held, const std::string& save = "") {
  StepHolding h;
  h.step = step;
  h.save = save.empty() ? "save" + std::to_string(step) : save;
  h.files = 4;
  h.held = std::move(held);
  for (int f = 0; f < 4; ++f) h.names.push_back("rank_0000" + std::to_string(f) + ".h5");
  return h;
}

TEST(ReplicaResume, InventoryTextRoundTrips) {
  const NodeInventory inv = {holding(4, {0, 1, 2, 3}), holding(8, {})};
  const NodeInventory back = inventory_from_text(inventory_to_text(inv));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].step, 4);
  EXPECT_EQ(back[0].held, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(back[1].held, std::vector<int>{});
  EXPECT_EQ(back[1].names, inv[1].names);
  EXPECT_EQ(back[1].save, "save8");
  EXPECT_TRUE(inventory_from_text("").empty());
}

TEST(ReplicaResume, AutoTakesTheNewestCompleteCheckpointAndWarnsAboutNewerOnes) {
  // Node 1 was wiped; node 0 still holds every file of step 4, but lost its replicas (2, 3) of step 8.
  const std::vector<NodeInventory> nodes = {{holding(4, {0, 1, 2, 3}), holding(8, {0, 1})}, {}};
  const ResumeChoice c = choose_resume(nodes, std::nullopt, "ckpt.resume=auto");
  EXPECT_EQ(c.step, 4);
  EXPECT_EQ(c.reference_node, 0);
  EXPECT_EQ(c.save, "save4");
  EXPECT_EQ(c.warning,
            "checkpoint: step_00000008 has lost rank_00002.h5, rank_00003.h5 (2 of its 4 rank files are in no node's "
            "directory, as a primary or a replica; node(s) 0 hold the rest). Resuming from step_00000004 instead, the "
            "newest checkpoint whose every file some node holds");
  // Spread over two nodes, step 8 is complete: no warning.
  const ResumeChoice whole = choose_resume({{holding(8, {0, 1})}, {holding(8, {2, 3})}}, std::nullopt, "auto");
  EXPECT_EQ(whole.step, 8);
  EXPECT_EQ(whole.warning, "");
  // Nothing committed anywhere: start fresh.
  EXPECT_FALSE(choose_resume({{}, {}}, std::nullopt, "auto").step.has_value());
}

TEST(ReplicaResume, NothingCompleteOrANamedIncompleteCheckpointIsBadInputNamingTheLostFiles) {
  const std::vector<NodeInventory> none = {{holding(4, {0, 1}), holding(8, {0, 1})}, {}};
  EXPECT_EQ(text_of(bad_input_message([&] { choose_resume(none, std::nullopt, "ckpt.resume=auto"); })),
            "ckpt.resume=auto: no checkpoint in the node-local ckpt.dirs is complete: step_00000008 has lost "
            "rank_00002.h5, rank_00003.h5 (2 of its 4 rank files are in no node's directory, as a primary or a "
            "replica; node(s) 0 hold the rest); step_00000004 has lost rank_00002.h5, rank_00003.h5 (2 of its 4 rank "
            "files are in no node's directory, as a primary or a replica; node(s) 0 hold the rest). Lost files cannot "
            "be restored: start from step 0 with ckpt.resume=none (or move the directories aside)");
  const std::vector<NodeInventory> some = {{holding(4, {0, 1, 2, 3}), holding(8, {0, 1})}, {}};
  EXPECT_EQ(text_of(bad_input_message([&] { choose_resume(some, 8, "ckpt.resume 'ck/node{node}/step_00000008'"); })),
            "ckpt.resume 'ck/node{node}/step_00000008': step_00000008 has lost rank_00002.h5, rank_00003.h5 (2 of its "
            "4 rank files are in no node's directory, as a primary or a replica; node(s) 0 hold the rest). Lost files "
            "cannot be restored; the newest complete checkpoint is step_00000004 (ckpt.resume=auto resumes from it)");
  EXPECT_EQ(text_of(bad_input_message([&] { choose_resume(some, 12, "ckpt.resume 'x'"); })),
            "ckpt.resume 'x': no node holds a committed step_00000012; the newest complete checkpoint is "
            "step_00000004 (ckpt.resume=auto resumes from it)");
  EXPECT_EQ(choose_resume(some, 4, "x").step, 4);
}

TEST(ReplicaResume, TwoSavesOfOneStepAreNotMixed) {
  // Node 1 holds files 2 and 3 of another save of step 8 (a run that went back): they complete nothing for node
  // 0's copy, whose files 2 and 3 are lost, and node 1's own copy lacks 0 and 1.
  const std::vector<NodeInventory> nodes = {{holding(4, {0, 1, 2, 3}), holding(8, {0, 1}, "a")},
                                            {holding(8, {2, 3}, "b")}};
  const ResumeChoice c = choose_resume(nodes, std::nullopt, "auto");
  EXPECT_EQ(c.step, 4);
  EXPECT_TRUE(contains(c.warning, "step_00000008 has lost")) << c.warning;
}

// A manifest of `files` files over 2 units for the restore plan (spans as a save of `files` ranks makes them).
Manifest plan_manifest(int files) {
  Manifest m;
  m.step = 8;
  m.world_size = files;
  m.units = {ManifestUnit{"a", 100, {}}, ManifestUnit{"b", 10, {}}};
  for (int f = 0; f < files; ++f) {
    ManifestFile mf;
    mf.rank = f;
    mf.name = "rank_0000" + std::to_string(f) + ".h5";
    for (const ManifestUnit& u : m.units) mf.spans.push_back(shard_span(u.numel, f, files));
    m.files.push_back(mf);
  }
  return m;
}

std::string moves_text(const std::vector<FileMove>& moves) {
  std::string out;
  for (const FileMove& m : moves) out += str_cat(out.empty() ? "" : " ", m.file, ":", m.from, ">", m.to);
  return out;
}

TEST(ReplicaResume, RestorePlanGivesEachNodeItsFilesAndTheNextNodesFromTheLowestHolder) {
  // 2 x 2, node 1 wiped: its primaries 2, 3 and its replicas 0, 1 all come from node 0.
  const Manifest m4 = plan_manifest(4);
  EXPECT_EQ(moves_text(plan_restore(m4, layout_of({2, 2}), {{0, 1, 2, 3}, {}})), "0:0>1 1:0>1 2:0>1 3:0>1");
  // 3 x 1, node 1 wiped: its own file 1 from node 0 (its replica holder), node 2's file from node 2.
  const Manifest m3 = plan_manifest(3);
  EXPECT_EQ(files_to_hold(m3, layout_of({1, 1, 1})), (std::vector<std::vector<int>>{{0, 1}, {1, 2}, {0, 2}}));
  EXPECT_EQ(moves_text(plan_restore(m3, layout_of({1, 1, 1}), {{0, 1}, {}, {0, 2}})), "1:0>1 2:2>1");
  // Nothing lost: nothing to move.
  EXPECT_EQ(moves_text(plan_restore(m3, layout_of({1, 1, 1}), {{0, 1}, {1, 2}, {0, 2}})), "");
  // Another world size (4 files read by 2 nodes x 1): each node needs the files its rank's spans meet, only them
  // (unit b's 10 elements: rank 1 of 2 reads [5, 10), which meets files 1, 2 and 3's [3, 6), [6, 9), [9, 10)).
  EXPECT_EQ(files_to_hold(m4, layout_of({1, 1})), (std::vector<std::vector<int>>{{0, 1}, {1, 2, 3}}));
  EXPECT_EQ(moves_text(plan_restore(m4, layout_of({1, 1}), {{0, 1, 2, 3}, {0, 1}})), "2:0>1 3:0>1");
}

// Each rank writes a file of its own size and content; the ring moves each to the previous rank.
TEST(FileTransfer, RingMovesEveryFileAndChecksItsHash) {
  TempDir tmp;
  const std::vector<int64_t> sizes = {0, 1, kTransferChunk + 5};
  auto content = [](int rank, int64_t i) { return static_cast<char>((rank * 131 + i * 7) & 0xff); };
  for (int r = 0; r < 3; ++r) {
    std::string bytes(static_cast<size_t>(sizes[static_cast<size_t>(r)]), '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = content(r, static_cast<int64_t>(i));
    std::ofstream(tmp.file("out" + std::to_string(r)), std::ios::binary) << bytes;
  }
  std::vector<FileTake> got(3);
  fake::spawn(3, [&](Communicator& comm) {
    const int r = comm.rank();
    const std::string path = tmp.file("out" + std::to_string(r));
    const FileOffer offer{r, path, sizes[static_cast<size_t>(r)], file_digest(path, 4096), 4096};
    transfer_files(comm, (r + 2) % 3, &offer, (r + 1) % 3, &got[static_cast<size_t>(r)],
                   [&](int f) { return tmp.file("in" + std::to_string(r) + "_of_" + std::to_string(f)); });
  });
  for (int r = 0; r < 3; ++r) {
    const int from = (r + 1) % 3;
    const FileTake& t = got[static_cast<size_t>(r)];
    EXPECT_TRUE(t.received);
    EXPECT_EQ(t.file, from);
    EXPECT_EQ(t.bytes, sizes[static_cast<size_t>(from)]);
    EXPECT_EQ(t.path, tmp.file("in" + std::to_string(r) + "_of_" + std::to_string(from)));
    EXPECT_EQ(read_file(t.path), read_file(tmp.file("out" + std::to_string(from)))) << "rank " << r;
  }
}

TEST(FileTransfer, AHashThatDoesNotMatchFailsTheReceiverAndNothingOfferedIsNotAFile) {
  TempDir tmp;
  std::ofstream(tmp.file("a"), std::ios::binary) << "payload";
  std::vector<std::string> errors(2);
  std::vector<FileTake> got(2);
  fake::spawn(2, [&](Communicator& comm) {
    const int r = comm.rank();
    // Rank 0 offers its file with rank 1's idea of its hash wrong; rank 1 offers nothing (its write failed).
    const FileOffer offer = r == 0 ? FileOffer{0, tmp.file("a"), 7, std::string(64, '0'), 4096} : FileOffer{};
    try {
      transfer_files(comm, 1 - r, &offer, 1 - r, &got[static_cast<size_t>(r)],
                     [&](int f) { return tmp.file("got" + std::to_string(f)); });
    } catch (const Error& e) {
      errors[static_cast<size_t>(r)] = std::to_string(static_cast<int>(e.kind())) + "|" + text_of(e.what());
    }
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_FALSE(got[0].received);
  EXPECT_TRUE(got[1].received);
  // kFault messages carry the source location after the process prefix.
  EXPECT_EQ(errors[1].substr(0, 2), std::to_string(static_cast<int>(ErrorKind::kFault)) + "|");
  EXPECT_TRUE(contains(errors[1], ": receiving file 0 from rank 0 into " + tmp.file("got0") +
                                      ": SHA-256 mismatch: expected " + std::string(64, '0') +
                                      " (the sender's), actual " + digest_hex("payload", 7, 4096)))
      << errors[1];
}

TEST(NodeLocalLock, EachNodeLocksItsOwnDirectoryAndASharedOneIsRefusedNamingBothNodes) {
  TempDir tmp;
  std::vector<int> held(4, -1), lock_files(4, -1);
  fake::spawn(
      4,
      [&](Communicator& comm) {
        const DirLock lock = lock_node_local_dirs(tmp.file("ck/node{node}"), comm);
        held[static_cast<size_t>(comm.rank())] = lock.held();
        lock_files[static_cast<size_t>(comm.rank())] =
            fs::exists(tmp.file(str_cat("ck/node", comm.node_id(), "/.lock")));
        comm.barrier();  // every lock is held until all have looked
      },
      fake::WorldOptions{2});
  EXPECT_EQ(held, (std::vector<int>{1, 0, 1, 0}));
  EXPECT_EQ(lock_files, (std::vector<int>{1, 1, 1, 1}));
  // Nothing was written into them: the job that created them leaves nothing behind.
  EXPECT_FALSE(fs::exists(tmp.file("ck/node0")));
  EXPECT_FALSE(fs::exists(tmp.file("ck/node1")));
  std::vector<std::string> errors(4);
  fake::spawn(
      4,
      [&](Communicator& comm) {
        try {
          lock_node_local_dirs(tmp.file("shared"), comm);
        } catch (const Error& e) {
          errors[static_cast<size_t>(comm.rank())] = e.what();
        }
      },
      fake::WorldOptions{2});
  for (const std::string& e : errors) {
    EXPECT_TRUE(contains(e, "ckpt.dir '" + tmp.file("shared") + "' is one directory for node ")) << e;
    EXPECT_TRUE(contains(e, "node 0 (ranks 0-1)") && contains(e, "node 1 (ranks 2-3)")) << e;
    EXPECT_TRUE(contains(e, "a replica in the same directory as its source protects nothing")) << e;
  }
}

// 2 nodes x 2 ranks save with replicas, node 1's directory is wiped, and a fresh world resumes: node 1's
// directory is restored from node 0's copy and every rank loads the saved state bit for bit.
// Full training, LoRA and QLoRA (the adapters' state in the files, the base drawn again from the seed).
std::vector<Config> replica_configs() {
  Config full = testing::tiny_config();
  full.train.steps = 4;
  full.ckpt.replicas = 1;
  full.ckpt.keep = 0;
  Config lora = full;
  lora.model.lora.rank = 2;
  lora.model.lora.targets = "qkv,fc";
  Config qlora = lora;
  qlora.model.lora.base_dtype = LoraBase::kNf4;
  return {full, lora, qlora};
}

// Saves at step 3 on 2 nodes x 2 ranks, wipes node 1, and resumes: node 1 gets its files back from node 0, and the
// state (and the frozen base) loads bit-exact.
void wiped_node_restores(Config cfg) {
  omp_set_num_threads(1);
  TempDir tmp;
  cfg.ckpt.dir = tmp.file("ck/node{node}");
  std::vector<std::vector<float>> saved, loaded;
  fake::spawn(
      4,
      [&](Communicator& comm) {
        StepEngine e(cfg, comm);
        testing::Trace tr;
        testing::train_steps(e, cfg, comm, 11, 0, 3, &tr);
        CheckpointState cs;
        cs.step = 3;
        cs.optimizer_updates = e.updates();
        save_checkpoint(cfg, e.sharded(), cs, comm);
        std::vector<std::vector<float>> s = testing::full_state(e.sharded());
        for (const UnitLayout& u : e.units()) s.push_back(e.sharded().gather_frozen(u.index));
        if (comm.rank() == 0) saved = std::move(s);
      },
      fake::WorldOptions{2});
  for (int node : {0, 1}) {
    const Manifest m = read_manifest(tmp.file("ck/node" + std::to_string(node) + "/step_00000003/manifest.json"));
    ASSERT_TRUE(m.node_local.has_value());
    EXPECT_EQ(m.node_local->node, node);
    EXPECT_EQ(m.node_local->primaries, node == 0 ? (std::vector<int>{0, 1}) : (std::vector<int>{2, 3}));
    EXPECT_EQ(m.node_local->replicas, node == 0 ? (std::vector<int>{2, 3}) : (std::vector<int>{0, 1}));
    for (const ManifestFile& f : m.files)
      EXPECT_EQ(
          file_digest(tmp.file("ck/node" + std::to_string(node) + "/step_00000003/" + f.name), m.digest_piece_bytes),
          f.digest);
  }
  fs::remove_all(tmp.file("ck/node1"));
  std::vector<std::string> from(4);
  fake::spawn(
      4,
      [&](Communicator& comm) {
        StepEngine e(cfg, comm);
        const std::optional<std::string> where = resume_node_local(cfg, e.sharded(), comm);
        ASSERT_TRUE(where.has_value());
        from[static_cast<size_t>(comm.rank())] = *where;
        const CheckpointState cs = load_checkpoint(*where, cfg, e.sharded(), comm);
        EXPECT_EQ(cs.step, 3);
        std::vector<std::vector<float>> s = testing::full_state(e.sharded());
        for (const UnitLayout& u : e.units()) s.push_back(e.sharded().gather_frozen(u.index));
        if (comm.rank() == 0) loaded = std::move(s);
      },
      fake::WorldOptions{2});
  EXPECT_EQ(from, (std::vector<std::string>{tmp.file("ck/node0/step_00000003"), tmp.file("ck/node0/step_00000003"),
                                            tmp.file("ck/node1/step_00000003"), tmp.file("ck/node1/step_00000003")}));
  ASSERT_EQ(saved.size(), loaded.size());
  for (size_t i = 0; i < saved.size(); ++i) EXPECT_EQ(testing::bits(saved[i]), testing::bits(loaded[i])) << i;
  const Manifest restored = read_manifest(tmp.file("ck/node1/step_00000003/manifest.json"));
  ASSERT_TRUE(restored.node_local.has_value());
  EXPECT_EQ(restored.node_local->node, 1);
  EXPECT_EQ(restored.node_local->primaries, (std::vector<int>{2, 3}));
  EXPECT_EQ(restored.node_local->replicas, (std::vector<int>{0, 1}));
  for (const ManifestFile& f : restored.files)
    EXPECT_EQ(file_digest(tmp.file("ck/node1/step_00000003/" + f.name), restored.digest_piece_bytes), f.digest)
        << f.name;
}

TEST(ReplicaResume, WipedNodeIsRestoredFromItsNeighbourAndLoadsBitExact) {
  for (Config cfg : replica_configs()) {
    SCOPED_TRACE(cfg.model.lora.enabled() ? to_string(cfg.model.lora.base_dtype) : "full");
    wiped_node_restores(cfg);
  }
}

}  // namespace
}  // namespace st
