// A kernel timeline for any CUDA program, with no change to it and no Nsight Systems (the GPU machine has no
// nsys): CUDA loads this library through its injection hook, and CUPTI's activity API records every kernel,
// memcpy and memset with its device start and end, its stream, and (for copies) its bytes.
//
//   CUDA_INJECTION64_PATH=build/libst_kernel_trace.so ST_KERNEL_TRACE=trace.csv build/shardtrain train ...
//   python3 bench/kernel_trace_report.py trace.csv
//
// Under mpirun each rank writes its own file: "%r" in ST_KERNEL_TRACE becomes OMPI_COMM_WORLD_RANK. The records are
// CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, which keeps kernels concurrent (the plain KERNEL kind serialises them), so
// the timeline is the program's own; CUPTI adds a little host time per launch.
//
// With ST_KERNEL_TRACE_API=1 it also records every CUDA runtime and driver API call (kind "api", the host's start
// and end, the thread in the stream column, the call's name): a device operation and the call that issued it share
// a correlation id, so the report can tell a gap the host left (the launch came after the device ran dry) from one
// the device left. It costs more host time per call than the device records alone.
//
// CSV columns: kind (kernel, memcpy, memset, api), start_ns, end_ns, device, stream, bytes, correlation, name.
// Timestamps are CUPTI's (nanoseconds, one clock for the host and every device of the process).
#include <cupti.h>
#include <cxxabi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace {

std::mutex g_mutex;
FILE* g_out = nullptr;

constexpr size_t kBufferBytes = size_t{8} << 20;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "kernel_trace: %s failed: %s\n", what, msg ? msg : "unknown CUPTI error");
}

std::string trace_path() {
  const char* p = std::getenv("ST_KERNEL_TRACE");
  std::string path = p && *p ? p : "kernel_trace.csv";
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const size_t at = path.find("%r");
  if (at != std::string::npos) path.replace(at, 2, rank ? rank : "0");
  return path;
}

// A kernel's readable name: CUPTI gives the mangled one.
std::string demangled(const char* name) {
  if (!name) return "";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d ? d : name;
  std::free(d);
  return out;
}

// Kernel names can hold commas (template arguments): quote them.
void write_row(const char* kind, uint64_t start, uint64_t end, uint32_t device, uint32_t stream, uint64_t bytes,
               uint32_t correlation, const char* name) {
  std::fprintf(g_out, "%s,%llu,%llu,%u,%u,%llu,%u,\"", kind, static_cast<unsigned long long>(start),
               static_cast<unsigned long long>(end), device, stream, static_cast<unsigned long long>(bytes),
               correlation);
  for (const char* c = name ? name : ""; *c; ++c) std::fputc(*c == '"' ? '\'' : *c, g_out);
  std::fputs("\"\n", g_out);
}

const char* copy_kind(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "peer";
    default:
      return "other";
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mutex);
  CUpti_Activity* record = nullptr;
  while (g_out && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        write_row("kernel", k->start, k->end, k->deviceId, k->streamId, 0, k->correlationId,
                  demangled(k->name).c_str());
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        write_row("memcpy", m->start, m->end, m->deviceId, m->streamId, m->bytes, m->correlationId,
                  copy_kind(m->copyKind));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY2: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpyPtoP4*>(record);
        write_row("memcpy", m->start, m->end, m->deviceId, m->streamId, m->bytes, m->correlationId, "peer");
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        write_row("memset", m->start, m->end, m->deviceId, m->streamId, m->bytes, m->correlationId, "");
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
        const char* name = nullptr;
        cuptiGetCallbackName(
            record->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API,
            a->cbid, &name);
        write_row("api", a->start, a->end, 0, a->threadId, 0, a->correlationId, name ? name : "");
        break;
      }
      default:
        break;
    }
  }
  std::free(buffer);
}

void finish() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_out) std::fclose(g_out);
  g_out = nullptr;
}

}  // namespace

// CUDA calls this once, at its initialisation, in a library named by CUDA_INJECTION64_PATH.
extern "C" int InitializeInjection(void) {
  const std::string path = trace_path();
  g_out = std::fopen(path.c_str(), "w");
  if (!g_out) {
    std::fprintf(stderr, "kernel_trace: cannot write %s\n", path.c_str());
    return 0;
  }
  std::fputs("kind,start_ns,end_ns,device,stream,bytes,correlation,name\n", g_out);
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernels");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable memcpy");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY2), "enable peer memcpy");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enable memset");
  const char* api = std::getenv("ST_KERNEL_TRACE_API");
  if (api && std::string(api) == "1") {
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME), "enable runtime API");
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER), "enable driver API");
  }
  std::atexit(finish);
  return 1;
}
