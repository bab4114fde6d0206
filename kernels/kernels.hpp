// The compute kernels behind one interface. CPU implementations (Kokkos host execution space +
// OpenBLAS) live in kernels/cpu/, CUDA twins in kernels/cuda/. All tensors are row-major,
// contiguous unless a leading dimension is given. T is float (training) or double (gradient checks).
//
// Shapes: N tokens of a packed micro-batch (documents back to back, cu_seqlens gives their
// offsets), C = d_model, H query heads, Hkv key/value heads, D head_dim, V vocab, F ffn_dim.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace sb::kernels {

// ---- dense algebra (cblas) ----
// C (M,N) = alpha * op(A) @ op(B) + beta * C; op(A) is (M,K), op(B) is (K,N).
template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B,
          int ldb, T beta, T* C, int ldc);
// y (N,out) = x (N,in) @ W^T, W (out,in) as PyTorch stores it.
template <class T>
void linear_fwd(const T* x, const T* W, T* y, int N, int in, int out);
// dx (N,in) += dy @ W  (skipped when dx == nullptr);  dW (out,in) += dy^T @ x.
template <class T>
void linear_bwd(const T* x, const T* W, const T* dy, T* dx, T* dW, int N, int in, int out);
// Bias of a linear layer (Qwen2's q/k/v): y (N,out) += b (out) on every row; backward
// db (out) += column sums of dy (N,out).
template <class T>
void bias_add_fwd(T* y, const T* b, int N, int out);
template <class T>
void bias_add_bwd(const T* dy, T* db, int N, int out);

// ---- elementwise / per-row ----
// y = x / rms(x) * w, rstd (N) saved for backward.
template <class T>
void rmsnorm_fwd(const T* x, const T* w, T* y, T* rstd, int N, int C, double eps);
// dx (N,C) += ..., dw (C) += ...
template <class T>
void rmsnorm_bwd(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int N, int C);
// RoPE's frequencies, computed once per model (src/model/rope.hpp, as transformers'
// ROPE_INIT_FUNCTIONS do): the angle of pair d at position p is p * inv_freq[d], and cos and sin are
// both multiplied by scale (YaRN's attention factor; 1 for plain, linear and llama3 RoPE). On the GPU
// inv_freq points at device memory.
struct RopeFreqs {
  const double* inv_freq = nullptr;  // (D/2)
  double scale = 1;
};
// The plain table theta^(-2d/D), d < D/2.
std::vector<double> rope_plain_inv_freq(int D, double theta);
// RoPE in place on x (N, nh, D), rotate-half convention (Hugging Face Llama): pairs (d, d+D/2),
// y = scale * rotate(x, pos[t] * inv_freq[d]). pos is the position inside the token's document.
template <class T>
void rope_fwd(T* x, const int32_t* pos, int N, int nh, int D, RopeFreqs f);
// Backward of rope_fwd, in place on the gradient (scale times the inverse rotation).
template <class T>
void rope_bwd(T* dx, const int32_t* pos, int N, int nh, int D, RopeFreqs f);
// h = silu(gate) * up, elementwise over n.
template <class T>
void swiglu_fwd(const T* gate, const T* up, T* h, size_t n);
// dgate, dup (overwritten) from dh.
template <class T>
void swiglu_bwd(const T* gate, const T* up, const T* dh, T* dgate, T* dup, size_t n);
// out (N,C) = table[ids]
template <class T>
void embedding_fwd(const int32_t* ids, const T* table, T* out, int N, int C);
// dtable[ids] += dout
template <class T>
void embedding_bwd(const int32_t* ids, const T* dout, T* dtable, int N, int C);
// Cross-entropy over logits (N,V) with targets (N) (-1 = no target). Returns the SUM of the
// losses over targeted rows; writes dlogits = scale * (softmax - onehot) on targeted rows and 0
// elsewhere (dlogits may alias logits). `correct` (optional, N) = 1 where argmax == target.
template <class T>
double cross_entropy(const T* logits, const int32_t* targets, T* dlogits, int N, int V, T scale,
                     uint8_t* correct = nullptr);
// LM head + cross-entropy, chunked and fused: the (N, V) logits are never whole in memory. For
// each chunk of `chunk` tokens (0 = all N at once): logits = x @ W^T (gemm) into one chunk buffer,
// the loss and, in place, dlogits = scale * (softmax - onehot) (cross_entropy above: untargeted
// rows get 0), then dx = dlogits @ W and dW += dlogits^T @ x; the buffer is reused by the next
// chunk. x (N,C) the final norm's output; W (V,C); targets (N) (-1 = not trained). Returns the
// summed loss over targeted rows. With dx (N,C, overwritten) and dW (V,C, accumulated) both
// nullptr it is the forward only. correct, argmax (N) optional: argmax == target, greedy token.
template <class T>
double lm_head_loss(const T* x, const T* W, const int32_t* targets, int N, int C, int V, int chunk, T scale, T* dx,
                    T* dW, uint8_t* correct = nullptr, int32_t* argmax = nullptr);

