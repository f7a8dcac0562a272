// Checkpoint saves that cost training a copy of the state, not a write: CheckpointSaver takes a snapshot of every
// rank's shards at the step boundary (StateSnapshot, pinned host memory on cuda) and writes, hashes and commits it
// on a background thread while the following steps train.
//
// The commit protocol is save_checkpoint()'s (checkpoint.h): every rank writes rank_XXXXX.h5 into
// <dir>/step_XXXXXXXX.tmp-<nonce>/; once every rank's file is complete, rank 0 writes the manifest (every file's
// size and SHA-256), renames the directory to step_XXXXXXXX/, replaces `latest` and applies ckpt.keep. What changes
// is how the ranks agree: instead of a blocking collective at the save, each rank reports its write (done or
// failed, the file's size and hash) in words that ride on an all-reduce the trainer makes every step anyway:
//
//   CheckpointSaver saver(cfg, model, comm, resumed_from);     // collective (one broadcast)
//   for each step:
//     ... train ...
//     if (save_step) saver.save(state);                        // snapshot; the write starts in the background
//     std::vector<double> w(1 + saver.control_words());         // [stop flag | the saver's words]
//     saver.put_control(w.data() + 1);
//     comm.all_reduce(w.data(), w.size());
//     saver.take_control(w.data() + 1);                        // may commit, may throw (ckpt.on_error = stop)
//   saver.drain();                                             // the end of the run waits for the pending save
//
// A save passes through: writing (every rank's thread writes its file) -> committing (rank 0's thread writes the
// manifest and renames) -> committed, or failed. A failure anywhere is acted on only once every rank's write has
// ended, so that rank 0 can remove the temporary directory (a full disk gets its space back) before the run stops
// with kFault (ckpt.on_error = stop) or logs and trains on (warn). Nothing partial is ever committed.
//
// save() first waits for the save before it (the snapshot memory is reused), as drain() does. With
// ckpt.async = false, save() writes and commits before it returns.
//
// With ckpt.replicas = 1 (node_local.h) every node saves into its own directory: the write job also sends this
// rank's file to its replica holder and receives its source's (file_transfer.h), over a dup of `comm` made by the
// constructor that only the background thread uses; each node's leader commits its own directory, and the save
// ends once every leader has reported its commit.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/shard/model_backend.h"

namespace st {

class CheckpointSaver {
 public:
  // `protect`: the directory resumed from, which ckpt.keep never deletes. Collective.
  CheckpointSaver(const Config& cfg, ModelBackend& model, Communicator& comm, std::string protect = "");
  ~CheckpointSaver();  // waits for this rank's background work; a save still pending stays uncommitted
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  // Collective. Takes this rank's snapshot of the state and starts writing it (after drain()). With ckpt.async
  // = false, returns once the save is committed (or throws as drain() does).
  void save(const CheckpointState& state);

  // The agreement's words: control_words() doubles (the same count on every rank; 0 when no save is pending),
  // which the caller sums over all ranks. put_control() fills them before the all-reduce, take_control() reads the
  // sum: it starts the commit once every file is written, ends the save once the commit is reported, and on a
  // failure that every rank has seen throws kFault (ckpt.on_error = stop) or logs it (warn).
  int64_t control_words() const;
  void put_control(double* words) const;
  void take_control(const double* summed);

  // Blocks until no save is pending. Collective (all-reduces the control words until the save has ended).
  void drain();
  bool pending() const;
  // The step directory of the newest save this saver committed ("" before the first).
  std::string last_committed() const;
  // How long the last save() waited for the save before it to end (0 when none was pending), in ms. The first
  // wait is also logged as a warning: saves come faster than the disk writes them.
  double last_wait_ms() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace st
