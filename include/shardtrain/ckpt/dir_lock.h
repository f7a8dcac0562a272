// Ownership of a checkpoint directory: one job at a time writes into a ckpt.dir.
//
// A job takes an exclusive flock(2) on <ckpt.dir>/.lock before it touches anything there (the start-up
// clean-up of uncommitted saves, resume, pruning) and holds it until the process ends. The kernel drops the
// lock when the holder's file descriptor closes, so a SIGKILLed or crashed job leaves no stale lock on a
// local filesystem; on NFS the server releases a dead client's lock when its lease expires
// (docs/checkpoint-format.md, "Checkpoint directory").
//
// After the lock is taken the file records the holder, one `key=value` a line: host, pid, and the start
// time in ISO-8601 UTC. A second job reads it and names the holder in its error.
//
// Rank 0 alone takes the lock (each node's leader, with node-local directories: lock_node_local_dirs): it is the rank
// that cleans, commits, prunes and writes `latest`, and the other ranks write only into the temporary directory of a
// save that rank 0 starts, inside the same job. flock excludes processes, not jobs, so a lock on every rank would make
// a job's ranks exclude each other.
//
//   DirLock lock = lock_checkpoint_dir(cfg.ckpt.dir, comm);   // collective; held while `lock` lives
#pragma once

#include <string>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/unique_fd.h"

namespace st {

class DirLock {
 public:
  DirLock() = default;  // holds nothing
  // Creates `dir` if absent (with its parents), proves it is a writable directory, takes the lock and
  // writes the holder record. kBadInput naming `dir` when it is not a directory, cannot be created or
  // written (errno text), another job holds it (naming that holder: host, pid, start time), or its
  // filesystem has no working locks (ENOLCK, EOPNOTSUPP, ENOSYS). `extra`: more key=value lines for the record.
  static DirLock acquire(const std::string& dir, const std::string& extra = "");

  DirLock(DirLock&& other) noexcept;
  DirLock& operator=(DirLock&& other) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  // Closes the descriptor, which releases the lock. A directory this job wrote nothing into (only the lock file in
  // it) is left as it was found: the lock file removed, and the directories acquire() created removed.
  ~DirLock();

  bool held() const { return static_cast<bool>(fd_); }
  const std::string& path() const { return path_; }      // <dir>/.lock, or "" when nothing is held
  const std::string& record() const { return record_; }  // what was written into it

 private:
  void leave_if_unused() noexcept;

  UniqueFd fd_;
  std::string dir_;
  std::string created_;  // the outermost directory acquire() created ("" if `dir` existed)
  std::string path_;
  std::string record_;
};

// The lock file's name inside a checkpoint directory.
inline constexpr const char* kDirLockFile = ".lock";

// Collective. Rank 0 acquires the lock on `dir` (nothing when `dir` is empty); then one rank of every other
// machine checks that it sees the same directory (rank 0's record in the lock file): a node-local ckpt.dir
// would commit checkpoints that lack the other machines' files. On any failure every rank throws the failing
// rank's error (kBadInput: exit 2), so a job stops as a whole instead of one rank exiting while the rest wait.
// Returns the held lock on rank 0 and an empty one elsewhere.
DirLock lock_checkpoint_dir(const std::string& dir, Communicator& comm);

// The same for node-local directories (ckpt.replicas = 1, node_local.h), where the check inverts: each node's leader
// (local rank 0) locks its own node_ckpt_dir(pattern, node), and a directory that two nodes share is refused, naming
// both (a replica in its source's directory protects nothing). Each record carries the job (rank 0's host, pid and
// start time) and the node, so a leader that finds its directory locked, or its record replaced, by another node of
// this job says so. First check_replica_layout (2 or more nodes, equal rank counts). Collective; on any failure every
// rank throws the failing leader's error. Returns the held lock on each node's leader and an empty one elsewhere.
DirLock lock_node_local_dirs(const std::string& pattern, Communicator& comm);

}  // namespace st
