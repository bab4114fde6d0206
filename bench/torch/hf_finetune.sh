#!/usr/bin/env bash
# Fine-tuning a Qwen2.5-0.5B-shaped model end to end (issue 19), on the GPU machine after
# jobs/gpu/build_on_gpu.sh:   L=8192 STEPS=50 bash bench/torch/hf_finetune.sh
# 1. a random Qwen2ForCausalLM of Qwen2.5-0.5B's shape (transformers from_config + save_pretrained,
#    bf16): no weights can be fetched, so random ones stand in for the real files;
# 2. `convert` it to a checkpoint, `train configs/qwen2.5-0.5b.toml --init-from` that checkpoint for
#    STEPS steps at L tokens with sparse attention (DST), `convert` the result back (bf16);
# 3. the reload: our dense loss on a batch of documents at the exported weights (`train --init-from`
#    the export, one step at lr 1e-12, log.batches), and transformers' on the same documents
#    (bench/torch/torch_trajectory.py --steps 0).
# Output in $OUT: ft_*.log, ft_reload.json. RUNS=/dev/shm keeps the checkpoints (12 bytes a parameter)
# in memory: writing them to that machine's disk took half a minute each.
set -uo pipefail
SB=${SB:-build-gpu/src/sparsebalance}
OUTDIR=${OUT:-gpu-out}
L=${L:-8192}
STEPS=${STEPS:-50}
R=${RUNS:-runs}/ft
mkdir -p "$OUTDIR" $R
rm -rf $R/qwen_hf $R/ck $R/out_hf $R/ck_check
PYTHONUNBUFFERED=1 python3 - $R/qwen_hf <<'PY' || exit 1
import sys, time, torch, transformers
from transformers import AutoModelForCausalLM, Qwen2Config
t0 = time.time()
cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
                  rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False, sliding_window=32768,
                  max_window_layers=24, bos_token_id=151643, eos_token_id=151643, initializer_range=0.02)
torch.manual_seed(0)
kw = {"dtype": torch.bfloat16} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": torch.bfloat16}
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # the init on the CPU took 30 s
    m = AutoModelForCausalLM.from_config(cfg, **kw)
with torch.no_grad():  # biases at 0 would not show a lost bias: make them random
    for n, p in m.named_parameters():
        if n.endswith(".bias"):
            p.copy_(0.1 * torch.randn_like(p))
m.save_pretrained(sys.argv[1], safe_serialization=True)
print(f"random Qwen2.5-0.5B-shaped model: {sum(p.numel() for p in m.parameters())} parameters, "
      f"saved in {time.time() - t0:.1f} s")
PY
data=$R/data_$L
[ -f "$data/shard_00000.h5" ] || "$SB" prep synth --preset longalign --docs 400 --max-len "$L" --output "$data" > /dev/null || exit 1
TIMEFORMAT='convert HF -> checkpoint: %R s'
time "$SB" convert $R/qwen_hf $R/ck0.h5 --overwrite || exit 1
"$SB" train configs/qwen2.5-0.5b.toml --init-from $R/ck0.h5 --set data.path="$data" --set train.steps="$STEPS" \
  --set train.micro_batch_tokens="$L" --set train.global_batch_tokens=$((2 * L)) --set checkpoint.dir=$R/ck \
  --set checkpoint.every=0 --set log.path=$R/m.h5 --summary $R/ft.json > "$OUTDIR/ft_train.log" 2>&1 \
  || { tail -30 "$OUTDIR/ft_train.log"; exit 1; }
grep -E "^step|fresh optimizer|train:" "$OUTDIR/ft_train.log" | head -3
tail -4 "$OUTDIR/ft_train.log"
last=$(ls $R/ck/ckpt_*.h5 | tail -1)
TIMEFORMAT='convert checkpoint -> HF: %R s'
time "$SB" convert "$last" $R/out_hf || exit 1
"$SB" train configs/qwen2.5-0.5b.toml --init-from $R/out_hf --set data.path="$data" --set train.steps=1 \
  --set train.lr=1e-12 --set attention.mode=dense --set balance.tuning=fixed --set balance.self_profile=false \
  --set train.micro_batch_tokens="$L" --set train.global_batch_tokens=$((2 * L)) --set checkpoint.dir=$R/ck_check \
  --set log.path=$R/m_check.h5 --set log.batches=$R/check.jsonl > "$OUTDIR/ft_check.log" 2>&1 \
  || { tail -20 "$OUTDIR/ft_check.log"; exit 1; }
PYTHONUNBUFFERED=1 python3 bench/torch/torch_trajectory.py --hf $R/out_hf --batches $R/check.jsonl --metrics $R/m_check.h5 \
  --checkpoint "$(ls $R/ck_check/ckpt_*.h5 | tail -1)" --steps 0 --json "$OUTDIR/ft_reload.json" 2>&1 | tee "$OUTDIR/ft_reload.log"
python3 -c "import json; s = json.load(open('$R/ft.json')); print('fine-tune summary:', {k: s[k] for k in s if k in ('first_loss', 'last_loss', 'steps', 'mean_density', 'tokens_per_s')})"
rm -rf $R/ck $R/ck_check $R/ck0.h5
