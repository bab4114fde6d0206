// The wgmma backward's pieces, on the host (no GPU needed; runs in CI): for random columns (a few
// long ones, as the sink block's, many short, some empty) under the column split and the head
// split at both query tiles, bwd_piece's pieces cover every column's tiles exactly once, in order,
// an unsplit column (empty too) by exactly one piece; and piece_bound, the compacted grid's size
// (bwd_pieces.cu), is never below the count of pieces with tiles: a low bound would drop pieces,
// and with them gradients, silently. Exit 0 all passed, 1 a failure.
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/cuda/attention_params.cuh"

namespace C = sb::kernels::cuda;

namespace {

struct Stats {
  long long cases = 0, fails = 0, pieces = 0, bound = 0, full = 0;
};

// One configuration: n_split as column_split (attention_bwd.cu) chooses it for a longest column
// of max_nb query blocks.
void check(std::mt19937_64& rng, Stats& st) {
  std::uniform_int_distribution<int> U(0, 1 << 30);
  const int groups[] = {1, 2, 5, 7};
  const int G = groups[U(rng) % 4], Hkv = 1 + U(rng) % 3, QT = U(rng) % 2 ? 64 : 128;
  const int n_items = 1 + U(rng) % 600, max_nb = 1 + U(rng) % 700;
  C::BwdParams p{};
  p.H = G * Hkv;
  p.Hkv = Hkv;
  p.n_items = n_items;
  const int bound = G * max_nb * 2;
  p.chunk = U(rng) % 4 == 0 ? 1 + U(rng) % 8 : std::max(1, bound / (1 + U(rng) % 20));
  const bool heads = U(rng) % 2;
  p.n_split = std::max(1, (bound + p.chunk - 1) / p.chunk);
  if (heads) {
    p.head_split = 1 + U(rng) % 140;  // the window: the SMs
    p.n_split = G * std::max(1, (max_nb * 2 + p.chunk - 1) / p.chunk);
  }
  // column lengths: mostly short, some empty, a few up to the longest
  std::vector<int> nq(n_items);
  int64_t kept = 0;
  for (int& n : nq) {
    const int r = U(rng) % 10;
    n = r == 0 ? 0 : r < 8 ? U(rng) % std::min(max_nb, 8) + 1 : U(rng) % max_nb + 1;
    kept += n;
  }
  const int kSub = 128 / QT;
  std::vector<int> next(n_items, 0);  // each column: the next tile a piece must start at
  std::vector<int> count(n_items, 0);
  bool ok = true;
  long long pieces = 0;
  const int positions = n_items * p.n_split;
  for (int x = 0; x < positions; x++) {
    const C::BwdCta c = C::bwd_cta(p, x);
    if (c.item < 0 || c.item >= n_items || c.s < 0 || c.s >= p.n_split) { ok = false; break; }
    int it0, niter;
    if (!C::bwd_piece(p, G, nq[c.item], QT, c.s, it0, niter)) continue;
    pieces++;
    count[c.item]++;
    // pieces of one column come in order of s, and the grid takes each position once
    if (it0 != next[c.item] || niter < 0 || (niter == 0 && nq[c.item] > 0)) ok = false;
    next[c.item] = it0 + niter;
  }
  for (int i = 0; i < n_items && ok; i++) {
    const bool split = p.chunk > 0 && G * nq[i] * 2 > p.chunk;
    if (next[i] != G * nq[i] * kSub || (!split && count[i] != 1)) ok = false;
  }
  const int64_t b = C::piece_bound(p, QT, kept);
  if (b < pieces || b > positions) ok = false;
  st.cases++;
  st.pieces += pieces;
  st.bound += b;
  st.full += positions;
  if (!ok) {
    st.fails++;
    if (st.fails <= 5)
      std::printf("FAIL G %d Hkv %d QT %d items %d max_nb %d chunk %d n_split %d head_split %d: pieces %lld bound %lld\n", G,
                  Hkv, QT, n_items, max_nb, p.chunk, p.n_split, p.head_split, pieces, (long long)b);
  }
}

}  // namespace

int main() {
  std::random_device rd;
  const uint64_t seed = (uint64_t(rd()) << 32) ^ rd();
  std::printf("seed %llu\n", (unsigned long long)seed);
  std::mt19937_64 rng(seed);
  Stats st;
  for (int i = 0; i < 3000; i++) check(rng, st);
  std::printf("%lld configurations: pieces with tiles %lld, compacted grid %lld (%.2fx), full grid %lld (%.2fx)\n",
              st.cases, st.pieces, st.bound, double(st.bound) / double(st.pieces), st.full,
              double(st.full) / double(st.pieces));
  std::printf("%lld passed, %lld failed\n", st.cases - st.fails, st.fails);
  return st.fails ? 1 : 0;
}
