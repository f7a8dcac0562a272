// A data shard truncated while a run reads it. The run is held still at a known step (SHARDTRAIN_FAULT=sigstop stops
// it before step 3), the shard is truncated, and the run is continued: its next read of the shard faults, and it must
// end with exit code 2 and a message naming the file, not die of SIGBUS without one.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../common/temp_dir.h"
#include "../data/data_test_util.h"

extern char** environ;

namespace st::testing {
namespace {

// An llm.c shard of `tokens` tokens 0, 1, 2, ... (mod 256).
std::string llmc_shard(int tokens) {
  LlmcShard shard;
  for (int i = 0; i < tokens; ++i) shard.tokens.push_back(static_cast<uint16_t>(i % 256));
  return shard.bytes();
}

// waitpid(2) with WUNTRACED until `pid` stops or ends, for at most 120 s; -1 when it did neither (it is then killed).
int wait_for_change(pid_t pid) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG | WUNTRACED);
    if (r == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

TEST(DataShard, TruncatedWhileTheRunReadsItExitsTwoNamingTheFile) {
  TempDir dir;
  const std::string shard = dir.file("train_000.bin");
  write_bytes(shard, llmc_shard(64 * 1024));
  const std::string log = dir.file("run.log");

  const std::vector<std::string> args = {SHARDTRAIN_BINARY,        "train",           "--data.format=llmc",
                                         "--data.path=" + shard,   "--train.steps=8", "--train.eval_every=0",
                                         "--train.sample_tokens=0"};
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_strings = {"SHARDTRAIN_FAULT=sigstop:0@3", "OMP_NUM_THREADS=1"};
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "SHARDTRAIN_FAULT=", 17) != 0 && std::strncmp(*e, "OMP_NUM_THREADS=", 16) != 0)
      env_strings.emplace_back(*e);
  }
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, SHARDTRAIN_BINARY, &actions, nullptr, argv.data(), envp.data()), 0);
  posix_spawn_file_actions_destroy(&actions);

  // Stopped before step 3: steps 1 and 2 have read the shard through its mapping.
  const int stopped = wait_for_change(pid);
  ASSERT_TRUE(stopped != -1 && WIFSTOPPED(stopped)) << "status " << stopped << "\n" << read_bytes(log);
  ASSERT_EQ(::truncate(shard.c_str(), 1024), 0);  // the header stays, every token goes
  ASSERT_EQ(::kill(pid, SIGCONT), 0);
  const int status = wait_for_change(pid);
  const std::string output = read_bytes(log);
  ASSERT_NE(status, -1) << output;
  ASSERT_TRUE(WIFEXITED(status)) << "ended by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << "\n"
                                 << output;
  EXPECT_EQ(WEXITSTATUS(status), 2) << output;
  EXPECT_NE(output.find("step      2/8"), std::string::npos) << output;
  EXPECT_EQ(output.find("step      8/8"), std::string::npos) << output;
  EXPECT_NE(output.find("error: ["), std::string::npos) << output;
  EXPECT_NE(output.find("] data file " + shard +
                        " changed while the job was reading it (a read of its memory mapping failed with SIGBUS: the "
                        "file was truncated or rewritten in place); data files must not change while a job reads "
                        "them\n"),
            std::string::npos)
      << output;
}

}  // namespace
}  // namespace st::testing
