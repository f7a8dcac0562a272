// NcclCommunicator: the device-side collectives of the CUDA backend, on a caller-given stream.
//
// Bootstrap: rank 0 of the host communicator (MPI, or any Communicator) creates the NCCL unique id and
// broadcasts it through that communicator; then every rank binds its local_rank()-th GPU and calls
// ncclCommInitRank. Groups (hybrid sharding's node and replica communicators) are split from a world one with
// ncclCommSplit. The host communicator stays in use for host-side scalars (loss, norm, checkpoint
// control); this one moves device buffers only.
//
//   MpiCommunicator host(...);
//   NcclCommunicator nccl(host);                     // collective; selects this rank's GPU
//   nccl.all_gather(shard, count, full, stream);     // enqueued on `stream`, returns at once
//
// Errors: every NCCL call goes through ST_NCCL_CHECK, whose message carries ncclGetErrorString and
// ncclGetLastError (the library's own explanation) and is a kFault (retry from the last checkpoint).
// abort() tears the communicator down without waiting for peers (a dead or hung rank).
//
// Watchdog: when `host` has one (host.watchdog(), watched_communicator.h), every collective is reported to it on
// a channel "nccl <host name>" with a CUDA event recorded after it, and ncclCommAbort is registered as its abort
// hook: a collective a peer never joins ends the job after dist.timeout_s instead of hanging the stream.
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/cuda.h"

namespace st {
namespace detail {
[[noreturn]] void nccl_fail(const char* file, int line, const char* expr, ncclResult_t r, ncclComm_t comm);
}  // namespace detail
}  // namespace st

#define ST_NCCL_CHECK_COMM(expr, comm)                                                             \
  do {                                                                                             \
    const ncclResult_t st_r_ = (expr);                                                             \
    if (st_r_ != ncclSuccess) ::st::detail::nccl_fail(__FILE__, __LINE__, #expr, st_r_, (comm));  \
  } while (0)
#define ST_NCCL_CHECK(expr) ST_NCCL_CHECK_COMM(expr, nullptr)

namespace st {

// Maps a buffer element type to NCCL's.
template <typename T>
ncclDataType_t nccl_type();

// How a split communicator's collectives may use the GPU (ncclConfig_t). Default: as its parent.
struct NcclSplitOptions {
  int max_ctas = 0;       // > 0: at most this many CTAs (SMs) per collective
  bool zero_cta = false;  // NCCL_CTA_POLICY_ZERO: all-gathers between symmetric windows (window_alloc) run on the
                          // copy engines, with no CTA at all; other collectives as before
};

// The linked NCCL (ncclGetVersion, e.g. 22803 for 2.28.3) offers copy-engine all-gathers: 2.28 or newer.
bool nccl_has_copy_engine_collectives();

class NcclCommunicator {
 public:
  // Collective over `host`. Binds this process to GPU host.device_rank() (its shared-memory local rank);
  // throws kBadInput if the machine runs more ranks than it has visible GPUs. `host` may be a sub-communicator
  // (hybrid sharding's node and replica groups): its rank 0 creates the unique id.
  explicit NcclCommunicator(Communicator& host);
  // A sub-communicator of `parent` by ncclCommSplit (no new bootstrap, no second peer check): the ranks of `parent`
  // with this `color`, ordered by `key`. `host` is the matching host sub-communicator (Communicator::split with the
  // same color and key), whose rank and size it must have; it names the watchdog channel. Collective over `parent`.
  NcclCommunicator(NcclCommunicator& parent, Communicator& host, int color, int key,
                   const NcclSplitOptions& options = {});
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  int device() const { return device_; }

  // Same contracts as Communicator (communicator.h), on device buffers, asynchronous on `stream`.
  template <typename T>
  void all_gather(const T* send, int64_t count, T* recv, cudaStream_t stream);
  template <typename T>
  void reduce_scatter(const T* send, int64_t count, T* recv, cudaStream_t stream);
  template <typename T>
  void all_reduce(T* buf, int64_t count, cudaStream_t stream);
  // send [world][count] -> recv [world][count]: slice r of each rank's send goes to rank r, and rank q's slice for
  // this rank lands at recv + q * count (ncclAlltoAll, NCCL 2.28+; with the zero-CTA policy and both buffers in
  // symmetric windows, on the copy engines). Throws kFault when built against an older NCCL.
  template <typename T>
  void all_to_all(const T* send, int64_t count, T* recv, cudaStream_t stream);

  // Aborts outstanding operations and frees the communicator without a handshake with peers. Later
  // calls throw kFault naming `reason`.
  void abort(const std::string& reason);

  // `bytes` of device memory (ncclMemAlloc), registered as a symmetric window of this communicator
  // (NCCL_WIN_COLL_SYMMETRIC). Collective: every rank asks for the same sizes in the same order, so a buffer at one
  // offset of its window on one rank is at that offset on all. The communicator owns the memory: it is freed after
  // ncclCommDestroy, which releases the window.
  void* window_alloc(size_t bytes);

 private:
  void check_usable() const;
  // The watchdog channel and abort hook, when `host` has a watchdog.
  void attach_watchdog(Communicator& host);
  // Reports the collective just enqueued on `stream` to the watchdog (no-op without one).
  void watch(const char* op, int64_t count, cudaStream_t stream);

  ncclComm_t comm_ = nullptr;
  Watchdog* watchdog_ = nullptr;
  int channel_ = -1, abort_hook_ = -1;
  std::atomic<bool> aborted_by_watchdog_{false};
  int rank_ = 0, world_ = 1, device_ = 0;
  std::string aborted_;         // the reason, once aborted
  std::vector<void*> windows_;  // window_alloc's memory, freed after the communicator
};

}  // namespace st
