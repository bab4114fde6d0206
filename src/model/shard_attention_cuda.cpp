// Attention of a sharded document on the GPU (context parallelism; the CPU path and the method are
// in shard_attention.cpp). The same steps on device buffers: K and V of the whole document gathered
// through the trainer's ShardExchange<float>, the selection built over the whole document with only
// this rank's query rows kept (keep_own_rows, shared with the CPU), the ordinary CUDA kernels, and
// in the backward dK, dV reduce-scattered back to the keys' owners.
//
// The exchange is staged through host memory: bf16 rows down, widened to float, the same comm call
// as the CPU path (MPI allgatherv / reduce_scatter in src/train/shard.cpp), rounded to bf16 and up
// again. That is what runs when several ranks share one GPU, and it keeps the model free of
// communication; an NCCL all-gather on device buffers (one GPU per rank) is not built yet.
#include <cuda_bf16.h>

#include "base/cuda_check.hpp"
#include "src/model/model_cuda.hpp"
#include "src/model/shard_attention.hpp"

namespace sb {

namespace kc = kernels::cuda;
using bf16 = kc::bf16;

namespace {

// Device rows (n values, bf16) -> host floats in h.mine or h.whole (`out`).
void to_host(const bf16* d, size_t n, ShardScratchCuda& h, std::vector<float>& out, cudaStream_t s) {
  h.h16.resize(n);
  SB_CUDA_CHECK(cudaMemcpyAsync(h.h16.data(), d, n * sizeof(bf16), cudaMemcpyDeviceToHost, s));
  SB_CUDA_CHECK(cudaStreamSynchronize(s));
  out.resize(n);
  for (size_t i = 0; i < n; ++i) out[i] = __bfloat162float(h.h16[i]);
}

// Host floats -> device rows (bf16); returns once the copy is done (h.h16 is reused).
void to_device(const std::vector<float>& in, bf16* d, ShardScratchCuda& h, cudaStream_t s) {
  h.h16.resize(in.size());
  for (size_t i = 0; i < in.size(); ++i) h.h16[i] = __float2bfloat16(in[i]);
  SB_CUDA_CHECK(cudaMemcpyAsync(d, h.h16.data(), in.size() * sizeof(bf16), cudaMemcpyHostToDevice, s));
  SB_CUDA_CHECK(cudaStreamSynchronize(s));
}

// This rank's packed rows (local_tokens x width) -> their document rows of `whole` (doc_len x
// width); the other rows of `whole` are zero. Device to device, one copy per piece.
template <class T>
void scatter_pieces(const DocShard& sh, const T* mine, int width, T* whole, cudaStream_t s) {
  SB_CUDA_CHECK(cudaMemsetAsync(whole, 0, size_t(sh.doc_len) * width * sizeof(T), s));
  size_t at = 0;
  for (auto [b, e] : sh.pieces) {
    const size_t n = size_t(e - b) * width;
    SB_CUDA_CHECK(cudaMemcpyAsync(whole + size_t(b) * width, mine + at, n * sizeof(T), cudaMemcpyDeviceToDevice, s));
    at += n;
  }
}

// The reverse: this rank's document rows of `whole` -> its packed rows.
template <class T>
void gather_pieces(const DocShard& sh, const T* whole, int width, T* mine, cudaStream_t s) {
  size_t at = 0;
  for (auto [b, e] : sh.pieces) {
    const size_t n = size_t(e - b) * width;
    SB_CUDA_CHECK(cudaMemcpyAsync(mine + at, whole + size_t(b) * width, n * sizeof(T), cudaMemcpyDeviceToDevice, s));
    at += n;
  }
}

// K or V of the whole document (doc_len x width, device) from every member's rows (mine, device).
void gather_whole(const DocShard& sh, const ShardExchange<float>& ex, const bf16* mine, int width, bf16* whole,
                  ShardScratchCuda& h, cudaStream_t s) {
  to_host(mine, size_t(sh.local_tokens()) * width, h, h.mine, s);
  h.whole.resize(size_t(sh.doc_len) * width);
  ex.gather(sh, h.mine, h.whole, width);
  to_device(h.whole, whole, h, s);
}

// The group's sum of every member's whole-document rows (whole, device) -> this rank's rows (mine).
void reduce_to_owners(const DocShard& sh, const ShardExchange<float>& ex, const bf16* whole, int width, bf16* mine,
                      ShardScratchCuda& h, cudaStream_t s) {
  to_host(whole, size_t(sh.doc_len) * width, h, h.whole, s);
  h.mine.resize(size_t(sh.local_tokens()) * width);
  ex.reduce_scatter(sh, h.whole, h.mine, width);
  to_device(h.mine, mine, h, s);
}

// Q and K, V of the whole document into h.q, h.k, h.v: Q zero outside this rank's rows.
void whole_qkv(const DocShard& sh, const ShardExchange<float>& ex, const bf16* q, const bf16* k, const bf16* v,
               kernels::AttnShape s, ShardScratchCuda& h, cudaStream_t cs) {
  const int HD = s.n_heads * s.head_dim, KD = s.n_kv_heads * s.head_dim;
  const size_t L = size_t(sh.doc_len);
  check_shard_pieces(sh, s.block_size);
  scatter_pieces(sh, q, HD, h.q.resize(L * HD), cs);
  gather_whole(sh, ex, k, KD, h.k.resize(L * KD), h, cs);
  gather_whole(sh, ex, v, KD, h.v.resize(L * KD), h, cs);
}

}  // namespace

kernels::GatingStats shard_attention_fwd_cuda(const DocShard& sh, const ShardExchange<float>& ex, const bf16* q,
                                              const bf16* k, const bf16* v, kernels::AttnShape s, bool sparse,
                                              kernels::GatingParams p, bool gate, kc::DeviceSelection& sel,
                                              bf16* att, float* lse, ShardScratchCuda& h, cudaStream_t cs) {
  const int HD = s.n_heads * s.head_dim;
  const size_t L = size_t(sh.doc_len);
  whole_qkv(sh, ex, q, k, v, s, h, cs);
  const int32_t cu[2] = {0, sh.doc_len};
  kernels::GatingStats st;
  if (gate) {  // built on the host (whatever SB_SELECT says): one document, kept rows only
    kernels::BlockSelection hs;
    if (sparse) kc::gate_blocks(h.q.data(), h.k.data(), cu, 1, s, p, hs, cs);
    else kernels::select_all_causal(cu, 1, s, hs);
    st = keep_own_rows(sh, s, hs);
    sel.upload(hs, cu, 1, s, cs);
  }
  bf16* O = h.o.resize(L * HD);       // (L, H*D)
  float* S = h.lse.resize(L * s.n_heads);  // (L, H)
  kc::block_attention_fwd(h.q.data(), h.k.data(), h.v.data(), sel, s, O, S, cs);
  gather_pieces(sh, O, HD, att, cs);
  gather_pieces(sh, S, s.n_heads, lse, cs);
  return st;
}

void shard_attention_bwd_cuda(const DocShard& sh, const ShardExchange<float>& ex, const bf16* q, const bf16* k,
                              const bf16* v, const bf16* att, const float* lse, const bf16* datt, kernels::AttnShape s,
                              const kc::DeviceSelection& sel, bf16* dq, bf16* dk, bf16* dv, ShardScratchCuda& h,
                              cudaStream_t cs) {
  const int HD = s.n_heads * s.head_dim, KD = s.n_kv_heads * s.head_dim;
  const size_t L = size_t(sh.doc_len);
  whole_qkv(sh, ex, q, k, v, s, h, cs);  // K and V again: nothing of the whole document stays between passes
  scatter_pieces(sh, att, HD, h.o.resize(L * HD), cs);
  scatter_pieces(sh, datt, HD, h.dout.resize(L * HD), cs);
  scatter_pieces(sh, lse, s.n_heads, h.lse.resize(L * s.n_heads), cs);
  bf16 *dQ = h.dq.resize(L * HD), *dK = h.dk.resize(L * KD), *dV = h.dv.resize(L * KD);
  void* ws = h.ws.resize(kc::block_attention_bwd_workspace(int64_t(L), s));
  kc::block_attention_bwd(h.q.data(), h.k.data(), h.v.data(), h.o.data(), h.lse.data(), h.dout.data(), sel, s, dQ,
                          dK, dV, ws, cs);
  gather_pieces(sh, dQ, HD, dq, cs);
  reduce_to_owners(sh, ex, dK, KD, dk, h, cs);  // every member's contribution to the keys this rank owns
  reduce_to_owners(sh, ex, dV, KD, dv, h, cs);
}

}  // namespace sb
