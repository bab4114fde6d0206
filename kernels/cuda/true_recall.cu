// True recall of sampled selection rows on the GPU, the twin of kernels/cpu/true_recall.cpp: the
// dense softmax mass on a row's kept blocks, averaged over the row's query tokens and its kv group's
// heads. One CTA per sampled row; one thread per (query token, head) pair walks the keys 0..t of its
// document once with an online softmax (max, sum over all keys, sum over the kept ones), in fp32 from
// the bf16 q and k; the row's kept blocks are a byte map in shared memory.
#include <algorithm>
#include <vector>

#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace sb::kernels::cuda {
namespace {

struct RowJob {
  int32_t doc_begin, doc_len, g, i;  // the row's place (kernels::RowPlace)
  int64_t row;                       // its index into the selection's row_ptr
};

__global__ void true_recall_kernel(const bf16* q, const bf16* k, const RowJob* jobs, const int64_t* row_ptr,
                                   const int32_t* cols, int H, int Hkv, int D, int Bs, float* out) {
  extern __shared__ unsigned char kept[];  // (i + 1) flags
  __shared__ float total;
  const RowJob jb = jobs[blockIdx.x];
  for (int j = threadIdx.x; j <= jb.i; j += blockDim.x) kept[j] = 0;
  if (threadIdx.x == 0) total = 0.f;
  __syncthreads();
  for (int64_t c = row_ptr[jb.row] + threadIdx.x; c < row_ptr[jb.row + 1]; c += blockDim.x) kept[cols[c]] = 1;
  __syncthreads();
  const int G = H / Hkv, t_lo = jb.i * Bs, n = min(jb.doc_len, t_lo + Bs) - t_lo;
  const float scale = rsqrtf(float(D));
  float mine = 0.f;
  for (int p = threadIdx.x; p < n * G; p += blockDim.x) {
    const int t = t_lo + p / G, h = jb.g * G + p % G;
    const bf16* qt = q + (int64_t(jb.doc_begin + t) * H + h) * D;
    float m = -INFINITY, all = 0.f, in = 0.f;
    for (int j = 0; j <= t; j++) {
      const bf16* kj = k + (int64_t(jb.doc_begin + j) * Hkv + jb.g) * D;
      float acc = 0.f;
      for (int d = 0; d < D; d++) acc += __bfloat162float(qt[d]) * __bfloat162float(kj[d]);
      const float sc = acc * scale;
      if (sc > m) {  // rescale both sums to the new max
        const float r = __expf(m - sc);
        all *= r, in *= r, m = sc;
      }
      const float e = __expf(sc - m);
      all += e;
      if (kept[j / Bs]) in += e;
    }
    mine += in / all;
  }
  atomicAdd(&total, mine);
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = total / float(n * G);
}

}  // namespace

void true_recall(const bf16* q, const bf16* k, const int32_t* cu_seqlens_host, int ndocs, AttnShape s,
                 const DeviceSelection& sel, const int64_t* rows_host, int nrows, float* out_host, cudaStream_t stream) {
  if (nrows <= 0) return;
  // The rows' places from cu_seqlens alone (row(d, g, i) = base[d] + g * nb(d) + i).
  std::vector<int64_t> base(size_t(ndocs) + 1, 0);
  for (int d = 0; d < ndocs; d++)
    base[size_t(d) + 1] = base[size_t(d)] + int64_t(s.n_kv_heads) * ((cu_seqlens_host[d + 1] - cu_seqlens_host[d] + s.block_size - 1) / s.block_size);
  std::vector<RowJob> jobs(static_cast<size_t>(nrows));
  int max_i = 0;
  for (int n = 0; n < nrows; n++) {
    const int64_t r = rows_host[n];
    const int d = int(std::upper_bound(base.begin(), base.end(), r) - base.begin()) - 1;
    const int L = cu_seqlens_host[d + 1] - cu_seqlens_host[d], nb = (L + s.block_size - 1) / s.block_size;
    jobs[size_t(n)] = {cu_seqlens_host[d], L, int((r - base[size_t(d)]) / nb), int((r - base[size_t(d)]) % nb), r};
    max_i = std::max(max_i, jobs[size_t(n)].i);
  }
  RowJob* dj = nullptr;
  float* dout = nullptr;
  SB_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&dj), jobs.size() * sizeof(RowJob), stream));
  SB_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&dout), size_t(nrows) * sizeof(float), stream));
  SB_CUDA_CHECK(cudaMemcpyAsync(dj, jobs.data(), jobs.size() * sizeof(RowJob), cudaMemcpyHostToDevice, stream));
  const int G = s.n_heads / s.n_kv_heads, threads = std::min(1024, std::max(32, (s.block_size * G + 31) / 32 * 32));
  true_recall_kernel<<<nrows, threads, size_t(max_i) + 1, stream>>>(q, k, dj, sel.row_ptr, sel.cols, s.n_heads,
                                                                    s.n_kv_heads, s.head_dim, s.block_size, dout);
  SB_CUDA_CHECK(cudaGetLastError());
  SB_CUDA_CHECK(cudaMemcpyAsync(out_host, dout, size_t(nrows) * sizeof(float), cudaMemcpyDeviceToHost, stream));
  SB_CUDA_CHECK(cudaFreeAsync(dj, stream));
  SB_CUDA_CHECK(cudaFreeAsync(dout, stream));
  SB_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace sb::kernels::cuda