// AdamW with decoupled weight decay and bias correction; step counts from 1.
void adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2,
           float eps, float weight_decay, int64_t step);

// ---- block-sparse attention ----
struct AttnShape {
  int n_heads, n_kv_heads, head_dim, block_size;
};

// The CUDA attention backward's workspace (kernels/cuda/attention_bwd.cu), in bytes, for n_tokens
// rows: the fp32 dQ accumulator and the rows' two dot products (N x H x (D + 2)), then at a 256-byte
// boundary the column split's fp32 dK, dV accumulators (2 x N x Hkv x D). Plain C++, so that the
// memory plan (src/model/gpu_buffers.hpp) counts what the kernels take.
inline size_t attention_bwd_dkv_offset(int64_t n_tokens, AttnShape s) {
  const size_t rows = size_t(n_tokens) * size_t(s.n_heads);
  return (rows * size_t(s.head_dim + 2) * sizeof(float) + 255) / 256 * 256;
}
inline size_t attention_bwd_workspace_bytes(int64_t n_tokens, AttnShape s) {
  return attention_bwd_dkv_offset(n_tokens, s) + 2 * size_t(n_tokens) * size_t(s.n_kv_heads) * size_t(s.head_dim) * sizeof(float);
}

// The kept key blocks of every (document, kv head, query block) row, CSR-style.
// Rows are enumerated doc by doc, then kv head, then query block:
//   row(d, g, i) = doc_row_base[d] + g * nblocks(d) + i
// cols[row_ptr[r] .. row_ptr[r+1]) are key block indices j <= i within the document, ascending.
struct BlockSelection {
  std::vector<int64_t> doc_row_base;  // (ndocs + 1)
  std::vector<int64_t> row_ptr;       // (rows + 1)
  std::vector<int32_t> cols;          // kept blocks
  std::vector<float> recall;          // (rows) attention mass kept, sum of p_ij over kept j
};

// How the gate scores key block j for query block i (attention.gate_query, attention.gate_key;
// kernels/README.md, "Gate modes"). Query side: mean, qbar_i (the block's tokens and the kv head's
// group of query heads pooled); max, the best of those token vectors (MoBA-style per-token scoring).
// Key side, per kv head: mean, kbar_j; bounds, per dimension the max and min of the block's keys
// scored sum_d max(q_d*kmax_d, q_d*kmin_d) (Quest: an upper bound on q.k over the block); sub, the
// block cut into sub_blocks equal sub-blocks, each pooled, scored by the best of them.
enum class GateQuery : uint8_t { mean, max };
enum class GateKey : uint8_t { mean, bounds, sub };

struct GatingParams {
  int k;             // budget: blocks per row besides the anchors (the knob DST turns)
  int local_blocks;  // w local blocks before the diagonal, always kept
  double theta;      // drop candidates with s_ij < a_i - theta
  GateQuery query = GateQuery::mean;
  GateKey key = GateKey::mean;
  int sub_blocks = 4;  // key = sub: sub-blocks per block; must divide the block size
};
// The rows of D values summarising one block's keys per kv head: 1 (mean), 2 (bounds: the max row,
// then the min row), sub_blocks (sub). Throws std::invalid_argument when sub_blocks does not divide
// the block size.
inline int key_summary_rows(const GatingParams& p, int block_size) {
  if (p.key == GateKey::bounds) return 2;
  if (p.key == GateKey::mean) return 1;
  if (p.sub_blocks < 1 || block_size % p.sub_blocks != 0)
    throw std::invalid_argument("gating: sub_blocks (" + std::to_string(p.sub_blocks) +
                                ") must divide the block size (" + std::to_string(block_size) + ")");
  return p.sub_blocks;
}

struct GatingStats {
  double rows = 0;           // rows gated (doc x kv head x query block)
  double kept_blocks = 0;    // blocks kept over all rows
  double causal_blocks = 0;  // blocks a dense causal mask would keep
  double recall_sum = 0;     // sum over rows of the row's recall
  // True recall (true_recall below) on the rows sampled for it (balance.recall_rows): their count and sum.
  double true_rows = 0, true_recall_sum = 0;
  double density() const { return causal_blocks > 0 ? kept_blocks / causal_blocks : 1.0; }
  double recall() const { return rows > 0 ? recall_sum / rows : 1.0; }
  double true_recall() const { return true_rows > 0 ? true_recall_sum / true_rows : 1.0; }
};

// Gating: block scores s_ij, by default mean(q_i) . mean(k_j) / sqrt(D), q pooled over the block's
// tokens and over the kv head's group of query heads, k over the block's tokens (the other modes:
// GatingParams above; every mode s_ij = (best over query vectors and key rows of the dot) / sqrt(D),
// the dots summed over d ascending, in double for the mean query, in float for the per-token query:
// gate_token_scores below); p_ij = softmax over j <= i. Anchors (sink j=0, diagonal j=i, w local blocks) always kept; candidates within theta
// of the anchor score a_i; at most k of them, best first. q (N,H,D), k (N,Hkv,D).
template <class T>
GatingStats gate_blocks(const T* q, const T* k, const int32_t* cu_seqlens, int ndocs, AttnShape s,
                        GatingParams p, BlockSelection& sel);
