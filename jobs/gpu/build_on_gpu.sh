#!/usr/bin/env bash
# Run on the GPU machine (device tool), from the repository root, with .debs/ carried
# (jobs/gpu/fetch_debs.sh made it here). Unpacks the Debian packages into a private prefix, fixes
# their CMake files to point there, configures with -DSB_CUDA=ON (serial HDF5 there), builds the CUDA
# test and benchmark, and runs the stages named on the command line (default: test sanitize bench):
#   test      tests/cuda correctness programs (ctest -L cuda: test_attention_cuda, test_ops_cuda,
#             test_train_cuda at 1 and 2 ranks: the model and 20 training steps against the CPU,
#             test_parts_cuda at 2 ranks: documents in parts against one rank and the CPU,
#             test_zero_cuda at 1 and 2 ranks: train.zero = 1 against 0, its checkpoint resumed)
#   sanitize  compute-sanitizer memcheck on the test programs (--quick cases)
#   bench     bench_attention_cuda over L x density (table at the end); its "x flex" / "x cudnn"
#             columns come from $OUT/flex.csv of the same call: name flex before bench
#   flex      bench/torch/flex_attention_ref.py (PyTorch FlexAttention + cuDNN SDPA on the same masks)
#   multi     bench/gpu/gpu_multi.sh: the four balancing policies with one rank per GPU (NCCL) on a
#             long-tail corpus, the one-GPU latency fit, 1 GPU vs all (NGPU, STEPS pass through)
#   e2e       bench/gpu/gpu_e2e.sh: train the 0.47B model of configs/gpu_0p5b.toml, dense and sparse, beside
#             PyTorch (LENS, STEPS, TORCH=0|1 pass through)
#   phases    bench/gpu/gpu_phase_breakdown.sh: per-phase GPU time of sparse steps (train.phase_times,
#             CUDA events; CONFIG, MODE, L, STEPS pass through)
#   fuse      bench_fused_cuda: each fused kernel beside its unfused chain, one layer's arrays of the
#             0.47B shape
#   overlap   bench/gpu/gpu_overlap.sh: the gradient all-reduce overlapped with the last backward against
#             after it, one rank per GPU (NGPU, L, STEPS, ROUNDS pass through)
#   accuracy  bench/gpu/accuracy.sh ACC_SCALE=gpu: the accuracy recipe, resumable; this call stops it
#             ACC_CALL_S (default 530) seconds after this script started (repeat until `accuracy: done`)
#   policies  bench/gpu/accuracy_policies.sh: the policy comparison from the recipe's POL_FROM (default
#             long) stage (run first if missing: ACC_UNTIL), resumable the same way (until `policies: done`)
#   gates     bench/gpu/accuracy_gates.sh: the recipe up to `long` (GATE_MODEL; run first if missing), then its dense
#             model read sparse under each gate variant and sparse long fine-tunes from `short` (issue 48),
#             resumable the same way (until `gates: done`; GATE_* pass through)
#   scaling   bench/gpu/gpu_scaling.sh: weak and strong scaling over 1, 2, 4, .. NGPU GPUs, a long document
#             split over them against one GPU, train.zero = 0 and 1 on all (NGPU, STEPS, PARTS, TPG,
#             CP_LEN, ZLEN, LONG pass through; SCALING_TIMEOUT, default 560 s)
#   memory3b  bench/gpu/gpu_3b_memory.sh: the Qwen2.5-3B shape at 32K context on one GPU, train.zero = 0
#             and 1: peak GPU memory, tokens/s, optimizer state per rank (STEPS, L, ZEROS pass through)
#   lora7b    bench/gpu/gpu_lora_7b.sh: the Qwen2.5-7B shape with LoRA r 16 at 32K and 64K on one GPU, dense and
#             sparse, beside PyTorch + peft, the memory plan against the measured peak; resumable, stops
#             LORA_CALL_S (default 570) seconds after this script started (LENS, MODES, STEPS, TORCH pass through)
#   fixtures  bench/torch/hf_fixtures.sh: transformers fixtures of tests/convert ($OUT/fixtures.tar)
#   traj      bench/torch/torch_trajectory.sh: our steps beside a plain PyTorch loop (CONFIG, L, STEPS)
#   finetune  bench/torch/hf_finetune.sh: a Qwen2.5-0.5B-shaped model (MODEL) converted, fine-tuned,
#             exported, reloaded by transformers (L, STEPS)
#   hfshapes  bench/torch/hf_shapes.sh: hf_finetune.sh for Qwen3-0.6B and Llama-3.2-1B shapes at 16K, 50
#             steps, each with its tokens/s beside PyTorch + FlexAttention; stops HF_CALL_S (default 570)
#             seconds after this script started; $OUT/hfshapes.md and hfshapes_logs.tar.gz (MODELS, L,
#             STEPS, RUNS pass through)
#   none      build only (BUILD_TARGETS narrows what is built; BUILD_DIR, DEBS, OUT as below;
#             SB_NO_BUILD=1 skips the build and runs the stages on the one in BUILD_DIR)
# Logs and CSVs go to $OUT (or ./gpu-out when OUT is unset).
set -uo pipefail
STAGES=${*:-test sanitize bench}
ROOT=$(pwd)
T0=$(date +%s)
OUTDIR=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUTDIR"
B=${BUILD_DIR:-$ROOT/build-gpu}
DEBS=${DEBS:-$ROOT/.debs}
log() { echo "== $(date -u +%H:%M:%S) $*"; }

