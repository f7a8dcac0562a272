// Saving and loading sharded checkpoints: the commit protocol, resume, and resharding on load.
//
// Commit protocol (docs/checkpoint-format.md has the layout):
//   1. Every rank writes rank_XXXXX.h5 into <dir>/step_XXXXXXXX.tmp-<nonce>/ (one nonce, chosen by rank 0
//      and broadcast) and fsyncs it; HDF5 never calls fsync itself.
//   2. The ranks agree that every write succeeded, and learn every file's size and SHA-256 (an all-reduce). If
//      any failed, every rank throws kFault naming the failed ranks, and nothing is committed: no manifest, no
//      rename.
//   3. Rank 0 writes and fsyncs manifest.json (with every file's size and SHA-256), renames the directory
//      to step_XXXXXXXX/, fsyncs <dir>, then replaces <dir>/latest atomically. An all-reduce ends the save.
// save_checkpoint() runs the protocol while the caller waits; CheckpointSaver (checkpoint_saver.h) runs the same
// protocol in the background, the agreement riding on the trainer's per-step all-reduce.
// A step directory without a manifest, or any *.tmp-* directory, is uncommitted: never loaded, removed
// by clean_uncommitted() at start-up, and never counted by ckpt.keep.
//
//   CheckpointState s{step, engine.updates(), skipped, 1.0, {}};
//   std::string where = save_checkpoint(cfg, model, s, comm);     // collective
//   CheckpointState r = load_checkpoint(where, cfg, model, comm);   // collective; any world size
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/ckpt/resume_data.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/shard/model_backend.h"

namespace st {

// The training state a checkpoint carries beside the tensors.
struct CheckpointState {
  int64_t step = 0;               // optimizer steps completed
  int64_t optimizer_updates = 0;  // AdamW t
  int64_t skipped_steps = 0;
  double loss_scale = 1.0;
  int64_t loss_scale_good_steps = 0;
  std::vector<uint64_t> rng_counters;  // per rank, in rank order (on load: this run's ranks, or empty)
  // The data order. On save only data.train_windows is read (the rest is the config's); on load all of it is
  // the manifest's.
  DataOrder data;
  // A LoRA run's frozen base (manifest.h): on save, what the lead rank records; on load, the base this run read (on
  // rank 0, which hashed its files and found the checkpoint's digests; empty on the others).
  ManifestBase base;
};

// "step_00000100".
std::string step_dir_name(int64_t step);

// Saves into cfg.ckpt.dir and commits before it returns, whatever ckpt.async and ckpt.on_error say (a failure
// throws). Collective. Returns the committed step directory. Then applies ckpt.keep, never deleting `protect` (the
// directory resumed from).
std::string save_checkpoint(const Config& cfg, ModelBackend& model, const CheckpointState& state, Communicator& comm,
                            const std::string& protect = "");

// The committed step directories in `dir`, oldest first.
std::vector<std::string> committed_checkpoints(const std::string& dir);

// What ckpt.resume names: none -> nothing; auto -> the newest committed checkpoint in ckpt.dir, if any
// (whatever `latest` says: it is written last and may lag); otherwise the given directory, which must exist
// and be committed (kBadInput naming it otherwise). First, whatever ckpt.resume says, check_latest_file. For one
// shared ckpt.dir; node-local directories (ckpt.replicas = 1) resume through resume_node_local (replica_resume.h).
std::optional<std::string> resolve_resume(const CkptConfig& cfg);

// kBadInput naming the path if <ckpt.dir>/latest exists and is not a file (a directory there would make
// every save commit its step and then fail to replace `latest`). Nothing to check without ckpt.dir.
void check_latest_file(const std::string& dir);

// Loads a committed checkpoint into this rank's shards, whatever world size wrote it. Every rank opens it
// with open_checkpoint (checkpoint_check.h); the model config must match (kBadInput naming the field and
// both values); rank 0 checks that every rank file exists with the manifest's size. Then each rank reads
// the intersection of its spans with the old files' spans (hyperslabs), opening only those files, each
// with open_rank_file (size, SHA-256, structure, attributes, spans) before its first read. A problem found
// on any rank is thrown on every rank, with that rank's message and kind. Collective. Rank 0 logs the load as
// `purpose` names it: "checkpoint: resumed from DIR (step N, written by W rank(s), loaded by X)" for a run that
// continues from it, "checkpoint: loaded step N from DIR (written by W rank(s), read by X)" for a read of its weights
// (eval, generate). A LoRA checkpoint (adapters only) also loads its frozen base: cfg.init.from, whose files must have
// the digests the manifest recorded (ckpt/lora_base.h), read as init_from_weights reads it; or, without init.from,
// the seed's random base, whose train.seed must be the checkpoint's.
enum class CheckpointLoad { kResume, kRead };
CheckpointState load_checkpoint(const std::string& step_dir, const Config& cfg, ModelBackend& model, Communicator& comm,
                                CheckpointLoad purpose = CheckpointLoad::kResume);

// Removes *.tmp-* directories left in `dir` by interrupted saves. Rank 0 only, before training, while it holds
// the directory's lock (dir_lock.h): another job's save in flight looks the same.
void clean_uncommitted(const std::string& dir);

// "on (HDF5 default)" or "off (HDF5_USE_FILE_LOCKING=FALSE)": which HDF5 file-locking mode is in force.
std::string hdf5_file_locking_mode();

}  // namespace st
