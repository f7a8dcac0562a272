// Checkpoint save and load speed per rank, through the real commit protocol and resume path, beside what the
// disk does on its own with the same number of bytes.
//
//   mpirun -np N bench_ckpt_io --config configs/gpt2-124m.ini --dir /tmp/ckpt [--iters 3] [--section.key=value ...]
//
// Each iteration times, on every rank at once (a barrier before each part):
//   save     save_checkpoint: the rank file written and hashed, the manifest, the rename;
//   load     load_checkpoint of that checkpoint: every check of open_rank_file, the file read once (RankFileLoad);
//   pass     the load's pass over this rank's own file without the copies: file_digest alone;
//   read     this rank's file read from the disk the way dd reads it (`dd bs=64M of=/dev/null`: 64 MiB read()s into
//            one buffer), and again with O_DIRECT (`iflag=direct`), the faster of the two being what the disk gives a
//            plain reader (load_over_best_plain_read);
//   writer   write_shard_file alone of this rank's state into --dir;
//   plain    the writer's byte count written as `dd bs=64M conv=fsync` does: open O_WRONLY|O_CREAT|O_TRUNC, 64 MiB
//            write()s from one buffer, fsync, close;
//   direct   the same with O_DIRECT (`dd bs=64M oflag=direct`, its last partial block without O_DIRECT as dd does,
//            then fsync); skipped, and said so, where the file system refuses O_DIRECT (tmpfs).
// Then, once, the digest's speed from memory over 256 MiB of varied bytes: SHA-256 of the whole (one stream, one
// core) and the checkpoint digest (16 MiB pieces on four threads), the ceiling each puts on a writer that hashes.
// Before the load and before the pass, this rank's file is dropped from the page cache (fdatasync, then
// posix_fadvise DONTNEED, which drops clean pages without root), and the share of its pages still resident is
// measured with mincore and printed: 0% means the part read the disk, 100% that it read memory.
// The AdamW moments, zero in a fresh model, are filled with varied floats first, as a trained model's are, and the
// plain writes' buffer holds varied bytes, so that a storage layer that compresses zeros flatters neither side.
//
// Prints, from rank 0: medians over --iters of each part's seconds and per-rank GB/s (this rank's file bytes /
// time), the writer's GB/s over the faster plain write's (writer_over_best_plain), the load's GB/s over the save's
// (load_speed_over_save), and the checkpoint's size on disk.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/digest.h"
#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/ckpt/shard_file.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/comm/launcher.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/elapsed.h"
#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/stats.h"
#include "shardtrain/core/unique_fd.h"
#include "shardtrain/shard/sharded_model.h"

namespace fs = std::filesystem;

namespace {

constexpr size_t kPlainBlock = size_t{64} << 20;  // dd bs=64M
constexpr size_t kDirectAlign = 4096;

// Drops the file's pages from the page cache: fdatasync makes them clean, DONTNEED then drops clean pages.
void drop_from_page_cache(const std::string& path) {
  const st::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) ST_FAULT("cannot open ", path, ": ", st::errno_text());
  ::fdatasync(fd.get());
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
}

// The share of the file's pages in the page cache, in percent (mincore of a read-only mapping).
double percent_in_page_cache(const std::string& path) {
  const st::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) ST_FAULT("cannot open ", path, ": ", st::errno_text());
  struct stat st {};
  ::fstat(fd.get(), &st);
  const size_t size = static_cast<size_t>(st.st_size);
  double out = 0;
  if (size > 0) {
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
    if (map == MAP_FAILED) ST_FAULT("cannot map ", path, ": ", st::errno_text());
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE)), pages = (size + page - 1) / page;
    std::vector<unsigned char> resident(pages);
    if (::mincore(map, size, resident.data()) != 0) ST_FAULT("mincore of ", path, ": ", st::errno_text());
    ::munmap(map, size);
    size_t in = 0;
    for (unsigned char r : resident) in += r & 1;
    out = 100.0 * static_cast<double>(in) / static_cast<double>(pages);
  }
  return out;
}

void write_all(int fd, const char* buf, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, buf, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) ST_FAULT("cannot write ", path, ": ", w < 0 ? st::errno_text() : "no progress");
    buf += w;
    n -= static_cast<size_t>(w);
  }
}

