#include "src/model/gpu_buffers.hpp"

#include <algorithm>

namespace sb {

GpuFrozenCopies gpu_frozen_copies(const ParamLayout& base, const std::vector<size_t>& of_base) {
  const std::vector<size_t> f32 = fp32_read_params(base);
  GpuFrozenCopies f;
  f.off16.assign(base.params.size(), kNoParam), f.off32 = f.off16;
  for (size_t i = 0; i < base.params.size(); ++i) {
    if (of_base[i] != kNoParam) continue;  // trained: in the trainable buffers
    const size_t n = base.params[i].size;
    const bool reads32 = std::find(f32.begin(), f32.end(), i) != f32.end();
    if (reads32 && i != base.embed) f.off32[i] = f.n32, f.n32 += n;  // a frozen embedding: bf16
    else f.off16[i] = f.n16, f.n16 += n;
  }
  return f;
}

bool gpu_qkv_adjacent(const ParamLayout& base, const ParamLayout& train, const std::vector<size_t>& of_base,
                      const GpuFrozenCopies& frozen) {
  // a tensor's bf16 copy: (buffer, offset), the trainable w16_ (0) or the frozen base16_ (1)
  auto at = [&](size_t i) {
    const size_t t = of_base[i];
    return t != kNoParam ? std::pair<int, size_t>{0, train.params[t].offset} : std::pair<int, size_t>{1, frozen.off16[i]};
  };
  auto next = [&](size_t a, size_t b) {
    const auto pa = at(a), pb = at(b);
    return pa.first == pb.first && pb.second == pa.second + base.params[a].size;
  };
  for (const LayerParams& I : base.layers)
    if (!next(I.q, I.k) || !next(I.k, I.v)) return false;
  return true;
}

double GpuLayerBuffers::bytes_but_input() const {
  return 4.0 * double(rstd1 + rstdq + rstdk + lse + x_mid + rstd2) +
         2.0 * double(xn + q + k + v + q_raw + k_raw + att + xn2 + h + gu) + 2.0 * double(u) * adapters;
}

double GpuBuffers::layers_bytes() const {
  const double full = recompute ? 1 : n_layers;  // the work layer, or every layer
  return 4.0 * double(layer.x_in) * n_layers + full * layer.bytes_but_input();
}

double GpuBuffers::bytes() const {
  return layers_bytes() + 4.0 * double(tokens) * 4 + 4.0 * double(loss + rstdf + xs_top + dxf + dx + dxn + dxa) +
         2.0 * double(qkv + xf + head + dx16 + dh + dgu + dqkv + datt + dq + dk + dv + du + xd + qkv_weights) +
         double(attn_ws);
}

GpuBuffers gpu_buffers(const ModelDims& d, const ModelExec& e, const LoraSpec& lora, int64_t N_, bool qkv_adjacent) {
  const size_t N = size_t(std::max<int64_t>(N_, 0)), C = size_t(d.d_model), F = size_t(d.ffn_dim),
               H = size_t(d.n_heads), Hkv = size_t(d.n_kv_heads), HD = H * size_t(d.head_dim),
               KD = Hkv * size_t(d.head_dim), P3 = HD + 2 * KD, r = size_t(lora.on() ? lora.rank : 0);
  GpuBuffers z;
  GpuLayerBuffers& a = z.layer;
  a.x_in = N * C, a.rstd1 = N;
  a.xn = N * C, a.q = N * HD, a.k = a.v = N * KD;
  if (d.qk_norm) a.q_raw = N * HD, a.k_raw = N * KD, a.rstdq = N * H, a.rstdk = N * Hkv;
  a.att = N * HD, a.lse = N * H;
  a.x_mid = N * C, a.rstd2 = N;
  a.xn2 = N * C, a.h = N * F, a.gu = 2 * N * F;
  size_t widest = 0;  // the adapted inputs: q, k, v, gate, up read (N, C), o (N, H*D), down (N, F)
  for (int t = 0; t < kLoraTargets && lora.on(); ++t) {
    if (!lora.targets[size_t(t)]) continue;
    a.adapters += 1;
    widest = std::max(widest, t == 3 ? HD : t == 6 ? F : C);
  }
  if (a.adapters) a.u = N * r, z.du = N * r;
  if (a.adapters && lora.dropout > 0) z.xd = z.dxa = N * widest;
  z.n_layers = d.n_layers, z.recompute = e.recompute;
  z.tokens = N, z.loss = z.rstdf = N;
  z.qkv = N * P3, z.xs_top = N * C, z.xf = N * C;
  z.head_rows = N ? e.head_rows(int(N), d.vocab, 2) : 0;  // bf16 logits
  z.head = size_t(z.head_rows) * size_t(d.vocab);
  z.dxf = z.dx = z.dxn = N * C, z.dx16 = N * C;
  z.dh = N * F, z.dgu = 2 * N * F, z.dqkv = N * P3;
  z.datt = z.dq = N * HD, z.dk = z.dv = N * KD;
  z.attn_ws = kernels::attention_bwd_workspace_bytes(int64_t(N), {d.n_heads, d.n_kv_heads, d.head_dim, 64});
  if (!qkv_adjacent) z.qkv_weights = size_t(d.n_layers) * P3 * C;
  return z;
}

namespace {
// A DeviceSelection's buffers (kernels/cuda/selection.cu: reserve, upload) for one document of nb
// blocks: BlockInfo (32 bytes) a block, both launch orders, the CSR and its transpose of `kept`
// blocks, the compacted grid's list (bwd_work_bytes; an H100's 132 SMs where MHA's split reads them).
double selection_bytes(const ModelDims& d, int block, int64_t nb, int64_t kept, bool known_kept) {
  const double H = d.n_heads, Hkv = d.n_kv_heads, rows = double(nb) * Hkv;
  double b = 32.0 * nb + 4.0 * nb * (H + Hkv) + 8.0 * 2 + 2 * 8.0 * (rows + 1) + 2 * 4.0 * double(kept);
  if (block == 128 && (d.head_dim == 64 || d.head_dim == 128)) {  // the wgmma backward's column split
    const int64_t G = d.n_heads / std::max(d.n_kv_heads, 1), per_head = std::max<int64_t>(1, nb * 2);
    const int64_t bound = std::max<int64_t>(1, G * nb * 2);
    int64_t chunk = std::max<int64_t>(128, (bound + 15) / 16);
    if (G == 1 && known_kept) {
      const int64_t half_share = kept * 2 / (2 * 132);
      chunk = bound <= half_share ? 0 : std::max<int64_t>(128, half_share);
    }
    const int64_t n_split = chunk > 0 ? G * ((per_head + chunk - 1) / chunk) : 1;
    if (n_split > 1) b += 256 + 4.0 * double(nb) * Hkv * double(n_split);
  }
  return b;
}
}  // namespace

double gpu_selection_bytes(const ModelDims& d, const AttnSettings& a, int k_max, int64_t N) {
  if (N <= 0) return 0;
  const double Hkv = d.n_kv_heads, D = d.head_dim, L = d.n_layers;
  bool any_dense = false;
  for (int l = 0; l < d.n_layers; ++l) any_dense = any_dense || !a.sparse_at(l);
  if (!a.sparse) {  // layer 0's all-causal selection at the dense kernels' block (128 with wgmma), shared
    const int bs = d.head_dim == 64 || d.head_dim == 128 ? 128 : a.block_size;
    const int64_t nb = (N + bs - 1) / bs;
    return selection_bytes(d, bs, nb, int64_t(d.n_kv_heads) * nb * (nb + 1) / 2, true);
  }
  const int bs = a.block_size;
  const int64_t nb = (N + bs - 1) / bs, rows = int64_t(d.n_kv_heads) * nb;
  const int64_t cap = std::max<int64_t>(1, std::min<int64_t>(k_max + std::max(a.local_blocks, 0) + 2, nb));
  double b = L * selection_bytes(d, bs, nb, rows * cap, false);  // every layer reserved (select_device.cu)
  if (any_dense) b += selection_bytes(d, bs, nb, rows * (nb + 1) / 2, true);  // dense_sel_
  // DeviceGating::prepare: blocks, pooled q (mean query) and k summaries (double), slots, counts,
  // recall, bit matrix, launch-order keys (work, keys, sorted, early) and the radix sort's scratch
  // (about its keys), the per-token scores (max query)
  const int R = kernels::key_summary_rows(a.gating(-1), bs);
  const double items = double(nb) * d.n_heads, words = double((nb + 31) / 32);
  b += 32.0 * nb + 4.0 * L + 8.0 * double(nb) * Hkv * D * (R + (a.gate_query == kernels::GateQuery::mean ? 1 : 0));
  b += 4.0 * double(rows) * double(cap) + 3 * 4.0 * double(rows) + 4.0 * double(rows) * words;
  b += 8.0 * items + 2 * 2 * 8.0 * items + items + 2 * 8.0 * items + 16.0 * L;
  if (a.gate_query == kernels::GateQuery::max) b += 4.0 * Hkv * double(nb) * double(nb + 1) / 2;
  return b;
}

}  // namespace sb
