// DeviceGating (attention_cuda.hpp): the sparse selection of one layer built on the device, so that
// nothing in the training step waits on the host between layers. Per layer, all on `stream`:
//   pool_kernel, [token_score_kernel,] row_kernel
//                             the gating of gating.cu (gating_kernels.cuh; the score stage of the
//                             per-token query in gate_score.cu), bit for bit the CPU's
//                             choice; the row kernel reads its budget from the device array of the
//                             micro-batch and also sets the transposed bit matrix (kv head, key
//                             block j) x query block i and counts each column
//   scan_kernel               row counts -> CSR row_ptr (one CTA), plus the layer's kept blocks and
//                             recall sum for the statistics (fixed reduction tree: deterministic)
//   compact_kernel            the rows' fixed-capacity slots -> CSR cols
//   scan_kernel, csc_kernel   column counts -> col_ptr; each column's set bits in ascending order
//                             -> col_rows (so the CSC equals the host transpose exactly)
//   order_keys_kernel, CUB radix sort, order_kernel
//                             the forward and backward CTA launch orders: one sort gives both the
//                             heaviest-first and the head-outer orders, a one-CTA kernel applies
//                             cta_order_bounded (kernels/cta_order.hpp) to them
// Buffers are sized per micro-batch in prepare() (grow-only), so select() allocates nothing.
#include <cub/cub.cuh>

#include <algorithm>
#include <vector>

#include "kernels/cta_order.hpp"
#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/gating_kernels.cuh"

namespace sb::kernels::cuda {
namespace {
using namespace gating;
constexpr int kOneCta = 1024;  // threads of the one-CTA scan and order kernels

// Each of kOneCta threads owns the contiguous range [lo, hi) of n items.
struct Chunk {
  int64_t lo, hi;
  __device__ explicit Chunk(int64_t n) {
    const int64_t per = (n + kOneCta - 1) / kOneCta;
    lo = min(n, per * int64_t(threadIdx.x));
    hi = min(n, lo + per);
  }
};

// ptr (n + 1) = exclusive scan of cnt (n). With stats: stats[0] = sum of cnt, stats[1] = sum of
// recall (double).
__global__ void __launch_bounds__(kOneCta) scan_kernel(const int32_t* cnt, int64_t n, int64_t* ptr,
                                                       const float* recall, double* stats) {
  using Scan = cub::BlockScan<int64_t, kOneCta>;
  using Reduce = cub::BlockReduce<double, kOneCta>;
  __shared__ union {
    typename Scan::TempStorage scan;
    typename Reduce::TempStorage reduce;
  } tmp;
  const Chunk c(n);
  int64_t s = 0;
  for (int64_t r = c.lo; r < c.hi; r++) s += cnt[r];
  int64_t off = 0, total = 0;
  Scan(tmp.scan).ExclusiveSum(s, off, total);
  for (int64_t r = c.lo; r < c.hi; r++) ptr[r] = off, off += cnt[r];
  if (threadIdx.x == 0) ptr[n] = total;
  if (!stats) return;  // uniform over the CTA
  double rs = 0;
  for (int64_t r = c.lo; r < c.hi; r++) rs += double(recall[r]);
  __syncthreads();  // tmp is reused
  const double rsum = Reduce(tmp.reduce).Sum(rs);
  if (threadIdx.x == 0) stats[0] = double(total), stats[1] = rsum;
}

// cols[ptr[r] + c] = slots[r * cap + c] for c < cnt[r]
__global__ void compact_kernel(const int32_t* slots, const int32_t* cnt, const int64_t* ptr, int64_t rows, int cap,
                               int32_t* cols) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < rows * cap; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / cap;
    const int c = int(e % cap);
    if (c < cnt[r]) cols[ptr[r] + c] = slots[e];
  }
}

