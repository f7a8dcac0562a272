#include "shardtrain/ckpt/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <sstream>
#include <utility>

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

bool no_lock_support(int err) { return err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS; }

// Creating and removing a directory is what a save does first; a directory that refuses it (read-only
// mount, permissions, a full disk or quota) is found here, before step 1, instead of after the training.
void prove_writable(const std::string& dir) {
  std::string probe = (fs::path(dir) / ".write-probe-XXXXXX").string();
  if (::mkdtemp(probe.data()) == nullptr)
    ST_BAD_INPUT("ckpt.dir '", dir, "' is not writable: cannot create a directory in it: ", std::strerror(errno),
                 "; give ckpt.dir a directory this job can write");
  ::rmdir(probe.c_str());
}

}  // namespace

DirLock DirLock::acquire(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    fs::create_directories(dir, ec);
    if (ec) ST_BAD_INPUT("ckpt.dir '", dir, "' cannot be created: ", ec.message());
  }
  if (!fs::is_directory(dir, ec))
    ST_BAD_INPUT("ckpt.dir '", dir, "' is not a directory", ec ? ": " + ec.message() : std::string(" (it is a file)"),
                 "; give ckpt.dir a directory path");

  const std::string path = (fs::path(dir) / kDirLockFile).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0)
    ST_BAD_INPUT("ckpt.dir '", dir, "' is not writable: cannot open ", path, " for writing: ", std::strerror(errno),
                 "; give ckpt.dir a directory this job can write");
  DirLock lock;
  lock.fd_ = fd;  // closed by ~DirLock on every path below
  lock.path_ = path;

  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
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
                   std::strerror(err),
                   "). shardtrain locks ckpt.dir so that no two jobs write into it at once: "
                   "put ckpt.dir on a filesystem with locking (on NFS, a server and client with the lock service "
                   "running; docs/checkpoint-format.md, \"Checkpoint directory\")");
    ST_BAD_INPUT("ckpt.dir '", dir, "': cannot lock ", path, ": ", std::strerror(err));
  }

  prove_writable(dir);
  const std::string record = str_cat("host=", this_host(), "\npid=", ::getpid(), "\nstarted=", utc_now_iso8601(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, record.data(), record.size(), 0) != static_cast<ssize_t>(record.size()) ||
      ::fsync(fd) != 0)
    ST_BAD_INPUT("ckpt.dir '", dir, "' is not writable: cannot write ", path, ": ", std::strerror(errno),
                 "; give ckpt.dir a directory this job can write");
  return lock;
}

DirLock::DirLock(DirLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::exchange(other.path_, std::string())) {}

DirLock& DirLock::operator=(DirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::exchange(other.path_, std::string());
  }
  return *this;
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);
}

DirLock lock_checkpoint_dir(const std::string& dir, Communicator& comm) {
  if (dir.empty()) return DirLock();
  DirLock lock;
  std::string error;
  int64_t head[2] = {0, static_cast<int64_t>(ErrorKind::kBadInput)};  // message bytes, error kind
  if (comm.rank() == 0) {
    try {
      lock = DirLock::acquire(dir);
      ST_LOG_INFO("ckpt.dir ", dir, ": locked by this job (", lock.path(), ")");
    } catch (const Error& e) {
      error = e.what();
      head[1] = static_cast<int64_t>(e.kind());
    } catch (const std::exception& e) {
      error = e.what();
      head[1] = static_cast<int64_t>(ErrorKind::kInternal);
    }
    head[0] = static_cast<int64_t>(error.size());
  }
  // Every rank learns rank 0's outcome, so all stop together with its message.
  comm.broadcast(head, sizeof(head), 0);
  if (head[0] == 0) return lock;
  error.resize(static_cast<size_t>(head[0]));
  comm.broadcast(error.data(), head[0], 0);
  const auto kind = static_cast<ErrorKind>(head[1]);
  if (comm.rank() == 0) throw Error(kind, error);
  throw Error(kind, str_cat(process_prefix(), " stopped: rank 0 could not take ckpt.dir: ", error));
}

}  // namespace st
