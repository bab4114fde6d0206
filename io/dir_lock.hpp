// One run owns its checkpoint directory (io/RELIABILITY.md, "One run per checkpoint directory").
// Rank 0 holds DIR/.sparsebalance.lock for the whole run with a POSIX record lock (fcntl F_SETLK,
// a write lock over the whole file): the kernel (or the NFS/Lustre lock manager) releases it when
// the process ends in any way, kill -9 included, so a lock left by a dead job is free and never
// blocks its requeued successor; the file's text (host, pid, start time, command) only names the
// holder in the message a second run gets.
#pragma once
#include <string>

namespace sb {

class DirLock {
 public:
  DirLock() = default;
  // Creates DIR (and parents) and takes DIR/.sparsebalance.lock. Throws naming DIR and the
  // holder's host, pid, start time and command when another process holds it. When the lock
  // cannot be taken for another reason (DIR cannot be made, a file system without POSIX locks)
  // it is not held and why() says why: the caller warns and goes on (the checkpoint writes then
  // fail or not on their own, as checkpoint.on_error says). `stale`, when
  // given, receives the holder text of a run that ended without releasing the lock (killed, or
  // ended by an error on some rank): its lock is gone, so this run took it; "" otherwise. A run
  // that ends normally empties the file when it releases the lock.
  DirLock(const std::string& dir, const std::string& command, std::string* stale = nullptr);
  ~DirLock();
  DirLock(DirLock&& o) noexcept;
  DirLock& operator=(DirLock&& o) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  bool held() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  const std::string& why() const { return why_; }  // "" when held and recorded

  static constexpr const char* kName = ".sparsebalance.lock";

 private:
  int fd_ = -1;
  std::string path_, why_;
};

}  // namespace sb
