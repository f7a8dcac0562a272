// mpi_comm_check: every collective of MpiCommunicator under a real mpirun (tests/comm/comm.cmake runs it
// for 1..4 ranks). Exits non-zero, naming each mismatch, if any rank saw a wrong value.
//
//   mpirun --oversubscribe --mca btl self,vader -np 3 ./mpi_comm_check
//   mpirun ... -np 3 ./mpi_comm_check --fail-rank 1   # rank 1 throws mid-run: the job must abort
//
// Data are dyadic (k/16 with |k| <= 2048), so every sum of up to 2^8 of them is exact in float and the
// checks compare bits, whatever order MPI sums in. One case uses normal values instead and checks
// tolerance, plus that every rank holds the same bits.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "../comm/point_to_point_checks.h"
#include "shardtrain/comm/mpi_check.h"
#include "shardtrain/comm/mpi_communicator.h"
#include "shardtrain/comm/mpi_session.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/rng.h"

namespace {

constexpr uint64_t kSeed = 20261129;

float dyadic(uint64_t stream, uint64_t i) {
  const int64_t k = static_cast<int64_t>((st::random_bits_at(kSeed, stream, i) >> 20) % 4097) - 2048;
  return static_cast<float>(k) / 16.0f;
}

uint64_t stream_of(int test, int64_t count, int rank) {
  return (static_cast<uint64_t>(test) << 48) ^ (static_cast<uint64_t>(count) << 8) ^ static_cast<uint64_t>(rank);
}

class Checker {
 public:
  explicit Checker(int rank) : rank_(rank) {}
  // Records a failed expectation; prints the first few.
  void expect(bool ok, const std::string& what) {
    ++checks_;
    if (ok) return;
    if (failures_++ < 12) std::fprintf(stderr, "mpi_comm_check: rank %d: MISMATCH %s\n", rank_, what.c_str());
  }
  int64_t failures() const { return failures_; }
  int64_t checks() const { return checks_; }

