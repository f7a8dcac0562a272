#include "shardtrain/comm/nccl_communicator.h"

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

NcclCommunicator::NcclCommunicator(Communicator& host) : rank_(host.rank()), world_(host.world_size()) {
  const int devices = cuda_device_count();
  if (devices == 0) ST_BAD_INPUT("train.device = cuda, but no CUDA device is visible to rank ", rank_);
  if (host.device_rank() >= devices)
    ST_BAD_INPUT("train.device = cuda: rank ", rank_, " is process ", host.device_rank() + 1,
                 " of its machine, which has ", devices, " visible CUDA device(s); start at most one rank per GPU");
  device_ = host.device_rank();
  ST_CUDA_CHECK(cudaSetDevice(device_));
  ncclUniqueId id{};
  if (rank_ == 0) ST_NCCL_CHECK(ncclGetUniqueId(&id));
  host.broadcast(&id, sizeof(id), 0);
  ST_NCCL_CHECK(ncclCommInitRank(&comm_, world_, id, rank_));
  ST_LOG_DEBUG("nccl: rank ", rank_, "/", world_, " on device ", device_, " (", cuda_device_name(), ")");
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_) ncclCommDestroy(comm_);
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
}

template <typename T>
void NcclCommunicator::reduce_scatter(const T* send, int64_t count, T* recv, cudaStream_t stream) {
  check_usable();
  ST_CHECK(count >= 0, "reduce_scatter count ", count);
  ST_NCCL_CHECK_COMM(
      ncclReduceScatter(send, recv, static_cast<size_t>(count), nccl_type<T>(), ncclSum, comm_, stream), comm_);
}

template <typename T>
void NcclCommunicator::all_reduce(T* buf, int64_t count, cudaStream_t stream) {
  check_usable();
  ST_CHECK(count >= 0, "all_reduce count ", count);
  ST_NCCL_CHECK_COMM(ncclAllReduce(buf, buf, static_cast<size_t>(count), nccl_type<T>(), ncclSum, comm_, stream),
                     comm_);
}

#define ST_NCCL_INSTANTIATE(T)                                                                  \
  template void NcclCommunicator::all_gather<T>(const T*, int64_t, T*, cudaStream_t);         \
  template void NcclCommunicator::reduce_scatter<T>(const T*, int64_t, T*, cudaStream_t);     \
  template void NcclCommunicator::all_reduce<T>(T*, int64_t, cudaStream_t);
ST_NCCL_INSTANTIATE(float)
ST_NCCL_INSTANTIATE(double)
ST_NCCL_INSTANTIATE(bf16)
ST_NCCL_INSTANTIATE(fp16)

}  // namespace st
