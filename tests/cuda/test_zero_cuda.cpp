// Issue 22, ZeRO-1 in the CUDA engine (needs a GPU; skipped without one), at 1 and 2 ranks (2 ranks
// share the one GPU of the test machine: the host-staged path, MPI reduce-scatter and all-gather):
// - train.zero = 1 trains as train.zero = 0, with the gradients reduced to their owners layer by
//   layer during the last backward (train.overlap_reduce, the default: NCCL reduces on its own
//   stream with a GPU per rank, the host-staged MPI reduces when ranks share one) and with the
//   reduce-scatter after it (overlap_reduce = false): losses at every step, the final weights and the
//   checkpoint's moments agree to rounding (relative L2; the GPU's backward sums in no fixed order),
//   with the clip active, q/k/v biases (fp32 copies beside the bf16 weights) and collectives in many
//   rounds (train.bucket_mb = 0.01); train.sync_check_every = 1 checks the gathered weights agree.
// - the zero = 1 checkpoint of step 3 resumed (zero = 1, and zero = 0) ends as the uninterrupted run.
// - the engine itself: it reports holding only this rank's slice, and weights and moments set on
//   the host come back unchanged through the device (from_host, then to_host's gather of the slices).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "base/hash.hpp"
#include "io/checkpoint.hpp"
#include "kernels/cuda/attention_cuda.hpp"
#include "src/engine/engine.hpp"
#include "src/train/trainer.hpp"
#include "tests/cuda/gpu_test_util.hpp"
#include "tests/train/train_test_util.hpp"

using namespace sbtest;

namespace {

double rel_l2(const std::vector<float>& got, const std::vector<float>& ref) {
  EXPECT_EQ(got.size(), ref.size());
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    const double d = double(got[i]) - double(ref[i]);
    num += d * d, den += double(ref[i]) * double(ref[i]);
  }
  return std::sqrt(num / den);
}

struct Trained {
  sb::TrainResult r;
  std::vector<float> w;
};

Trained train(const sb::Comm& comm, const std::string& dir, const std::string& tag, const std::string& extra,
          const std::string& resume = "") {
  const std::string flags =
      " --set model.d_model=128 --set model.n_heads=2 --set model.n_kv_heads=1 --set model.ffn_dim=256"
      " --set model.qkv_bias=true --set attention.block_size=128 --set train.micro_batch_tokens=1024"
      " --set train.global_batch_tokens=4096 --set train.steps=6 --set train.lr=2e-3 --set train.grad_clip=0.05"
      " --set train.bucket_mb=0.01 --set checkpoint.every=3 --set attention.mode=dense --set balance.tuning=fixed"
      " --set balance.self_profile=false --set train.device=cuda --set checkpoint.dir=" + dir + "/ckpt_" + tag +
      " --set log.path=" + dir + "/metrics_" + tag + ".h5 " + extra;
  sb::Trainer t(tiny_config(dir, flags), comm, resume, 0);
  Trained out{t.run(), {}};
  out.w = t.model().weights();
  return out;
}

}  // namespace