 private:
  int rank_;
  int64_t checks_ = 0;
  int64_t failures_ = 0;
};

std::string where(const st::Communicator& c, const char* op, int64_t count, int64_t i) {
  return st::str_cat(op, " world ", c.world_size(), " count ", count, " element ", i);
}

// Every collective for one count on one communicator.
void check_collectives(st::MpiCommunicator& comm, int64_t count, Checker& check) {
  const int rank = comm.rank();
  const int world = comm.world_size();
  const float kGarbage = std::nanf("");
  const std::string tag = st::str_cat(" (max_chunk ", comm.max_chunk(), ")");

  {  // all_gather: recv[r * count + i] = rank r's send[i]
    std::vector<float> send(count), recv(world * count + 1, kGarbage);
    for (int64_t i = 0; i < count; ++i) send[i] = dyadic(stream_of(1, count, rank), i);
    const float guard = 12345.0f;
    recv[world * count] = guard;  // must survive: nothing is written past world * count
    comm.all_gather(send.data(), count, recv.data());
    int64_t bad = -1;
    for (int r = 0; r < world && bad < 0; ++r)
      for (int64_t i = 0; i < count && bad < 0; ++i)
        if (recv[r * count + i] != dyadic(stream_of(1, count, r), i)) bad = r * count + i;
    check.expect(bad < 0, where(comm, "all_gather", count, bad) + tag);
    check.expect(recv[world * count] == guard, where(comm, "all_gather wrote past the end", count, world * count));
  }
  {  // in place: send is recv + rank * count
    std::vector<float> recv(world * count, kGarbage);
    for (int64_t i = 0; i < count; ++i) recv[rank * count + i] = dyadic(stream_of(2, count, rank), i);
    comm.all_gather(recv.data() + rank * count, count, recv.data());
    int64_t bad = -1;
    for (int r = 0; r < world && bad < 0; ++r)
      for (int64_t i = 0; i < count && bad < 0; ++i)
        if (recv[r * count + i] != dyadic(stream_of(2, count, r), i)) bad = r * count + i;
    check.expect(bad < 0, where(comm, "all_gather in place", count, bad) + tag);
  }
  {  // reduce_scatter: recv[i] = sum over r of r's send[rank * count + i]
    std::vector<float> send(world * count), recv(count + 1, kGarbage);
    for (int64_t j = 0; j < world * count; ++j) send[j] = dyadic(stream_of(3, count, rank), j);
    recv[count] = 777.0f;
    comm.reduce_scatter(send.data(), count, recv.data());
    int64_t bad = -1;
    for (int64_t i = 0; i < count && bad < 0; ++i) {
      double sum = 0;
      for (int r = 0; r < world; ++r) sum += dyadic(stream_of(3, count, r), rank * count + i);
      if (recv[i] != static_cast<float>(sum)) bad = i;
    }
    check.expect(bad < 0, where(comm, "reduce_scatter", count, bad) + tag);
    check.expect(recv[count] == 777.0f, where(comm, "reduce_scatter wrote past the end", count, count));
  }
  {  // all_reduce, float and double
    std::vector<float> f(count);
    std::vector<double> d(count);
    for (int64_t i = 0; i < count; ++i) {
      f[i] = dyadic(stream_of(4, count, rank), i);
      d[i] = static_cast<double>(dyadic(stream_of(5, count, rank), i)) / 1024.0;
    }
    comm.all_reduce(f.data(), count);
    comm.all_reduce(d.data(), count);
    int64_t bad_f = -1, bad_d = -1;
    for (int64_t i = 0; i < count; ++i) {
      double sf = 0, sd = 0;
      for (int r = 0; r < world; ++r) {
        sf += dyadic(stream_of(4, count, r), i);
        sd += static_cast<double>(dyadic(stream_of(5, count, r), i)) / 1024.0;
      }
      if (bad_f < 0 && f[i] != static_cast<float>(sf)) bad_f = i;
      if (bad_d < 0 && d[i] != sd) bad_d = i;
    }
    check.expect(bad_f < 0, where(comm, "all_reduce(float)", count, bad_f) + tag);
    check.expect(bad_d < 0, where(comm, "all_reduce(double)", count, bad_d) + tag);
  }
  {  // all_reduce of normal values: close to the serial sum, and the same bits on every rank
    std::vector<float> f(count);
    for (int64_t i = 0; i < count; ++i) f[i] = static_cast<float>(st::normal_at(kSeed, stream_of(6, count, rank), i));
    comm.all_reduce(f.data(), count);
    int64_t bad = -1;
    uint64_t hash = 1469598103934665603ull;
    for (int64_t i = 0; i < count; ++i) {
      double sum = 0, mag = 0;
      for (int r = 0; r < world; ++r) {
        const double x = static_cast<float>(st::normal_at(kSeed, stream_of(6, count, r), i));
        sum += x;
        mag += std::fabs(x);
      }
      if (bad < 0 && !(std::fabs(f[i] - sum) <= 1e-6 * mag + 1e-30)) bad = i;
      uint32_t bits;
      std::memcpy(&bits, &f[i], 4);
      hash = (hash ^ bits) * 1099511628211ull;
    }
    check.expect(bad < 0, where(comm, "all_reduce(float) of normals vs serial sum", count, bad) + tag);
    uint64_t root_hash = hash;
    comm.broadcast(&root_hash, sizeof(root_hash), 0);
    check.expect(root_hash == hash, where(comm, "all_reduce(float) bits differ from rank 0's", count, -1) + tag);
  }
  // broadcast from every root, an odd number of bytes
  const int64_t bytes = count == 0 ? 0 : 4 * count + 3;
  for (int root = 0; root < world; ++root) {
    std::vector<unsigned char> buf(bytes + 1, 0xAB);
    if (rank == root)
      for (int64_t i = 0; i < bytes; ++i) buf[i] = static_cast<unsigned char>(st::random_bits_at(kSeed, 7 + root, i));
    buf[bytes] = 0x5C;
    comm.broadcast(buf.data(), bytes, root);
    int64_t bad = -1;
    for (int64_t i = 0; i < bytes && bad < 0; ++i)
      if (buf[i] != static_cast<unsigned char>(st::random_bits_at(kSeed, 7 + root, i))) bad = i;
    check.expect(bad < 0, where(comm, st::str_cat("broadcast from root ", root).c_str(), bytes, bad) + tag);
    check.expect(buf[bytes] == 0x5C, where(comm, "broadcast wrote past the end", bytes, bytes));
  }
  comm.barrier();
}

// Expects `f` to throw st::Error of `kind` whose message contains every one of `needles`.
template <typename F>
void expect_error(Checker& check, const std::string& what, st::ErrorKind kind, const std::vector<std::string>& needles,
                  F&& f) {
  try {
    f();
    check.expect(false, what + ": no error was thrown");
  } catch (const st::Error& e) {
    const std::string msg = e.what();
    bool all = e.kind() == kind;
    for (const std::string& n : needles) all = all && msg.find(n) != std::string::npos;
    check.expect(all, what + ": got kind " + std::to_string(static_cast<int>(e.kind())) + " message: " + msg);
  }
}

void check_topology(Checker& check, int rank, int world) {
  {  // one host, no override: one node holding every rank
    st::MpiCommunicator comm;
    check.expect(comm.kind() == "mpi", "kind() = " + comm.kind());
    check.expect(
        comm.node_id() == 0 && comm.local_rank() == rank && comm.local_size() == world && comm.num_nodes() == 1,
        st::str_cat("default topology: node ", comm.node_id(), " local ", comm.local_rank(), "/", comm.local_size(),
                    " nodes ", comm.num_nodes(), "; expected node 0 local ", rank, "/", world, " nodes 1"));
  }
  {  // SHARDTRAIN_NODE_ID 7, 3, 7, 3, ...: id 7 holds rank 0, so it is node 0 though 7 > 3
    setenv("SHARDTRAIN_NODE_ID", rank % 2 == 0 ? "7" : "3", 1);
    st::MpiCommunicator comm;
    const int parity = rank % 2;
    const int expect_size = (world - parity + 1) / 2;
    const int expect_nodes = world >= 2 ? 2 : 1;
    check.expect(comm.node_id() == parity && comm.local_rank() == rank / 2 && comm.local_size() == expect_size &&
                     comm.num_nodes() == expect_nodes,
                 st::str_cat("SHARDTRAIN_NODE_ID topology: node ", comm.node_id(), " local ", comm.local_rank(), "/",
                             comm.local_size(), " nodes ", comm.num_nodes(), "; expected node ", parity, " local ",
                             rank / 2, "/", expect_size, " nodes ", expect_nodes));
    // The machine's processes are still all of them: device_rank/device_ranks ignore the override (GPUs and the
    // host AdamW's CPU slices are the host's), in the world and in a split of it.
    check.expect(comm.device_rank() == rank && comm.device_ranks() == world,
                 st::str_cat("SHARDTRAIN_NODE_ID device rank ", comm.device_rank(), "/", comm.device_ranks(),
                             "; expected ", rank, "/", world));
    check.expect(comm.split(parity, rank)->device_ranks() == world, "a split keeps device_ranks()");
    // The collectives do not care about nodes; run one across them.
    std::vector<double> x(5, rank + 1.0);
    comm.all_reduce(x.data(), 5);
    check.expect(x[4] == world * (world + 1) / 2.0, "all_reduce on a SHARDTRAIN_NODE_ID communicator");
  }
  {  // the same id everywhere: one node
    setenv("SHARDTRAIN_NODE_ID", "-4", 1);
    st::MpiCommunicator comm;
    check.expect(comm.node_id() == 0 && comm.local_rank() == rank && comm.local_size() == world,
                 "SHARDTRAIN_NODE_ID=-4 on every rank is one node");
  }
  unsetenv("SHARDTRAIN_NODE_ID");
  {  // the launcher's local rank wins over shared memory when they disagree (with a warning)
    const char* saved = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    const std::string launcher_said = saved ? saved : "";
    const int claimed = world - 1 - rank;
    if (rank == 0 && world > 1)
      std::fprintf(stderr, "mpi_comm_check: a warning about OMPI_COMM_WORLD_LOCAL_RANK is expected next\n");
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(claimed).c_str(), 1);
    st::MpiCommunicator comm;
    check.expect(comm.local_rank() == claimed && comm.local_size() == world,
                 st::str_cat("OMPI_COMM_WORLD_LOCAL_RANK=", claimed, ": local rank ", comm.local_rank(), "/",
                             comm.local_size()));
    if (saved) {
      setenv("OMPI_COMM_WORLD_LOCAL_RANK", launcher_said.c_str(), 1);
    } else {
      unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    }
  }
  setenv("SHARDTRAIN_NODE_ID", "node-a", 1);
  expect_error(check, "SHARDTRAIN_NODE_ID=node-a", st::ErrorKind::kBadInput, {"SHARDTRAIN_NODE_ID", "node-a"},
               [] { st::MpiCommunicator comm; });
  if (world >= 2) {  // set on rank 0 only: every rank must fail, none may hang
    if (rank == 0) {
      setenv("SHARDTRAIN_NODE_ID", "1", 1);
    } else {
      unsetenv("SHARDTRAIN_NODE_ID");
    }
    expect_error(check, "SHARDTRAIN_NODE_ID on rank 0 only", st::ErrorKind::kBadInput,
                 {"SHARDTRAIN_NODE_ID", "set on rank 0 but not on rank"}, [] { st::MpiCommunicator comm; });
  }
  unsetenv("SHARDTRAIN_NODE_ID");
}

