#!/usr/bin/env python3
"""PyTorch FlexAttention (and cuDNN SDPA, dense) forward+backward on the same block masks as
bench/cpp/bench_attention_cuda.cu: one document of L tokens, MHA (or GQA with --kv-heads), bf16, block
128; query block i keeps block 0, block i and round(density*(i+1))-2 further blocks drawn uniformly
from 1..i-1 (the same splitmix64 draws as the C++ program, so the masks are identical). Median of --reps CUDA-event timings
after warm-ups. Effective TFLOP/s as in the C++ program (computed causal blocks; diagonal = half;
forward+backward = 3.5 x forward's two matmuls).

  python3 bench/torch/flex_attention_ref.py [--lens 8192,16384,32768,65536] [--densities 1,0.5,0.25,0.1]
                                      [--heads 32] [--kv-heads H] [--dim 128] [--reps 10] [--seed 1234]
                                      [--csv FILE] [--power] [--fwd]
--fwd: also time the forward alone (the training forward: inputs that need gradients, so the
log-sum-exp is kept), printed as "fwd ms" beside f+b (not in the CSV).
--power: after each timing, the mean board power, SM clock and share of samples at the power cap
while its loop ran (NVML through ctypes, as bench/cpp/gpu_power.hpp does for the C++ program).
The Qwen2.5-0.5B shape: --heads 14 --kv-heads 2 --dim 64 (both sides take K, V of 2 heads, enable_gqa).
"""
import argparse
import ctypes
import sys
import threading
import time

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from bench_masks import row_blocks  # the mask family of bench_attention_cuda (splitmix64)


def block_mask(L, density, seed, bs, device):
    nb = (L + bs - 1) // bs
    # full blocks (no mask_mod needed): kept j < i; partial: the diagonal (causal inside)
    full_num = torch.zeros(1, 1, nb, dtype=torch.int32)
    full_idx = torch.zeros(1, 1, nb, nb, dtype=torch.int32)
    part_num = torch.ones(1, 1, nb, dtype=torch.int32)
    part_idx = torch.zeros(1, 1, nb, nb, dtype=torch.int32)
    flops = 0.0
    kept = 0
    for i in range(nb):
        js = row_blocks(i, density, seed)
        off = [j for j in js if j != i]
        full_num[0, 0, i] = len(off)
        if off:
            full_idx[0, 0, i, : len(off)] = torch.tensor(off, dtype=torch.int32)
        part_idx[0, 0, i, 0] = i
        kept += len(js)
        flops += len(off) + 0.5
    causal = lambda b, h, q, k: q >= k
    bm = BlockMask.from_kv_blocks(part_num.to(device), part_idx.to(device), full_num.to(device),
                                  full_idx.to(device), BLOCK_SIZE=bs, mask_mod=causal, seq_lengths=(L, L))
    return bm, flops, kept / (nb * (nb + 1) / 2)


class PowerSampler:
    """NVML (libnvidia-ml.so.1): the energy counter over an interval, the SM clock and its clock-event
    reasons sampled every 5 ms by a thread. ok is False where NVML is absent."""

    def __init__(self):
        self.ok = False
        try:
            self.nv = ctypes.CDLL("libnvidia-ml.so.1")
            self.dev = ctypes.c_void_p()
            self.ok = (self.nv.nvmlInit_v2() == 0 and
                       self.nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.dev)) == 0)
        except OSError:
            pass

    def _energy_mj(self):
        e = ctypes.c_ulonglong()
        self.nv.nvmlDeviceGetTotalEnergyConsumption(self.dev, ctypes.byref(e))
        return e.value

    def start(self):
        if not self.ok:
            return
        self.stop_flag, self.mhz, self.capped = False, [], 0
        self.e0, self.t0 = self._energy_mj(), time.monotonic()

        def run():
            c, r = ctypes.c_uint(), ctypes.c_ulonglong()
            while not self.stop_flag:
                if self.nv.nvmlDeviceGetClockInfo(self.dev, 1, ctypes.byref(c)) == 0:  # NVML_CLOCK_SM
                    self.mhz.append(c.value)
                    # 0x4 software power cap, 0x80 hardware power brake
                    if self.nv.nvmlDeviceGetCurrentClocksThrottleReasons(self.dev, ctypes.byref(r)) == 0 and r.value & 0x84:
                        self.capped += 1
                time.sleep(0.005)
        self.th = threading.Thread(target=run)
        self.th.start()

    def stop(self):
        if not self.ok:
            return "n/a"
        self.stop_flag = True
        self.th.join()
        sec = time.monotonic() - self.t0
        w = (self._energy_mj() - self.e0) * 1e-3 / sec
        n = max(1, len(self.mhz))
        return f"{w:4.0f} W {sum(self.mhz) / n:4.0f} MHz {100 * self.capped / n:3.0f}% capped"


