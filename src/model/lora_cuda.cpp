// LoRA on the GPU model (model_cuda.hpp, model.hpp "LoRA"): the frozen base's device copies and the
// adapters' GEMMs, as lora.cpp on the CPU. Every GEMM through cuBLAS, bf16 inputs (the adapters'
// bf16 copies in w16_, the saved u), fp32 accumulation; the adapters' gradients in fp32.
#include <algorithm>
#include <stdexcept>
#include <vector>

#include "base/cuda_check.hpp"
#include "base/hash.hpp"
#include "kernels/cuda/lora_dropout_cuda.hpp"
#include "kernels/lora_dropout.hpp"
#include "src/model/model_cuda.hpp"

namespace sb {

namespace kc = kernels::cuda;

// Each frozen tensor of `base` (base_layout_ order, fp32 on the host) to its one device copy: bf16
// (what the GEMMs and the embedding read) or fp32 (norms, biases), through a bounded staging buffer.
void ModelCuda::upload_base(const std::vector<float>& base) {
  if (!lora_.on()) return;
  if (base.size() != base_layout_.size) throw std::logic_error("ModelCuda::upload_base: size differs from the base's");
  DeviceArray<float> stage(std::min<size_t>(base.size(), size_t(1) << 24));  // 64 MiB at most
  for (size_t i = 0; i < base_layout_.params.size(); ++i) {
    const ParamInfo& p = base_layout_.params[i];
    if (boff32_[i] != kNoParam) {
      SB_CUDA_CHECK(cudaMemcpyAsync(base32_.data() + boff32_[i], base.data() + p.offset, p.size * sizeof(float),
                                    cudaMemcpyHostToDevice, stream_));
      continue;
    }
    if (boff16_[i] == kNoParam) continue;  // trained: its copy is in the trainable buffers
    for (size_t lo = 0; lo < p.size; lo += stage.capacity()) {
      const size_t len = std::min(stage.capacity(), p.size - lo);
      SB_CUDA_CHECK(cudaMemcpyAsync(stage.data(), base.data() + p.offset + lo, len * sizeof(float),
                                    cudaMemcpyHostToDevice, stream_));
      kc::to_bf16(stage.data(), base16_.data() + boff16_[i] + lo, len, stream_);
      SB_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the staging buffer is reused
    }
  }
  SB_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

uint64_t ModelCuda::base_hash() const {
  if (!lora_.on()) return 0;
  // bf16 pairs read as float words (an odd count's last one alone), then the fp32 copies
  const size_t n16 = base16_.capacity(), n32 = base32_.capacity();
  std::vector<float> h16((n16 + 1) / 2, 0.f), h32(n32);
  if (n16) SB_CUDA_CHECK(cudaMemcpyAsync(h16.data(), base16_.data(), n16 * sizeof(bf16), cudaMemcpyDeviceToHost, stream_));
  if (n32) SB_CUDA_CHECK(cudaMemcpyAsync(h32.data(), base32_.data(), n32 * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  SB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return fnv1a_words(h32.data(), h32.size(), fnv1a_words(h16.data(), h16.size()));
}

const ModelCuda::bf16* ModelCuda::dropped(int l, int t, const bf16* x, int in, int N) {
  if (!training_ || lora_.dropout <= 0) return x;
  const size_t n = size_t(N) * in;
  kc::lora_dropout_fwd(x, xd_.resize(sz_.xd), n, kernels::dropout_key(drop_key_, l, t),
                       kernels::dropout_threshold(lora_.dropout), float(1.0 / (1.0 - lora_.dropout)), stream_);
  return xd_.data();
}

// u (N, r) = scale * x (N, in) @ A^T, A (r, in); x after lora.dropout's mask in training
void ModelCuda::adapter_in(int l, int t, const bf16* x, int in, DeviceArray<bf16>& u, int N) {
  if (!has_adapter(l, t)) return;
  x = dropped(l, t, x, in, N);
  const int r = lora_.rank;
  const ParamInfo& A = layout_.params[adapters_[size_t(l)][size_t(t)].a];
  kc::gemm(*blas_, false, true, N, r, in, float(lora_.scale()), x, in, w16_.data() + A.offset, in, 0.f,
           u.resize(sz_.layer.u), r);  // (N, r)
}

// y (N, out; rows ld_y apart) += u (N, r) @ B^T, B (out, r)
template <class Y>
void ModelCuda::adapter_out(int l, int t, const bf16* u, Y* y, int ld_y, int out, int N) {
  if (!has_adapter(l, t)) return;
  const int r = lora_.rank;
  const ParamInfo& B = layout_.params[adapters_[size_t(l)][size_t(t)].b];
  kc::gemm(*blas_, false, true, N, out, r, 1.f, u, r, w16_.data() + B.offset, r, 1.f, y, ld_y);
}

// dy (N, out; rows ld_dy apart) the gradient of the projection's output; x (N, in), u (N, r) the forward's.
template <class Y>
void ModelCuda::adapter_bwd(int l, int t, const bf16* x, int in, const bf16* dy, int ld_dy, int out, const bf16* u,
                            Y* dx, int N) {
  if (!has_adapter(l, t)) return;
  const int r = lora_.rank;
  const LoraPair& ab = adapters_[size_t(l)][size_t(t)];
  const ParamInfo &A = layout_.params[ab.a], &B = layout_.params[ab.b];
  kc::Blas& bl = *blas_;
  bf16* du = du_.resize(sz_.du);  // (N, r)
  // dB (out, r) += dy^T @ u;  du (N, r) = scale * dy @ B;  dA (r, in) += du^T @ x;  dx (N, in) += du @ A
  // (lora.dropout: x is the dropped input, drawn again with the forward's key, and du @ A goes
  // through the same mask and scale)
  kc::gemm(bl, true, false, out, r, N, 1.f, dy, ld_dy, u, r, 1.f, g32_.data() + B.offset, r);
  kc::gemm(bl, false, false, N, r, out, float(lora_.scale()), dy, ld_dy, w16_.data() + B.offset, r, 0.f, du, r);
  const bf16* xd = dropped(l, t, x, in, N);
  kc::gemm(bl, true, false, r, in, N, 1.f, du, r, xd, in, 1.f, g32_.data() + A.offset, in);
  if (xd == x) return kc::gemm(bl, false, false, N, in, r, 1.f, du, r, w16_.data() + A.offset, in, 1.f, dx, in);
  const size_t n = size_t(N) * in;
  float* dxa = dxa_.resize(sz_.dxa);  // (N, the widest in): n used
  kc::gemm(bl, false, false, N, in, r, 1.f, du, r, w16_.data() + A.offset, in, 0.f, dxa, in);
  kc::lora_dropout_bwd_add(dxa, dx, n, kernels::dropout_key(drop_key_, l, t), kernels::dropout_threshold(lora_.dropout),
                           float(1.0 / (1.0 - lora_.dropout)), stream_);
}

template void ModelCuda::adapter_out<float>(int, int, const bf16*, float*, int, int, int);
template void ModelCuda::adapter_out<kc::bf16>(int, int, const bf16*, bf16*, int, int, int);
template void ModelCuda::adapter_bwd<float>(int, int, const bf16*, int, const bf16*, int, int, const bf16*, float*, int);
template void ModelCuda::adapter_bwd<kc::bf16>(int, int, const bf16*, int, const bf16*, int, int, const bf16*, bf16*,
                                               int);

}  // namespace sb
