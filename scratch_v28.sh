#!/bin/bash
# one-off device batch for session 28 (not committed): the suite and table, then probes
cd "$(dirname "$0")"
PYTEST_TIMEOUT=320 BENCH_TIMEOUT=200 bash scripts/gpu_all.sh > $OUT/gpu_all.txt 2>&1
echo "gpu_all rc $?"
sed -n '/== summary ==/,$p' $OUT/gpu_all.txt
export PYTHONPATH=.:benchmarks
V="default,fold ahead 16 h128,fold ahead 8 h128,fold ahead 16 h64,fold ahead 32 h64,default again"
PROBE_POINTS=4096:uniform,8192:uniform,8192:zipf timeout 75 python benchmarks/probe_calls.py "$V" 2>&1 | grep "^|" 
PROBE_POINTS=4096:8,8192:8 timeout 50 python benchmarks/probe_tp.py "$V" 2>&1 | grep "^|"
PROBE_POINTS=2048:zipf,3072:zipf timeout 40 python benchmarks/probe_jax.py "default,long batched" 2>&1 | grep "^|"
