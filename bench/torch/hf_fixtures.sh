#!/usr/bin/env bash
# The transformers fixtures of tests/convert (issue 19), on the GPU machine after
# jobs/gpu/build_on_gpu.sh: bench/torch/hf_parity.py makes tiny random Llama / Mistral / Qwen2 models with
# their logits; we import Qwen2 and Mistral and export them again (bf16), and hf_parity.py --check
# loads those exports in transformers. Everything lands in $OUT/fixtures.tar: copy llama/, mistral/,
# qwen2/ and exp_*/ (check_<name>.json -> exp_<name>/transformers_logits.json) into tests/convert/fixtures.
set -uo pipefail
SB=${SB:-build-gpu/src/sparsebalance}
OUTDIR=${OUT:-gpu-out}
D=runs/fx
rm -rf $D runs/fx_ck && mkdir -p $D runs/fx_ck "$OUTDIR"
python3 bench/torch/hf_parity.py --out $D || exit 1
for name in qwen2 mistral; do
  "$SB" convert $D/$name runs/fx_ck/$name.h5 || exit 1
  "$SB" convert runs/fx_ck/$name.h5 $D/exp_${name}_bf16 --dtype bf16 || exit 1
done
python3 bench/torch/hf_parity.py --out $D --check $D/exp_qwen2_bf16 $D/exp_mistral_bf16 --tar  # tars even when a check fails
cp $D/fixtures.tar "$OUTDIR/"
