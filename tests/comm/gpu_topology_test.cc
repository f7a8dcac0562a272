#include "shardtrain/comm/gpu_topology.h"

#include <gtest/gtest.h>

#include "env_guard.h"

namespace st {
namespace {

// Two H200s on NVSwitch and a PCIe-only pair, as NVML would describe them.
GpuTopology three_gpus() {
  GpuTopology t;
  t.nvml = "ok";
  t.gpus = {{"NVIDIA H200", "0000:19:00.0", 5, 16, 5, 16},
            {"NVIDIA H200", "0000:3B:00.0", 5, 16, 5, 16},
            {"NVIDIA GeForce RTX 4090", "0000:81:00.0", 4, 8, 4, 16}};
  t.link = {{"X", "NV18", "SYS"}, {"NV18", "X", "SYS"}, {"SYS", "SYS", "X"}};
  t.peer = {{false, true, false}, {true, false, false}, {false, false, false}};
  return t;
}

TEST(GpuTopology, FormatsOneLinePerGpuAndTheLinkMatrix) {
  const std::string s = format_gpu_topology(three_gpus(), "box-a");
  EXPECT_EQ(s,
            "gpus on box-a (links from NVML: ok):\n"
            "  gpu  name                       bus id         pcie now / max\n"
            "  0    NVIDIA H200                0000:19:00.0   gen5 x16 / gen5 x16\n"
            "  1    NVIDIA H200                0000:3B:00.0   gen5 x16 / gen5 x16\n"
            "  2    NVIDIA GeForce RTX 4090    0000:81:00.0   gen4 x8 / gen4 x16\n"
            "  links (NV<n> NVLinks, PIX/PXB one/several PCIe switches, PHB host bridge, NODE one NUMA node, SYS "
            "across sockets; +P: CUDA peer access):\n"
            "         gpu0      gpu1      gpu2    \n"
            "  gpu0   X         NV18+P    SYS     \n"
            "  gpu1   NV18+P    X         SYS     \n"
            "  gpu2   SYS       SYS       X       \n");
}

TEST(GpuTopology, UnknownLinksAndPcieShowAsQuestionMarks) {
  GpuTopology t = three_gpus();
  t.nvml = "NVML not loaded (libnvidia-ml.so.1: cannot open shared object file)";
  t.gpus[2].pcie_gen = 0;
  t.link[0][2] = "";
  const std::string s = format_gpu_topology(t, "h");
  EXPECT_NE(s.find("(links from NVML: NVML not loaded (libnvidia-ml.so.1: cannot open shared object file)):"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("0000:81:00.0   ? / gen4 x16"), std::string::npos) << s;
  EXPECT_NE(s.find("  gpu0   X         NV18+P    ?       \n"), std::string::npos) << s;
}

TEST(GpuTopology, NoGpusSaysWhy) {
  GpuTopology t;
  t.nvml = "built without CUDA";
  EXPECT_EQ(format_gpu_topology(t, "ci"), "gpus on ci: none visible (built without CUDA)\n");
}

TEST(NcclNetworkSummary, ASetInterfaceIsReportedAsSet) {
  testing::EnvGuard env;
  env.set("NCCL_SOCKET_IFNAME", "enp5s0");
  env.set("NCCL_IB_DISABLE", "1");
  EXPECT_EQ(nccl_network_summary(), "NCCL_SOCKET_IFNAME=enp5s0 (set), NCCL_IB_DISABLE=1");
}

TEST(NcclNetworkSummary, UnsetListsTheCandidatesWithoutLoopback) {
  testing::EnvGuard env;
  env.clear("NCCL_SOCKET_IFNAME");
  env.clear("NCCL_IB_DISABLE");
  const std::string s = nccl_network_summary();
  EXPECT_EQ(s.rfind("NCCL_SOCKET_IFNAME unset: NCCL picks from ", 0), 0u) << s;
  EXPECT_EQ(s.find("lo ("), std::string::npos) << s;
  EXPECT_NE(s.find("set NCCL_SOCKET_IFNAME to the LAN's interface on every node"), std::string::npos) << s;
}

}  // namespace
}  // namespace st
