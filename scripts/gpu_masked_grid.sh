#!/usr/bin/env bash
# The masked route's partials grid on the H200 in one device call (NOTES v60 items 6-7): the GPU
# tests of the route first, then Megatron's TP input masked through both frontends under grid
# variants, each call checked bit for bit by the probe; the two tables last. Logs land in $OUT.
#   run(command="bash scripts/gpu_masked_grid.sh")
#   PROBE_POINTS=8192:8,8192:2 TORCH_VARIANTS="default,pp 32" JAX_VARIANTS="default,partials 32/SM" bash scripts/gpu_masked_grid.sh
#   PYTEST_K=none ... (the probes alone)
# The JAX probe runs 20 calls unrolled in one jit (probe_tp.py --unrolled), so its figures leave
# out the host's dispatch: about 15 s of compiles and timing per point and variant. The three
# timeouts (200 + 130 + 240 s) keep the call inside the device tool's 600 s.
set -u
source "$(dirname "$0")/gpu_env.sh"
export PROBE_POINTS=${PROBE_POINTS:-4096:8,8192:8,8192:2,16384:8,16384:2}
pytest_rc=0
if [ "${PYTEST_K:-}" != none ]; then
  timeout -s INT -k 15 "${PYTEST_TIMEOUT:-200}" python3 -m pytest -q -rfEs -n 4 -p no:cacheprovider tests/ \
    -k "${PYTEST_K:-masked or megatron or compact or route or lone or cross or launch}" 2>&1 | tee "$OUT/pytest.log" | tail -3
  pytest_rc=${PIPESTATUS[0]}
fi
timeout "${TORCH_TIMEOUT:-130}" python3 benchmarks/probe_tp.py --masked "${TORCH_VARIANTS:-default,pp 64,pp 32,default 2}" \
  2>&1 | tee "$OUT/torch.log" | tail -1
torch_rc=${PIPESTATUS[0]}
timeout "${JAX_TIMEOUT:-240}" python3 benchmarks/probe_tp.py --jax --masked --unrolled \
  "${JAX_VARIANTS:-default,partials 64/SM,partials 32/SM}" 2>&1 | tee "$OUT/jax.log" | tail -1
jax_rc=${PIPESTATUS[0]}
echo
echo "== summary =="
[ -f "$OUT/pytest.log" ] && echo "pytest (exit $pytest_rc): $(grep -E '[0-9]+ (passed|failed)' "$OUT/pytest.log" | tail -1)"
echo "torch, CUDA graph (exit $torch_rc):"
sed -n '/^| variant |/,$p' "$OUT/torch.log"
echo "JAX, 20 calls unrolled in one jit (exit $jax_rc; custom calls per 20 calls: $(grep -o '[0-9]* custom calls' "$OUT/jax.log" | sort -u | tr '\n' ' ')):"
sed -n '/^| JAX variant/,$p' "$OUT/jax.log"
grep -h "DIFFERENT" "$OUT/torch.log" "$OUT/jax.log" && exit 1
exit $(( pytest_rc != 0 || torch_rc != 0 || jax_rc != 0 ))
