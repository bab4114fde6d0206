// GPU block-sparse attention benchmark: forward, backward and forward+backward times (median of
// --reps runs, CUDA events) on one document of L tokens, bf16, over the mask family the GPU
// issue fixes: query block i keeps block 0, block i and round(density*(i+1))-2 further blocks drawn
// uniformly from 1..i-1 (splitmix64, identical to bench/torch/flex_attention_ref.py). Effective TFLOP/s
// counts only computed blocks, causal: a diagonal block as half; forward = 2 matmuls (4*Bs*Bs*D per
// block and head), backward = 2.5x forward, forward+backward = 3.5x forward.
//   bench_attention_cuda [--lens 8192,16384,32768,65536] [--densities 1,0.5,0.25,0.1] [--heads 32]
//                        [--kv-heads H] [--dim 128] [--block 128] [--reps 10] [--seed 1234] [--csv FILE]
//                        [--kernels wgmma,mma] [--ref FLEX.csv] [--split 1] [--power 1] [--trace FILE]
//                        [--order mixed] [--bwd-grid compact] [--bwd-chunk -1] [--gate MODES]
// --kv-heads: grouped-query attention (default = --heads, MHA); each kv head's query blocks keep the
// same blocks for the whole group, as the gating selects (--heads 14 --kv-heads 2 --dim 64 is the
// Qwen2.5-0.5B shape).
// --kernels: the kernel generations to time, side by side on the same inputs and masks (wgmma only
// where it runs: sm_90a build, block 128); "x mma" is the mma.sync time over this line's.
// --ref: bench/torch/flex_attention_ref.py's CSV from the same device call (same shape, masks and seed):
// "x flex" and "x cudnn" are their times over this line's; nan where it has no such point.
// --split 1: after each line, the forward+backward's two halves (an event between them), and the
// two timed apart after a 100 ms idle pause each: whether back to back the kernels run slower than
// alone, and in which half.
// --power 1: after each line, the mean board power, SM clock and share of samples at the power cap
// while the forward, backward and forward+backward loops ran (NVML, bench/cpp/gpu_power.hpp).
// --trace FILE: after each line's timings, one more wgmma backward with per-CTA timestamps
// (set_bwd_trace), written to FILE as CSV (L, density, CTA, then set_bwd_trace's ten values);
// bench/analysis/bwd_trace.py summarizes it: where the backward's
// time goes between its CTAs' tiles, their starts and ends, and the last wave.
// --order heads|blocks: the CTA launch order's alternatives to the default mixed (set_launch_order);
// --bwd-grid full: the wgmma backward's full grid instead of the compacted one (set_bwd_compact);
// --bwd-chunk N: its column split at N 64-query tiles, 0 none (set_bwd_column_chunk; -1 automatic).
// Each against the default in one call: bench/gpu/ab_bench.sh ALT="--order heads".
// --gate MODES: time the device gating of one layer per gate mode instead (time_gating below), e.g.
//   bench_attention_cuda --gate mean,max,max+bounds --lens 16384,32768 --heads 10 --kv-heads 2
//   (the 0.47B shape at its defaults --dim 128 --block 128)
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "bench/cpp/bench_flags.hpp"
#include "bench/cpp/gpu_power.hpp"

namespace K = sb::kernels;
namespace C = sb::kernels::cuda;
using C::bf16;

namespace {

struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

// Kept blocks of query block i (ascending).
std::vector<int32_t> row_blocks(int i, double density, uint64_t seed) {
  if (i == 0) return {0};
  int extra = int(std::floor(density * (i + 1) + 0.5)) - 2;
  extra = std::clamp(extra, 0, i - 1);
  std::vector<int32_t> cand(i - 1);
  for (int x = 0; x < i - 1; x++) cand[x] = x + 1;
  SplitMix rng{seed + uint64_t(i) * 0x9E3779B97F4A7C15ull};
  const int n = i - 1;
  for (int t = 0; t < extra; t++) {
    const int r = t + int(rng.next() % uint64_t(n - t));
    std::swap(cand[t], cand[r]);
  }
  std::vector<int32_t> out(cand.begin(), cand.begin() + extra);
  out.push_back(0);
  out.push_back(i);
  std::sort(out.begin(), out.end());
  return out;
}

__global__ void fill_random(bf16* x, size_t n, uint64_t seed, float sd) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u1 = ((z & 0xFFFFFF) + 0.5f) / 16777216.f, u2 = (((z >> 24) & 0xFFFFFF) + 0.5f) / 16777216.f;
    x[i] = __float2bfloat16(sd * sqrtf(-2.f * logf(u1)) * cospif(2.f * u2));
  }
}