void check_errors_and_moves(Checker& check) {
  st::MpiCommunicator comm;
  // MPI's own error text comes through, with the expression, as a fault; the communicator returns
  // errors rather than aborting (MPI_ERRORS_RETURN), so a bad root is an exception, not a dead job.
  expect_error(check, "ST_MPI_CHECK(MPI_Bcast with a bad root)", st::ErrorKind::kFault, {"MPI_Bcast", "MPI_ERR_ROOT"},
               [&] {
                 int x = 0;
                 ST_MPI_CHECK(MPI_Bcast(&x, 1, MPI_INT, comm.world_size() + 5, comm.handle()));
               });
  expect_error(check, "broadcast root out of range", st::ErrorKind::kInternal, {"root"}, [&] {
    char c = 0;
    comm.broadcast(&c, 1, comm.world_size());
  });
  expect_error(check, "max_chunk 0", st::ErrorKind::kInternal, {"max_chunk"},
               [] { st::MpiCommunicator bad(st::MpiCommunicatorOptions{0}); });

  MPI_Comm handle = comm.handle();
  st::MpiCommunicator moved(std::move(comm));
  check.expect(comm.handle() == MPI_COMM_NULL && moved.handle() == handle, "move constructor takes the handle");
  st::MpiCommunicator assigned;
  assigned = std::move(moved);
  check.expect(moved.handle() == MPI_COMM_NULL && assigned.handle() == handle, "move assignment takes the handle");
  float one = 1.0f;
  assigned.all_reduce(&one, 1);
  check.expect(one == static_cast<float>(assigned.world_size()), "all_reduce after two moves");
  expect_error(check, "collective on a moved-from communicator", st::ErrorKind::kInternal, {"moved-from"},
               [&] { comm.barrier(); });
}

