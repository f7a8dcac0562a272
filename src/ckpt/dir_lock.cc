#include "shardtrain/ckpt/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "shardtrain/ckpt/node_local.h"
#include "shardtrain/comm/on_all_ranks.h"
#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/log.h"

namespace fs = std::filesystem;

namespace st {
namespace {

std::string this_host() {
  char buf[HOST_NAME_MAX + 1] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

std::string utc_now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The holder as a second job names it: "host H, pid P, started T", from the record's key=value lines.
std::string describe_holder(int fd) {
  char buf[4096];
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  std::string host, pid, started;
  std::istringstream in(std::string(buf, n > 0 ? static_cast<size_t>(n) : 0));
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "host") host = value;
    if (key == "pid") pid = value;
    if (key == "started") started = value;
  }
  // The holder writes its record right after taking the lock: an empty one is a job still starting.
  if (host.empty() && pid.empty()) return "a job that has not written its host and pid yet (it is starting)";
  return str_cat("host ", host.empty() ? "?" : host, ", pid ", pid.empty() ? "?" : pid, ", started ",
                 started.empty() ? "?" : started);
}

// A holder record on one line: "host=a, pid=1, started=...".
std::string one_line(const std::string& record) {
  std::string out;
  std::istringstream in(record);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out += (out.empty() ? "" : ", ") + line;
  return out.empty() ? "an empty record" : out;
}

bool no_lock_support(int err) { return err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS; }

// Creating and removing a directory is what a save does first; a directory that refuses it (read-only
// mount, permissions, a full disk or quota) is found here, before step 1, instead of after the training.
void prove_writable(const std::string& dir) {
  std::string probe = (fs::path(dir) / ".write-probe-XXXXXX").string();
  if (::mkdtemp(probe.data()) == nullptr)
    ST_BAD_INPUT("ckpt.dir '", dir, "' is not writable: cannot create a directory in it: ", errno_text(),
                 "; give ckpt.dir a directory this job can write");
  ::rmdir(probe.c_str());
}

// The lock file as this machine sees it, against the record rank 0 wrote: "" when they match. A shared
// filesystem shows the new record at once (NFS revalidates a file when it is opened); a few retries cover a
// client whose attribute cache is late.
std::string check_same_directory(const std::string& dir, const std::string& record, int node) {
  const std::string path = (fs::path(dir) / kDirLockFile).string();
  std::string seen;
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::ifstream f(path, std::ios::binary);
    seen = f ? std::string(std::istreambuf_iterator<char>(f), {}) : std::string();
    if (f && seen == record) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  std::error_code ec;
  const std::string sees = !fs::exists(dir, ec)    ? "no such directory"
                           : !fs::exists(path, ec) ? "no lock file " + path
                                                   : "another job's record in " + path + " (" + one_line(seen) + ")";
  return str_cat(process_prefix(), " ckpt.dir '", dir, "' is not one directory shared by every machine: node ", node,
                 " (", this_host(), ") sees ", sees, " where rank 0 wrote ", one_line(record),
                 ". A run over several machines needs "
                 "ckpt.dir on a filesystem all of them mount (NFS or another shared filesystem): a save commits one "
                 "directory holding every rank's file, and resume reads them all (docs/checkpoint-format.md, "
                 "\"Checkpoint directory\")");
}

}  // namespace

