// Resume from node-local checkpoint directories (ckpt.replicas = 1, node_local.h): the nodes agree on the checkpoint
// to resume, and a node whose directory lost files gets them back from the nodes that hold them.
//
//   1. Inventory: each node's leader lists the committed step directories of its ckpt.dir and, for each, the files
//      of its manifest that are there with the manifest's size (a wiped directory lists nothing).
//   2. Agreement (choose_resume, the same on every rank): a checkpoint is complete when each of its files is held by
//      some node (as a primary or a replica). ckpt.resume=auto takes the newest complete one; when a newer one is
//      incomplete the log warns, naming its lost files and the checkpoint resumed instead. With none complete, or
//      when ckpt.resume names an incomplete one, every rank throws kBadInput naming the lost files and the newest
//      complete checkpoint (or that there is none).
//   3. Restore (plan_restore): each node must hold the files its ranks read and, at the checkpoint's world size, its
//      ranks' files and the next node's (what a save would have left there). A node that lacks some receives them
//      from a node that holds them, into <dir>/step_XXXXXXXX.tmp-<nonce>/ beside hard links to the files it still
//      has, with the manifest (its node_local naming this node's primaries and replicas), and renames that into place
//      (an old copy moved aside first). Transfers go between the nodes' leaders, one at a time in plan order.
//   Then each rank loads from its own node's step directory (load_checkpoint), whose SHA-256 checks cover the
//   restored files too.
//
//   std::optional<std::string> from = resume_node_local(cfg, engine.sharded(), comm);   // collective
//   if (from) load_checkpoint(*from, cfg, engine.sharded(), comm);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/ckpt/node_local.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/shard/model_backend.h"

namespace st {

// One node's copy of one committed checkpoint.
struct StepHolding {
  int64_t step = 0;
  std::string save;  // SHA-256 of the manifest's step and file list (names, sizes, hashes): copies of one save agree
  int files = 0;     // the manifest's file count
  std::vector<int> held;           // files present with the manifest's size, ascending
  std::vector<std::string> names;  // the manifest's file names, by index
};

// What one node's ckpt.dir holds, newest step last.
using NodeInventory = std::vector<StepHolding>;

// The inventory of a node's ckpt.dir (committed step directories only), and its text form (JSON) for the exchange.
NodeInventory scan_node_dir(const std::string& dir);
std::string inventory_to_text(const NodeInventory& inv);
NodeInventory inventory_from_text(const std::string& text);

struct ResumeChoice {
  std::optional<int64_t> step;  // none: nothing committed on any node (start fresh)
  std::string save;             // the chosen copy's save fingerprint
  int reference_node = -1;      // the lowest node holding it: its manifest is the one every node writes
  std::string warning;          // auto fell back past incomplete checkpoints: names them, their lost files, the step
};

// The agreement: `wanted` is the step ckpt.resume names, or none for auto. kBadInput (naming the lost files and the
// newest complete checkpoint, or that none is complete) when no complete checkpoint can be resumed: auto with
// committed checkpoints none of which is complete, or a named step that no node holds completely.
ResumeChoice choose_resume(const std::vector<NodeInventory>& nodes, std::optional<int64_t> wanted,
                           const std::string& what);

// One file to send: from the leader of node `from` to the leader of node `to`.
struct FileMove {
  int file = 0;
  int from = 0;
  int to = 0;
};

// The files each node of `layout` must hold (the files whose spans meet its ranks' spans at layout's world size,
// and at the manifest's world size also its ranks' own files and the next node's), and for every one it lacks a
// node that holds it (the lowest one). Ordered by receiving node, then file.
std::vector<std::vector<int>> files_to_hold(const Manifest& m, const NodeLayout& layout);
std::vector<FileMove> plan_restore(const Manifest& m, const NodeLayout& layout,
                                   const std::vector<std::vector<int>>& held);

// Steps 1-3 above for cfg.ckpt (ckpt.resume auto or a step directory of ckpt.dir, {node} expanded per node; none
// returns nullopt at once). Returns this node's step directory to load, or nullopt to start fresh. Collective.
std::optional<std::string> resume_node_local(const Config& cfg, ModelBackend& model, Communicator& comm);

}  // namespace st
