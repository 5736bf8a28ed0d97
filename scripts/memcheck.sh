#!/usr/bin/env bash
# Both frontends' kernels under compute-sanitizer's memcheck, on every route (scripts/memcheck.py).
#   bash scripts/memcheck.sh          (the GPU machine; both frontends 66 s on the H200, 2026-12-01)
# Each torch tensor is its own allocation, and so are JAX's arguments, so memcheck sees an access
# past any of them. Exit status: nonzero on a memcheck error or a result that differs from the core.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export PYTORCH_NO_CUDA_MEMORY_CACHING=1 XLA_PYTHON_CLIENT_ALLOCATOR=platform XLA_PYTHON_CLIENT_PREALLOCATE=false
rc=0
for frontend in torch jax; do
  timeout ${MEMCHECK_TIMEOUT:-280} compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
    python3 scripts/memcheck.py "$frontend" 2>&1 | tail -40
  status=${PIPESTATUS[0]}
  echo "memcheck $frontend: exit $status"
  [ "$status" -eq 0 ] || rc=1
done
exit $rc