DirLock DirLock::acquire(const std::string& dir, const std::string& extra) {
  std::error_code ec;
  std::string created;  // the outermost directory this call creates
  for (fs::path p = fs::absolute(dir, ec); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    created = p.string();
    if (p == p.parent_path()) break;
  }
  if (!created.empty()) {
    fs::create_directories(dir, ec);
    if (ec) ST_BAD_INPUT("ckpt.dir '", dir, "' cannot be created: ", ec.message());
  }
  if (!fs::is_directory(dir, ec))
    ST_BAD_INPUT("ckpt.dir '", dir, "' is not a directory", ec ? ": " + ec.message() : std::string(" (it is a file)"),
                 "; give ckpt.dir a directory path");

  const std::string path = (fs::path(dir) / kDirLockFile).string();
  DirLock lock;
  lock.dir_ = dir;
  lock.created_ = created;
  int fd = -1, rc = 0;
  // A job that leaves the directory unused removes the lock file while it holds the lock (~DirLock): a lock taken
  // on a file that is no longer the directory's is no lock, so the file is opened again until they agree.
  for (int attempt = 0;; ++attempt) {
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
      ST_BAD_INPUT("ckpt.dir '", dir, "' is not writable: cannot open ", path, " for writing: ", errno_text(),
                   "; give ckpt.dir a directory this job can write");
    lock.fd_ = UniqueFd(fd);  // closed by ~DirLock on every path below
    do {
      rc = ::flock(fd, LOCK_EX | LOCK_NB);
    } while (rc != 0 && errno == EINTR);
    struct stat held {
    }, named{};
    if (rc != 0 || attempt == 100 ||
        (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
         held.st_dev == named.st_dev))
      break;
  }
  lock.path_ = path;
  if (rc != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK)
      ST_BAD_INPUT("ckpt.dir '", dir, "' is in use by another job: ", describe_holder(fd), " (lock file ", path,
                   "). Two jobs on one ckpt.dir delete each other's unfinished saves and resume each other's "
                   "checkpoints: wait for that job to end, stop it, or give this job another ckpt.dir. A job "
                   "that died releases the lock at once on a local filesystem, and when its client's lease "
                   "expires on NFS (docs/checkpoint-format.md, \"Checkpoint directory\")");
    if (no_lock_support(err))
      ST_BAD_INPUT("ckpt.dir '", dir, "' is on a filesystem without working file locks (flock on ", path, ": ",
                   errno_text(err),
                   "). shardtrain locks ckpt.dir so that no two jobs write into it at once: "
                   "put ckpt.dir on a filesystem with locking (on NFS, a server and client with the lock service "
                   "running; docs/checkpoint-format.md, \"Checkpoint directory\")");
    ST_BAD_INPUT("ckpt.dir '", dir, "': cannot lock ", path, ": ", errno_text(err));
  }

  prove_writable(dir);
  const std::string record =
      str_cat("host=", this_host(), "\npid=", ::getpid(), "\nstarted=", utc_now_iso8601(), "\n", extra);
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, record.data(), record.size(), 0) != static_cast<ssize_t>(record.size()) ||
      ::fsync(fd) != 0)
    ST_BAD_INPUT("ckpt.dir '", dir, "' is not writable: cannot write ", path, ": ", errno_text(),
                 "; give ckpt.dir a directory this job can write");
  lock.record_ = record;
  return lock;
}

DirLock::DirLock(DirLock&& other) noexcept { *this = std::move(other); }

DirLock& DirLock::operator=(DirLock&& other) noexcept {
  if (this != &other) {
    leave_if_unused();
    fd_ = std::move(other.fd_);
    dir_ = std::exchange(other.dir_, std::string());
    created_ = std::exchange(other.created_, std::string());
    path_ = std::exchange(other.path_, std::string());
    record_ = std::exchange(other.record_, std::string());
  }
  return *this;
}

DirLock::~DirLock() { leave_if_unused(); }

// A job that wrote nothing into the directory (it stopped before step 1, or saved nothing) leaves it as it found it:
// the lock file is removed while still locked, then the directories this job created, where they are empty.
void DirLock::leave_if_unused() noexcept {
  if (!fd_ || record_.empty()) return;  // not held, or taken but refused before its record was written
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename() != kDirLockFile) return;
  if (ec) return;
  ::unlink(path_.c_str());
  fd_ = UniqueFd();
  if (created_.empty()) return;
  for (fs::path p = fs::absolute(dir_, ec); !ec && !p.empty(); p = p.parent_path()) {
    if (::rmdir(p.c_str()) != 0 || p.string() == created_) break;
  }
}