// One warp per column x: the set bits of bits[x * words ...] (query blocks) in ascending order.
__global__ void csc_kernel(const uint32_t* bits, int words, int64_t rows, const int64_t* col_ptr, int32_t* col_rows) {
  const int lane = threadIdx.x % 32;
  const int64_t nwarps = int64_t(gridDim.x) * blockDim.x / 32;
  for (int64_t x = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; x < rows; x += nwarps) {
    int64_t out = col_ptr[x];
    for (int w0 = 0; w0 < words; w0 += 32) {
      uint32_t word = w0 + lane < words ? bits[x * words + w0 + lane] : 0u;
      const int n = __popc(word);
      int incl = n;
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      int64_t pos = out + incl - n;
      for (; word; word &= word - 1) col_rows[pos++] = (w0 + lane) * 32 + __ffs(word) - 1;
      out += __shfl_sync(0xffffffffu, incl, 31);
    }
  }
}

// Work items x = block * n_heads + head of one launch order (forward: query heads, a row of the CSR
// each; backward: kv heads, a CSC column times the group). Sort keys, ascending = launch order:
//   keys[x]     = (wmax_key - work) << ib | x                          heaviest first, ties by index
//   keys[n + x] = 1 << (ib + wb + hb) | head << (ib + wb) | the above  head-outer, then as above
struct OrderParams {
  const BlockInfo* blocks;
  const int64_t *row_base, *ptr;  // ptr: row_ptr (forward) or col_ptr (backward)
  int n_items, n_heads, group, weight;
  int ib, wb, hb;
  int64_t* work;   // (n_items)
  uint64_t* keys;  // (2 n_items)
};

__global__ void order_keys_kernel(const OrderParams p) {
  const uint64_t wm = (uint64_t(1) << p.wb) - 1;
  for (int x = blockIdx.x * blockDim.x + threadIdx.x; x < p.n_items; x += gridDim.x * blockDim.x) {
    const int bi = x / p.n_heads, h = x % p.n_heads;
    const BlockInfo b = p.blocks[bi];
    const int64_t r = p.row_base[b.doc] + int64_t(h / p.group) * b.nb + b.i;
    const int64_t w = p.weight * (p.ptr[r + 1] - p.ptr[r]);
    p.work[x] = w;
    const uint64_t low = ((wm - uint64_t(w)) << p.ib) | uint64_t(x);
    p.keys[x] = low;
    p.keys[p.n_items + x] = (uint64_t(1) << (p.ib + p.wb + p.hb)) | (uint64_t(h) << (p.ib + p.wb)) | low;
  }
}

