#!/usr/bin/env bash
# The tests that need two devices (JAX under jit with sharded arrays, or on the second device; torch
# with its tensors on a GPU that is not the current one), then benchmarks/sharded_jax.py,
# on a machine of two or more GPUs: the device tool's nvidia-h200-x2,
#   run(kind="nvidia-h200-x2", command="bash scripts/gpu_two.sh")
# On one GPU those tests skip (tests/test_jax_frontend.py, TWO_DEVICES), so gpu_all.sh never runs
# them; on a CPU, CI runs them over two host devices (tests/conftest.py). A skip here, or fewer
# than two GPUs, fails the script. Logs land in $OUT.
set -u
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi -L
python3 -c "import jax; d = jax.devices(); print(len(d), 'x', d[0].device_kind, 'jax', jax.__version__); assert len(d) >= 2" ||
  { echo "needs two GPUs"; exit 2; }
timeout -s INT -k 15 "${PYTEST_TIMEOUT:-300}" python3 -m pytest -q -rfEs -p no:cacheprovider \
  tests/test_jax_frontend.py -k "own_shard or split_by_rows or second_device" 2>&1 | tee "$OUT/pytest_two.log"
pytest_rc=${PIPESTATUS[0]}
# torch: tensors on the second GPU while the first is current (its own process: no JAX beside it)
timeout -s INT -k 15 "${TORCH_TIMEOUT:-200}" python3 -m pytest -q -rfEs -p no:cacheprovider \
  tests/test_torch_frontend.py -k "not_the_current" 2>&1 | tee "$OUT/pytest_two_torch.log"
torch_rc=${PIPESTATUS[0]}
# Megatron's VocabParallelEmbedding at TP 1 and 2 over NCCL, where the call carried .megatron/ (scripts/device_megatron.sh)
megatron_rc=0
if [ -d .megatron ]; then
  timeout -s INT -k 15 "${MEGATRON_TIMEOUT:-200}" python3 -m pytest -q -rfEs -p no:cacheprovider \
    tests/test_megatron.py 2>&1 | tee "$OUT/pytest_two_megatron.log"
  megatron_rc=${PIPESTATUS[0]}
fi
timeout "${BENCH_TIMEOUT:-240}" python3 benchmarks/sharded_jax.py 2>&1 | tee "$OUT/sharded.log"
bench_rc=${PIPESTATUS[0]}
echo
echo "== summary =="
echo "pytest, JAX (exit $pytest_rc): $(grep -E '[0-9]+ (passed|failed)' "$OUT/pytest_two.log" | tail -1)"
echo "pytest, torch (exit $torch_rc): $(grep -E '[0-9]+ (passed|failed)' "$OUT/pytest_two_torch.log" | tail -1)"
[ -d .megatron ] && echo "pytest, Megatron (exit $megatron_rc): $(grep -E '[0-9]+ (passed|failed)' "$OUT/pytest_two_megatron.log" | tail -1)"
skips=$(cat "$OUT"/pytest_two*.log | grep -cE '^SKIPPED')
[ "$skips" -eq 0 ] || echo "$skips tests skipped: they did not run on two GPUs"
echo "sharded_jax.py (exit $bench_rc):"
sed -n '/^| n |/,$p' "$OUT/sharded.log"
exit $(( pytest_rc != 0 || torch_rc != 0 || megatron_rc != 0 || bench_rc != 0 || skips != 0 ))