def median_ms(fn, reps, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    m = len(ts) // 2
    return ts[m] if len(ts) % 2 else 0.5 * (ts[m - 1] + ts[m])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lens", default="8192,16384,32768,65536")
    ap.add_argument("--densities", default="1,0.5,0.25,0.1")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=0, help="K/V heads (GQA); 0: as --heads")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--csv", default=None)
    ap.add_argument("--no-cudnn", action="store_true")
    ap.add_argument("--power", action="store_true", help="print power, SM clock and cap share per timing")
    ap.add_argument("--fwd", action="store_true", help="also time the forward alone")
    a = ap.parse_args()
    dev = "cuda"
    H, D, bs = a.heads, a.dim, a.block
    Hkv = a.kv_heads or H
    if H % Hkv:
        sys.exit(f"flex_attention_ref: --heads {H} is not a multiple of --kv-heads {Hkv}")
    gqa = Hkv != H
    flex = torch.compile(flex_attention, dynamic=False)
    ps = PowerSampler() if a.power else None
    if ps and not ps.ok:
        print("--power: NVML (libnvidia-ml.so.1) is not available here; no power figures")

    def timed(fn, what):
        if not ps or not ps.ok:
            return median_ms(fn, a.reps)
        for _ in range(3):  # warm-ups (and compiles) outside the sampled interval
            fn()
        torch.cuda.synchronize()
        ps.start()
        try:
            ms = median_ms(fn, a.reps, warm=0)
        finally:
            line = ps.stop()
        print(f"{what} power | {line}", flush=True)
        return ms
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}; H={H} Hkv={Hkv} D={D} Bs={bs}, median of {a.reps}")
    rows = []
    print(f"{'L':>6} {'dens':>5} {'kept':>6} | {'flex f+b ms':>11} {'TF':>6} | {'cudnn f+b ms':>12}")
    for L in [int(x) for x in a.lens.split(",")]:
        g = torch.Generator(device=dev).manual_seed(a.seed)
        q, k, v, do = (torch.randn(1, h, L, D, device=dev, dtype=torch.bfloat16, generator=g) for h in (H, Hkv, Hkv, H))
        for t in (q, k, v):
            t.requires_grad_(True)
        cud = float("nan")
        if not a.no_cudnn:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            def sdpa_fwd():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

            def sdpa():
                torch.autograd.grad(sdpa_fwd(), (q, k, v), do)
            try:
                cud = timed(sdpa, f"{L:>6}  1.00 cudnn")
                if a.fwd:
                    print(f"{L:>6}  1.00 cudnn fwd ms {timed(sdpa_fwd, f'{L:>6}  1.00 cudnn fwd'):.3f}", flush=True)
            except Exception as e:  # noqa: BLE001
                print("cudnn sdpa failed:", e, file=sys.stderr)
        for d in [float(x) for x in a.densities.split(",")]:
            bm, nblk, kept = block_mask(L, d, a.seed, bs, dev)

            def fwd():
                return flex(q, k, v, block_mask=bm, enable_gqa=gqa)

            def fb():
                torch.autograd.grad(fwd(), (q, k, v), do)
            ms = timed(fb, f"{L:>6} {d:>5.2f} flex ")
            if a.fwd:
                fwd_ms = timed(fwd, f"{L:>6} {d:>5.2f} flex fwd")
                print(f"{L:>6} {d:>5.2f} flex fwd ms {fwd_ms:.3f}", flush=True)
            flops = 3.5 * 4.0 * bs * bs * D * H * nblk
            tf = flops / (ms * 1e-3) / 1e12
            print(f"{L:>6} {d:>5.2f} {kept:>6.3f} | {ms:>11.3f} {tf:>6.1f} | {cud if d == 1 else float('nan'):>12.3f}",
                  flush=True)
            rows.append((L, d, kept, ms, tf, cud if d == 1 else float("nan")))
        del q, k, v, do
        torch.cuda.empty_cache()
    if a.csv:
        with open(a.csv, "w") as f:
            # the shape last: bench_attention_cuda --ref checks it against its own
            f.write("L,density,kept_frac,flex_fwdbwd_ms,flex_tflops,cudnn_fwdbwd_ms,heads,kv_heads,dim\n")
            for r in rows:
                f.write(",".join(str(x) for x in (*r, H, Hkv, D)) + "\n")


if __name__ == "__main__":
    main()
