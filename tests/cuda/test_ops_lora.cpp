// LoRA's device kernels (kernels/cuda/lora_dropout.cu) against the host mask. Part of test_ops_cuda
// (its main calls test_lora_dropout).
#include "kernels/cuda/lora_dropout_cuda.hpp"
#include "kernels/lora_dropout.hpp"
#include "tests/cuda/ops_check.hpp"

using namespace opcheck;

// ---- LoRA dropout (lora_dropout.cu) ----
// The mask of kernels/lora_dropout.hpp on the host: the same elements dropped, the kept ones scaled;
// the backward adds the masked, scaled gradient into fp32 and bf16 dx.
void test_lora_dropout(size_t n, double p) {
  const uint64_t key = sb::kernels::dropout_key(99, 1, 4);
  const uint32_t thr = sb::kernels::dropout_threshold(p);
  const float inv = float(1.0 / (1.0 - p));
  const std::vector<double> x = randn(n, 1.0);  // bf16 values
  std::vector<double> xd(n), g = randn(n, 1.0, 0.0, false), d0 = randn(n, 1.0), d32(n), d16(n);
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool keep = sb::kernels::dropout_keep(key, i, thr);
    kept += keep;
    xd[i] = keep ? double(bfr(float(x[i]) * inv)) : 0.0;
    d32[i] = d0[i] + (keep ? double(float(g[i]) * inv) : 0.0);
    d16[i] = keep ? double(bfr(float(d0[i]) + float(g[i]) * inv)) : d0[i];
  }
  Dev<bf16> dx(to_b(x)), dxd(n), dd16(to_b(d0));
  Dev<float> dg(to_f(g)), dd32(to_f(d0));
  dxd.poison();
  C::lora_dropout_fwd(dx.p, dxd.p, n, key, thr, inv, g_stream);
  C::lora_dropout_bwd_add(dg.p, dd32.p, n, key, thr, inv, g_stream);
  C::lora_dropout_bwd_add(dg.p, dd16.p, n, key, thr, inv, g_stream);
  char name[128];
  std::snprintf(name, sizeof name, "lora_dropout_fwd n%zu p%.2f (kept %.3f)", n, p, double(kept) / double(n));
  report(name, compare(to_d(dxd.down()), xd), kTolF32);
  std::snprintf(name, sizeof name, "lora_dropout_bwd_add fp32 n%zu p%.2f", n, p);
  report(name, compare(to_d(dd32.down()), d32), kTolF32);
  std::snprintf(name, sizeof name, "lora_dropout_bwd_add bf16 n%zu p%.2f", n, p);
  report(name, compare(to_d(dd16.down()), d16), kTolBf16);
}