float median(std::vector<float> t) {
  std::sort(t.begin(), t.end());
  return t.size() % 2 ? t[t.size() / 2] : 0.5f * (t[t.size() / 2 - 1] + t[t.size() / 2]);
}

// Medians (two warm-ups) of the halves of f1(); f2() timed with an event between them, or with a
// sync and a `pause_ms` idle pause before each half when pause_ms > 0.
template <class F1, class F2>
std::pair<float, float> median_halves_ms(int reps, int pause_ms, F1&& f1, F2&& f2) {
  cudaEvent_t e[4];  // f1 between e[0] and e[1], f2 between e[2] and e[3]
  for (auto& x : e) SB_CUDA_CHECK(cudaEventCreate(&x));
  std::vector<float> t1, t2;
  for (int r = 0; r < reps + 2; r++) {
    if (pause_ms > 0) usleep(useconds_t(pause_ms) * 1000);
    SB_CUDA_CHECK(cudaEventRecord(e[0]));
    f1();
    SB_CUDA_CHECK(cudaEventRecord(e[1]));
    if (pause_ms > 0) {
      SB_CUDA_CHECK(cudaEventSynchronize(e[1]));
      usleep(useconds_t(pause_ms) * 1000);
    }
    SB_CUDA_CHECK(cudaEventRecord(e[2]));
    f2();
    SB_CUDA_CHECK(cudaEventRecord(e[3]));
    SB_CUDA_CHECK(cudaEventSynchronize(e[3]));
    float a, b;
    SB_CUDA_CHECK(cudaEventElapsedTime(&a, e[0], e[1]));
    SB_CUDA_CHECK(cudaEventElapsedTime(&b, e[2], e[3]));
    if (r >= 2) t1.push_back(a), t2.push_back(b);
  }
  for (auto& x : e) SB_CUDA_CHECK(cudaEventDestroy(x));
  return {median(std::move(t1)), median(std::move(t2))};
}

template <class F>
float median_ms(int reps, F&& f) {
  cudaEvent_t a, b;
  SB_CUDA_CHECK(cudaEventCreate(&a));
  SB_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < reps + 2; r++) {
    SB_CUDA_CHECK(cudaEventRecord(a));
    f();
    SB_CUDA_CHECK(cudaEventRecord(b));
    SB_CUDA_CHECK(cudaEventSynchronize(b));
    float ms;
    SB_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r >= 2) t.push_back(ms);  // two warm-ups
  }
  SB_CUDA_CHECK(cudaEventDestroy(a));
  SB_CUDA_CHECK(cudaEventDestroy(b));
  return median(std::move(t));
}