DirLock lock_checkpoint_dir(const std::string& dir, Communicator& comm) {
  if (dir.empty()) return DirLock();
  DirLock lock;
  on_all_ranks(
      comm,
      [&] {
        if (comm.rank() != 0) return;
        lock = DirLock::acquire(dir);
        ST_LOG_INFO("ckpt.dir ", dir, ": locked by this job (", lock.path(), ")");
      },
      "could not take ckpt.dir");

  // Every other machine must see the same directory: rank 0's record in its lock file.
  std::string record = lock.record();
  int64_t bytes = static_cast<int64_t>(record.size());
  comm.broadcast(&bytes, sizeof(bytes), 0);
  record.resize(static_cast<size_t>(bytes));
  comm.broadcast(record.data(), bytes, 0);
  on_all_ranks(
      comm,
      [&] {
        if (comm.node_id() == 0 || comm.local_rank() != 0) return;
        const std::string error = check_same_directory(dir, record, comm.node_id());
        if (!error.empty()) throw Error(ErrorKind::kBadInput, error);
      },
      "does not see rank 0's ckpt.dir");
  return lock;
}

namespace {

// The value of `key` in a lock record ("" if absent).
std::string record_value(const std::string& record, const std::string& key) {
  std::istringstream in(record);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + "=", 0) == 0) return line.substr(key.size() + 1);
  return "";
}

}  // namespace

DirLock lock_node_local_dirs(const std::string& pattern, Communicator& comm) {
  if (pattern.empty()) return DirLock();
  const NodeLayout layout = node_layout(comm);
  check_replica_layout(layout);
  // This job, as every node's record names it: rank 0's host, pid and start time.
  std::string job = comm.rank() == 0 ? str_cat(this_host(), ":", ::getpid(), ":", utc_now_iso8601()) : std::string();
  int64_t bytes = static_cast<int64_t>(job.size());
  comm.broadcast(&bytes, sizeof(bytes), 0);
  job.resize(static_cast<size_t>(bytes));
  comm.broadcast(job.data(), bytes, 0);

  const int node = comm.node_id();
  const bool leader = comm.local_rank() == 0;
  const std::string dir = node_ckpt_dir(pattern, node);
  DirLock lock;
  std::optional<Error> failed;
  if (leader) {
    try {
      lock = DirLock::acquire(dir, str_cat("job=", job, "\nnode=", node, "\n"));
    } catch (const Error& e) {
      failed = e;
    }
  }
  comm.barrier();  // every leader that took its lock has written its record
  on_all_ranks(
      comm,
      [&] {
        if (!leader) return;
        std::ifstream f((fs::path(dir) / kDirLockFile).string(), std::ios::binary);
        const std::string seen = f ? std::string(std::istreambuf_iterator<char>(f), {}) : std::string();
        const std::string other = record_value(seen, "node");
        if (record_value(seen, "job") == job && !other.empty() && other != std::to_string(node))
          ST_BAD_INPUT("ckpt.dir '", dir, "' is one directory for ", layout.describe_node(std::stoi(other)), " and ",
                       layout.describe_node(node),
                       ": with ckpt.replicas=1 each node keeps its files and a replica of the next node's in a "
                       "directory of its own, and a replica in the same directory as its source protects nothing. "
                       "Give each node a directory on its own disk (the same path on each machine), or put {node} "
                       "in ckpt.dir (e.g. ckpt/node{node}); a directory every node shares takes ckpt.replicas=0");
        if (failed) throw *failed;
        ST_LOG_INFO("ckpt.dir ", dir, ": locked by this job for node ", node, " (", lock.path(), ")");
      },
      "could not take its node's ckpt.dir");
  return lock;
}

}  // namespace st
