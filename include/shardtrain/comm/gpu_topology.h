// What a machine's GPUs and network look like to NCCL: the table `shardtrain topo` prints and `train` logs at start
// on cuda, in the manner of `nvidia-smi topo -m`.
//
// Per GPU: name, PCI bus id, PCIe generation and width (current and maximum). Per pair: the link, in nvidia-smi's
// legend (NV<n>: n NVLinks, directly or through NVSwitch; PIX: one PCIe switch; PXB: several; PHB: a host bridge;
// NODE: host bridges of one NUMA node; SYS: across sockets; BRD: one board), and whether CUDA reports peer access.
// NVML is loaded at run time (dlopen libnvidia-ml.so.1, part of the driver): a machine without it still gets the
// CUDA half, and `nvml` says why the links are missing. A build without CUDA, or a machine without GPUs, finds none.
//
//   std::puts(format_gpu_topology(discover_gpu_topology(), "box-a").c_str());
#pragma once

#include <string>
#include <vector>

namespace st {

struct GpuInfo {
  std::string name, bus_id;
  int pcie_gen = 0, pcie_width = 0, pcie_max_gen = 0, pcie_max_width = 0;  // 0: unknown
};

struct GpuTopology {
  std::vector<GpuInfo> gpus;
  std::vector<std::vector<std::string>> link;  // [a][b], "X" on the diagonal; "" when unknown
  std::vector<std::vector<bool>> peer;         // cudaDeviceCanAccessPeer(a, b)
  std::string nvml = "not loaded";             // "ok", or why the links are unknown
};

// The GPUs this process can see. Never throws for a missing driver or NVML; the result says what is missing.
GpuTopology discover_gpu_topology();

// The table, one line per GPU and a link matrix; "no GPUs visible" when there are none.
std::string format_gpu_topology(const GpuTopology& t, const std::string& host);

// The network NCCL will use between nodes: NCCL_SOCKET_IFNAME (and NCCL_IB_DISABLE) when set, else the interfaces
// that are up, in the order NCCL's default considers them (InfiniBand ib* first; lo and docker* skipped).
std::string nccl_network_summary();

}  // namespace st