// FlexAttention and cuDNN (SDPA) fwd+bwd ms from bench/torch/flex_attention_ref.py's CSV (--ref), measured
// in the same device call on the same masks, so the ratio columns compare like with like; without
// --ref (or for a point the CSV lacks) those columns print nan.
struct RefPoint {
  int L;
  double density, flex_ms, cudnn_ms;
  int heads = 0, kv_heads = 0, dim = 0;  // the shape it was timed at (0: an older CSV without it)
};
std::vector<RefPoint> read_ref(const char* path) {
  std::vector<RefPoint> out;
  FILE* f = std::fopen(path, "r");
  if (!f) {
    std::fprintf(stderr, "--ref %s: cannot open (run bench/torch/flex_attention_ref.py --csv FILE first)\n", path);
    std::exit(2);
  }
  char line[512];
  // header: L,density,kept_frac,flex_fwdbwd_ms,flex_tflops,cudnn_fwdbwd_ms
  if (!std::fgets(line, sizeof line, f) || std::strncmp(line, "L,density,kept_frac,flex_fwdbwd_ms", 34) != 0) {
    std::fprintf(stderr, "--ref %s: not a flex_attention_ref.py CSV (expected the header L,density,kept_frac,...)\n", path);
    std::exit(2);
  }
  while (std::fgets(line, sizeof line, f)) {
    RefPoint r{};
    double kept = 0, tf = 0;
    char cud[64] = "";
    // L,density,kept_frac,flex ms,flex TF,cudnn ms[,heads,kv_heads,dim]
    if (std::sscanf(line, "%d,%lf,%lf,%lf,%lf,%63[^,\n],%d,%d,%d", &r.L, &r.density, &kept, &r.flex_ms, &tf, cud,
                    &r.heads, &r.kv_heads, &r.dim) < 5)
      continue;
    r.cudnn_ms = cud[0] ? std::strtod(cud, nullptr) : NAN;
    if (r.cudnn_ms <= 0) r.cudnn_ms = NAN;
    out.push_back(r);
  }
  std::fclose(f);
  return out;
}
const RefPoint* find_ref(const std::vector<RefPoint>& ref, int L, double d) {
  for (const auto& r : ref)
    if (r.L == L && std::fabs(r.density - d) < 1e-9) return &r;
  return nullptr;
}

