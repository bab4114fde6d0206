// Each fused elementwise kernel (kernels/cuda/fused.cu) beside the unfused chain it replaces, on one
// layer's arrays of the 0.47B shape at 32K tokens (configs/gpu_0p5b.toml): GPU ms per call (CUDA
// events, median of REPS after a warm-up) and the ratio. The residual rows include the GEMM whose
// output the add reads (unfused: copy + GEMM beta 1 + norm; fused: GEMM beta 0 + add_rmsnorm_fwd).
//   bench_fused_cuda [--tokens N] [--dmodel C] [--ffn F] [--heads H] [--kv-heads Hkv] [--head-dim D]
//                    [--bias] [--reps R]
// Prints one markdown table. Needs a GPU (exit 77 without one).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "bench/cpp/bench_flags.hpp"
#include "kernels/cuda/attention_cuda.hpp"  // device_available
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/ops_cuda.hpp"

namespace C = sb::kernels::cuda;
using C::bf16;

namespace {

template <class T>
struct Buf {
  T* p = nullptr;
  explicit Buf(size_t n, float scale = 1.0f) {
    SB_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(n, 1) * sizeof(T)));
    std::vector<T> h(n);
    uint64_t s = 0x9E3779B97F4A7C15ull ^ n;  // any non-zero values: an LCG in [-scale, scale)
    for (auto& v : h) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      const float f = scale * (float(s >> 40) / float(1 << 24) * 2.0f - 1.0f);
      if constexpr (std::is_same_v<T, bf16>) v = __float2bfloat16(f);
      else v = f;
    }
    SB_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

