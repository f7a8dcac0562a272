// Checkpoint-directory faults: two jobs on one ckpt.dir, a ckpt.dir that is a file or read-only, and a
// preemption without ckpt.dir. Each drives the shardtrain binary and asserts the exit code, the message and
// what is left on disk.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "../common/run_shardtrain.h"
#include "../common/temp_dir.h"
#include "shardtrain/core/unique_fd.h"

namespace fs = std::filesystem;

namespace st::testing {
namespace {

const std::string kTiny = std::string(SHARDTRAIN_SOURCE_DIR) + "/configs/tiny.ini";

// A few-second tiny run: 4 sequences of 128 bytes a step (2 a micro-batch, so 1 or 2 ranks), no evaluation, no
// sample.
std::string tiny_args(const std::string& ckpt_dir, int64_t steps, const std::string& extra = "") {
  std::string a = "train --config " + kTiny + " --train.steps=" + std::to_string(steps) +
                  " --train.global_batch=4 --train.micro_batch=2 --train.eval_every=0 --train.sample_tokens=0";
  if (!ckpt_dir.empty()) a += " --ckpt.dir=" + ckpt_dir;
  return a + (extra.empty() ? "" : " " + extra);
}

// Every entry under `dir` (the lock file aside) with, for a file, its size and a hash of its bytes: what the
// tests compare before and after.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(e.path(), dir).string();
    if (rel == ".lock") continue;
    if (!e.is_regular_file()) {
      out[rel] = "directory";
      continue;
    }
    const std::string bytes = read_bytes(e.path().string());
    out[rel] = std::to_string(bytes.size()) + " bytes, hash " + std::to_string(std::hash<std::string>()(bytes));
  }
  return out;
}