// Context parallelism (src/model/part_attention.cpp): gating of one document split over ranks.
// pool_block_keys: the key summaries gate_blocks uses, kbar (Hkv, R, D) per block in double (R =
// key_summary_rows(p)), of the blocks [b0, b1) of a document of L tokens, k (rows, Hkv, D) starting
// at block b0's first row. gate_blocks_pooled: gate_blocks of that one document (cu_seqlens {0, L})
// given every block's summaries kbar (nb, Hkv, R, D): the same selection bit for bit. Non-null `query_blocks` (nb flags):
// only the flagged query blocks are gated (a group member's own rows: its gating is its share);
// their rows are gate_blocks' bit for bit, the others' rows are empty (recall 0), and the stats
// count the flagged rows only.
template <class T>
void pool_block_keys(const T* k, int L, int b0, int b1, AttnShape s, GatingParams p, double* kbar);
template <class T>
GatingStats gate_blocks_pooled(const T* q, const double* kbar, int L, AttnShape s, GatingParams p,
                               BlockSelection& sel, const char* query_blocks = nullptr);
// The score stage of the per-token query (GatingParams::query = max) for one document of L tokens
// and kv head g: out (nb, nb) row-major, out[i nb + j] (j <= i; the rest untouched) = the max over
// block i's query vectors (its tokens x the group's H/Hkv heads) and block j's key rows of their dot
// in float: q and the summary rounded to float, summed over d ascending of rounded products (no FMA;
// bounds: sum_d max(q_d hi_d, q_d lo_d)). gate_blocks scores s_ij = double(out) / sqrt(D); the CUDA
// twin (kernels/cuda/gate_score.cu) gives the same bits. q (L, H, D) from the document's first
// row; block j's summary (R, D) doubles at kbar + j * kstride (pool_block_keys' layout: kstride =
// Hkv R D, kbar offset by g R D).
template <class T>
void gate_token_scores(const T* q, const double* kbar, int kstride, int L, int g, AttnShape s, GatingParams p,
                       float* out);
// Every causal block kept (dense attention through the same kernel); recall = 1.
GatingStats select_all_causal(const int32_t* cu_seqlens, int ndocs, AttnShape s, BlockSelection& sel);
// The stats select_all_causal returns, without building the selection.
GatingStats all_causal_stats(const int32_t* cu_seqlens, int ndocs, AttnShape s);

// Attention over the kept blocks only, causal inside each document, softmax scale 1/sqrt(D).
// q,out (N,H,D); k,v (N,Hkv,D); lse (N,H) log-sum-exp saved for backward.
template <class T>
void block_attention_fwd(const T* q, const T* k, const T* v, const int32_t* cu_seqlens, int ndocs,
                         AttnShape s, const BlockSelection& sel, T* out, T* lse);
// dq (N,H,D), dk, dv (N,Hkv,D) are overwritten.
template <class T>
void block_attention_bwd(const T* q, const T* k, const T* v, const T* out, const T* lse, const T* dout,
                         const int32_t* cu_seqlens, int ndocs, AttnShape s, const BlockSelection& sel,
                         T* dq, T* dk, T* dv);

// Plain reference: materialises each document's score matrix, masks to the selection (token
// causal inside kept blocks), softmax, weighted sum. For tests only.
template <class T>
void reference_attention_fwd(const T* q, const T* k, const T* v, const int32_t* cu_seqlens, int ndocs,
                             AttnShape s, const BlockSelection& sel, T* out);

// ---- true recall and the oracle gate (kernels/cpu/true_recall.cpp) ----
// Where selection row `row` sits: document d, kv head g, query block i; the document's first token
// (in the packed batch) and its length.
struct RowPlace {
  int doc, g, i, doc_begin, doc_len;
};
RowPlace place_row(const BlockSelection& sel, const int32_t* cu_seqlens, int ndocs, AttnShape s, int64_t row);
// True recall of selection rows: out[n] (nrows) = the dense softmax attention mass that row rows[n]'s
// kept blocks hold, averaged over the row's query tokens and its kv group's query heads (query t sees
// keys <= t of its document; scale 1/sqrt(D)). BlockSelection::recall is the gate's own estimate
// (a softmax over pooled block scores); this is what the attention loses. q (N,H,D), k (N,Hkv,D).
template <class T>
void true_recall(const T* q, const T* k, const int32_t* cu_seqlens, int ndocs, AttnShape s, const BlockSelection& sel,
                 const int64_t* rows, int nrows, float* out);
// The oracle gate (eval --diagnose): key blocks `blocks` of document `doc` added to every row of that
// document that may see them (j <= i), after gating; the rows stay ascending, without repeats.
// sel.recall is left as the gate computed it.
void force_blocks(BlockSelection& sel, const int32_t* cu_seqlens, int ndocs, AttnShape s, int doc,
                  const std::vector<int32_t>& blocks);

}  // namespace sb::kernels
