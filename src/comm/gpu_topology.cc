#include "shardtrain/comm/gpu_topology.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdio>

#include "shardtrain/core/env.h"
#include "shardtrain/core/error.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include <cuda_runtime.h>
#include <dlfcn.h>
#endif

namespace st {
namespace {

#ifdef SHARDTRAIN_HAVE_CUDA
// The slice of NVML's C API used here (nvml.h is not in every CUDA toolkit install; the ABI is stable).
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
constexpr int kNvmlP2pCapsNvlink = 2;  // NVML_P2P_CAPS_INDEX_NVLINK
constexpr int kNvmlP2pStatusOk = 0;
constexpr unsigned kNvmlMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS

// libnvidia-ml.so.1 and the functions taken from it; null members when it or they are missing.
class Nvml {
 public:
  Nvml() {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib_) {
      const char* e = dlerror();
      status_ = str_cat("NVML not loaded (", e ? e : "libnvidia-ml.so.1 missing", ")");
      return;
    }
    bind(init, "nvmlInit_v2");
    bind(shutdown, "nvmlShutdown");
    bind(by_bus_id, "nvmlDeviceGetHandleByPciBusId_v2");
    bind(link_state, "nvmlDeviceGetNvLinkState");
    bind(remote_pci, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
    bind(p2p_status, "nvmlDeviceGetP2PStatus");
    bind(common_ancestor, "nvmlDeviceGetTopologyCommonAncestor");
    bind(pcie_gen, "nvmlDeviceGetCurrPcieLinkGeneration");
    bind(pcie_width, "nvmlDeviceGetCurrPcieLinkWidth");
    bind(pcie_max_gen, "nvmlDeviceGetMaxPcieLinkGeneration");
    bind(pcie_max_width, "nvmlDeviceGetMaxPcieLinkWidth");
    if (!init || !shutdown || !by_bus_id) {
      status_ = "NVML lacks nvmlInit_v2 or nvmlDeviceGetHandleByPciBusId_v2";
    } else if (init() != 0) {
      status_ = "nvmlInit_v2 failed";
    } else {
      initialised_ = true;
      status_ = "ok";
    }
  }
  ~Nvml() {
    if (initialised_) shutdown();
    if (lib_) dlclose(lib_);
  }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool ok() const { return initialised_; }
  const std::string& status() const { return status_; }

  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*by_bus_id)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*link_state)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*remote_pci)(nvmlDevice_t, unsigned, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*p2p_status)(nvmlDevice_t, nvmlDevice_t, int, int*) = nullptr;
  nvmlReturn_t (*common_ancestor)(nvmlDevice_t, nvmlDevice_t, int*) = nullptr;
  nvmlReturn_t (*pcie_gen)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*pcie_width)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*pcie_max_gen)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*pcie_max_width)(nvmlDevice_t, unsigned*) = nullptr;

 private:
  template <typename F>
  void bind(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(lib_, name));
  }
  void* lib_ = nullptr;
  bool initialised_ = false;
  std::string status_;
};

int query(nvmlReturn_t (*f)(nvmlDevice_t, unsigned*), nvmlDevice_t d) {
  unsigned v = 0;
  return f && f(d, &v) == 0 ? static_cast<int>(v) : 0;
}

// NVML's bus ids are "00000000:19:00.0"; CUDA's "0000:19:00.0": compare the last 12 characters, lower case.
std::string bus_key(const char* id) {
  std::string s(id);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s.size() > 12 ? s.substr(s.size() - 12) : s;
}

std::string pcie_level(int level) {
  switch (level) {
    case 0:
      return "BRD";  // NVML_TOPOLOGY_INTERNAL
    case 10:
      return "PIX";  // SINGLE
    case 20:
      return "PXB";  // MULTIPLE
    case 30:
      return "PHB";  // HOSTBRIDGE
    case 40:
      return "NODE";
    case 50:
      return "SYS";
  }
  return "?";
}

// NV<n> when NVML reports an NVLink path: n links to that GPU, or all of a's active links when they go to NVSwitch
// (as nvidia-smi prints NV18 on an HGX board). Otherwise the PCIe relation.
std::string pair_link(const Nvml& nvml, nvmlDevice_t a, nvmlDevice_t b, const std::string& b_bus) {
  int status = -1;
  if (nvml.p2p_status && nvml.p2p_status(a, b, kNvmlP2pCapsNvlink, &status) == 0 && status == kNvmlP2pStatusOk) {
    int direct = 0, active = 0;
    for (unsigned l = 0; l < kNvmlMaxLinks && nvml.link_state; ++l) {
      int on = 0;
      if (nvml.link_state(a, l, &on) != 0 || !on) continue;
      ++active;
      nvmlPciInfo_t remote{};
      if (nvml.remote_pci && nvml.remote_pci(a, l, &remote) == 0 && bus_key(remote.busId) == b_bus) ++direct;
    }
    return str_cat("NV", direct > 0 ? direct : active);
  }
  int level = -1;
  if (nvml.common_ancestor && nvml.common_ancestor(a, b, &level) == 0) return pcie_level(level);
  return "";
}
#endif

}  // namespace

