#!/usr/bin/env bash
# Weak scaling: one training job per rank count, the same tokens per rank, i.e.
# train.global_batch_tokens = ranks x SB_TOKENS_PER_RANK. One command submits everything:
#
#   jobs/slurm/weak_scaling.sh [RESULTS_DIR]        (default runs/weak-YYYYmmdd-HHMMSS)
#
#   SB_RANKS            rank counts (default "1 2 4 8")
#   SB_TOKENS_PER_RANK  tokens per rank per step (default 4096; a multiple of train.micro_batch_tokens)
#   + the common variables of study_common.sh (SB_CONFIG, SB_SET, SB_STEPS, SB_SBATCH, SB_CHAIN, ...)
# Results: RESULTS/nN.json (train --summary), RESULTS/nN-JOBID.out, RESULTS/nN/{ckpt,metrics.h5},
# RESULTS/study.json; then: /usr/bin/python3 jobs/plots/report_study.py RESULTS
study_command="$0 $*"
source "$(dirname "$0")/study_common.sh"
RANKS=${SB_RANKS:-1 2 4 8}
TPR=${SB_TOKENS_PER_RANK:-4096}
study_init weak "${1:-runs/weak-$(date -u +%Y%m%d-%H%M%S)}"
for n in $RANKS; do
  study_submit "n$n" "$n" "train.global_batch_tokens=$((n * TPR))"
done
study_finish "\"tokens_per_rank\": $TPR"
