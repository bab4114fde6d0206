#!/usr/bin/env bash
# A checkpoint loads into a plain NumPy re-implementation of Llama (HF names and conventions)
# and gives the same loss as `sparsebalance eval`. Skips (77) without h5py/numpy.
set -euo pipefail
SB=$1; SRC=$2
/usr/bin/python3 -c "import h5py, numpy, tomllib" 2>/dev/null || { echo "SKIP: python3-h5py/numpy missing"; exit 77; }
D=$(mktemp -d /tmp/sb_ref.XXXXXX); trap 'rm -rf "$D"' EXIT
$SB prep synth --preset longalign --docs 60 --seed 2 --max-len 300 --min-len 40 --output $D/data >/dev/null
FLAGS="--set data.path=$D/data --set checkpoint.dir=$D/ckpt --set log.path=$D/m.h5 --set model.d_model=32 \
  --set model.ffn_dim=48 --set model.tie_embeddings=false --set train.global_batch_tokens=1024 \
  --set train.micro_batch_tokens=256 --set attention.block_size=16 --set log.progress=false --set data.val_fraction=0.2"
$SB train $FLAGS --set train.steps=3 >/dev/null
$SB eval $FLAGS --checkpoint latest --set eval.docs=6 --summary $D/eval.json >/dev/null
/usr/bin/python3 $SRC/jobs/plots/reference_loss.py $D/ckpt/ckpt_00000003.h5 $D/eval.json --tol 1e-4
