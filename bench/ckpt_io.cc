// Checkpoint save and load speed per rank, through the real commit protocol and resume path.
//
//   mpirun -np N bench_ckpt_io --config configs/gpt2-124m.ini --dir /tmp/ckpt [--iters 3] [--section.key=value ...]
// Prints, from rank 0: median save and load seconds, per-rank GB/s (this rank's file bytes / time), and
// the checkpoint's size on disk. Beside each load it times the two halves of it on this rank's own file: the
// SHA-256 pass alone (sha256_file) and the reads alone (ShardFileReader hyperslabs of this rank's spans, no
// hash), so that the cost of verifying on load is measured, not estimated.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/ckpt/shard_file.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/comm/launcher.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/stats.h"
#include "shardtrain/shard/sharded_model.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  std::optional<st::MpiSession> mpi;
  try {
    const std::unique_ptr<st::Communicator> comm = st::join_world(&argc, &argv, st::WorldOptions{}, &mpi);
    std::optional<std::string> config;
    std::string dir;
    int iters = 3;
    std::vector<std::string> overrides;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--config" && i + 1 < argc) {
        config = argv[++i];
      } else if (a == "--dir" && i + 1 < argc) {
        dir = argv[++i];
      } else if (a == "--iters" && i + 1 < argc) {
        iters = std::stoi(argv[++i]);
      } else {
        overrides.push_back(a);
      }
    }
    if (dir.empty()) ST_BAD_INPUT("bench_ckpt_io needs --dir");
    overrides.push_back("--ckpt.dir=" + dir);
    overrides.push_back("--ckpt.keep=1");
    overrides.push_back("--train.micro_batch=1");
    const st::Config cfg = st::load_config(config, overrides);
    st::ShardedModel model(cfg, *comm);
    std::vector<double> save_s, load_s, hash_s, read_s;
    char name[32];
    std::snprintf(name, sizeof(name), "rank_%05d.h5", comm->rank());
    auto seconds_since = [](std::chrono::steady_clock::time_point t0) {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    std::string where;
    for (int it = 0; it < iters; ++it) {
      st::CheckpointState cs;
      cs.step = it + 1;
      comm->barrier();
      auto t0 = std::chrono::steady_clock::now();
      where = st::save_checkpoint(cfg, model, cs, *comm);
      save_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      comm->barrier();
      t0 = std::chrono::steady_clock::now();
      st::load_checkpoint(where, cfg, model, *comm);
      load_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      // The halves of the load on this rank's own file (the load above read the same file, written by the same
      // world size): the hash pass, then the reads without it.
      const std::string mine = (fs::path(where) / name).string();
      comm->barrier();
      t0 = std::chrono::steady_clock::now();
      st::sha256_file(mine);
      hash_s.push_back(seconds_since(t0));
      comm->barrier();
      t0 = std::chrono::steady_clock::now();
      {
        const st::ShardFileReader f(mine);
        for (const st::UnitLayout& u : model.units()) {
          st::UnitShard& sh = model.shard(u.index);
          f.read(u.name, st::ShardState::kParam, sh.span, sh.param.data());
          f.read(u.name, st::ShardState::kExpAvg, sh.span, sh.m.data());
          f.read(u.name, st::ShardState::kExpAvgSq, sh.span, sh.v.data());
        }
      }
      read_s.push_back(seconds_since(t0));
    }
    const double my_bytes = static_cast<double>(fs::file_size(fs::path(where) / name));
    double total = 0;
    for (const auto& e : fs::directory_iterator(where)) total += static_cast<double>(e.file_size());
    if (comm->rank() == 0) {
      const double s = st::median(save_s), l = st::median(load_s);
      std::printf("ckpt_io world=%d params_file_bytes_rank0=%.0f size_on_disk_GB=%.3f median_save_s=%.3f "
                  "save_GBps_per_rank=%.2f median_load_s=%.3f load_GBps_per_rank=%.2f\n",
                  comm->world_size(), my_bytes, total / 1e9, s, my_bytes / s / 1e9, l, my_bytes / l / 1e9);
      std::printf("ckpt_io load_halves median_hash_s=%.3f hash_GBps=%.2f median_read_without_hash_s=%.3f\n",
                  st::median(hash_s), my_bytes / st::median(hash_s) / 1e9, st::median(read_s));
    }
    return 0;
  } catch (const st::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return st::fail_world(mpi, e.kind());
  }
}