GpuTopology discover_gpu_topology() {
  GpuTopology t;
#ifdef SHARDTRAIN_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
    cudaGetLastError();
    t.nvml = "no CUDA device";
    return t;
  }
  Nvml nvml;
  t.nvml = nvml.status();
  std::vector<nvmlDevice_t> handles(static_cast<size_t>(n), nullptr);
  for (int i = 0; i < n; ++i) {
    GpuInfo g;
    cudaDeviceProp p{};
    char bus[32] = "?";
    cudaGetDeviceProperties(&p, i);
    cudaDeviceGetPCIBusId(bus, sizeof(bus), i);
    g.name = p.name;
    g.bus_id = bus;
    nvmlDevice_t& h = handles[static_cast<size_t>(i)];
    if (nvml.ok() && nvml.by_bus_id(bus, &h) == 0) {
      g.pcie_gen = query(nvml.pcie_gen, h);
      g.pcie_width = query(nvml.pcie_width, h);
      g.pcie_max_gen = query(nvml.pcie_max_gen, h);
      g.pcie_max_width = query(nvml.pcie_max_width, h);
    } else {
      h = nullptr;
    }
    t.gpus.push_back(g);
  }
  t.link.assign(static_cast<size_t>(n), std::vector<std::string>(static_cast<size_t>(n)));
  t.peer.assign(static_cast<size_t>(n), std::vector<bool>(static_cast<size_t>(n), false));
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      std::string& l = t.link[static_cast<size_t>(a)][static_cast<size_t>(b)];
      if (a == b) {
        l = "X";
        continue;
      }
      int can = 0;
      cudaDeviceCanAccessPeer(&can, a, b);
      t.peer[static_cast<size_t>(a)][static_cast<size_t>(b)] = can != 0;
      const nvmlDevice_t ha = handles[static_cast<size_t>(a)], hb = handles[static_cast<size_t>(b)];
      if (ha && hb) l = pair_link(nvml, ha, hb, bus_key(t.gpus[static_cast<size_t>(b)].bus_id.c_str()));
    }
  }
  cudaGetLastError();
#else
  t.nvml = "built without CUDA";
#endif
  return t;
}

std::string format_gpu_topology(const GpuTopology& t, const std::string& host) {
  if (t.gpus.empty()) return str_cat("gpus on ", host, ": none visible (", t.nvml, ")\n");
  auto pcie = [](int gen, int width) { return gen > 0 ? str_cat("gen", gen, " x", width) : std::string("?"); };
  std::string out = str_cat("gpus on ", host, " (links from NVML: ", t.nvml, "):\n");
  char line[256];
  std::snprintf(line, sizeof(line), "  %-4s %-26s %-14s %s\n", "gpu", "name", "bus id", "pcie now / max");
  out += line;
  for (size_t i = 0; i < t.gpus.size(); ++i) {
    const GpuInfo& g = t.gpus[i];
    std::snprintf(line, sizeof(line), "  %-4zu %-26s %-14s %s / %s\n", i, g.name.c_str(), g.bus_id.c_str(),
                  pcie(g.pcie_gen, g.pcie_width).c_str(), pcie(g.pcie_max_gen, g.pcie_max_width).c_str());
    out += line;
  }
  out += "  links (NV<n> NVLinks, PIX/PXB one/several PCIe switches, PHB host bridge, NODE one NUMA node, SYS across "
         "sockets; +P: CUDA peer access):\n       ";
  for (size_t b = 0; b < t.gpus.size(); ++b) out += str_cat("  gpu", b, std::string(b < 10 ? 4 : 3, ' '));
  out += "\n";
  for (size_t a = 0; a < t.gpus.size(); ++a) {
    out += str_cat("  gpu", a, a < 10 ? " " : "");
    for (size_t b = 0; b < t.gpus.size(); ++b) {
      std::string cell = t.link[a][b].empty() ? std::string("?") : t.link[a][b];
      if (a != b && t.peer[a][b]) cell += "+P";
      std::snprintf(line, sizeof(line), "  %-8s", cell.c_str());
      out += line;
    }
    out += "\n";
  }
  return out;
}

std::string nccl_network_summary() {
  const std::string ifname = env_get("NCCL_SOCKET_IFNAME");
  const std::string ib = env_get("NCCL_IB_DISABLE");
  const std::string ib_note = ib.empty() ? std::string() : str_cat(", NCCL_IB_DISABLE=", ib);
  if (!ifname.empty()) return str_cat("NCCL_SOCKET_IFNAME=", ifname, " (set)", ib_note);
  // Interfaces that are up with an IPv4 or IPv6 address, each once, in getifaddrs order.
  std::vector<std::string> names, addrs;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (const ifaddrs* i = list; i; i = i->ifa_next) {
      if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
      const int family = i->ifa_addr->sa_family;
      if (family != AF_INET && family != AF_INET6) continue;
      if (std::find(names.begin(), names.end(), i->ifa_name) != names.end()) continue;
      char a[INET6_ADDRSTRLEN] = "";
      const void* src = family == AF_INET ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr)
                                          : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr);
      inet_ntop(family, src, a, sizeof(a));
      names.push_back(i->ifa_name);
      addrs.push_back(a);
    }
    freeifaddrs(list);
  }
  auto starts = [](const std::string& s, const char* p) { return s.rfind(p, 0) == 0; };
  std::string ordered;
  for (int pass = 0; pass < 2; ++pass) {  // ib* first, then the rest but lo and docker*
    for (size_t k = 0; k < names.size(); ++k) {
      const std::string& n = names[k];
      const bool take = pass == 0 ? starts(n, "ib") : !starts(n, "ib") && !starts(n, "lo") && !starts(n, "docker");
      if (take) ordered += str_cat(ordered.empty() ? "" : ", ", n, " (", addrs[k], ")");
    }
  }
  if (ordered.empty()) ordered = "none but lo/docker*: only this host can take part";
  return str_cat("NCCL_SOCKET_IFNAME unset: NCCL picks from ", ordered, ib_note,
                 "; set NCCL_SOCKET_IFNAME to the LAN's interface on every node (launch/mpirun.sh --iface)");
}

}  // namespace st