// sorted (2n): the heaviest-first order, then the head-outer one. Writes the launch order of `mode`
// (cta_order_bounded for mixed) into order; early (n) is scratch.
__global__ void __launch_bounds__(kOneCta) order_kernel(const uint64_t* sorted, const int64_t* work, int n, int ib,
                                                        int slots, int mode, char* early, int32_t* order) {
  using Scan = cub::BlockScan<int64_t, kOneCta>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ unsigned long long s_total, s_wmax;
  const uint64_t mask = (uint64_t(1) << ib) - 1;
  auto by_work = [&](int64_t p) { return int32_t(sorted[p] & mask); };
  auto by_head = [&](int64_t p) { return int32_t(sorted[n + p] & mask); };
  const Chunk c(n);
  if (mode == int(CtaOrder::blocks)) {
    for (int64_t p = c.lo; p < c.hi; p++) order[p] = by_work(p);
    return;
  }
  if (threadIdx.x == 0) s_total = 0, s_wmax = 0;
  __syncthreads();
  unsigned long long ts = 0, wm = 0;
  for (int64_t p = c.lo; p < c.hi; p++) {
    order[p] = by_head(p);
    early[p] = 0;
    ts += work[p], wm = max(wm, (unsigned long long)work[p]);
  }
  if (mode == int(CtaOrder::heads)) return;
  atomicAdd(&s_total, ts);
  atomicMax(&s_wmax, wm);
  __syncthreads();
  const double limit = __dmul_rn(1.03, fmax(__ddiv_rn(double(s_total), double(slots)), double(s_wmax)));
  for (int pass = 0; pass < 8; pass++) {
    // finish-time bound of each item in the current order
    int64_t s = 0;
    for (int64_t p = c.lo; p < c.hi; p++) s += work[order[p]];
    int64_t off = 0;
    Scan(tmp).ExclusiveSum(s, off);
    int moved = 0;
    for (int64_t p = c.lo; p < c.hi; p++) {
      const int32_t x = order[p];
      if (__dadd_rn(__ddiv_rn(double(off), double(slots)), double(work[x])) > limit && !early[x]) early[x] = 1, moved = 1;
      off += work[x];
    }
    if (!__syncthreads_or(moved)) break;
    // early items in heaviest-first order, then the others in head-outer order
    int64_t ne = 0, pos = 0, n_early = 0;
    for (int64_t p = c.lo; p < c.hi; p++) ne += early[by_work(p)];
    Scan(tmp).ExclusiveSum(ne, pos, n_early);
    for (int64_t p = c.lo; p < c.hi; p++)
      if (early[by_work(p)]) order[pos++] = by_work(p);
    int64_t nr = 0;
    for (int64_t p = c.lo; p < c.hi; p++) nr += !early[by_head(p)];
    __syncthreads();  // tmp is reused
    Scan(tmp).ExclusiveSum(nr, pos);
    pos += n_early;
    for (int64_t p = c.lo; p < c.hi; p++)
      if (!early[by_head(p)]) order[pos++] = by_head(p);
    __syncthreads();
  }
}

int bits_for(int64_t v) {  // bits to hold 0..v, at least 1
  int b = 1;
  while (b < 62 && (int64_t(1) << b) <= v) b++;
  return b;
}

// A grow-only device buffer.
template <class T>
struct Buf {
  T* p = nullptr;
  size_t cap = 0;
  T* need(size_t n) {
    n = std::max<size_t>(n, 1);
    if (p && cap >= n) return p;
    if (p) SB_CUDA_CHECK(cudaFree(p));
    p = nullptr;
    SB_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)));
    cap = n;
    return p;
  }
  ~Buf() {
    if (p) cudaFree(p);  // no check in a destructor
  }
};

int grid_for(int64_t n, int threads) { return int(std::clamp<int64_t>((n + threads - 1) / threads, 1, 4096)); }
}  // namespace

struct DeviceGating::Impl {
  AttnShape s{};
  int ndocs = 0, n_blocks = 0, max_nb = 0, cap = 0, words = 0, slots = 1, local = 0, n_layers = 0;
  double theta = 0, causal = 0;
  GatingParams gate{0, 0, 0};  // the mode (query, key, sub_blocks) of prepare()
  int R = 1;                   // key summary rows
  int64_t rows = 0, n_tokens = 0;
  CtaOrder mode = CtaOrder::mixed;
  Buf<BlockInfo> blocks;
  Buf<int32_t> block_base, kbud, row_slots, cnt, ccnt;
  Buf<int64_t> row_base, work, pair_base;
  Buf<ScoreTile> tiles;    // the per-token score stage's CTAs (prepare)
  Buf<uint32_t> tok_score;  // its scores, (pairs)
  int n_tiles = 0;
  int64_t n_pairs = 0;
  Buf<double> qbar, kbar, stats;
  Buf<float> recall;
  Buf<uint32_t> bits;
  Buf<uint64_t> keys, sorted;
  Buf<char> early;
  Buf<unsigned char> cub_tmp;
  size_t cub_bytes = 0;
  double* hstats = nullptr;  // pinned (2 n_layers): kept, recall sum per layer
  size_t hstats_cap = 0;

