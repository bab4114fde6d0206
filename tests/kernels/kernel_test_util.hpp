// Helpers of the kernel tests: seeded random inputs (never zero) and central finite differences.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace sbtest {

struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t seed) : gen(seed) {}
  // Uniform magnitude in [0.1, 1], random sign: never zero, never tiny.
  double value() {
    double m = std::uniform_real_distribution<double>(0.1, 1.0)(gen);
    return (gen() & 1) ? m : -m;
  }
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(gen); }
  int integer(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); }  // [lo, hi]
  template <class T = double>
  std::vector<T> vec(size_t n, double scale = 1.0) {
    std::vector<T> v(n);
    for (auto& x : v) x = T(scale * value());
    return v;
  }
};

// max |a - b| / max |b| (b the trusted one); 0 when both are empty.
template <class A, class B>
double rel_err(const std::vector<A>& a, const std::vector<B>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); i++) {
    num = std::max(num, std::abs(double(a[i]) - double(b[i])));
    den = std::max(den, std::abs(double(b[i])));
  }
  return den > 0 ? num / den : num;
}

// Central differences of loss() with respect to every entry of x, compared with grad:
// returns max |fd - grad| / max |fd|.
inline double fd_check(std::vector<double>& x, const std::vector<double>& grad, const std::function<double()>& loss,
                       double h = 1e-5) {
  std::vector<double> fd(x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss();
    x[i] = x0 - h;
    const double lm = loss();
    x[i] = x0;
    fd[i] = (lp - lm) / (2 * h);
  }
  return rel_err(grad, fd);
}

// sum(a * w): the scalar loss whose gradient with respect to a is w.
inline double dot(const std::vector<double>& a, const std::vector<double>& w) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * w[i];
  return s;
}

}  // namespace sbtest
