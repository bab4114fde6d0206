#include "src/engine/zero_cuda.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "base/cuda_check.hpp"

namespace sb {

namespace kc = kernels::cuda;

ZeroCuda::ZeroCuda(const Comm& comm, ModelCuda& gpu, const ParamLayout& layout, AdamW& opt, ZeroReducer& red,
                   size_t bucket_bytes, bool in_place)
    : comm_(comm), gpu_(gpu), layout_(layout), opt_(opt), red_(red), host_(comm, bucket_bytes), sh_(opt.slice()) {
  if (gpu.has_master() || sh_.hi > gpu.size() || opt.params() != gpu.size())
    throw std::logic_error("ZeroCuda: the model keeps its own master, or the slice does not fit it");
  master_.resize(sh_.size()), m_.resize(sh_.size()), v_.resize(sh_.size());
  // One rank: the slice is everything and the reduction the identity, so AdamW reads the gradients
  // in place; so it does when the engine reduced them to their owners in place.
  own_g_ = comm.size() > 1 && !in_place;
  if (own_g_) g_mine_ = g_.resize(sh_.size());
  else g_mine_ = gpu.grads() + sh_.lo;
}

void ZeroCuda::reduce_gradients() {
  if (own_gradient_copy()) red_.reduce_scatter_sum(gpu_.grads(), gpu_.size(), g_mine_);
}

double ZeroCuda::gradient_norm() {
  double s = sh_.size() ? kc::sum_squares(g_mine_, sh_.size(), gpu_.stream()) : 0.0;
  comm_.allreduce_sum_inplace(std::span<double>(&s, 1));
  return std::sqrt(s);
}

void ZeroCuda::update(double grad_norm, double lr, int64_t step) {
  cudaStream_t s = gpu_.stream();
  const size_t lo = sh_.lo;
  opt_.step(
      layout_, grad_norm, lr, step, [&](float c) { kc::scale_inplace(g_mine_, c, sh_.size(), s); },
      [&](const ParamInfo& p, const AdamWArgs& a) {  // the part of tensor p inside the slice, if any
        const size_t b = std::max(p.offset, lo), e = std::min(p.offset + p.size, sh_.hi);
        if (b >= e) return;
        kc::adamw(master_.data() + (b - lo), nullptr, g_mine_ + (b - lo), m_.data() + (b - lo), v_.data() + (b - lo),
                  e - b, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.step, s);
      });
  red_.allgather(master_.data(), gpu_.size(),
                 [&](const float* piece, size_t at, size_t len) { gpu_.set_weights(piece, at, len); });
}

void ZeroCuda::gather_weights(std::vector<float>& w) {
  w.resize(gpu_.size());
  SB_CUDA_CHECK(cudaMemcpyAsync(w.data() + sh_.lo, master_.data(), sh_.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                gpu_.stream()));
  SB_CUDA_CHECK(cudaStreamSynchronize(gpu_.stream()));
  host_.allgather(w.data(), w.size());
}

static void copy_slice(float* to, const float* from, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
  SB_CUDA_CHECK(cudaMemcpyAsync(to, from, n * sizeof(float), kind, s));
}

void ZeroCuda::to_host(std::vector<float>& w) {
  gather_weights(w);
  opt_.m().resize(sh_.size()), opt_.v().resize(sh_.size());
  copy_slice(opt_.m().data(), m_.data(), sh_.size(), cudaMemcpyDeviceToHost, gpu_.stream());
  copy_slice(opt_.v().data(), v_.data(), sh_.size(), cudaMemcpyDeviceToHost, gpu_.stream());
  SB_CUDA_CHECK(cudaStreamSynchronize(gpu_.stream()));
}

void ZeroCuda::from_host(const std::vector<float>& w) {
  if (w.size() != gpu_.size() || opt_.m().size() != sh_.size() || opt_.v().size() != sh_.size())
    throw std::logic_error("ZeroCuda::from_host: weights or moments not of the model's and the slice's size");
  copy_slice(master_.data(), w.data() + sh_.lo, sh_.size(), cudaMemcpyHostToDevice, gpu_.stream());
  copy_slice(m_.data(), opt_.m().data(), sh_.size(), cudaMemcpyHostToDevice, gpu_.stream());
  copy_slice(v_.data(), opt_.v().data(), sh_.size(), cudaMemcpyHostToDevice, gpu_.stream());
  gpu_.upload_weights(w);  // synchronises the stream
}

}  // namespace sb
