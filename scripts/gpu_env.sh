# Sourced by the device scripts (gpu_all.sh, gpu_two.sh, gpu_masked_grid.sh, gpu_megatron.sh): the
# repository root as the working directory and on PYTHONPATH, $OUT made, a missing GPU an error for
# the tests, and JAX allocating GPU memory as it goes (beside torch in the same process or the same GPU).
# megatron-core, where scripts/device_megatron.sh unpacked it and the call carried it (.megatron/), goes on
# PYTHONPATH, and tests/test_megatron.py must then run.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-/tmp/embwgrad-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 EMBWGRAD_REQUIRE_GPU=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false
if [ -d .megatron ]; then
  export PYTHONPATH=$PYTHONPATH:$PWD/.megatron/core EMBWGRAD_REQUIRE_MEGATRON=1
  python3 -c "import packaging.version" 2>/dev/null || export PYTHONPATH=$PYTHONPATH:$PWD/.megatron/deps
fi