  // One launch order (forward or backward) of sel into items.
  void order(const int64_t* ptr, int n_heads, int group, int weight, int64_t wmax, int32_t* items,
             const DeviceSelection& sel, cudaStream_t stream) {
    const int n = n_blocks * n_heads;
    OrderParams p{sel.blocks, sel.row_base, ptr, n, n_heads, group, weight,
                  bits_for(n - 1), bits_for(wmax), n_heads > 1 ? bits_for(n_heads - 1) : 0, work.p, keys.p};
    const int end_bit = p.ib + p.wb + p.hb + 1;
    if (end_bit > 64) throw Error("DeviceGating: launch-order sort keys need more than 64 bits");
    order_keys_kernel<<<grid_for(n, 256), 256, 0, stream>>>(p);
    SB_CUDA_CHECK_LAUNCH("order_keys_kernel");
    size_t bytes = cub_bytes;
    SB_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(cub_tmp.p, bytes, keys.p, sorted.p, 2 * n, 0, end_bit, stream));
    order_kernel<<<1, kOneCta, 0, stream>>>(sorted.p, work.p, n, p.ib, slots, int(mode), early.p, items);
    SB_CUDA_CHECK_LAUNCH("order_kernel");
  }
};

DeviceGating::DeviceGating() : impl_(std::make_unique<Impl>()) {}
DeviceGating::~DeviceGating() {
  if (impl_->hstats) cudaFreeHost(impl_->hstats);
}

void DeviceGating::prepare(const int32_t* cu, int ndocs, AttnShape s, const std::vector<int>& k_per_layer,
                           GatingParams gp, cudaStream_t stream) {
  Impl& m = *impl_;
  const int Bs = s.block_size, Hkv = s.n_kv_heads, D = s.head_dim;
  if (Bs <= 0 || Hkv <= 0 || s.n_heads % Hkv != 0) throw Error("DeviceGating: n_heads must be a multiple of n_kv_heads");
  const int local_blocks = gp.local_blocks;
  const double theta = gp.theta;
  m.gate = gp, m.R = key_summary_rows(gp, Bs);
  std::vector<BlockInfo> blocks;
  std::vector<int32_t> block_base(ndocs + 1, 0);
  std::vector<int64_t> row_base(ndocs + 1, 0);
  m.max_nb = 0, m.causal = 0;
  for (int d = 0; d < ndocs; d++) {
    const int L = cu[d + 1] - cu[d], nb = L > 0 ? (L + Bs - 1) / Bs : 0;
    for (int i = 0; i < nb; i++) blocks.push_back({d, i, cu[d] + i * Bs, std::min(Bs, L - i * Bs), nb, cu[d], L, 0});
    block_base[d + 1] = block_base[d] + nb;
    row_base[d + 1] = row_base[d] + int64_t(Hkv) * nb;
    m.max_nb = std::max(m.max_nb, nb);
    m.causal += double(Hkv) * nb * (nb + 1) / 2;
  }
  int kmax = 0;
  for (int k : k_per_layer) kmax = std::max(kmax, k);
  m.s = s, m.ndocs = ndocs, m.n_blocks = int(blocks.size()), m.rows = row_base[ndocs], m.n_tokens = cu[ndocs];
  m.local = local_blocks, m.theta = theta, m.n_layers = int(k_per_layer.size());
  m.cap = std::max(1, std::min(kmax + std::max(local_blocks, 0) + 2, m.max_nb));
  m.words = (m.max_nb + 31) / 32;
  m.mode = launch_order();
  m.slots = sm_count();
  // worst case of every layer of this micro-batch
  const size_t nbk = size_t(m.n_blocks), rows = size_t(m.rows), items = nbk * s.n_heads;
  m.blocks.need(nbk);
  m.block_base.need(ndocs + 1);
  m.row_base.need(ndocs + 1);
  m.kbud.need(k_per_layer.size());
  if (gp.query == GateQuery::mean) m.qbar.need(nbk * Hkv * D);
  m.kbar.need(nbk * Hkv * m.R * D);
  m.row_slots.need(rows * m.cap);
  m.cnt.need(rows);
  m.ccnt.need(rows);
  m.recall.need(rows);
  m.bits.need(rows * m.words);
  m.work.need(items);
  m.keys.need(2 * items);
  m.sorted.need(2 * items);
  m.early.need(items);
  m.stats.need(2 * k_per_layer.size());
  size_t bytes = 0;
  SB_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, bytes, m.keys.p, m.sorted.p, int(2 * items), 0, 64, stream));
  m.cub_bytes = bytes;
  m.cub_tmp.need(bytes);
  if (m.hstats_cap < 2 * k_per_layer.size()) {
    if (m.hstats) SB_CUDA_CHECK(cudaFreeHost(m.hstats));
    m.hstats = nullptr;
    SB_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&m.hstats), std::max<size_t>(2 * k_per_layer.size(), 1) * sizeof(double)));
    m.hstats_cap = 2 * k_per_layer.size();
  }
  std::fill(m.hstats, m.hstats + 2 * k_per_layer.size(), 0.0);
  auto up = [&](auto* d, const auto& h) {
    if (!h.empty()) SB_CUDA_CHECK(cudaMemcpyAsync(d, h.data(), h.size() * sizeof(h[0]), cudaMemcpyHostToDevice, stream));
  };
  // the per-token query's score stage: pair offsets, tiles (fixed for the micro-batch), scores
  const std::vector<int64_t> pair_base = pair_bases(block_base, Hkv);
  const bool per_token = gp.query == GateQuery::max;
  const std::vector<ScoreTile> tiles = per_token ? score_tiles(blocks, m.R, gp.key == GateKey::bounds) : std::vector<ScoreTile>();
  m.n_pairs = pair_base[ndocs], m.n_tiles = int(tiles.size());
  m.pair_base.need(ndocs + 1);
  if (per_token) m.tiles.need(tiles.size()), m.tok_score.need(size_t(m.n_pairs));
  up(m.pair_base.p, pair_base);
  up(m.tiles.p, tiles);
  up(m.blocks.p, blocks);
  up(m.block_base.p, block_base);
  up(m.row_base.p, row_base);
  const std::vector<int32_t> kb(k_per_layer.begin(), k_per_layer.end());
  up(m.kbud.p, kb);
  SB_CUDA_CHECK(cudaMemsetAsync(m.stats.p, 0, m.stats.cap * sizeof(double), stream));
}

