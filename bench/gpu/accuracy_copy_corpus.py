#!/usr/bin/env python3
"""The copy corpus of bench/gpu/accuracy.sh's `copymix` recipe: JSONL records {"text": s + "\\n" + s ...},
a random string s of lowercase letters and digits repeated 2-4 times. The first copy cannot be
predicted (ln 36 = 3.58 nats a byte); every later one only by copying, so the loss falls to ~1.2 only
once the model has formed copy (induction) heads: the circuit that retrieval needs, trained with a
dense signal instead of the few answer bytes of a task document.

usage: accuracy_copy_corpus.py OUT.jsonl --docs N [--seed S] [--min-len 16] [--max-len 300]
"""
import argparse
import json
import random

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--docs", type=int, required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--min-len", type=int, default=16, help="shortest string, characters")
    ap.add_argument("--max-len", type=int, default=300, help="longest string, characters")
    a = ap.parse_args()
    if not 1 <= a.min_len <= a.max_len:
        ap.error(f"--min-len {a.min_len} / --max-len {a.max_len}: expected 1 <= min <= max")
    r = random.Random(a.seed)
    with open(a.out, "w") as f:
        for _ in range(a.docs):
            s = "".join(r.choice(ALPHABET) for _ in range(r.randint(a.min_len, a.max_len)))
            f.write(json.dumps({"text": "\n".join([s] * r.randint(2, 4))}) + "\n")


if __name__ == "__main__":
    main()
