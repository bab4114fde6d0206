// Block gating on the GPU, bit-compatible with kernels/cpu/gating.cpp: every double operation (and
// the per-token query's float ones) in the same order as there (explicit _rn intrinsics, so no FMA
// contraction), so scores, thresholds and the top-k choice match exactly; exp in the softmax
// (recall) may differ in the last bit.
//   pool_kernel: one CTA per (block, kv head), one thread per dimension: qbar (mean query) and the
//                key summary (mean, bounds or sub-block means: GatingParams) in double.
//   token_score_kernel (gate_score.cu, per-token query only): every pair's max over the query
//                block's tokens x group heads of the fp32 dots with the key rows, tiled (the CPU's
//                bits: each dot one thread's sequential sum of rounded products).
//   row_kernel:  one CTA per (block i, kv head): scores s_ij (j <= i) into shared memory (the
//                mean query: qbar_i . summary_j in double; per-token: the score stage's, read
//                back), anchors, the rank of each candidate (O(i^2) / threads), then thread 0 does
//                the softmax and recall sequentially, as the CPU does. Rows are written into
//                fixed-capacity slots (k + w + 2) and compacted into CSR on the host.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/gating_kernels.cuh"

namespace sb::kernels::cuda {
namespace {
using namespace gating;

// Stream-ordered scratch (the device's memory pool): cudaMalloc/cudaFree per call synchronised the
// whole device once per layer.
template <class T>
T* dmalloc(size_t n, cudaStream_t stream) {
  T* d = nullptr;
  SB_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&d), std::max<size_t>(n, 1) * sizeof(T), stream));
  return d;
}
}  // namespace

