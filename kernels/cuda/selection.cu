// DeviceSelection: a BlockSelection and its transpose on the device; device probing.
#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/attention_params.cuh"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cta_order.hpp"

namespace sb::kernels::cuda {

namespace {
// Grow-only: a layer's selection is uploaded every micro-batch, and cudaFree synchronises the whole
// device, so buffers are reused while they are large enough.
template <class T>
T* grow(T*& d, size_t& cap, size_t n) {
  n = std::max<size_t>(n, 1);
  if (!d || cap < n) {
    if (d) SB_CUDA_CHECK(cudaFree(d));
    d = nullptr;
    SB_CUDA_CHECK(cudaMalloc(&d, n * sizeof(T)));
    cap = n;
  }
  return d;
}
template <class T>
T* to_device(const std::vector<T>& h, T*& d, size_t& cap, cudaStream_t stream) {
  grow(d, cap, h.size());
  if (!h.empty()) SB_CUDA_CHECK(cudaMemcpyAsync(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  return d;
}
// The backward's scratch (bwd_work_bytes for this selection), grow-only as above. kept as the
// backward passes it to the column split (-1 for a selection built on the device), so that both
// choose the same split.
void size_bwd_work(DeviceSelection& d, AttnShape s) {
  const size_t need = bwd_work_bytes(d.n_blocks, d.max_doc_blocks, d.kept, s);
  if (need == 0) return;  // no column split: nothing to list
  auto* w = static_cast<unsigned char*>(d.bwd_work);
  grow(w, d.bwd_work_size, need);
  d.bwd_work = w;
}
template <class T>
void free_ptr(T*& p) {
  if (p) cudaFree(p);  // no check: also called from the destructor
  p = nullptr;
}
CtaOrder g_launch_order = CtaOrder::mixed;  // set_launch_order
}  // namespace

void set_launch_order(CtaOrder mode) { g_launch_order = mode; }
CtaOrder launch_order() { return g_launch_order; }

DeviceSelection::~DeviceSelection() { release(); }

void DeviceSelection::release() {
  free_ptr(blocks);
  free_ptr(fwd_items);
  free_ptr(bwd_items);
  free_ptr(row_base);
  free_ptr(row_ptr);
  free_ptr(cols);
  free_ptr(col_ptr);
  free_ptr(col_rows);
  free_ptr(bwd_work);
  bwd_work_size = 0;
  cap_ = {};
  n_blocks = 0;
}

void DeviceSelection::upload(const BlockSelection& sel, const int32_t* cu, int ndocs, AttnShape s,
                             cudaStream_t stream) {
  const int Bs = s.block_size, Hkv = s.n_kv_heads;
  if (int(sel.doc_row_base.size()) != ndocs + 1) throw Error("DeviceSelection: doc_row_base size");
  const int64_t rows = sel.doc_row_base[ndocs];
  if (int64_t(sel.row_ptr.size()) != rows + 1) throw Error("DeviceSelection: row_ptr size");
  if (s.n_heads < Hkv || s.n_heads % Hkv != 0) throw Error("DeviceSelection: n_heads must be a multiple of n_kv_heads");
  std::vector<BlockInfo> binfo;
  int max_nb = 0;
  std::vector<int64_t> cnt(rows + 1, 0);    // transpose counts, then col_ptr
  for (int d = 0; d < ndocs; d++) {
    const int L = cu[d + 1] - cu[d], nb = (L + Bs - 1) / Bs;
    if (sel.doc_row_base[d + 1] - sel.doc_row_base[d] != int64_t(Hkv) * nb)
      throw Error("DeviceSelection: selection does not match cu_seqlens / block size");
    max_nb = std::max(max_nb, nb);
    for (int i = 0; i < nb; i++) binfo.push_back({d, i, cu[d] + i * Bs, std::min(Bs, L - i * Bs), nb, cu[d], L, 0});
    for (int g = 0; g < Hkv; g++)
      for (int i = 0; i < nb; i++) {
        const int64_t r = sel.doc_row_base[d] + int64_t(g) * nb + i;
        for (int64_t c = sel.row_ptr[r]; c < sel.row_ptr[r + 1]; c++) {
          const int j = sel.cols[c];
          if (j < 0 || j > i) throw Error("DeviceSelection: kept block outside 0..i");
          cnt[sel.doc_row_base[d] + int64_t(g) * nb + j + 1]++;
        }
      }
  }
  std::partial_sum(cnt.begin(), cnt.end(), cnt.begin());
  std::vector<int32_t> crow(sel.cols.size());
  {
    std::vector<int64_t> fill(cnt.begin(), cnt.end() - 1);
    // rows in ascending order, so every column's query blocks come out ascending
    for (int d = 0; d < ndocs; d++) {
      const int L = cu[d + 1] - cu[d], nb = (L + Bs - 1) / Bs;
      for (int g = 0; g < Hkv; g++)
        for (int i = 0; i < nb; i++) {
          const int64_t base = sel.doc_row_base[d] + int64_t(g) * nb;
          for (int64_t c = sel.row_ptr[base + i]; c < sel.row_ptr[base + i + 1]; c++)
            crow[fill[base + sel.cols[c]]++] = i;
        }
    }
  }
  // CTA launch order (kernels/cta_order.hpp). Work of a forward item (block, head): its kept key
  // blocks; of a backward item (key block, kv head): the query blocks keeping it, times the group.
  const int H = s.n_heads, G = H / Hkv;
  std::vector<int64_t> fw(binfo.size() * H), bw(binfo.size() * Hkv);
  for (size_t bi = 0; bi < binfo.size(); bi++) {
    const BlockInfo& b = binfo[bi];
    for (int g = 0; g < Hkv; g++) {
      const int64_t r = sel.doc_row_base[b.doc] + int64_t(g) * b.nb + b.i;
      for (int h = g * G; h < g * G + G; h++) fw[bi * H + h] = sel.row_ptr[r + 1] - sel.row_ptr[r];
      bw[bi * Hkv + g] = G * (cnt[r + 1] - cnt[r]);
    }
  }
  const int slots = sm_count();
  const CtaOrder mode = g_launch_order;

  n_blocks = int(binfo.size());
  block_size = Bs;
  n_heads = H;
  n_kv_heads = Hkv;
  n_tokens = cu[ndocs];  // tokens are indexed from 0 (cu[0] == 0)
  max_doc_blocks = max_nb;
  kept = max_kept = int64_t(sel.cols.size());
  size_bwd_work(*this, s);
  to_device(binfo, this->blocks, cap_[0], stream);
  const std::vector<int32_t> fo = cta_order(fw, H, slots, mode), bo = cta_order(bw, Hkv, slots, mode);
  to_device(fo, fwd_items, cap_[1], stream);
  to_device(bo, bwd_items, cap_[7], stream);
  to_device(sel.doc_row_base, row_base, cap_[2], stream);
  to_device(sel.row_ptr, row_ptr, cap_[3], stream);
  to_device(sel.cols, cols, cap_[4], stream);
  to_device(cnt, col_ptr, cap_[5], stream);
  to_device(crow, col_rows, cap_[6], stream);
  SB_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void DeviceSelection::reserve(int nblocks, int ndocs, int64_t max_kept, AttnShape s, int64_t ntokens,
                              int max_doc_nb) {
  const size_t rows = size_t(nblocks) * s.n_kv_heads;
  grow(blocks, cap_[0], nblocks);
  grow(fwd_items, cap_[1], size_t(nblocks) * s.n_heads);
  grow(bwd_items, cap_[7], size_t(nblocks) * s.n_kv_heads);
  grow(row_base, cap_[2], size_t(ndocs) + 1);
  grow(row_ptr, cap_[3], rows + 1);
  grow(cols, cap_[4], size_t(max_kept));
  grow(col_ptr, cap_[5], rows + 1);
  grow(col_rows, cap_[6], size_t(max_kept));
  n_blocks = nblocks;
  block_size = s.block_size;
  n_heads = s.n_heads;
  n_kv_heads = s.n_kv_heads;
  n_tokens = ntokens;
  max_doc_blocks = max_doc_nb;
  kept = -1;
  this->max_kept = max_kept;
  size_bwd_work(*this, s);
}

DeviceSelection::HostCopy DeviceSelection::download(int ndocs, cudaStream_t stream) const {
  HostCopy h;
  const size_t rows = size_t(n_blocks) * n_kv_heads;
  auto get = [&](auto& v, const auto* d, size_t n) {
    v.resize(n);
    if (n) SB_CUDA_CHECK(cudaMemcpyAsync(v.data(), d, n * sizeof(v[0]), cudaMemcpyDeviceToHost, stream));
  };
  get(h.blocks, blocks, size_t(n_blocks));
  get(h.sel.doc_row_base, row_base, size_t(ndocs) + 1);
  get(h.sel.row_ptr, row_ptr, rows + 1);
  get(h.col_ptr, col_ptr, rows + 1);
  get(h.fwd_items, fwd_items, size_t(n_blocks) * n_heads);
  get(h.bwd_items, bwd_items, size_t(n_blocks) * n_kv_heads);
  SB_CUDA_CHECK(cudaStreamSynchronize(stream));
  get(h.sel.cols, cols, size_t(h.sel.row_ptr.back()));
  get(h.col_rows, col_rows, size_t(h.col_ptr.back()));
  SB_CUDA_CHECK(cudaStreamSynchronize(stream));
  return h;
}

// SMs of the current device: the launch order's slots (one wgmma CTA per SM; the mma.sync kernels
// fit two, which the order tolerates).
int sm_count() {
  int dev = 0, n = 0;
  SB_CUDA_CHECK(cudaGetDevice(&dev));
  SB_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return std::max(n, 1);
}
bool device_available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = e != cudaSuccess ? std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e) : "no CUDA device";
    cudaGetLastError();
    return false;
  }
  return true;
}

}  // namespace sb::kernels::cuda
