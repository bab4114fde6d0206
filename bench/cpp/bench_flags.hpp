// Strict values for the bench programs' own flags (bench_attention_cuda, bench_fused_cuda,
// bench_cp_exchange, bench_checkpoint). With atoi a mistyped value read as 0 and the program timed
// something else without a word; here a value that is not a number in range, a flag without its
// value or an unknown flag stops the program with exit 2 and a line naming the program, the flag,
// the text and what is expected. C++17: bench_attention_cuda and bench_fused_cuda are nvcc sources.
#pragma once
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace sb::bench {

// The whole text s is a decimal integer in [lo, hi] (into *out).
inline bool whole(const char* s, long long lo, long long hi, long long* out) {
  errno = 0;
  char* end = nullptr;
  *out = std::strtoll(s, &end, 10);
  return *s && !*end && errno != ERANGE && *out >= lo && *out <= hi;
}
// The whole text s is a finite number in [lo, hi] (lo_open: lo excluded) (into *out).
inline bool real(const char* s, double lo, double hi, bool lo_open, double* out) {
  errno = 0;
  char* end = nullptr;
  *out = std::strtod(s, &end);
  return *s && !*end && errno != ERANGE && std::isfinite(*out) && *out >= lo && !(lo_open && *out == lo) && *out <= hi;
}

// Reads `prog [--flag value]...` left to right:
//   for (Flags f("prog", argc, argv); f.next();) if (f.is("--reps")) reps = int(f.integer(1, INT_MAX)); ...
class Flags {
 public:
  Flags(const char* prog, int argc, char** argv) : prog_(prog), argc_(argc), argv_(argv) {}

  // Moves to the next flag; false at the end.
  bool next() {
    if (i_ + 1 >= argc_) return false;
    flag_ = argv_[++i_];
    return true;
  }
  bool is(const char* name) const { return !std::strcmp(flag_, name); }

  // The text after the current flag.
  const char* text() {
    if (i_ + 1 >= argc_) {
      std::fprintf(stderr, "%s: %s needs a value\n", prog_, flag_);
      std::exit(2);
    }
    return argv_[++i_];
  }
  // A whole number in [lo, hi].
  long long integer(long long lo, long long hi) {
    const char* t = text();
    long long v = 0;
    if (!whole(t, lo, hi, &v)) fail(t, "a whole number " + range(double(lo), double(hi), false));
    return v;
  }
  // A number in [lo, hi]; lo_open: lo itself excluded.
  double number(double lo, double hi, bool lo_open) {
    const char* t = text();
    double v = 0;
    if (!real(t, lo, hi, lo_open, &v)) fail(t, "a number " + range(lo, hi, lo_open));
    return v;
  }
  // Comma-separated numbers in [lo, hi] (lo_open: lo excluded; integers: whole numbers only).
  std::vector<double> list(double lo, double hi, bool lo_open, bool integers) {
    const std::string t = text();
    std::vector<double> v;
    for (size_t p0 = 0;;) {
      const size_t p1 = t.find(',', p0);
      const std::string item = t.substr(p0, p1 == std::string::npos ? std::string::npos : p1 - p0);
      double x = 0;
      bool ok;
      if (integers) {
        long long n = 0;
        ok = whole(item.c_str(), (long long)std::ceil(lo), (long long)hi, &n);
        x = double(n);
      } else {
        ok = real(item.c_str(), lo, hi, lo_open, &x);
      }
      if (!ok)
        fail(t.c_str(), std::string("comma-separated ") + (integers ? "whole numbers " : "numbers ") +
                            range(lo, hi, lo_open));
      v.push_back(x);
      if (p1 == std::string::npos) return v;
      p0 = p1 + 1;
    }
  }
  [[noreturn]] void unknown() const {
    std::fprintf(stderr, "%s: unknown flag %s (its flags are listed at the top of its source file)\n", prog_, flag_);
    std::exit(2);
  }

 private:
  [[noreturn]] void fail(const char* t, const std::string& expected) const {
    std::fprintf(stderr, "%s: %s %s: expected %s\n", prog_, flag_, t, expected.c_str());
    std::exit(2);
  }
  // "no upper bound" is any hi from INT_MAX up
  static std::string range(double lo, double hi, bool lo_open) {
    char b[96];
    if (hi >= double(INT_MAX)) std::snprintf(b, sizeof b, "%s %g", lo_open ? ">" : ">=", lo);
    else std::snprintf(b, sizeof b, "%s %g and <= %g", lo_open ? ">" : ">=", lo, hi);
    return b;
  }

  const char* prog_;
  int argc_;
  char** argv_;
  int i_ = 0;
  const char* flag_ = "";
};

}  // namespace sb::bench