std::string host_name() {
  char buf[HOST_NAME_MAX + 1] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// A shardtrain job in the background, its output in `log`, with SHARDTRAIN_FAULT set when `fault` is given. A
// job still running when the test ends (a failed assertion) is SIGKILLed.
class BackgroundJob {
 public:
  BackgroundJob(const std::string& args, const std::string& log, const std::string& fault = "") {
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      if (!fault.empty()) setenv("SHARDTRAIN_FAULT", fault.c_str(), 1);
      const std::string cmd = "exec " + std::string(SHARDTRAIN_BINARY) + " " + args;
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~BackgroundJob() {
    if (pid_ > 0) signal_and_reap(SIGKILL);
  }
  BackgroundJob(const BackgroundJob&) = delete;
  BackgroundJob& operator=(const BackgroundJob&) = delete;

  pid_t pid() const { return pid_; }
  // Sends `sig` and waits for the end: the exit code, or -1 when a signal ended it.
  int signal_and_reap(int sig) {
    ::kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
};

// Waits up to `seconds` for `pred`; true if it held.
template <typename Pred>
bool wait_for(Pred pred, int seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pred();
}

// The state letter of /proc/<pid>/stat ('T' when stopped), or 0 when it is gone.
char proc_state(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  std::getline(f, s);
  const size_t paren = s.rfind(')');
  return paren == std::string::npos || paren + 2 >= s.size() ? 0 : s[paren + 2];
}

// The test process holds the lock of `dir` as a live job would, with a holder record of its own.
class HeldLock {
 public:
  HeldLock(const std::string& dir, const std::string& record)
      : fd_(::open((dir + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    EXPECT_GE(fd_.get(), 0);
    EXPECT_EQ(::flock(fd_.get(), LOCK_EX | LOCK_NB), 0);
    EXPECT_EQ(::pwrite(fd_.get(), record.data(), record.size(), 0), static_cast<ssize_t>(record.size()));
  }

 private:
  UniqueFd fd_;  // closing it releases the lock
};

TEST(CkptDirTest, SecondJobOnAHeldDirectoryExits2NamingTheHolderAndTouchesNothing) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  fs::create_directories(dir + "/step_00000003.tmp-00000000000000aa");
  write_bytes(dir + "/step_00000003.tmp-00000000000000aa/rank_00000.h5", "a save in flight");
  fs::create_directories(dir + "/step_00000002");
  write_bytes(dir + "/step_00000002/manifest.json", "{\"the first job's\": \"checkpoint\"}");
  const auto before = snapshot(dir);
  HeldLock holder(dir, "host=trainer-7\npid=4242\nstarted=2026-12-01T09:30:00Z\n");

  const CliResult r = run_shardtrain(tiny_args(dir, 3, "--ckpt.resume=auto --log.metrics=" + tmp.file("m.jsonl")));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("ckpt.dir '" + dir +
                          "' is in use by another job: host trainer-7, pid 4242, started "
                          "2026-12-01T09:30:00Z (lock file " +
                          dir + "/.lock)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("give this job another ckpt.dir"), std::string::npos) << r.output;
  EXPECT_EQ(snapshot(dir), before);
  EXPECT_FALSE(fs::exists(tmp.file("m.jsonl"))) << "a step ran";
}

// Every rank exits 2 with rank 0's reason, not rank 0 alone while the others wait in a collective.
TEST(CkptDirTest, EveryRankOfAJobStopsWhenTheDirectoryIsHeld) {
  if (run_command("command -v mpirun").code != 0) GTEST_SKIP() << "mpirun is not installed";
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  fs::create_directories(dir);
  HeldLock holder(dir, "host=trainer-7\npid=4242\nstarted=2026-12-01T09:30:00Z\n");
  const CliResult r = run_command(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 timeout 120 mpirun "
      "--oversubscribe --bind-to none --mca btl self,vader -np 2 " +
      std::string(SHARDTRAIN_BINARY) + " " + tiny_args(dir, 3, "--dist.timeout_s=60"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("[rank 1/2 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("stopped: rank 0 could not take ckpt.dir: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("is in use by another job: host trainer-7, pid 4242"), std::string::npos) << r.output;
}

// Two stand-in machines (SHARDTRAIN_NODE_ID) where the second has a ckpt.dir of its own at the same path (a
// tmpfs mounted over it in its own mount namespace): the run would commit checkpoints without its files.
TEST(CkptDirTest, AMachineWithADirectoryOfItsOwnStopsTheJob) {
  if (run_command("command -v mpirun").code != 0) GTEST_SKIP() << "mpirun is not installed";
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  fs::create_directories(dir);
  if (run_command("unshare -m sh -c 'mount -t tmpfs none " + dir + "'").code != 0)
    GTEST_SKIP() << "a mount namespace with a tmpfs (unshare -m) is not permitted here";
  const std::string job = std::string(SHARDTRAIN_BINARY) + " " + tiny_args(dir, 3, "--dist.timeout_s=60");
  const CliResult r = run_command(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 timeout 120 mpirun "
      "--oversubscribe --bind-to none --mca btl self,vader -np 1 sh -c 'SHARDTRAIN_NODE_ID=0 exec " +
      job + "' : -np 1 unshare -m sh -c 'mount -t tmpfs none " + dir + " && SHARDTRAIN_NODE_ID=1 exec " + job + "'");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("ckpt.dir '" + dir + "' is not one directory shared by every machine: node 1 (" +
                          host_name() + ") sees no lock file " + dir + "/.lock where rank 0 wrote host=" + host_name()),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir + "/step_00000003")) << r.output;
}

// Two real jobs: the first stops itself (SIGSTOP) after its step-2 checkpoint, mid-run, with a save in flight
// beside it. A second job with another seed is refused; after the first is SIGKILLed, a third resumes its
// checkpoint and finishes.
TEST(CkptDirTest, AJobStoppedMidRunKeepsItsDirectoryUntilKilled) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  // Saves the run waits for: step 2 is committed by the time the run stops before step 4.
  BackgroundJob job(tiny_args(dir, 6, "--ckpt.every=2 --ckpt.async=false"), tmp.file("first.log"), "sigstop:0@4");
  const pid_t first = job.pid();
  ASSERT_GT(first, 0);
  const bool stopped = wait_for([&] { return proc_state(first) == 'T' || proc_state(first) == 0; }, 240);
  ASSERT_TRUE(stopped && proc_state(first) == 'T') << read_bytes(tmp.file("first.log"));
  ASSERT_TRUE(fs::exists(dir + "/step_00000002/manifest.json")) << read_bytes(tmp.file("first.log"));
  // The first job's next save, as it would be in flight when the second one starts.
  fs::create_directories(dir + "/step_00000004.tmp-00000000000000bb");
  write_bytes(dir + "/step_00000004.tmp-00000000000000bb/rank_00000.h5", "half a save");
  const auto before = snapshot(dir);

  const CliResult second = run_shardtrain(tiny_args(dir, 6, "--ckpt.every=2 --ckpt.keep=1 --train.seed=99"));
  EXPECT_EQ(second.code, 2) << second.output;
  EXPECT_NE(second.output.find("is in use by another job: host " + host_name() + ", pid " + std::to_string(first) +
                               ", started 20"),
            std::string::npos)
      << second.output;
  EXPECT_EQ(snapshot(dir), before);

  EXPECT_EQ(job.signal_and_reap(SIGKILL), -1);
  const CliResult third = run_shardtrain(tiny_args(dir, 6, "--ckpt.every=2 --ckpt.resume=auto"));
  EXPECT_EQ(third.code, 0) << third.output;
  EXPECT_NE(third.output.find("checkpoint: resumed from " + dir + "/step_00000002 (step 2"), std::string::npos)
      << third.output;
  EXPECT_FALSE(fs::exists(dir + "/step_00000004.tmp-00000000000000bb"));
  EXPECT_TRUE(fs::exists(dir + "/step_00000006/manifest.json"));
}

TEST(CkptDirTest, ADirectoryThatIsAFileExits2BeforeStep1) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  write_bytes(dir, "not a directory");
  const CliResult r = run_shardtrain(tiny_args(dir, 3, "--log.metrics=" + tmp.file("m.jsonl")));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("ckpt.dir '" + dir + "' is not a directory (it is a file)"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(tmp.file("m.jsonl"))) << "a step ran";
  EXPECT_EQ(read_bytes(dir), "not a directory");
}

// chmod does not stop root, so as root the directory is made read-only by a read-only bind mount in a mount
// namespace of the job's own (unshare -m).
TEST(CkptDirTest, AReadOnlyDirectoryExits2BeforeStep1) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  fs::create_directories(dir);
  const std::string job =
      std::string(SHARDTRAIN_BINARY) + " " + tiny_args(dir, 3, "--log.metrics=" + tmp.file("m.jsonl"));
  std::string command, reason;
  if (geteuid() != 0) {
    fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec);
    command = job;
    reason = "Permission denied";
  } else {
    const std::string ro_mount = "mount --bind -o ro " + dir + " " + dir;
    if (run_command("unshare -m sh -c '" + ro_mount + "'").code != 0)
      GTEST_SKIP() << "running as root, where chmod does not stop writes, and unshare -m with a read-only bind "
                      "mount is not permitted here";
    command = "unshare -m sh -c '" + ro_mount + " && exec " + job + "'";
    reason = "Read-only file system";
  }
  const CliResult r = run_command(command);
  fs::permissions(dir, fs::perms::owner_all);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("ckpt.dir '" + dir + "' is not writable: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(reason), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(tmp.file("m.jsonl"))) << "a step ran";
}

// Exit 76 says "preempted"; without ckpt.dir the message must say that nothing was saved.
TEST(CkptDirTest, PreemptedWithoutCkptDirSaysNothingWasSaved) {
  TempDir tmp;
  const std::string metrics = tmp.file("m.jsonl");
  BackgroundJob job(tiny_args("", 100000, "--log.metrics=" + metrics), tmp.file("job.log"));
  ASSERT_GT(job.pid(), 0);
  const bool stepping = wait_for(
      [&] { return fs::exists(metrics) && read_bytes(metrics).find("{\"step\": 2,") != std::string::npos; }, 240);
  ASSERT_TRUE(stepping) << read_bytes(tmp.file("job.log"));
  EXPECT_EQ(job.signal_and_reap(SIGTERM), 76);
  const std::string out = read_bytes(tmp.file("job.log"));
  EXPECT_NE(out.find(": NO checkpoint was saved (ckpt.dir is not set), so the "), std::string::npos) << out;
  EXPECT_NE(out.find("exit 76 here does not mean a checkpoint was committed"), std::string::npos) << out;
}

}  // namespace
}  // namespace st::testing
