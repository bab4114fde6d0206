# Gate variants by name, sourced by bench/gpu/accuracy_gates.sh and bench/gpu/accuracy_policies.sh:
# a variant is '+'-joined parts, each part one choice of issue 48's gate (the schema's keys).
#   base   the defaults (attention.gate_query = mean, gate_key = mean, no dense layers)
#   qmax   attention.gate_query = max      (the best of the query block's tokens)
#   kbounds attention.gate_key = bounds    (per-dimension max/min of the key block)
#   ksub   attention.gate_key = sub        (sub-block means, the best of them)
#   dlN    attention.dense_layers = last:N (the last N layers dense)
#   wN     attention.local_blocks = N      (N local blocks always kept, besides the k0 chosen)
# e.g. "kbounds+dl2". gate_variant_sets NAME prints the --set flags (one word each).
gate_variant_sets() {
  local part out=()
  IFS=+ read -r -a parts <<< "$1"
  for part in "${parts[@]}"; do
    case $part in
      base) ;;
      qmax) out+=(--set attention.gate_query=max) ;;
      kbounds) out+=(--set attention.gate_key=bounds) ;;
      ksub) out+=(--set attention.gate_key=sub) ;;
      w[0-9]*) out+=(--set "attention.local_blocks=${part#w}") ;;
      dl[0-9]*) out+=(--set "attention.dense_layers=last:${part#dl}") ;;
      *) echo "gate_variant_sets: unknown part '$part' of '$1' (base qmax kbounds ksub dlN wN)" >&2; return 1 ;;
    esac
  done
  echo "${out[@]}"
}
