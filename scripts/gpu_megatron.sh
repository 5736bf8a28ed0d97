#!/usr/bin/env bash
# The README's Megatron table in one device call: Megatron's vocab-parallel input (rank 1 of TP,
# Zipf(1.1) ids over V = 129280, H = 7168, bf16 grad into the fp32 shard) through both frontends,
# one process each, every call checked bit for bit by the probe: torch in CUDA graphs beside the
# dense path on the shard and the floor (plain, zero_rows, masked), then JAX 20 calls unrolled in
# one jit (zero_rows, plain, masked). Logs land in $OUT; the four tables last.
# About 450 s whole (session 63: JAX's plain probe needs a little over 200 s, hence its 240 s limit);
# each probe's time is printed beside its exit status.
#   run(command="bash scripts/gpu_megatron.sh")
#   PROBE_POINTS=8192:8,8192:2 bash scripts/gpu_megatron.sh
#   PARTS=torch_masked,jax_masked bash scripts/gpu_megatron.sh   (some of the four probes)
set -u
source "$(dirname "$0")/gpu_env.sh"
export PROBE_POINTS=${PROBE_POINTS:-4096:8,8192:8,8192:2,16384:8,32768:8,65536:8}
PARTS=${PARTS:-torch,torch_masked,jax,jax_masked}
run() {  # run NAME TIMEOUT ARGS...: one probe process, its log in $OUT/NAME.log (if NAME is in PARTS)
  local name=$1 limit=$2
  shift 2
  [[ ",$PARTS," == *",$name,"* ]] || return 0
  local start=$SECONDS
  timeout "$limit" python3 benchmarks/probe_tp.py "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - start)) s (limit $limit)"
}
run torch "${TORCH_TIMEOUT:-120}" "default,skip off"
run torch_masked "${TORCH_TIMEOUT:-120}" --masked default
run jax "${JAX_TIMEOUT:-240}" --jax --unrolled "default,skip off"
run jax_masked "${JAX_MASKED_TIMEOUT:-170}" --jax --masked --unrolled default
echo
echo "== summary (us; torch CUDA graph; JAX 20 calls unrolled in one jit; default = zero_rows, skip off = plain) =="
for name in torch torch_masked jax jax_masked; do
  [ -f "$OUT/$name.log" ] || continue
  echo "$name:"
  sed -n '/^| \(JAX \)\{0,1\}variant/,$p' "$OUT/$name.log"
done
! grep -h "DIFFERENT\|Traceback" "$OUT"/*.log
