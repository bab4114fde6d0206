#!/usr/bin/env bash
# Run on the CPU machine (Debian 12): download the Debian packages the GPU machine lacks into .debs/
# (ignored by git), to be carried to the device machine (`carry: [".debs"]`) and unpacked there by
# jobs/gpu/build_on_gpu.sh. Kokkos and toml++ (not on the GPU image), nlohmann-json, the word list
# of `prep synth` (wamerican), PCRE2, ICU and pkgconf (the BPE tokenizer), and OpenBLAS
# with its Fortran runtime (unpacked there only when the machine has no OpenBLAS of its own).
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
mkdir -p .debs
cd .debs
apt-get download libtrilinos-kokkos-13.2 libtrilinos-kokkos-dev libtomlplusplus3 libtomlplusplus-dev \
  nlohmann-json3-dev wamerican pkgconf pkgconf-bin libpkgconf3 libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libicu-dev libicu72 libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev libopenblas0 libgfortran5
ls -la
