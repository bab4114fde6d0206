#!/usr/bin/env bash
# Pack the libFuzzer targets for a machine with more cores and no clang (the device machine's 16
# CPU cores): the built targets, their seeds and corpus, and every shared library they load
# except glibc's and the C++ runtime (newer ones there serve), into .fuzzpack/ (git-ignored),
# laid out like a build dir so run_fuzz.sh --no-build runs there unchanged:
#   here:   tests/fuzz/pack_for_device.sh
#   there:  (device call with carry [".fuzzpack"])
#           LD_LIBRARY_PATH=$PWD/.fuzzpack/lib SB_FUZZ_BUILD=$PWD/.fuzzpack SB_FUZZ_FORK=$(nproc) \
#             tests/fuzz/run_fuzz.sh --no-build shard 240
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${SB_FUZZ_BUILD:-$ROOT/build-fuzz}
PACK=$ROOT/.fuzzpack
bash "$ROOT/tests/fuzz/run_fuzz.sh" config 1 >/dev/null   # builds targets + seeds if needed
rm -rf "$PACK"
mkdir -p "$PACK/tests/fuzz" "$PACK/lib"
for t in config shard checkpoint; do cp "$BUILD/tests/fuzz/fuzz_$t" "$PACK/tests/fuzz/"; done
cp -r "$BUILD/fuzz-seeds" "$BUILD/fuzz-corpus" "$PACK/"
ldd "$BUILD"/tests/fuzz/fuzz_{config,shard,checkpoint} | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|libresolv|libstdc\+\+|libgcc_s)\.so' |
  xargs -I{} cp -L {} "$PACK/lib/"
du -sh "$PACK"