// `bytes` bytes to a new file the way dd writes them: 64 MiB write()s of `buf`, fsync, close. Returns the
// seconds, or nothing where O_DIRECT was asked for and the file system refuses it.
std::optional<double> plain_write(const std::string& path, int64_t bytes, const char* buf, bool direct) {
  fs::remove(path);
  const auto t0 = std::chrono::steady_clock::now();
  st::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (direct ? O_DIRECT : 0), 0644));
  if (!fd && direct && errno == EINVAL) return std::nullopt;
  if (!fd) ST_FAULT("cannot create ", path, ": ", st::errno_text());
  // O_DIRECT takes whole blocks only: the last partial block is written without it, as dd does.
  const int64_t end = direct ? bytes / static_cast<int64_t>(kDirectAlign) * static_cast<int64_t>(kDirectAlign) : bytes;
  for (int64_t done = 0; done < end;) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(end - done, static_cast<int64_t>(kPlainBlock)));
    if (direct && done == 0) {  // the first write shows whether the file system takes O_DIRECT writes
      const ssize_t w = ::write(fd.get(), buf, n);
      if (w < 0 && errno == EINVAL) {
        fd.reset();
        fs::remove(path);
        return std::nullopt;
      }
      if (w < 0) ST_FAULT("cannot write ", path, ": ", st::errno_text());
      write_all(fd.get(), buf + w, n - static_cast<size_t>(w), path);
    } else {
      write_all(fd.get(), buf, n, path);
    }
    done += static_cast<int64_t>(n);
  }
  if (end < bytes) {
    if (::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_DIRECT) != 0)
      ST_FAULT("cannot turn O_DIRECT off on ", path, ": ", st::errno_text());
    write_all(fd.get(), buf, static_cast<size_t>(bytes - end), path);
  }
  if (::fsync(fd.get()) != 0) ST_FAULT("fsync of ", path, ": ", st::errno_text());
  if (fd.close() != 0) ST_FAULT("close of ", path, ": ", st::errno_text());
  return st::seconds_since(t0);
}

// Reads the whole file the way dd reads it: 64 MiB read()s into `buf`, with O_DIRECT or through the page cache.
// Returns the seconds, or nothing where the file system refuses O_DIRECT.
std::optional<double> plain_read(const std::string& path, char* buf, bool direct) {
  const auto t0 = std::chrono::steady_clock::now();
  st::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0)));
  if (!fd && direct && errno == EINVAL) return std::nullopt;
  if (!fd) ST_FAULT("cannot open ", path, ": ", st::errno_text());
  for (;;) {
    const ssize_t r = ::read(fd.get(), buf, kPlainBlock);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && direct && errno == EINVAL) return std::nullopt;
    if (r < 0) ST_FAULT("cannot read ", path, ": ", st::errno_text());
    if (r == 0) break;
  }
  fd.reset();  // the close is part of the read's time
  return st::seconds_since(t0);
}

