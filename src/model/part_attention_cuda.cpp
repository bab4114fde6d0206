// Attention of a split document on the GPU (context parallelism; the CPU path and the method are
// in part_attention.cpp). The same steps on device buffers: K and V of the whole document gathered
// through the trainer's device exchange (PartExchangeCuda, model_cuda.hpp), the selection built
// over the whole document with only this rank's query rows kept (keep_own_rows, shared with the
// CPU), the ordinary CUDA kernels, and in the backward dK, dV reduce-scattered back to the keys'
// owners.
//
// The exchange is the trainer's (src/parts/groups_cuda.hpp), by the engine's rule for gradients:
// NCCL point-to-point on device buffers, on this stream, when every rank has its own GPU; MPI
// through host memory when ranks share one. Both run the same plans (src/comm/row_exchange.hpp).
// The gather is not overlapped with the local chunk's attention: src/model/README.md ("Split
// documents") has the estimate of what that would save.
#include <cuda_bf16.h>

#include "base/cuda_check.hpp"
#include "src/model/model_cuda.hpp"
#include "src/model/part_attention.hpp"

namespace sb {

namespace kc = kernels::cuda;
using bf16 = kc::bf16;

namespace {

// This rank's packed rows (local_tokens x width) -> their document rows of `whole` (doc_len x
// width); the other rows of `whole` are zero. Device to device, one copy per piece.
template <class T>
void scatter_pieces(const DocPart& sh, const T* mine, int width, T* whole, cudaStream_t s) {
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
void gather_pieces(const DocPart& sh, const T* whole, int width, T* mine, cudaStream_t s) {
  size_t at = 0;
  for (auto [b, e] : sh.pieces) {
    const size_t n = size_t(e - b) * width;
    SB_CUDA_CHECK(cudaMemcpyAsync(mine + at, whole + size_t(b) * width, n * sizeof(T), cudaMemcpyDeviceToDevice, s));
    at += n;
  }
}

// Q and K, V of the whole document into h.q, h.k, h.v: Q zero outside this rank's rows.
void whole_qkv(const DocPart& sh, const PartExchangeCuda& ex, const bf16* q, const bf16* k, const bf16* v,
               kernels::AttnShape s, PartScratchCuda& h, cudaStream_t cs) {
  const int HD = s.n_heads * s.head_dim, KD = s.n_kv_heads * s.head_dim;
  const size_t L = size_t(sh.doc_len);
  check_part_pieces(sh, s.block_size);
  scatter_pieces(sh, q, HD, h.q.resize(L * HD), cs);
  ex.gather(sh, k, h.k.resize(L * KD), KD, cs);
  ex.gather(sh, v, h.v.resize(L * KD), KD, cs);
}

}  // namespace

kernels::GatingStats part_attention_fwd_cuda(const DocPart& sh, const PartExchangeCuda& ex, const bf16* q,
                                              const bf16* k, const bf16* v, kernels::AttnShape s, bool sparse,
                                              kernels::GatingParams p, bool gate, kc::DeviceSelection& sel,
                                              bf16* att, float* lse, PartScratchCuda& h, cudaStream_t cs) {
  const int HD = s.n_heads * s.head_dim;
  const size_t L = size_t(sh.doc_len);
  whole_qkv(sh, ex, q, k, v, s, h, cs);
  const int32_t cu[2] = {0, sh.doc_len};
  kernels::GatingStats st;
  if (gate) {  // built on the host: one document, kept rows only
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

void part_attention_bwd_cuda(const DocPart& sh, const PartExchangeCuda& ex, const bf16* q, const bf16* k,
                              const bf16* v, const bf16* att, const float* lse, const bf16* datt, kernels::AttnShape s,
                              const kc::DeviceSelection& sel, bf16* dq, bf16* dk, bf16* dv, PartScratchCuda& h,
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
  ex.reduce_scatter(sh, dK, dk, KD, cs);  // every member's contribution to the keys this rank owns
  ex.reduce_scatter(sh, dV, dv, KD, cs);
}

}  // namespace sb
