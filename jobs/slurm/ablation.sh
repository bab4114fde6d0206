#!/usr/bin/env bash
# Ablation: the four balancing policies on the same config, rank count and data, one job each:
#   sequential+fixed (no balancing), sparse+fixed (SAB only), sequential+dst (DST only),
#   sparse+dst (SparseBalance). One command submits everything:
#
#   jobs/slurm/ablation.sh [RESULTS_DIR]            (default runs/ablation-YYYYmmdd-HHMMSS)
#
#   SB_NTASKS    ranks of every job (default 2)
#   SB_POLICIES  subset/order of policies (default "sequential+fixed sparse+fixed sequential+dst sparse+dst")
#   + the common variables of study_common.sh (SB_CONFIG, SB_SET, SB_STEPS, SB_SBATCH, SB_CHAIN, ...)
# Results: RESULTS/<batching>+<tuning>.json, .out, run dirs, study.json; report_study.py compares
# step time, imbalance, bubble and loss against sequential+fixed.
study_command="$0 $*"
source "$(dirname "$0")/study_common.sh"
NT=${SB_NTASKS:-2}
POLICIES=${SB_POLICIES:-sequential+fixed sparse+fixed sequential+dst sparse+dst}
study_init ablation "${1:-runs/ablation-$(date -u +%Y%m%d-%H%M%S)}"
for p in $POLICIES; do
  study_submit "$p" "$NT" "balance.batching=${p%+*} balance.tuning=${p#*+}"
done
study_finish "\"ranks\": $NT"