void DeviceGating::reserve(DeviceSelection& sel) const {
  const Impl& m = *impl_;
  sel.reserve(m.n_blocks, m.ndocs, m.rows * m.cap, m.s, m.n_tokens, m.max_nb);
}

void DeviceGating::select(const bf16* q, const bf16* k, int layer, DeviceSelection& sel, cudaStream_t stream) {
  Impl& m = *impl_;
  if (layer < 0 || layer >= m.n_layers) throw Error("DeviceGating::select: layer outside the budgets of prepare()");
  sel.reserve(m.n_blocks, m.ndocs, m.rows * m.cap, m.s, m.n_tokens, m.max_nb);  // no allocation after reserve()
  if (m.n_blocks == 0) return;
  const int Hkv = m.s.n_kv_heads, D = m.s.head_dim, H = m.s.n_heads;
  SB_CUDA_CHECK(cudaMemcpyAsync(sel.blocks, m.blocks.p, m.n_blocks * sizeof(BlockInfo), cudaMemcpyDeviceToDevice, stream));
  SB_CUDA_CHECK(cudaMemcpyAsync(sel.row_base, m.row_base.p, (m.ndocs + 1) * sizeof(int64_t), cudaMemcpyDeviceToDevice, stream));
  SB_CUDA_CHECK(cudaMemsetAsync(m.bits.p, 0, size_t(m.rows) * m.words * sizeof(uint32_t), stream));
  SB_CUDA_CHECK(cudaMemsetAsync(m.ccnt.p, 0, size_t(m.rows) * sizeof(int32_t), stream));
  const dim3 grid(unsigned(m.n_blocks), unsigned(Hkv));
  const bool per_token = m.gate.query == GateQuery::max;
  double* qbar = per_token ? nullptr : m.qbar.p;
  pool_kernel<<<grid, std::min(D, 128), 0, stream>>>(q, k, m.blocks.p, H, Hkv, D, int(m.gate.key), m.R,
                                                      m.s.block_size / m.R, qbar, m.kbar.p);
  SB_CUDA_CHECK_LAUNCH("pool_kernel");
  if (per_token)
    token_scores(q, m.kbar.p, m.blocks.p, m.block_base.p, m.pair_base.p, m.tiles.p, m.n_tiles, m.n_pairs, H, Hkv, D, m.R,
                 m.gate.key == GateKey::bounds, m.tok_score.p, stream);
  const RowParams rp{m.blocks.p, m.block_base.p, m.row_base.p, qbar, m.kbar.p, Hkv, D, 0, m.local, m.cap, m.theta,
                     1.0 / std::sqrt(double(D)), m.row_slots.p, m.cnt.p, m.recall.p, m.kbud.p, layer, m.words,
                     m.bits.p, m.ccnt.p, per_token ? m.tok_score.p : nullptr, m.pair_base.p, int(m.gate.key), m.R};
  const size_t smem = row_smem_bytes(D, m.max_nb);
  if (smem > 48 * 1024)
    SB_CUDA_CHECK(cudaFuncSetAttribute(row_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  row_kernel<<<grid, 128, smem, stream>>>(rp);
  SB_CUDA_CHECK_LAUNCH("row_kernel");
  scan_kernel<<<1, kOneCta, 0, stream>>>(m.cnt.p, m.rows, sel.row_ptr, m.recall.p, m.stats.p + 2 * layer);
  SB_CUDA_CHECK_LAUNCH("scan_kernel");
  compact_kernel<<<grid_for(m.rows * m.cap, 256), 256, 0, stream>>>(m.row_slots.p, m.cnt.p, sel.row_ptr, m.rows, m.cap,
                                                                     sel.cols);
  SB_CUDA_CHECK_LAUNCH("compact_kernel");
  scan_kernel<<<1, kOneCta, 0, stream>>>(m.ccnt.p, m.rows, sel.col_ptr, nullptr, nullptr);
  SB_CUDA_CHECK_LAUNCH("scan_kernel");
  csc_kernel<<<grid_for(m.rows * 32, 256), 256, 0, stream>>>(m.bits.p, m.words, m.rows, sel.col_ptr, sel.col_rows);
  SB_CUDA_CHECK_LAUNCH("csc_kernel");
  const int G = H / Hkv;
  m.order(sel.row_ptr, H, G, 1, std::min(m.cap, m.max_nb), sel.fwd_items, sel, stream);
  m.order(sel.col_ptr, Hkv, 1, G, int64_t(G) * m.max_nb, sel.bwd_items, sel, stream);
}

void DeviceGating::fetch_stats(cudaStream_t stream) {
  Impl& m = *impl_;
  if (m.n_layers > 0)
    SB_CUDA_CHECK(cudaMemcpyAsync(m.hstats, m.stats.p, 2 * m.n_layers * sizeof(double), cudaMemcpyDeviceToHost, stream));
}

GatingStats DeviceGating::stats(int layer) const {
  const Impl& m = *impl_;
  GatingStats st;
  if (layer < 0 || layer >= m.n_layers || m.n_blocks == 0) return st;
  st.rows = double(m.rows);
  st.causal_blocks = m.causal;
  st.kept_blocks = m.hstats[2 * layer];
  st.recall_sum = m.hstats[2 * layer + 1];
  return st;
}

}  // namespace sb::kernels::cuda
