// Helpers of the CUDA op tests (test_ops_cuda.cpp, test_ops_fused.cpp; one program): random inputs,
// device buffers, the relative-error comparison and the OK/FAIL report (see test_ops_cuda.cpp).
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/attention_cuda.hpp"  // device_available
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/ops_cuda.hpp"
#include "kernels/kernels.hpp"

namespace opcheck {

namespace K = sb::kernels;
namespace C = sb::kernels::cuda;
using C::bf16;

inline constexpr double kTolBf16 = 1e-2;   // bf16 outputs
inline constexpr double kTolGemm32 = 1e-3; // GEMM, fp32 output
inline constexpr double kTolF32 = 1e-5;    // fp32-output math

inline int g_fails = 0;
inline bool g_quick = false;
inline std::mt19937_64 g_rng;

// ---- host helpers ----
inline float bfr(double x) { return __bfloat162float(__float2bfloat16(float(x))); }
inline uint16_t bits(bf16 x) {
  uint16_t u;
  std::memcpy(&u, &x, 2);
  return u;
}
inline uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// n values ~ N(mean, sd), rounded to bf16 when `round_bf16`.
inline std::vector<double> randn(size_t n, double sd, double mean = 0, bool round_bf16 = true) {
  std::normal_distribution<double> D(mean, sd);
  std::vector<double> x(n);
  for (auto& v : x) v = round_bf16 ? double(bfr(D(g_rng))) : double(float(D(g_rng)));
  return x;
}
inline std::vector<float> to_f(const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); }
inline std::vector<bf16> to_b(const std::vector<double>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); i++) y[i] = __float2bfloat16(float(x[i]));
  return y;
}
inline std::vector<double> to_d(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }
inline std::vector<double> to_d(const std::vector<bf16>& x) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); i++) y[i] = __bfloat162float(x[i]);
  return y;
}

// A device buffer of n T's (RAII, so a thrown check leaks nothing).
template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t n_) : n(n_) {
    SB_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(n, 1) * sizeof(T)));
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { up(h); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void up(const std::vector<T>& h) {
    SB_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  void poison() { SB_CUDA_CHECK(cudaMemset(p, 0xFF, n * sizeof(T))); }  // NaN (fp32, bf16), -1 (int32)
  std::vector<T> down() const {
    SB_CUDA_CHECK(cudaDeviceSynchronize());  // the work runs on a stream; also surfaces kernel faults
    std::vector<T> h(n);
    SB_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

struct Err {
  double rel = 0;
  size_t bad = 0;  // NaN / inf in the GPU output (unwritten, poisoned) or a non-finite mismatch
};
inline Err compare(const std::vector<double>& gpu, const std::vector<double>& ref) {
  Err e;
  double num = 0, den = 0;
  if (gpu.size() != ref.size()) {
    e.bad = std::max(gpu.size(), ref.size());
    return e;
  }
  for (size_t i = 0; i < ref.size(); i++) {
    const double g = gpu[i], r = ref[i];
    if (!std::isfinite(g) || !std::isfinite(r)) {
      e.bad++;
      continue;
    }
    num += (g - r) * (g - r);
    den += r * r;
  }
  e.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

// One line per check; counts failures.
inline bool report(const std::string& name, const Err& e, double tol, size_t extra_bad = 0,
            const std::string& note = "") {
  const size_t bad = e.bad + extra_bad;
  const bool ok = bad == 0 && e.rel <= tol;
  std::printf("%-4s %-52s rel err %.2e (tol %.0e) bad %zu%s%s\n", ok ? "OK" : "FAIL", name.c_str(), e.rel, tol,
              bad, note.empty() ? "" : " | ", note.c_str());
  g_fails += !ok;
  return ok;
}

inline cudaStream_t g_stream = nullptr;

// Positions where two bf16 arrays differ bitwise (all of them when the sizes differ).
inline size_t bits_differ(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  size_t n = a.size() == b.size() ? 0 : std::max(a.size(), b.size());
  for (size_t i = 0; i < a.size() && i < b.size(); i++) n += bits(a[i]) != bits(b[i]);
  return n;
}

}  // namespace opcheck