// --gate MODES: the device gating of one layer (DeviceGating::select: pooling, the per-token score
// stage, ranking, CSR/CSC, launch orders) per gate mode, one document of L tokens, random q and k,
// k 8, w 1, theta 8 (configs/gpu_0p5b.toml); median ms of reps. A mode is the query side, mean or
// max, then optionally +bounds or +subN (the key side), e.g. mean,max,max+bounds,max+sub4.
int time_gating(const std::vector<double>& lens, int H, int Hkv, int D, int Bs, int reps, const std::string& modes,
                uint64_t seed) {
  std::vector<std::pair<std::string, K::GatingParams>> gps;
  for (size_t p0 = 0; p0 <= modes.size();) {
    const size_t p1 = std::min(modes.find(',', p0), modes.size());
    const std::string t = modes.substr(p0, p1 - p0), qs = t.substr(0, t.find('+')), ks = t.find('+') == t.npos ? "" : t.substr(t.find('+') + 1);
    K::GatingParams gp{8, 1, 8.0, qs == "max" ? K::GateQuery::max : K::GateQuery::mean, K::GateKey::mean, 4};
    if (ks == "bounds") gp.key = K::GateKey::bounds;
    else if (ks.rfind("sub", 0) == 0 && ks.size() > 3) gp.key = K::GateKey::sub, gp.sub_blocks = std::atoi(ks.c_str() + 3);
    if ((qs != "mean" && qs != "max") || (!ks.empty() && ks != "bounds" && gp.key != K::GateKey::sub) ||
        (gp.key == K::GateKey::sub && (gp.sub_blocks < 1 || Bs % gp.sub_blocks != 0))) {
      std::fprintf(stderr, "--gate: '%s': expected mean or max, then optionally +bounds or +subN (N divides --block)\n", t.c_str());
      return 2;
    }
    gps.push_back({t, gp});
    p0 = p1 + 1;
  }
  std::printf("%6s %-14s %9s\n", "L", "gate", "select ms");
  cudaEvent_t e0, e1;
  SB_CUDA_CHECK(cudaEventCreate(&e0));
  SB_CUDA_CHECK(cudaEventCreate(&e1));
  for (const double Ld : lens) {
    const int L = int(Ld);
    bf16 *q = nullptr, *k = nullptr;
    SB_CUDA_CHECK(cudaMalloc(&q, size_t(L) * H * D * sizeof(bf16)));
    SB_CUDA_CHECK(cudaMalloc(&k, size_t(L) * Hkv * D * sizeof(bf16)));
    fill_random<<<1024, 256>>>(q, size_t(L) * H * D, seed, 1.f);
    fill_random<<<1024, 256>>>(k, size_t(L) * Hkv * D, seed + 1, 1.f);
    const int32_t cu[2] = {0, L};
    for (const auto& [name, gp] : gps) {
      C::DeviceGating gate;
      C::DeviceSelection sel;
      gate.prepare(cu, 1, K::AttnShape{H, Hkv, D, Bs}, {gp.k}, gp);
      gate.reserve(sel);
      std::vector<float> t;
      for (int r = 0; r < reps + 2; r++) {
        SB_CUDA_CHECK(cudaEventRecord(e0));
        gate.select(q, k, 0, sel);
        SB_CUDA_CHECK(cudaEventRecord(e1));
        SB_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        SB_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 2) t.push_back(ms);
      }
      std::printf("%6d %-14s %9.3f\n", L, name.c_str(), median(t));
    }
    SB_CUDA_CHECK(cudaFree(q));
    SB_CUDA_CHECK(cudaFree(k));
  }
  SB_CUDA_CHECK(cudaEventDestroy(e0));
  SB_CUDA_CHECK(cudaEventDestroy(e1));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<double> lens = {8192, 16384, 32768, 65536}, dens = {1, 0.5, 0.25, 0.1};
  int H = 32, Hkv = 0, D = 128, Bs = 128, reps = 10, split = 0, power = 0;
  uint64_t seed = 1234;
  const char* csv = nullptr;
  const char* trace = nullptr;
  std::vector<RefPoint> ref;
  std::string kernels = "wgmma,mma";
  K::CtaOrder order = K::CtaOrder::mixed;
  bool bwd_compact = true;
  int bwd_chunk = -1;
  std::string gate;  // --gate: time the gating instead of attention
  for (sb::bench::Flags f("bench_attention_cuda", argc, argv); f.next();) {
    if (f.is("--lens")) lens = f.list(1, INT_MAX, false, true);
    else if (f.is("--densities")) dens = f.list(0, 1, true, false);
    else if (f.is("--heads")) H = int(f.integer(1, 1024));
    else if (f.is("--kv-heads")) Hkv = int(f.integer(1, 1024));
    else if (f.is("--dim")) D = int(f.integer(1, 1024));
    else if (f.is("--block")) Bs = int(f.integer(1, 1024));
    else if (f.is("--reps")) reps = int(f.integer(1, INT_MAX));
    else if (f.is("--seed")) seed = uint64_t(f.integer(0, LLONG_MAX));
    else if (f.is("--csv")) csv = f.text();
    else if (f.is("--kernels")) kernels = f.text();
    else if (f.is("--ref")) ref = read_ref(f.text());
    else if (f.is("--split")) split = int(f.integer(0, 1));
    else if (f.is("--power")) power = int(f.integer(0, 1));
    else if (f.is("--trace")) trace = f.text();
    else if (f.is("--order")) {
      const std::string t = f.text();
      if (t == "mixed") order = K::CtaOrder::mixed;
      else if (t == "heads") order = K::CtaOrder::heads;
      else if (t == "blocks") order = K::CtaOrder::blocks;
      else { std::fprintf(stderr, "bench_attention_cuda: --order '%s': expected mixed, heads or blocks\n", t.c_str()); return 2; }
    } else if (f.is("--bwd-grid")) {
      const std::string t = f.text();
      if (t == "compact" || t == "full") bwd_compact = t == "compact";
      else { std::fprintf(stderr, "bench_attention_cuda: --bwd-grid '%s': expected compact or full\n", t.c_str()); return 2; }
    } else if (f.is("--bwd-chunk")) bwd_chunk = int(f.integer(-1, INT_MAX));
    else if (f.is("--gate")) gate = f.text();
    else f.unknown();
  }
  if (Hkv == 0) Hkv = H;
  if (H < 1 || Hkv < 1 || H % Hkv != 0) {
    std::fprintf(stderr, "--kv-heads %d must divide --heads %d\n", Hkv, H);
    return 2;
  }
  for (const auto& r : ref) {  // an older CSV without the shape was MHA at its defaults
    const int rh = r.heads ? r.heads : 32, rkv = r.kv_heads ? r.kv_heads : rh, rd = r.dim ? r.dim : 128;
    if (rh != H || rkv != Hkv || rd != D) {
      std::fprintf(stderr, "--ref: timed at heads %d, kv_heads %d, dim %d; this run is --heads %d --kv-heads %d --dim %d\n",
                   rh, rkv, rd, H, Hkv, D);
      return 2;
    }
  }
  std::string why;
  if (!C::device_available(&why)) {
    std::printf("SKIP: no usable CUDA device (%s)\n", why.c_str());
    return 77;
  }
  cudaDeviceProp prop;
  SB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs; H=%d Hkv=%d D=%d Bs=%d, median of %d\n", prop.name, prop.multiProcessorCount, H, Hkv,
              D, Bs, reps);
  if (!gate.empty()) return time_gating(lens, H, Hkv, D, Bs, reps, gate, seed);
  C::set_launch_order(order);
  C::set_bwd_compact(bwd_compact);
  C::set_bwd_column_chunk(bwd_chunk);
  if (order != K::CtaOrder::mixed || !bwd_compact || bwd_chunk != -1)
    std::printf("launch order %s, backward grid %s, column chunk %d\n",
                order == K::CtaOrder::heads ? "heads" : order == K::CtaOrder::blocks ? "blocks" : "mixed",
                bwd_compact ? "compacted" : "full", bwd_chunk);
  PowerSampler sampler;
  if (power && !sampler.ok()) std::printf("--power: NVML (libnvidia-ml.so.1) is not available here; no power figures\n");
  std::vector<bool> gens;  // true: wgmma, false: mma.sync
  for (size_t p0 = 0; p0 <= kernels.size();) {
    const size_t p1 = std::min(kernels.find(',', p0), kernels.size());
    const std::string t = kernels.substr(p0, p1 - p0);
    if (t == "mma") gens.push_back(false);
    else if (t == "wgmma" && Bs == 128 && C::wgmma_attention_available()) gens.push_back(true);
    else if (t == "wgmma") std::printf("wgmma kernels do not run here (block %d, or no sm_90a build / 9.0 device)\n", Bs);
    else { std::fprintf(stderr, "--kernels: unknown '%s' (expected wgmma, mma or wgmma,mma)\n", t.c_str()); return 2; }
    p0 = p1 + 1;
  }
  if (gens.empty()) {
    std::fprintf(stderr, "--kernels: nothing to run here\n");
    return 2;
  }
  FILE* fc = csv ? std::fopen(csv, "w") : nullptr;
  FILE* ft = nullptr;
  if (trace) {
    if (!(ft = std::fopen(trace, "w"))) {
      std::fprintf(stderr, "--trace %s: cannot open for writing\n", trace);
      return 2;
    }
    std::fprintf(ft, "L,density,cta,start_ns,end_ns,sm,tiles,start_clk,first_tile_clk,last_tile_clk,dq_staged_clk,"
                 "waited_clk,end_clk\n");
  }
  if (fc)
    std::fprintf(fc, "kernels,L,density,kept_frac,fwd_ms,bwd_ms,fwdbwd_ms,fwd_tflops,fwdbwd_tflops,flex_ms,cudnn_ms,bwd_tflops\n");  // flex/cudnn from --ref
  std::printf("%6s %5s %6s %5s | %8s %8s %9s | %7s %7s %8s | %8s %7s %8s %7s %6s\n", "L", "dens", "kept", "kern",
              "fwd ms", "bwd ms", "f+b ms", "fwd TF", "bwd TF", "f+b TF", "flex ms", "x flex", "cudnn ms", "x cudnn", "x mma");
  const K::AttnShape s{H, Hkv, D, Bs};
  for (double Ld : lens) {
    const int L = int(Ld);
    const size_t n = size_t(L) * H * D, nkv = size_t(L) * Hkv * D;  // q, o, dO, dq; k, v, dk, dv
    bf16 *q, *k, *v, *o, *dO, *dq, *dk, *dv;
    float* lse;
    void* ws;
    for (bf16** p : {&q, &o, &dO, &dq}) SB_CUDA_CHECK(cudaMalloc(p, n * sizeof(bf16)));
    for (bf16** p : {&k, &v, &dk, &dv}) SB_CUDA_CHECK(cudaMalloc(p, nkv * sizeof(bf16)));
    SB_CUDA_CHECK(cudaMalloc(&lse, size_t(L) * H * sizeof(float)));
    SB_CUDA_CHECK(cudaMalloc(&ws, C::block_attention_bwd_workspace(L, s)));
    int sd = 1;
    for (bf16* p : {q, k, v, dO}) {
      fill_random<<<1024, 256>>>(p, p == k || p == v ? nkv : n, seed * 7919 + sd++, 1.0f);
      SB_CUDA_CHECK_LAUNCH("fill_random");
    }
    const int32_t cu[2] = {0, L};
    const int nb = (L + Bs - 1) / Bs;
    for (double dd : dens) {
      K::BlockSelection sel;
      sel.doc_row_base = {0, int64_t(Hkv) * nb};
      sel.row_ptr.assign(1, 0);
      double flops_fwd = 0;
      for (int g = 0; g < Hkv; g++)
        for (int i = 0; i < nb; i++) {
          for (int32_t j : row_blocks(i, dd, seed)) {
            sel.cols.push_back(j);
            flops_fwd += 4.0 * Bs * Bs * D * (H / Hkv) * (j == i ? 0.5 : 1.0);  // every head of the group
          }
          sel.row_ptr.push_back(int64_t(sel.cols.size()));
        }
      sel.recall.assign(size_t(Hkv) * nb, 1.f);
      const double kept_frac = double(sel.cols.size()) / (double(Hkv) * nb * (nb + 1) / 2);
      C::DeviceSelection dsel;
      dsel.upload(sel, cu, 1, s);
      struct T { float f, b, fb; PowerSample pf, pb, pfb; };
      std::vector<T> t(gens.size());
      float t_mma = NAN;
      auto timed = [&](PowerSample& ps, auto&& fn) {
        if (power) sampler.start();
        const float ms = median_ms(reps, fn);
        if (power) ps = sampler.stop();
        return ms;
      };
      auto fwd = [&] { C::block_attention_fwd(q, k, v, dsel, s, o, lse); };
      auto bwd = [&] { C::block_attention_bwd(q, k, v, o, lse, dO, dsel, s, dq, dk, dv, ws); };
      for (size_t gi = 0; gi < gens.size(); gi++) {
        C::prefer_wgmma_attention(gens[gi]);
        t[gi].f = timed(t[gi].pf, fwd);
        t[gi].b = timed(t[gi].pb, bwd);
        t[gi].fb = timed(t[gi].pfb, [&] { fwd(); bwd(); });
        SB_CUDA_CHECK(cudaDeviceSynchronize());
        if (!gens[gi]) t_mma = t[gi].fb;
      }
      // "x flex" / "x cudnn": their time over ours (> 1: ours is faster), from --ref (same call)
      const RefPoint* rp = find_ref(ref, L, dd);
      const double fr = rp ? rp->flex_ms : NAN, cr = rp ? rp->cudnn_ms : NAN;
      for (size_t gi = 0; gi < gens.size(); gi++) {
        const double tff = flops_fwd / (t[gi].f * 1e-3) / 1e12, tfbf = 3.5 * flops_fwd / (t[gi].fb * 1e-3) / 1e12;
        const double tfb = 2.5 * flops_fwd / (t[gi].b * 1e-3) / 1e12;
        const char* kn = gens[gi] ? "wgmma" : "mma";
        std::printf("%6d %5.2f %6.3f %5s | %8.3f %8.3f %9.3f | %7.1f %7.1f %8.1f | %8.2f %7.2f %8.2f %7.2f %6.2f\n", L,
                    dd, kept_frac, kn, t[gi].f, t[gi].b, t[gi].fb, tff, tfb, tfbf, fr, fr / t[gi].fb, cr, cr / t[gi].fb,
                    t_mma / t[gi].fb);
        if (power) {
          auto pr = [](const PowerSample& x) {
            if (!x.ok) return std::string("     n/a");
            char b[64];
            std::snprintf(b, sizeof b, "%4.0f W %4.0f MHz %3.0f%% capped", x.watts, x.sm_mhz, 100 * x.capped);
            return std::string(b);
          };
          std::printf("%6d %5.2f power %5s | fwd %s | bwd %s | f+b %s\n", L, dd, kn, pr(t[gi].pf).c_str(),
                      pr(t[gi].pb).c_str(), pr(t[gi].pfb).c_str());
        }
        if (fc)
          std::fprintf(fc, "%s,%d,%g,%.4f,%.4f,%.4f,%.4f,%.1f,%.1f,%g,%g,%.1f\n", kn, L, dd, kept_frac, t[gi].f, t[gi].b,
                       t[gi].fb, tff, tfbf, fr, cr, tfb);
      }
      if (ft && std::find(gens.begin(), gens.end(), true) != gens.end()) {
        // a CTA per (key block, kv head, piece): at most 16 pieces a query head of the group
        const int64_t ctas = int64_t(nb) * H * 16;
        unsigned long long* buf;
        SB_CUDA_CHECK(cudaMalloc(&buf, size_t(ctas) * 16 * sizeof(unsigned long long)));
        SB_CUDA_CHECK(cudaMemset(buf, 0, size_t(ctas) * 16 * sizeof(unsigned long long)));
        C::prefer_wgmma_attention(true);
        C::set_bwd_trace(buf, ctas);
        bwd();
        C::set_bwd_trace(nullptr, 0);
        std::vector<unsigned long long> h(size_t(ctas) * 16);
        SB_CUDA_CHECK(cudaMemcpy(h.data(), buf, h.size() * sizeof(h[0]), cudaMemcpyDeviceToHost));
        SB_CUDA_CHECK(cudaFree(buf));
        if (h[size_t(ctas - 1) * 16 + 4] != 0)  // the last slot taken: later CTAs may have gone untraced
          std::fprintf(stderr, "--trace: L %d density %g: the backward may have more than the %lld CTAs traced; "
                       "the trace is partial\n", L, dd, (long long)ctas);
        for (int64_t x = 0; x < ctas; x++) {
          const unsigned long long* r = &h[size_t(x) * 16];
          if (r[1] == 0) continue;  // not run (a spare CTA)
          std::fprintf(ft, "%d,%g,%lld", L, dd, (long long)x);
          for (int c = 0; c < 10; c++) std::fprintf(ft, ",%llu", r[c]);
          std::fprintf(ft, "\n");
        }
      }
      for (size_t gi = 0; split && gi < gens.size(); gi++) {
        C::prefer_wgmma_attention(gens[gi]);
        const auto [f1, b1] = median_halves_ms(reps, 0, fwd, bwd);
        const auto [f2, b2] = median_halves_ms(reps, 100, fwd, bwd);
        std::printf("%6d %5.2f split %5s | f+b's halves: fwd %8.3f bwd %8.3f (sum %8.3f) | apart, 100 ms idle before "
                    "each: fwd %8.3f bwd %8.3f\n",
                    L, dd, gens[gi] ? "wgmma" : "mma", f1, b1, f1 + b1, f2, b2);
      }
      std::fflush(stdout);
      C::prefer_wgmma_attention(true);
    }
    for (void* p : {(void*)q, (void*)k, (void*)v, (void*)o, (void*)dO, (void*)dq, (void*)dk, (void*)dv, (void*)lse, ws})
      SB_CUDA_CHECK(cudaFree(p));
  }
  if (fc) std::fclose(fc);
  if (ft) std::fclose(ft);
  return 0;
}