// Median GPU ms of one call of f on stream s over reps calls (after 3 warm-up calls).
double time_ms(cudaStream_t s, int reps, const std::function<void()>& f) {
  for (int i = 0; i < 3; i++) f();
  cudaEvent_t a, b;
  SB_CUDA_CHECK(cudaEventCreate(&a));
  SB_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < reps; i++) {
    SB_CUDA_CHECK(cudaEventRecord(a, s));
    f();
    SB_CUDA_CHECK(cudaEventRecord(b, s));
    SB_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    SB_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int N = 32768, Cm = 1280, F = 3584, H = 10, Hkv = 2, D = 128, reps = 20;
  bool bias = false;
  for (sb::bench::Flags f("bench_fused_cuda", argc, argv); f.next();) {
    if (f.is("--tokens")) N = int(f.integer(1, INT_MAX));
    else if (f.is("--dmodel")) Cm = int(f.integer(1, INT_MAX));
    else if (f.is("--ffn")) F = int(f.integer(1, INT_MAX));
    else if (f.is("--heads")) H = int(f.integer(1, 1024));
    else if (f.is("--kv-heads")) Hkv = int(f.integer(1, 1024));
    else if (f.is("--head-dim")) D = int(f.integer(1, 1024));
    else if (f.is("--reps")) reps = int(f.integer(1, INT_MAX));
    else if (f.is("--bias")) bias = true;
    else f.unknown();
  }
  std::string why;
  if (!C::device_available(&why)) {
    std::printf("SKIP: no usable CUDA device (%s)\n", why.c_str());
    return 77;
  }
  try {
    cudaStream_t s;
    SB_CUDA_CHECK(cudaStreamCreate(&s));
    C::Blas bl(s);
    const size_t NC = size_t(N) * Cm, NF = size_t(N) * F, HD = size_t(H) * D, KD = size_t(Hkv) * D;
    Buf<float> x(NC), xm(NC), w(Cm, 1.0f), rstd(N, 1.0f), dy(NC), dx(NC), dw(Cm), bq(HD, 0.1f), bk(KD, 0.1f),
        bv(KD, 0.1f);
    Buf<bf16> y(NC), att(size_t(N) * HD), wo(size_t(Cm) * HD, 0.02f), dx16(NC), q(size_t(N) * HD), k(size_t(N) * KD),
        v(size_t(N) * KD), gate(NF), up(NF), h(NF), dh(NF), dg(NF), du(NF);
    std::vector<int32_t> hp(N);
    for (int t = 0; t < N; t++) hp[t] = t;
    int32_t* pos = nullptr;
    SB_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&pos), N * sizeof(int32_t)));
    SB_CUDA_CHECK(cudaMemcpy(pos, hp.data(), N * sizeof(int32_t), cudaMemcpyHostToDevice));
    // RoPE's plain table theta^(-2d/D), theta 1e6, on the device as the model keeps it (src/model/rope.hpp)
    std::vector<double> freq(size_t(D / 2));
    for (int d = 0; d < D / 2; d++) freq[size_t(d)] = std::pow(1e6, -2.0 * d / D);
    double* dfreq = nullptr;
    SB_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dfreq), freq.size() * sizeof(double)));
    SB_CUDA_CHECK(cudaMemcpy(dfreq, freq.data(), freq.size() * sizeof(double), cudaMemcpyHostToDevice));
    const sb::kernels::RopeFreqs rope{dfreq, 1.0};
    const float eps = 1e-5f;
    const int HDi = int(HD), KDi = int(KD);
    struct Row {
      const char* name;
      int per_layer;  // calls per layer and micro-batch (0: a row inside another)
      std::function<void()> unfused, fused;
    };
    const std::vector<Row> rows = {
        {"residual + rmsnorm + bf16 (with the o GEMM)", 2,
         [&] {
           SB_CUDA_CHECK(cudaMemcpyAsync(xm.p, x.p, NC * sizeof(float), cudaMemcpyDeviceToDevice, s));
           C::gemm(bl, false, true, N, Cm, HDi, 1.f, att.p, HDi, wo.p, HDi, 1.f, xm.p, Cm);
           C::rmsnorm_fwd(xm.p, w.p, y.p, rstd.p, N, Cm, eps, s);
         },
         [&] {
           C::gemm(bl, false, true, N, Cm, HDi, 1.f, att.p, HDi, wo.p, HDi, 0.f, xm.p, Cm);
           C::add_rmsnorm_fwd(xm.p, x.p, w.p, y.p, rstd.p, N, Cm, eps, s);
         }},
        {"residual + rmsnorm + bf16 (elementwise only)", 0,
         [&] {
           SB_CUDA_CHECK(cudaMemcpyAsync(xm.p, x.p, NC * sizeof(float), cudaMemcpyDeviceToDevice, s));
           C::rmsnorm_fwd(xm.p, w.p, y.p, rstd.p, N, Cm, eps, s);
         },
         [&] { C::add_rmsnorm_fwd(xm.p, x.p, w.p, y.p, rstd.p, N, Cm, eps, s); }},
        {"rmsnorm backward + dw + bf16(dx)", 2,
         [&] {
           C::rmsnorm_bwd(x.p, w.p, rstd.p, dy.p, dx.p, dw.p, N, Cm, s);
           C::to_bf16(dx.p, dx16.p, NC, s);
         },
         [&] { C::rmsnorm_bwd_fused(x.p, w.p, rstd.p, dy.p, dx.p, dx16.p, dw.p, N, Cm, s); }},
        {bias ? "q/k/v bias + RoPE q, k" : "RoPE q, k", 1,
         [&] {
           if (bias) {
             C::bias_add_fwd(q.p, bq.p, N, HDi, s);
             C::bias_add_fwd(k.p, bk.p, N, KDi, s);
             C::bias_add_fwd(v.p, bv.p, N, KDi, s);
           }
           C::rope_fwd(q.p, pos, N, H, D, rope, s);
           C::rope_fwd(k.p, pos, N, Hkv, D, rope, s);
         },
         [&] {
           C::qkv_rope_fwd(q.p, k.p, v.p, bias ? bq.p : nullptr, bias ? bk.p : nullptr, bias ? bv.p : nullptr, pos, N,
                           H, Hkv, D, rope, s);
         }},
        {"RoPE backward dq, dk", 1,
         [&] {
           C::rope_bwd(q.p, pos, N, H, D, rope, s);
           C::rope_bwd(k.p, pos, N, Hkv, D, rope, s);
         },
         [&] { C::qk_rope_bwd(q.p, k.p, pos, N, H, Hkv, D, rope, s); }},
        {"SwiGLU forward (16-byte loads)", 1, [&] { C::swiglu_fwd(gate.p, up.p, h.p, NF, s); },
         [&] { C::swiglu_fwd_wide(gate.p, up.p, h.p, NF, s); }},
        {"SwiGLU backward (16-byte loads)", 1, [&] { C::swiglu_bwd(gate.p, up.p, dh.p, dg.p, du.p, NF, s); },
         [&] { C::swiglu_bwd_wide(gate.p, up.p, dh.p, dg.p, du.p, NF, s); }},
    };
    std::printf("N %d, C %d, F %d, heads %d/%d x %d%s; GPU ms per call, median of %d\n\n", N, Cm, F, H, Hkv, D,
                bias ? ", q/k/v bias" : "", reps);
    std::printf("| chain | unfused ms | fused ms | fused / unfused |\n|---|---:|---:|---:|\n");
    double tu = 0, tf = 0;  // per layer and micro-batch
    for (const Row& r : rows) {
      const double a = time_ms(s, reps, r.unfused), b = time_ms(s, reps, r.fused);
      tu += r.per_layer * a, tf += r.per_layer * b;
      std::printf("| %s | %.3f | %.3f | %.3f |\n", r.name, a, b, b / a);
    }
    std::printf("| one layer (2 residual + norm, 2 norm backward, RoPE fwd + bwd, SwiGLU fwd + bwd) | %.3f | %.3f | %.3f |\n",
                tu, tf, tf / tu);
    cudaFree(pos);
    cudaFree(dfreq);
    SB_CUDA_CHECK(cudaStreamDestroy(s));
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  return 0;
}
