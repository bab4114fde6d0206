#include "io/dir_lock.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <utility>

#include "base/error.hpp"

namespace sb {

namespace {

std::string read_fd(int fd) {
  std::string out;
  char buf[4096];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, at);
    if (n <= 0 || out.size() > 65536) break;
    out.append(buf, size_t(n)), at += n;
  }
  return out;
}

// "host=... pid=... started=... command=..." on one line, from the file's lines.
std::string one_line(std::string text) {
  while (!text.empty() && text.back() == '\n') text.pop_back();
  for (auto& c : text) c = c == '\n' ? ' ' : c;
  return text.empty() ? "(no holder recorded)" : text;
}

}  // namespace

DirLock::DirLock(const std::string& dir, const std::string& command, std::string* stale) {
  std::error_code ec;
  path_ = (std::filesystem::path(dir) / kName).string();
  std::filesystem::create_directories(dir, ec);
  if (ec) {  // no checkpoint can be written there either: checkpoint.on_error decides what happens
    why_ = dir + ": cannot create the checkpoint directory: " + ec.message();
    return;
  }
  // O_NOFOLLOW and O_NONBLOCK: a symlink or FIFO planted under the name neither redirects nor blocks us.
  const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) {
    why_ = path_ + ": cannot open the lock file: " + std::strerror(errno);
    return;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path_ + ": not a regular file; expected the lock file of checkpoint.dir (remove it)");
  }
  struct flock fl {};
  fl.l_type = F_WRLCK, fl.l_whence = SEEK_SET, fl.l_start = 0, fl.l_len = 0;  // the whole file
  if (::fcntl(fd, F_SETLK, &fl) != 0) {
    const int e = errno;
    const std::string holder = one_line(read_fd(fd));
    ::close(fd);
    if (e == EACCES || e == EAGAIN)
      throw Error("checkpoint.dir " + dir + " is in use by another run (" + holder + ", lock " + path_ +
                  "): one run owns a checkpoint directory; wait for it to end, stop it, or give this run another "
                  "checkpoint.dir");
    why_ = path_ + ": cannot lock: " + std::strerror(e) +
           " (a file system without POSIX fcntl locks? NFS needs lockd, Lustre the flock mount option)";
    return;
  }
  // Ours. A text left behind names a holder that is gone (its lock died with it).
  const std::string before = read_fd(fd);
  if (stale) *stale = before.empty() ? "" : one_line(before);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char when[32] = {};
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  const std::string text = "host=" + std::string(host) + "\npid=" + std::to_string(::getpid()) + "\nstarted=" + when +
                           "\ncommand=" + command + "\n";
  fd_ = fd;  // held from here on, even if the text below cannot be written (a full disk)
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != ssize_t(text.size()))
    why_ = path_ + ": locked, but its holder text could not be written: " + std::strerror(errno);
  ::fsync(fd);
}

DirLock::~DirLock() {
  // An emptied file says "released cleanly"; closing releases the lock. The file stays (removing
  // it would race with a run taking it).
  if (fd_ >= 0) (void)!::ftruncate(fd_, 0), ::close(fd_);
}

DirLock::DirLock(DirLock&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)), why_(std::move(o.why_)) {}
DirLock& DirLock::operator=(DirLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) (void)!::ftruncate(fd_, 0), ::close(fd_);
    fd_ = std::exchange(o.fd_, -1), path_ = std::move(o.path_), why_ = std::move(o.why_);
  }
  return *this;
}

}  // namespace sb