GatingStats gate_blocks(const bf16* q, const bf16* k, const int32_t* cu, int ndocs, AttnShape s, GatingParams gp,
                        BlockSelection& sel, cudaStream_t stream) {
  const int Bs = s.block_size, Hkv = s.n_kv_heads, D = s.head_dim;
  if (s.n_heads % Hkv != 0) throw Error("cuda::gate_blocks: n_heads % n_kv_heads != 0");
  std::vector<BlockInfo> blocks;
  std::vector<int32_t> block_base(ndocs + 1, 0);
  sel.doc_row_base.assign(ndocs + 1, 0);
  int max_nb = 0;
  for (int d = 0; d < ndocs; d++) {
    const int L = cu[d + 1] - cu[d], nb = L > 0 ? (L + Bs - 1) / Bs : 0;
    for (int i = 0; i < nb; i++) blocks.push_back({d, i, cu[d] + i * Bs, std::min(Bs, L - i * Bs), nb, cu[d], L, 0});
    block_base[d + 1] = block_base[d] + nb;
    sel.doc_row_base[d + 1] = sel.doc_row_base[d] + int64_t(Hkv) * nb;
    max_nb = std::max(max_nb, nb);
  }
  const int64_t rows = sel.doc_row_base[ndocs];
  const int kk = std::max(gp.k, 0), w = std::max(gp.local_blocks, 0);
  const int cap = kk + w + 2;
  GatingStats st;
  sel.row_ptr.assign(rows + 1, 0);
  sel.cols.clear();
  sel.recall.assign(rows, 0.f);
  if (blocks.empty()) return st;

  BlockInfo* dblocks = dmalloc<BlockInfo>(blocks.size(), stream);
  int32_t* dbase = dmalloc<int32_t>(block_base.size(), stream);
  int64_t* drow = dmalloc<int64_t>(sel.doc_row_base.size(), stream);
  const int R = key_summary_rows(gp, Bs);
  const bool per_token = gp.query == GateQuery::max;
  double* qbar = per_token ? nullptr : dmalloc<double>(blocks.size() * Hkv * D, stream);
  double* kbar = dmalloc<double>(blocks.size() * Hkv * R * D, stream);
  // the per-token query's score stage: pair offsets, tiles, scores
  const std::vector<int64_t> pair_base = pair_bases(block_base, Hkv);
  const std::vector<ScoreTile> tiles = per_token ? score_tiles(blocks, R, gp.key == GateKey::bounds) : std::vector<ScoreTile>();
  int64_t* dpair = dmalloc<int64_t>(pair_base.size(), stream);
  ScoreTile* dtiles = per_token ? dmalloc<ScoreTile>(tiles.size(), stream) : nullptr;
  uint32_t* dscore = per_token ? dmalloc<uint32_t>(size_t(pair_base[ndocs]), stream) : nullptr;
  int32_t* ocols = dmalloc<int32_t>(size_t(rows) * cap, stream);
  int32_t* ocnt = dmalloc<int32_t>(rows, stream);
  float* orec = dmalloc<float>(rows, stream);
  SB_CUDA_CHECK(cudaMemcpyAsync(dblocks, blocks.data(), blocks.size() * sizeof(BlockInfo), cudaMemcpyHostToDevice, stream));
  SB_CUDA_CHECK(cudaMemcpyAsync(dbase, block_base.data(), block_base.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  SB_CUDA_CHECK(cudaMemcpyAsync(drow, sel.doc_row_base.data(), sel.doc_row_base.size() * sizeof(int64_t),
                                cudaMemcpyHostToDevice, stream));
  SB_CUDA_CHECK(cudaMemcpyAsync(dpair, pair_base.data(), pair_base.size() * sizeof(int64_t), cudaMemcpyHostToDevice, stream));
  if (per_token)
    SB_CUDA_CHECK(cudaMemcpyAsync(dtiles, tiles.data(), tiles.size() * sizeof(ScoreTile), cudaMemcpyHostToDevice, stream));
  const dim3 grid(unsigned(blocks.size()), unsigned(Hkv));
  pool_kernel<<<grid, std::min(D, 128), 0, stream>>>(q, k, dblocks, s.n_heads, Hkv, D, int(gp.key), R, Bs / R, qbar,
                                                      kbar);
  SB_CUDA_CHECK_LAUNCH("pool_kernel");
  if (per_token)
    token_scores(q, kbar, dblocks, dbase, dpair, dtiles, int(tiles.size()), pair_base[ndocs], s.n_heads, Hkv, D, R,
                 gp.key == GateKey::bounds, dscore, stream);
  RowParams rp{dblocks, dbase, drow, qbar, kbar, Hkv, D, kk, gp.local_blocks, cap, gp.theta,
               1.0 / std::sqrt(double(D)), ocols, ocnt, orec, nullptr, 0, 0, nullptr, nullptr,
               dscore, dpair, int(gp.key), R};
  const size_t smem = row_smem_bytes(D, max_nb);
  if (smem > 48 * 1024)
    SB_CUDA_CHECK(cudaFuncSetAttribute(row_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  row_kernel<<<grid, 128, smem, stream>>>(rp);
  SB_CUDA_CHECK_LAUNCH("row_kernel");
  std::vector<int32_t> hcols(size_t(rows) * cap), hcnt(rows);
  SB_CUDA_CHECK(cudaMemcpyAsync(hcols.data(), ocols, hcols.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  SB_CUDA_CHECK(cudaMemcpyAsync(hcnt.data(), ocnt, hcnt.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  SB_CUDA_CHECK(cudaMemcpyAsync(sel.recall.data(), orec, rows * sizeof(float), cudaMemcpyDeviceToHost, stream));
  SB_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (void* ptr : {(void*)dblocks, (void*)dbase, (void*)drow, (void*)qbar, (void*)kbar, (void*)ocols, (void*)ocnt,
                    (void*)orec, (void*)dpair, (void*)dtiles, (void*)dscore})
    if (ptr) SB_CUDA_CHECK(cudaFreeAsync(ptr, stream));

  for (int64_t r = 0; r < rows; r++) {
    if (hcnt[r] < 0 || hcnt[r] > cap) throw Error("cuda::gate_blocks: row overflow");
    sel.cols.insert(sel.cols.end(), hcols.begin() + r * cap, hcols.begin() + r * cap + hcnt[r]);
    sel.row_ptr[r + 1] = int64_t(sel.cols.size());
  }
  for (int d = 0; d < ndocs; d++) {
    const int nb = block_base[d + 1] - block_base[d];
    for (int64_t r = sel.doc_row_base[d]; r < sel.doc_row_base[d + 1]; r++) {
      const int i = int((r - sel.doc_row_base[d]) % nb);
      st.rows += 1;
      st.kept_blocks += double(sel.row_ptr[r + 1] - sel.row_ptr[r]);
      st.causal_blocks += i + 1;
      st.recall_sum += sel.recall[r];
    }
  }
  return st;
}

}  // namespace sb::kernels::cuda