TEST(ZeroCuda, SlicedOptimizerTrainsAsPlainDataParallelAndResumes) {
  if (!have_gpu()) GTEST_SKIP();
  sb::Comm comm;
  const std::string dir = scratch(comm, "zero_cuda");
  const double tol = 1e-3;
  const Trained plain = train(comm, dir, "z0", "--set train.zero=0");
  const Trained zero = train(comm, dir, "z1", "--set train.zero=1");
  ASSERT_EQ(plain.r.losses.size(), 6u);
  ASSERT_EQ(zero.r.losses.size(), 6u);
  for (size_t s = 0; s < 6; ++s)
    EXPECT_NEAR(zero.r.losses[s], plain.r.losses[s], tol * plain.r.losses[s]) << "step " << s + 1;
  EXPECT_LT(zero.r.losses.back(), zero.r.losses.front());
  EXPECT_LT(rel_l2(zero.w, plain.w), tol);
  const Trained scattered = train(comm, dir, "z1rs", "--set train.zero=1 --set train.overlap_reduce=false");
  ASSERT_EQ(scattered.r.losses.size(), 6u);
  for (size_t s = 0; s < 6; ++s)
    EXPECT_NEAR(scattered.r.losses[s], plain.r.losses[s], tol * plain.r.losses[s]) << "reduce-scatter, step " << s + 1;
  EXPECT_LT(rel_l2(scattered.w, plain.w), tol);
  if (comm.root()) {  // the sliced checkpoint (every rank's slice of the moments) holds what the plain one does
    for (int s : {3, 6}) {
      const sb::Checkpoint a = sb::read_checkpoint(sb::checkpoint_path(dir + "/ckpt_z0", s));
      const sb::Checkpoint b = sb::read_checkpoint(sb::checkpoint_path(dir + "/ckpt_z1", s));
      EXPECT_LT(rel_l2(b.params, a.params), tol) << "step " << s;
      EXPECT_LT(rel_l2(b.m, a.m), tol) << "step " << s;
      EXPECT_LT(rel_l2(b.v, a.v), 10 * tol) << "step " << s;
    }
  }
  // Resumed from the zero = 1 checkpoint of step 3: steps 4..6 again, sliced and not.
  const std::string ck3 = sb::checkpoint_path(dir + "/ckpt_z1", 3);
  for (int z : {1, 0}) {
    const Trained res = train(comm, dir, "resumed" + std::to_string(z), "--set train.zero=" + std::to_string(z), ck3);
    EXPECT_EQ(res.r.first_step, 4) << "zero " << z;
    ASSERT_EQ(res.r.last_step, 6) << "zero " << z;
    EXPECT_NEAR(res.r.last_loss, zero.r.last_loss, tol * zero.r.last_loss) << "zero " << z;
    EXPECT_LT(rel_l2(res.w, zero.w), tol) << "zero " << z;
  }
  if (comm.root())
    std::printf("zero: 6 steps on %d rank(s), loss %.5f -> %.5f (zero 1) vs %.5f -> %.5f (zero 0), weights rel %.2e\n",
                comm.size(), zero.r.losses.front(), zero.r.losses.back(), plain.r.losses.front(),
                plain.r.losses.back(), rel_l2(zero.w, plain.w));
}

TEST(ZeroCuda, EngineKeepsItsSliceAndRoundTripsTheState) {
  if (!have_gpu()) GTEST_SKIP();
  sb::Comm comm;
  const std::string dir = scratch(comm, "zero_cuda_state");
  const sb::Config cfg = tiny_config(
      dir, " --set model.d_model=128 --set model.n_heads=2 --set model.n_kv_heads=1 --set model.ffn_dim=256"
           " --set model.qkv_bias=true --set attention.block_size=128 --set train.device=cuda --set train.zero=1"
           " --set train.bucket_mb=0.01");
  const sb::Settings s = sb::from_config(cfg, 300);
  sb::Model<float> model(s.model);
  model.init(5);
  const size_t n = model.weights().size();
  const sb::Slice sh = sb::slice_of(n, comm.rank(), comm.size());
  sb::AdamW opt(s.optim, n, sh);
  std::vector<float> m0(sh.size()), v0(sh.size());
  for (size_t i = 0; i < sh.size(); ++i) m0[i] = float(sh.lo + i), v0[i] = 0.5f * float(sh.lo + i);
  opt.m() = m0, opt.v() = v0;
  std::unique_ptr<sb::Engine> engine = sb::make_engine(s.engine(), comm, model, opt);
  const std::string line = engine->memory_line();
  EXPECT_NE(line.find("of " + std::to_string(sh.size()) + " of " + std::to_string(n) + " parameters"),
            std::string::npos) << line;
  EXPECT_NE(line.find("train.zero = 1"), std::string::npos) << line;
  engine->from_host();
  const std::vector<float> w0 = model.weights();
  EXPECT_EQ(engine->weights_hash(), sb::fnv1a_words(w0.data(), n));
  std::fill(model.weights().begin(), model.weights().end(), 0.f);
  std::fill(opt.m().begin(), opt.m().end(), 0.f);
  std::fill(opt.v().begin(), opt.v().end(), 0.f);
  engine->to_host();
  EXPECT_EQ(model.weights(), w0);
  EXPECT_EQ(opt.m(), m0);
  EXPECT_EQ(opt.v(), v0);
}
