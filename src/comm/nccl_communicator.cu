#include "shardtrain/comm/nccl_communicator.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "shardtrain/comm/watchdog.h"
#include "shardtrain/core/env.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/fault.h"
#include "shardtrain/core/log.h"

namespace st {
namespace detail {

void nccl_fail(const char* file, int line, const char* expr, ncclResult_t r, ncclComm_t comm) {
  // ncclGetLastError says which peer, transport or resource failed; the result code alone does not.
  const char* last = ncclGetLastError(comm);
  fail(ErrorKind::kFault, file, line, expr,
       str_cat("NCCL error ", static_cast<int>(r), " (", ncclGetErrorString(r), ")",
               last && *last ? str_cat(": ", last) : std::string()));
}

}  // namespace detail

template <>
ncclDataType_t nccl_type<float>() { return ncclFloat32; }
template <>
ncclDataType_t nccl_type<double>() { return ncclFloat64; }
template <>
ncclDataType_t nccl_type<bf16>() { return ncclBfloat16; }
template <>
ncclDataType_t nccl_type<fp16>() { return ncclFloat16; }
template <>
ncclDataType_t nccl_type<uint8_t>() { return ncclUint8; }

namespace {

// A 1 MiB copy from every GPU of this machine that reports peer access to `device`, with a pattern checked on
// arrival and a deadline: some machines (RTX 4090 boxes among them) report peer access the hardware cannot do,
// and NCCL then hangs. Returns the failures ("1->0 timed out", ...), empty when all worked; *checked counts
// the pairs that reported peer access.
std::string failed_peer_copies(int device, bool injected, int* checked) {
  *checked = 0;
  if (injected) return "injected by SHARDTRAIN_FAULT=p2p_broken";
  constexpr size_t kBytes = size_t{1} << 20;
  constexpr unsigned char kPattern = 0x5a;
  std::string failures;
  for (int peer = 0; peer < cuda_device_count(); ++peer) {
    int can = 0;
    if (peer == device || cudaDeviceCanAccessPeer(&can, device, peer) != cudaSuccess || !can) continue;
    ++*checked;
    void* src = nullptr;
    ST_CUDA_CHECK(cudaSetDevice(peer));
    ST_CUDA_CHECK(cudaMalloc(&src, kBytes));
    ST_CUDA_CHECK(cudaMemset(src, kPattern, kBytes));
    ST_CUDA_CHECK(cudaDeviceSynchronize());
    ST_CUDA_CHECK(cudaSetDevice(device));
    DeviceBuffer<unsigned char> dst(kBytes);
    CudaStream s;
    // On s, before the copy: a cudaMemset would run on the legacy default stream, which s does not wait for.
    zero_async(dst, kBytes, s.get());
    bool ok = cudaMemcpyPeerAsync(dst.data(), device, src, peer, kBytes, s.get()) == cudaSuccess;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    cudaError_t q = cudaErrorNotReady;
    while (ok && (q = cudaStreamQuery(s.get())) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::vector<unsigned char> host(4096, 0);
    if (ok && q == cudaSuccess) {
      ST_CUDA_CHECK(cudaMemcpy(host.data(), dst.data() + kBytes - host.size(), host.size(), cudaMemcpyDeviceToHost));
      ok = std::all_of(host.begin(), host.end(), [](unsigned char c) { return c == kPattern; });
      if (!ok) failures += str_cat(failures.empty() ? "" : ", ", peer, "->", device, " copied wrong bytes");
    } else {
      failures += str_cat(failures.empty() ? "" : ", ", peer, "->", device, q == cudaErrorNotReady ? " timed out" : " failed");
    }
    if (q != cudaErrorNotReady) {  // a copy still in flight keeps its buffers: leaking them beats a crash
      ST_CUDA_CHECK(cudaSetDevice(peer));
      cudaFree(src);
      ST_CUDA_CHECK(cudaSetDevice(device));
    } else {
      new DeviceBuffer<unsigned char>(std::move(dst));  // deliberately leaked, with src: the copy may still land
    }
  }
  cudaGetLastError();  // clear the (non-sticky) error a failed peer copy leaves
  return failures;
}

// Once per process, collectively over the first communicator's ranks (a machine's GPUs: every rank of it
// decides alike): unless NCCL_P2P_DISABLE is set, verify peer copies and fall back to NCCL_P2P_DISABLE=1.
void check_peer_access(Communicator& host, int device) {
  static bool done = false;
  if (done) return;
  done = true;
  if (!env_get("NCCL_P2P_DISABLE").empty()) {
    if (host.rank() == 0) ST_LOG_INFO("peer access: NCCL_P2P_DISABLE=", env_get("NCCL_P2P_DISABLE"), " (set by the user)");
    return;
  }
  int checked = 0;
  const std::string failures = failed_peer_copies(device, fault_injected("p2p_broken", host.rank(), -1), &checked);
  double counts[2] = {failures.empty() ? 0.0 : 1.0, static_cast<double>(checked)};
  host.all_reduce(counts, 2);
  const double bad = counts[0];
  if (!failures.empty()) ST_LOG_WARN("peer access: rank ", host.rank(), " on GPU ", device, ": ", failures);
  if (bad > 0) {
    setenv("NCCL_P2P_DISABLE", "1", 1);  // before ncclCommInitRank, on every rank alike
    if (host.rank() == 0)
      ST_LOG_WARN("peer access: GPU peer copies failed on ", bad, " rank(s); NCCL_P2P_DISABLE=1 for this run "
                  "(NCCL goes through shared memory or sockets instead of hanging)");
  } else if (host.rank() == 0 && counts[1] == 0) {
    ST_LOG_INFO("peer access: no GPU pair reports it (e.g. RTX 4090s): NCCL goes through shared memory or sockets");
  } else if (host.rank() == 0) {
    ST_LOG_INFO("peer access: ", counts[1], " GPU pair(s) report it, and each copied 1 MiB correctly");
  }
}

}  // namespace

NcclCommunicator::NcclCommunicator(Communicator& host) : rank_(host.rank()), world_(host.world_size()) {
  const int devices = cuda_device_count();
  if (devices == 0) ST_BAD_INPUT("train.device = cuda, but no CUDA device is visible to rank ", rank_);
  if (host.device_rank() >= devices)
    ST_BAD_INPUT("train.device = cuda: rank ", rank_, " is process ", host.device_rank() + 1,
                 " of its machine, which has ", devices, " visible CUDA device(s); start at most one rank per GPU");
  device_ = host.device_rank();
  ST_CUDA_CHECK(cudaSetDevice(device_));
  check_peer_access(host, device_);
  ncclUniqueId id{};
  if (rank_ == 0) ST_NCCL_CHECK(ncclGetUniqueId(&id));
  host.broadcast(&id, sizeof(id), 0);
  ST_NCCL_CHECK(ncclCommInitRank(&comm_, world_, id, rank_));
  ST_LOG_DEBUG("nccl: rank ", rank_, "/", world_, " on device ", device_, " (", cuda_device_name(), ")");
  attach_watchdog(host);
}

bool nccl_has_copy_engine_collectives() {
  int version = 0;
  return ncclGetVersion(&version) == ncclSuccess && version >= 22800;
}

NcclCommunicator::NcclCommunicator(NcclCommunicator& parent, Communicator& host, int color, int key,
                                   const NcclSplitOptions& options)
    : rank_(host.rank()), world_(host.world_size()), device_(parent.device_) {
  parent.check_usable();
  ST_CHECK(options.max_ctas >= 0, "max_ctas ", options.max_ctas);
  ST_CUDA_CHECK(cudaSetDevice(device_));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  if (options.max_ctas > 0) config.maxCTAs = options.max_ctas;
  if (options.zero_cta) config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
  const bool configured = options.max_ctas > 0 || options.zero_cta;
  ST_NCCL_CHECK_COMM(ncclCommSplit(parent.comm_, color, key, &comm_, configured ? &config : nullptr), parent.comm_);
  int rank = -1, count = -1;
  ST_NCCL_CHECK_COMM(ncclCommUserRank(comm_, &rank), comm_);
  ST_NCCL_CHECK_COMM(ncclCommCount(comm_, &count), comm_);
  ST_CHECK(rank == rank_ && count == world_, "ncclCommSplit(color ", color, ", key ", key, ") gave rank ", rank, " of ",
           count, ", but the host group '", host.name(), "' has rank ", rank_, " of ", world_);
  ST_LOG_DEBUG("nccl: split '", host.name(), "': rank ", rank_, "/", world_, " on device ", device_,
               options.max_ctas > 0 ? str_cat(", at most ", options.max_ctas, " CTAs") : std::string(),
               options.zero_cta ? ", zero-CTA policy" : "");
  attach_watchdog(host);
}

void NcclCommunicator::attach_watchdog(Communicator& host) {
  watchdog_ = host.watchdog();
  if (watchdog_ && watchdog_->enabled()) {
    channel_ = watchdog_->channel("nccl " + host.name());
    // From the watchdog's thread, while this rank's stream is stuck in a collective: ncclCommAbort is the one
    // NCCL call made for that. The process ends right after (the expiry action), so comm_ is left as it is.
    abort_hook_ = watchdog_->add_abort_hook([this] {
      aborted_by_watchdog_ = true;
      ncclCommAbort(comm_);
    });
  }
}

NcclCommunicator::~NcclCommunicator() {
  if (abort_hook_ >= 0) watchdog_->remove_abort_hook(abort_hook_);
  if (aborted_by_watchdog_) return;   // the process ends next; a window may still be in use by the aborted NCCL
  if (comm_) ncclCommDestroy(comm_);  // releases the windows
  for (void* p : windows_) ncclMemFree(p);
}

void* NcclCommunicator::window_alloc(size_t bytes) {
  check_usable();
  ST_CHECK(bytes > 0, "window of 0 bytes");
  ST_CUDA_CHECK(cudaSetDevice(device_));
  void* p = nullptr;
  ST_NCCL_CHECK_COMM(ncclMemAlloc(&p, bytes), comm_);
  windows_.push_back(p);  // freed with the communicator, also if the registration below throws
  ncclWindow_t window = nullptr;
  ST_NCCL_CHECK_COMM(ncclCommWindowRegister(comm_, p, bytes, &window, NCCL_WIN_COLL_SYMMETRIC), comm_);
  return p;
}

void NcclCommunicator::watch(const char* op, int64_t count, cudaStream_t stream) {
  if (channel_ < 0) return;
  auto done = std::make_shared<CudaEvent>();
  done->record(stream);
  const int device = device_;
  watchdog_->begin_async(channel_, op, count, [done, device] {
    cudaSetDevice(device);  // the watchdog's thread
    return cudaEventQuery(done->get()) != cudaErrorNotReady;  // an error surfaces on the trainer's thread
  });
}

void NcclCommunicator::abort(const std::string& reason) {
  if (comm_) ncclCommAbort(comm_);
  comm_ = nullptr;
  aborted_ = reason.empty() ? "aborted" : reason;
}

void NcclCommunicator::check_usable() const {
  if (!comm_) ST_FAULT("NCCL communicator of rank ", rank_, " was aborted: ", aborted_);
}

template <typename T>
void NcclCommunicator::all_gather(const T* send, int64_t count, T* recv, cudaStream_t stream) {
  check_usable();
  ST_CHECK(count >= 0, "all_gather count ", count);
  ST_NCCL_CHECK_COMM(ncclAllGather(send, recv, static_cast<size_t>(count), nccl_type<T>(), comm_, stream), comm_);
  watch("all_gather", count, stream);
}

template <typename T>
void NcclCommunicator::reduce_scatter(const T* send, int64_t count, T* recv, cudaStream_t stream) {
  check_usable();
  ST_CHECK(count >= 0, "reduce_scatter count ", count);
  ST_NCCL_CHECK_COMM(
      ncclReduceScatter(send, recv, static_cast<size_t>(count), nccl_type<T>(), ncclSum, comm_, stream), comm_);
  watch("reduce_scatter", count, stream);
}

template <typename T>
void NcclCommunicator::all_to_all(const T* send, int64_t count, T* recv, cudaStream_t stream) {
  check_usable();
  ST_CHECK(count >= 0, "all_to_all count ", count);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
  ST_NCCL_CHECK_COMM(ncclAlltoAll(send, recv, static_cast<size_t>(count), nccl_type<T>(), comm_, stream), comm_);
  watch("all_to_all", count, stream);
#else
  (void)send, (void)recv, (void)stream;
  ST_FAULT("all_to_all needs NCCL 2.28 or newer; this build's nccl.h is ", NCCL_VERSION_CODE);
#endif
}

template <typename T>
void NcclCommunicator::all_reduce(T* buf, int64_t count, cudaStream_t stream) {
  check_usable();
  ST_CHECK(count >= 0, "all_reduce count ", count);
  ST_NCCL_CHECK_COMM(ncclAllReduce(buf, buf, static_cast<size_t>(count), nccl_type<T>(), ncclSum, comm_, stream),
                     comm_);
  watch("all_reduce", count, stream);
}

#define ST_NCCL_INSTANTIATE(T)                                                            \
  template void NcclCommunicator::all_gather<T>(const T*, int64_t, T*, cudaStream_t);     \
  template void NcclCommunicator::reduce_scatter<T>(const T*, int64_t, T*, cudaStream_t); \
  template void NcclCommunicator::all_reduce<T>(T*, int64_t, cudaStream_t);               \
  template void NcclCommunicator::all_to_all<T>(const T*, int64_t, T*, cudaStream_t);
ST_NCCL_INSTANTIATE(float)
ST_NCCL_INSTANTIATE(double)
ST_NCCL_INSTANTIATE(bf16)
ST_NCCL_INSTANTIATE(fp16)
// Bytes: an NF4 base's storage (model/nf4_base.h) is gathered as it is stored.
template void NcclCommunicator::all_gather<uint8_t>(const uint8_t*, int64_t, uint8_t*, cudaStream_t);

}  // namespace st
