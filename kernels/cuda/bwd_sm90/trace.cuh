// The wgmma backward's one trace hook (set_bwd_trace, attention_cuda.hpp; bench_attention_cuda
// --trace, bench/analysis/bwd_trace.py): thread 0 of each traced CTA stores 16 values, each stamp at once
// (nothing held in registers across the loop). Off (p.trace null): every call tests one pointer.
#pragma once
#include "kernels/cuda/attention_params.cuh"

namespace sb::kernels::cuda::bwd90 {

// The %clock64 slots; [0], [1] %globaltimer at the start and end, [2] %smid, [3] the tiles.
enum Stamp { kStart = 4, kFirstTile = 5, kLastTile = 6, kDqStaged = 7, kDrained = 8, kEnd = 9 };

struct Trace {
  unsigned long long* t;
  __device__ __forceinline__ Trace(unsigned long long* buf, int64_t ctas, int tid)
      : t(buf && tid == 0 && int64_t(blockIdx.x) < ctas ? buf + 16 * int64_t(blockIdx.x) : nullptr) {}
  static __device__ __forceinline__ unsigned long long globaltimer() {
    unsigned long long v;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
    return v;
  }
  __device__ __forceinline__ void stamp(Stamp s) const {
    if (t) t[s] = clock64();
  }
  __device__ __forceinline__ void start() const {
    if (t) {
      t[0] = globaltimer();
      stamp(kStart);
    }
  }
  // After every thread's stores were issued (a CTA barrier, only when tracing).
  __device__ __forceinline__ void end(const BwdParams& p, int niter) const {
    if (!p.trace) return;
    __syncthreads();
    if (t) {
      unsigned smid;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
      stamp(kEnd);
      t[1] = globaltimer();
      t[2] = smid;
      t[3] = unsigned(niter);
    }
  }
};

}  // namespace sb::kernels::cuda::bwd90
