#!/usr/bin/env bash
# Strong scaling: one training job per rank count, the same global batch for all of them
# (train.global_batch_tokens = SB_GLOBAL_TOKENS). One command submits everything:
#
#   jobs/slurm/strong_scaling.sh [RESULTS_DIR]      (default runs/strong-YYYYmmdd-HHMMSS)
#
#   SB_RANKS          rank counts (default "1 2 4 8")
#   SB_GLOBAL_TOKENS  tokens per step (default 16384; needs >= max ranks x train.micro_batch_tokens)
#   + the common variables of study_common.sh (SB_CONFIG, SB_SET, SB_STEPS, SB_SBATCH, SB_CHAIN, ...)
# Results as in weak_scaling.sh; then: /usr/bin/python3 jobs/plots/report_study.py RESULTS
study_command="$0 $*"
source "$(dirname "$0")/study_common.sh"
RANKS=${SB_RANKS:-1 2 4 8}
G=${SB_GLOBAL_TOKENS:-16384}
study_init strong "${1:-runs/strong-$(date -u +%Y%m%d-%H%M%S)}"
for n in $RANKS; do
  study_submit "n$n" "$n" "train.global_batch_tokens=$G"
done
study_finish "\"global_batch_tokens\": $G"
