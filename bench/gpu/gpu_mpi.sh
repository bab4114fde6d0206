# Sourced by the multi-GPU benchmarks (gpu_multi.sh, gpu_overlap.sh, gpu_scaling.sh): one rank per
# GPU through mpirun, with NVLink multicast off, and a config's micro-batch after --set flags.
# NVLink multicast stays off (jobs/gpu/README.md): it can take a shared host's GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# gpu_mpirun NP COMMAND...: NP ranks, rank r on the node's GPU r; one rank runs on GPU 0 only.
gpu_mpirun() {
  local np=$1 env=()
  shift
  [ "$np" = 1 ] && env=(env CUDA_VISIBLE_DEVICES=0)
  "${env[@]}" mpirun -np "$np" -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS \
    -x LD_LIBRARY_PATH "$@"
}

# micro_batch_of CONFIG [FLAG...]: train.micro_batch_tokens of CONFIG after the flags' --set of it
# (the last wins, as in the program). Python 3.11+ (tomllib): $PYTHON, else python3.
micro_batch_of() {
  "${PYTHON:-python3}" - "$@" <<'PY'
import sys, tomllib
mb = tomllib.load(open(sys.argv[1], "rb"))["train"]["micro_batch_tokens"]
a = sys.argv[2:]
for i, x in enumerate(a):
    if x == "--set" and i + 1 < len(a) and a[i + 1].startswith("train.micro_batch_tokens="):
        mb = int(a[i + 1].split("=", 1)[1])
print(mb)
PY
}
