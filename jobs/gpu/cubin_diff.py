#!/usr/bin/env python3
"""Compare one kernel's machine code in two cubins, without a GPU or cuobjdump (neither is on the
build machine): a kernel's SASS is its ELF section .text.<mangled name>, 16 bytes an instruction.

  cubin_diff.py A.cubin                      # list the kernels: name, instructions, sha1 of the code
  cubin_diff.py A.cubin SUBSTR_A B.cubin SUBSTR_B
      # the kernel of A whose name contains SUBSTR_A against B's: identical, or the instruction counts,
      # how many differ, and whether they differ only in the constant-bank offset field (bits 38..53:
      # a kernel parameter read at another offset, as when a field of its parameter struct moved)

Make the cubins with the build's flags plus -cubin, e.g. (sm_90a, the wgmma backward):
  nvcc -DSB_WGMMA=1 -I. -O3 -DNDEBUG -arch=sm_90a -cubin -lineinfo --expt-relaxed-constexpr -std=c++17 \\
       -Xptxas -v -x cu kernels/cuda/attention_bwd_sm90.cu -o new.cubin
and the same in a checkout of the older commit (git worktree add, or jobs/gpu/make_baseline.sh's tree).
-Xptxas -v prints each kernel's registers and spills beside it.
"""
import collections
import hashlib
import struct
import sys


def kernels(path):
    d = open(path, "rb").read()
    shoff, = struct.unpack_from("<Q", d, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize) for i in range(shnum)]
    strtab = secs[shstrndx][4]
    out = {}
    for s in secs:
        name = d[strtab + s[0]: d.index(b"\0", strtab + s[0])].decode()
        if name.startswith(".text."):
            out[name[len(".text."):]] = d[s[4]: s[4] + s[5]]
    return out


def pick(ks, sub, path):
    hits = [k for k in ks if sub in k]
    if len(hits) != 1:
        sys.exit(f"{path}: {len(hits)} kernels contain '{sub}' (need exactly one): " + ", ".join(hits[:8]))
    return hits[0]


def main(argv):
    if len(argv) == 2:
        for name, code in sorted(kernels(argv[1]).items()):
            print(f"{len(code) // 16:7d} {hashlib.sha1(code).hexdigest()[:12]} {name}")
        return 0
    if len(argv) != 5:
        print(__doc__)
        return 2
    ka, kb = kernels(argv[1]), kernels(argv[3])
    na, nb = pick(ka, argv[2], argv[1]), pick(kb, argv[4], argv[3])
    a, b = ka[na], kb[nb]
    print(f"A {na}: {len(a) // 16} instructions\nB {nb}: {len(b) // 16} instructions")
    if a == b:
        print("identical")
        return 0
    if len(a) != len(b):
        print("different lengths")
        return 1
    moved = collections.Counter()
    other = 0
    for i in range(0, len(a), 16):
        x, y = int.from_bytes(a[i:i + 16], "little"), int.from_bytes(b[i:i + 16], "little")
        if x == y:
            continue
        if (x ^ y) & ~(0xFFFF << 38) == 0:  # only the constant-bank offset
            moved[((x >> 38) & 0xFFFF) - ((y >> 38) & 0xFFFF)] += 1
        else:
            other += 1
    for delta, n in sorted(moved.items()):
        print(f"{n} instructions differ only in a constant-bank offset, by {delta:+d} bytes (A - B)")
    print(f"{other} instructions differ otherwise")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
