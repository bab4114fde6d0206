#!/usr/bin/env bash
# Here, before a device call: puts the tree of commit REV (default HEAD) into .baseline/ (ignored),
# for bench/gpu/ab_bench.sh to build and time beside the working tree. Carry it: carry [".debs", ".baseline"].
set -euo pipefail
REV=${1:-HEAD}
cd "$(git rev-parse --show-toplevel)"
rm -rf .baseline && mkdir .baseline
git archive "$(git rev-parse "$REV")" | tar -x -C .baseline
git rev-parse "$REV" > .baseline/REV
echo ".baseline/ = $(cat .baseline/REV)"