// Varied bits (a xorshift stream): no zero runs, no short period.
void fill_varied(void* out, size_t bytes, uint64_t seed) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  auto* p = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < bytes; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(p + i, &x, std::min<size_t>(8, bytes - i));
  }
}

}  // namespace

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
    if (iters < 1) ST_BAD_INPUT("bench_ckpt_io: --iters is ", iters, ", expected >= 1");
    overrides.push_back("--ckpt.dir=" + dir);
    overrides.push_back("--ckpt.keep=1");
    overrides.push_back("--train.micro_batch=1");
    const st::Config cfg = st::load_config(config, overrides);
    st::ShardedModel model(cfg, *comm);
    std::vector<st::UnitSlice> slices;
    for (const st::UnitLayout& u : model.units()) {
      st::UnitShard& sh = model.shard(u.index);
      const size_t n = static_cast<size_t>(sh.span.count);
      fill_varied(sh.m.data(), n * sizeof(float), 2 * static_cast<uint64_t>(u.index) + 1);
      fill_varied(sh.v.data(), n * sizeof(float), 2 * static_cast<uint64_t>(u.index) + 2);
      slices.push_back(st::UnitSlice{u.name, sh.span, sh.param.data(), sh.m.data(), sh.v.data()});
    }

    char name[32];
    std::snprintf(name, sizeof(name), "rank_%05d.h5", comm->rank());
    const std::string tag = name + 5;  // "00000.h5"
    const std::string writer_path = (fs::path(dir) / ("bench_writer_" + tag)).string();
    const std::string plain_path = (fs::path(dir) / ("bench_plain_" + tag + ".bin")).string();
    std::unique_ptr<char, decltype(&std::free)> block(static_cast<char*>(std::aligned_alloc(kDirectAlign, kPlainBlock)),
                                                      &std::free);
    fill_varied(block.get(), kPlainBlock, 1000 + static_cast<uint64_t>(comm->rank()));

    std::vector<double> save_s, load_s, hash_s, writer_s, plain_s, direct_s, cached_load, cached_hash;
    std::vector<double> plain_read_s[2];  // dd-style reads: buffered, O_DIRECT (absent where refused)
    bool direct_refused = false;
    std::string where;
    int64_t my_bytes = 0;
    for (int it = 0; it < iters; ++it) {
      st::CheckpointState cs;
      cs.step = it + 1;
      comm->barrier();
      auto t0 = std::chrono::steady_clock::now();
      where = st::save_checkpoint(cfg, model, cs, *comm);
      save_s.push_back(st::seconds_since(t0));
      const std::string mine = (fs::path(where) / name).string();
      drop_from_page_cache(mine);
      cached_load.push_back(percent_in_page_cache(mine));
      comm->barrier();
      t0 = std::chrono::steady_clock::now();
      st::load_checkpoint(where, cfg, model, *comm);
      load_s.push_back(st::seconds_since(t0));
      // The load's pass over this rank's own file (the load above read the same file, written by the same world
      // size) without the copies into the model or HDF5's parse: what reading and hashing alone take.
      drop_from_page_cache(mine);
      cached_hash.push_back(percent_in_page_cache(mine));
      comm->barrier();
      t0 = std::chrono::steady_clock::now();
      st::file_digest(mine, st::kDigestPieceBytes);
      hash_s.push_back(st::seconds_since(t0));
      for (bool direct : {false, true}) {
        drop_from_page_cache(mine);
        comm->barrier();
        const std::optional<double> r = plain_read(mine, block.get(), direct);
        if (r) plain_read_s[direct].push_back(*r);
      }

      // The writer alone, then the disk alone with the same byte count.
      fs::remove(writer_path);
      comm->barrier();
      t0 = std::chrono::steady_clock::now();
      my_bytes = st::write_shard_file(writer_path, comm->rank(), comm->world_size(), cs.step, slices).bytes;
      writer_s.push_back(st::seconds_since(t0));
      fs::remove(writer_path);
      comm->barrier();
      plain_s.push_back(*plain_write(plain_path, my_bytes, block.get(), false));
      fs::remove(plain_path);
      comm->barrier();
      const std::optional<double> direct = plain_write(plain_path, my_bytes, block.get(), true);
      if (direct) direct_s.push_back(*direct);
      direct_refused = !direct;
      fs::remove(plain_path);
    }
    std::vector<char> hashed(size_t{256} << 20);
    fill_varied(hashed.data(), hashed.size(), 7);
    double digest_GBps[2];
    for (int k = 0; k < 2; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      st::digest_hex(hashed.data(), hashed.size(), k == 0 ? 0 : st::kDigestPieceBytes);
      digest_GBps[k] = static_cast<double>(hashed.size()) / st::seconds_since(t0) / 1e9;
    }
    double total = 0;
    for (const auto& e : fs::directory_iterator(where)) total += static_cast<double>(e.file_size());
    if (comm->rank() == 0) {
      const double bytes = static_cast<double>(my_bytes);
      const double s = st::median(save_s), l = st::median(load_s);
      std::printf(
          "ckpt_io world=%d params_file_bytes_rank0=%.0f size_on_disk_GB=%.3f median_save_s=%.3f "
          "save_GBps_per_rank=%.2f median_load_s=%.3f load_GBps_per_rank=%.2f load_speed_over_save=%.2f "
          "page_cache_before_load=%.0f%%\n",
          comm->world_size(), bytes, total / 1e9, s, bytes / s / 1e9, l, bytes / l / 1e9, s / l,
          st::median(cached_load));
      std::printf(
          "ckpt_io pass median_digest_pass_s=%.3f digest_pass_GBps=%.2f page_cache_before_pass=%.0f%% "
          "(file_digest: the load's read and hash without its copies)\n",
          st::median(hash_s), bytes / st::median(hash_s) / 1e9, st::median(cached_hash));
      const double buffered_read = st::median(plain_read_s[0]);
      double best_read = buffered_read;
      std::printf("ckpt_io read plain_buffered_read_GBps=%.2f ", bytes / buffered_read / 1e9);
      if (plain_read_s[1].empty()) {
        std::printf("direct_read=skipped (the file system refuses O_DIRECT) ");
      } else {
        const double direct_read = st::median(plain_read_s[1]);
        best_read = std::min(best_read, direct_read);
        std::printf("plain_direct_read_GBps=%.2f ", bytes / direct_read / 1e9);
      }
      std::printf("load_over_best_plain_read=%.2f\n", best_read / l);
      const double w = st::median(writer_s), p = st::median(plain_s);
      double best = p;
      std::printf("ckpt_io write median_writer_s=%.3f writer_GBps=%.2f median_plain_s=%.3f plain_GBps=%.2f ", w,
                  bytes / w / 1e9, p, bytes / p / 1e9);
      if (direct_refused) {
        std::printf("direct=skipped (the file system refuses O_DIRECT) ");
      } else {
        const double d = st::median(direct_s);
        best = std::min(best, d);
        std::printf("median_direct_s=%.3f direct_GBps=%.2f ", d, bytes / d / 1e9);
      }
      std::printf("writer_over_best_plain=%.2f\n", best / w);
      std::printf("ckpt_io digest_from_memory sha256_one_stream_GBps=%.2f piece_digest_GBps=%.2f\n", digest_GBps[0],
                  digest_GBps[1]);
    }
    return 0;
  } catch (const st::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return st::fail_world(mpi, e.kind());
  }
}