int run(int fail_rank) {
  st::MpiCommunicator comm;
  const int rank = comm.rank();
  const int world = comm.world_size();
  st::set_process_identity(rank, world);
  Checker check(rank);

  if (fail_rank >= 0) {
    if (fail_rank >= world) ST_BAD_INPUT("--fail-rank ", fail_rank, " is not a rank of a world of ", world);
    std::vector<float> x(16, 1.0f);
    comm.all_reduce(x.data(), 16);
    if (rank == fail_rank) ST_FAULT("injected failure on rank ", rank, " (--fail-rank)");
    comm.all_reduce(x.data(), 16);  // the others wait here until the launcher ends the job
    comm.barrier();
    std::fprintf(stderr, "mpi_comm_check: rank %d: passed a collective that rank %d never entered\n", rank, fail_rank);
    return 1;
  }

  check_topology(check, rank, world);
  check_errors_and_moves(check);
  for (const int64_t count : {0, 1, 13, 100003}) check_collectives(comm, count, check);
  st::MpiCommunicator chunked(st::MpiCommunicatorOptions{7});
  for (const int64_t count : {0, 1, 6, 7, 8, 13, 14, 101, 1009}) check_collectives(chunked, count, check);

  // Point-to-point: one message a transfer, then (max_chunk 7) many, whose counts differ between the two halves of
  // a send_recv; and a dup used from a second thread beside the original (MPI_THREAD_MULTIPLE).
  auto p2p = [&](const std::string& error, const std::string& what) {
    check.expect(error.empty(), what + ": " + error);
  };
  for (const int64_t bytes : {0, 1, 13, 100003}) {
    p2p(st::testing::check_ring_send_recv(comm, bytes), st::str_cat("ring send_recv ", bytes));
    p2p(st::testing::check_ring_send_recv(chunked, bytes), st::str_cat("ring send_recv ", bytes, " (max_chunk 7)"));
  }
  p2p(st::testing::check_send_then_recv(comm, 1000), "send then recv");
  p2p(st::testing::check_send_then_recv(chunked, 50), "send then recv (max_chunk 7)");
  p2p(st::testing::check_dup_beside(comm, 50), "dup beside the original");
  p2p(st::testing::check_dup_beside(chunked, 10), "dup beside the original (max_chunk 7)");

  double totals[2] = {static_cast<double>(check.failures()), static_cast<double>(check.checks())};
  comm.all_reduce(totals, 2);
  if (rank == 0) {
    std::printf("mpi_comm_check: world %d: %.0f checks, %.0f failures: %s\n", world, totals[1], totals[0],
                totals[0] == 0 ? "OK" : "FAILED");
  }
  return totals[0] == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int fail_rank = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--fail-rank") == 0 && i + 1 < argc) {
      fail_rank = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: mpirun -np N %s [--fail-rank R]\n", argv[0]);
      return st::kExitBadInput;
    }
  }
  if (!st::MpiSession::launched_by_mpi()) {
    std::fprintf(stderr, "mpi_comm_check: run me under mpirun (no MPI launcher in the environment)\n");
    return st::kExitBadInput;
  }
  // The MpiSession outlives the try block, so the error path can still abort the whole job through MPI.
  std::optional<st::MpiSession> mpi;
  try {
    mpi.emplace(&argc, &argv);
    return run(fail_rank);
  } catch (const st::Error& e) {
    std::fprintf(stderr, "mpi_comm_check: error: %s\n", e.what());
    st::MpiSession::abort(st::exit_code_for(e.kind()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_comm_check: error: internal: %s\n", e.what());
    st::MpiSession::abort(st::kExitInternal);
  }
}
