"""The mask family of bench_attention_cuda (bench/cpp/bench_attention_cuda.cu row_blocks), for the
Python tools beside it (flex_attention_ref.py, bwd_spare_ctas.py): query block i keeps block 0,
block i and round(density * (i + 1)) - 2 further blocks drawn uniformly from 1..i-1 (splitmix64).
No torch: bwd_spare_ctas.py runs on machines without it."""
import math

M64 = (1 << 64) - 1
GOLD = 0x9E3779B97F4A7C15


def splitmix(state):
    """Returns (new_state, value), as SplitMix::next in the C++ bench."""
    state = (state + GOLD) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def row_blocks(i, density, seed):
    if i == 0:
        return [0]
    extra = int(math.floor(density * (i + 1) + 0.5)) - 2
    extra = max(0, min(extra, i - 1))
    cand = list(range(1, i))
    state = (seed + i * GOLD) & M64
    n = i - 1
    for t in range(extra):
        state, z = splitmix(state)
        r = t + z % (n - t)
        cand[t], cand[r] = cand[r], cand[t]
    return sorted(cand[:extra] + [0, i])