P=$(mktemp -d /tmp/sbdeps.XXXX)
have_blas=0
if ldconfig -p | grep -q libopenblas && compgen -G "/usr/include/*/cblas.h" >/dev/null; then have_blas=1; fi
log "system OpenBLAS: $have_blas"
for f in "$DEBS"/*.deb; do
  case $(basename "$f") in
    *openblas*|libgfortran*) [ $have_blas = 1 ] && continue ;;
  esac
  dpkg -x "$f" "$P"
done
grep -rl "/usr/lib/x86_64-linux-gnu\|/usr/include" "$P"/usr/lib/x86_64-linux-gnu/cmake | xargs sed -i \
  "s#\"/usr/lib/x86_64-linux-gnu/libtrilinos#\"$P/usr/lib/x86_64-linux-gnu/libtrilinos#g; \
   s#/usr/lib/x86_64-linux-gnu/libtomlplusplus#$P/usr/lib/x86_64-linux-gnu/libtomlplusplus#g; \
   s#/usr/include/trilinos#$P/usr/include/trilinos#g; \
   s#set(Kokkos_INSTALL_DIR \"/usr\")#set(Kokkos_INSTALL_DIR \"$P/usr\")#"
# pkg-config files (PCRE2, ICU: the BPE tokenizer) name prefix /usr: point them at the private prefix.
sed -i -E "s#^(prefix *= *)/usr\$#\1$P/usr#" "$P"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
export PKG_CONFIG_PATH=$P/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
command -v pkg-config >/dev/null || export PATH=$PATH:$P/usr/bin  # the carried pkgconf, if none there
# `prep synth` (tests, bench/gpu/gpu_e2e.sh) reads the word list where Debian puts it (prep.dict).
if [ ! -f /usr/share/dict/american-english ] && [ -f "$P/usr/share/dict/american-english" ]; then
  mkdir -p /usr/share/dict && cp "$P/usr/share/dict/american-english" /usr/share/dict/
fi
# No ssh/rsh there: a program the tests start outside mpirun (MPI singleton) fails at MPI_Init
# looking for one, though it never launches a remote daemon. Any existing command satisfies it.
export OMPI_MCA_plm_rsh_agent=${OMPI_MCA_plm_rsh_agent:-false}
export LD_LIBRARY_PATH=$P/usr/lib/x86_64-linux-gnu:$P/usr/lib/x86_64-linux-gnu/openblas-pthread:${LD_LIBRARY_PATH:-}
extra=()
if [ $have_blas = 0 ]; then
  extra+=(-DCMAKE_LIBRARY_PATH=$P/usr/lib/x86_64-linux-gnu/openblas-pthread
          -DCBLAS_INCLUDE_DIR=$P/usr/include/x86_64-linux-gnu/openblas-pthread)
fi
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
# SB_NO_BUILD=1: a later call on the same (still warm) machine runs stages on the build already there.
if [ "${SB_NO_BUILD:-0}" != 1 ]; then
log "configure ($NVCC)"
# -include cstdint: GCC 13 there (unlike 12 on Debian) does not pull <cstdint> in transitively; a
# header that forgets it (src/comm/comm.hpp once did) still builds there as it does here.
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSB_CUDA=ON -DSB_BENCH=OFF \
  -DCMAKE_CXX_FLAGS="-include cstdint" \
  -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_PREFIX_PATH="$P/usr" \
  -DKokkos_DIR="$P/usr/lib/x86_64-linux-gnu/cmake/Kokkos" \
  -Dtomlplusplus_DIR="$P/usr/lib/x86_64-linux-gnu/cmake/tomlplusplus" "${extra[@]}" \
  > "$OUTDIR/configure.log" 2>&1 || { tail -40 "$OUTDIR/configure.log"; exit 1; }
grep -E "HDF5|SB_CUDA|CUDA compiler identification" "$OUTDIR/configure.log"
log "build"
ninja -C "$B" -j16 ${BUILD_TARGETS:-sparsebalance test_attention_cuda test_ops_cuda test_train_cuda test_parts_cuda test_zero_cuda test_select_cuda test_bwd_pieces bench_attention_cuda bench_fused_cuda} > "$OUTDIR/build.log" 2>&1 || { tail -60 "$OUTDIR/build.log"; exit 1; }
fi
rc=0
for st in $STAGES; do
  case $st in
    test)
      log "test"
      (cd "$B" && timeout 400 ctest ${SB_CTEST_ARGS:--L cuda} -V) 2>&1 | tee "$OUTDIR/test.log" | grep -E "OK |FAIL|PASS|SKIP|tests passed|rel|worst|steps, loss" || rc=1 ;;
    sanitize)
      log "compute-sanitizer memcheck"
      timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$B/tests/cuda/test_attention_cuda" --quick \
        2>&1 | tee "$OUTDIR/memcheck.log" | tail -8 || rc=1
      timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$B/tests/cuda/test_ops_cuda" --quick \
        2>&1 | tee -a "$OUTDIR/memcheck.log" | tail -8 || rc=1 ;;
    bench)
      log "bench"
      ref=(); [ -f "$OUTDIR/flex.csv" ] && ref=(--ref "$OUTDIR/flex.csv")
      timeout 300 "$B/kernels/bench_attention_cuda" --csv "$OUTDIR/bench_cuda.csv" "${ref[@]}" 2>&1 | tee "$OUTDIR/bench_cuda.log" || rc=1 ;;
    flex)
      log "flex"
      PYTHONUNBUFFERED=1 timeout 400 python3 bench/torch/flex_attention_ref.py --csv "$OUTDIR/flex.csv" 2>&1 | tee "$OUTDIR/flex.log" || rc=1 ;;
    multi)
      log "multi-GPU"
      SB=$B/src/sparsebalance OUT=$OUTDIR timeout ${MULTI_TIMEOUT:-560} bash bench/gpu/gpu_multi.sh 2>&1 | tee "$OUTDIR/multi.log" || rc=1 ;;
    e2e)
      log "e2e"
      SB=$B/src/sparsebalance OUT=$OUTDIR timeout 560 bash bench/gpu/gpu_e2e.sh 2>&1 | tee "$OUTDIR/e2e.log" || rc=1 ;;
    phases)
      log "phases"
      SB=$B/src/sparsebalance OUT=$OUTDIR timeout 560 bash bench/gpu/gpu_phase_breakdown.sh 2>&1 | tee "$OUTDIR/phases.log" || rc=1 ;;
    fuse)
      log "fused kernels"
      [ -x "$B/kernels/bench_fused_cuda" ] && { timeout 120 "$B/kernels/bench_fused_cuda" 2>&1 | tee "$OUTDIR/bench_fused.md" || rc=1; } ;;
    overlap)
      log "overlap"
      SB=$B/src/sparsebalance OUT=$OUTDIR timeout 560 bash bench/gpu/gpu_overlap.sh 2>&1 | tee "$OUTDIR/overlap.log" || rc=1 ;;
    accuracy)
      log "accuracy recipe"
      SB=$B/src/sparsebalance OUT=$OUTDIR ACC_SCALE=gpu ACC_DEADLINE=$((T0 + ${ACC_CALL_S:-530})) \
        bash bench/gpu/accuracy.sh 2>&1 | tee "$OUTDIR/accuracy.log" || rc=1 ;;
    policies)
      log "accuracy policies"
      # The recipe's stages up to POL_FROM first (kept when done: a no-op on the machine that ran the recipe).
      (export SB=$B/src/sparsebalance OUT=$OUTDIR ACC_SCALE=gpu POL_SCALE=gpu ACC_DEADLINE=$((T0 + ${ACC_CALL_S:-530}))
       ACC_UNTIL=${POL_FROM:-long} bash bench/gpu/accuracy.sh && { [ ! -s runs/accuracy_gpu/final_${POL_FROM:-long} ] || bash bench/gpu/accuracy_policies.sh; }) 2>&1 | tee "$OUTDIR/policies.log" || rc=1 ;;
    gates)
      log "accuracy gates"
      (export SB=$B/src/sparsebalance OUT=$OUTDIR ACC_SCALE=gpu ACC_DEADLINE=$((T0 + ${ACC_CALL_S:-530}))
       ACC_UNTIL=${GATE_MODEL:-long} bash bench/gpu/accuracy.sh && { [ ! -s runs/accuracy_gpu/final_${GATE_MODEL:-long} ] || bash bench/gpu/accuracy_gates.sh; }) 2>&1 | tee "$OUTDIR/gates.log" || rc=1 ;;
    scaling)
      log "scaling"
      SB=$B/src/sparsebalance OUT=$OUTDIR timeout ${SCALING_TIMEOUT:-560} bash bench/gpu/gpu_scaling.sh 2>&1 | tee "$OUTDIR/scaling.log" || rc=1 ;;
    memory3b)
      log "memory3b"
      SB=$B/src/sparsebalance OUT=$OUTDIR timeout 560 bash bench/gpu/gpu_3b_memory.sh 2>&1 | tee "$OUTDIR/memory3b.log" || rc=1 ;;
    lora7b)
      log "lora7b"
      SB=$B/src/sparsebalance OUT=$OUTDIR DEADLINE=$((T0 + ${LORA_CALL_S:-570})) bash bench/gpu/gpu_lora_7b.sh \
        2>&1 | tee "$OUTDIR/lora7b.log" || rc=1 ;;
    fixtures|traj|finetune)
      script=bench/torch/hf_fixtures.sh; [ $st = traj ] && script=bench/torch/torch_trajectory.sh
      [ $st = finetune ] && script=bench/torch/hf_finetune.sh
      log "$st"
      SB=$B/src/sparsebalance OUT=$OUTDIR timeout ${STAGE_TIMEOUT:-560} bash $script 2>&1 | tee "$OUTDIR/$st.log" || rc=1 ;;
    hfshapes)
      log "hfshapes"
      SB=$B/src/sparsebalance OUT=$OUTDIR DEADLINE=$((T0 + ${HF_CALL_S:-570})) bash bench/torch/hf_shapes.sh \
        2>&1 | tee "$OUTDIR/hfshapes.log" || rc=1 ;;
    none) ;;  # build only
    *) echo "unknown stage $st"; rc=2 ;;
  esac
done
log "done rc=$rc"
exit $rc
