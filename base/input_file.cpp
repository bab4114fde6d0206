#include "base/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.hpp"

namespace sb {

// What a stat says about a path that is not a readable regular file within `max_bytes`, or "".
static std::string refusal(const struct stat& st, uint64_t max_bytes) {
  if (S_ISDIR(st.st_mode)) return "not a regular file (a directory)";
  if (S_ISFIFO(st.st_mode)) return "not a regular file (a FIFO: reading it would block until a writer comes)";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "not a regular file (a device)";
  if (S_ISSOCK(st.st_mode)) return "not a regular file (a socket)";
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  if (max_bytes > 0 && uint64_t(st.st_size) > max_bytes)
    return "holds " + std::to_string(st.st_size) + " bytes, more than a file read here may hold (" +
           std::to_string(max_bytes) + ")";
  return "";
}

void check_input_file(const std::string& path, const std::string& expected, uint64_t max_bytes) {
  if (path.empty()) throw Error("an empty path; expected " + expected);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw Error(path + ": cannot open: " + (errno == ENOENT ? std::string("no such file") : std::strerror(errno)) +
                "; expected " + expected);
  if (auto why = refusal(st, max_bytes); !why.empty()) throw Error(path + ": " + why + "; expected " + expected);
}

std::string read_input_file(const std::string& path, const std::string& expected, uint64_t max_bytes) {
  check_input_file(path, expected, max_bytes);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno) + "; expected " + expected);
  struct stat st {};
  std::string why = ::fstat(fd, &st) != 0 ? std::string(std::strerror(errno)) : refusal(st, max_bytes);
  std::string out;
  if (why.empty()) {
    out.resize(size_t(st.st_size));
    size_t got = 0;
    while (got < out.size()) {  // a file that shrinks while read ends early; one that grows is cut at its size
      const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) why = std::string("read failed: ") + std::strerror(errno);
      if (n <= 0) break;
      got += size_t(n);
    }
    out.resize(got);
  }
  ::close(fd);
  if (!why.empty()) throw Error(path + ": " + why + "; expected " + expected);
  return out;
}

}  // namespace sb
