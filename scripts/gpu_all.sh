#!/usr/bin/env bash
# The whole GPU test suite plus the benchmark, in one call on the H200; a short table last.
#   bash scripts/gpu_all.sh                 (device tool: logs, JSON and PNG land in $OUT)
#   BENCH_ARGS="--ns 8192 --dists uniform" PYTEST_ARGS="-k real tests/" bash scripts/gpu_all.sh
# tests/test_megatron.py needs megatron-core, which the device image lacks: run scripts/device_megatron.sh
# here first and pass carry=[".megatron"] (gpu_env.sh then requires it); without it those tests skip, saying so.
# The device tool allows 600 s a call. The benchmark runs first (about 135 s; BENCH_TIMEOUT caps
# it) and the suite gets what is left of DEADLINE (seconds from the start), less a margin for its
# SIGINT and the summary. The suite's time on a fresh machine varies: 393 GPU tests at -n 3 took
# 316-338 s on some (sessions 30, 33) and did not finish in 373 s on another (session 33: 389
# passed); at -n 4 they took 249 s, the GPU's memory peaking at 72.6 of 143 GB (nvidia-smi each
# second; session 33), and 212 s after the benchmark in a whole call of 330 s (session 34). At
# -n 2 they no longer fit, and at -n 6 the workers' JAX and torch caches together exhausted the
# GPU's memory. On an 80 GB H100, -n 4 with the tests dealt out one by one ran out of memory (session
# 72: three tests failed, 769 in 424 s). Now `--dist loadgroup` runs the tests that hold a GiB or
# more one at a time in one worker, and each other test function's tests in one worker
# (tests/conftest.py), so a fifth worker fits: at -n 5 on an H100, 768 of 770 tests passed in the
# 371 s left beside a one-row benchmark, none failed, the GPU's memory peaking at 53.5 of 79.6 GiB
# (session 72), and in one whole call with the whole benchmark all 770 tests passed or skipped in
# 340 s of the 433 s left, memory peaking at 56.6 GiB (session 73, before tests/test_gpu_racecheck.py
# added about 112 s of worker time). With it, on an H200, all 772 tests passed or skipped in 260 s of
# the 458 s left, memory peaking at 53.4 of 140.4 GiB (session 74). The summary gives that peak
# (nvidia-smi each second). A suite cut short names the tests it did not reach (collected minus reported).
set -u
start=$SECONDS
source "$(dirname "$0")/gpu_env.sh"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
  python3 -c "import sys, torch, triton, jax, pytest, xdist; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'jax', jax.__version__, 'pytest', pytest.__version__, 'xdist', xdist.__version__)"
} 2>&1 | tee "$OUT/env.txt"
PYTEST_ARGS=${PYTEST_ARGS:--n 5 --dist loadgroup tests/}
# The suite's test ids, listed beside the benchmark, to name what a cut-short suite missed. The GPU is
# hidden from this process (importing the tests would otherwise open a JAX client on it while the
# benchmark times); the ids are the same without it (446 of 446 alike, session 33).
CUDA_VISIBLE_DEVICES= JAX_PLATFORMS=cpu EMBWGRAD_REQUIRE_GPU=0 \
  python3 -m pytest --collect-only -q -p no:cacheprovider $PYTEST_ARGS >"$OUT/collected.txt" 2>&1 &
collect_pid=$!

timeout ${BENCH_TIMEOUT:-200} python3 benchmarks/run.py --json "$OUT/bench.json" --png "$OUT/bench.png" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
bench_rc=${PIPESTATUS[0]}
wait $collect_pid

# SIGINT first, so that a suite cut short still reports its failures so far (-rfEs) and its junit
# file; killed 20 s later.
left=$(( ${DEADLINE:-585} - (SECONDS - start) - 30 ))
left=$(( left > 0 ? left : 1 ))  # (timeout 0 would mean no limit at all)
echo "pytest gets ${PYTEST_TIMEOUT:-$left} s"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits -lms 1000 >"$OUT/memory.csv" 2>&1 &
smi_pid=$!
timeout -s INT -k 20 ${PYTEST_TIMEOUT:-$left} python3 -m pytest -q -rfEs --durations=15 -p no:cacheprovider \
  --junitxml "$OUT/junit.xml" $PYTEST_ARGS 2>&1 | tee "$OUT/pytest.log"
pytest_rc=${PIPESTATUS[0]}
kill $smi_pid 2>/dev/null

echo
echo "== summary =="
cat "$OUT/env.txt"
echo "pytest (exit $pytest_rc): $(grep -E '^[0-9]+ (passed|failed)|[0-9]+ (passed|failed).* in ' "$OUT/pytest.log" | tail -1)"
awk -F', *' '$1 ~ /^[0-9]+$/ { if ($1 > peak) peak = $1; total = $2 } END { printf "GPU memory during the suite: peak %.1f of %.1f GiB\n", peak / 1024, total / 1024 }' "$OUT/memory.csv"
python3 - "$OUT/collected.txt" "$OUT/junit.xml" <<'EOF'
import sys, xml.etree.ElementTree as ET
collected = [l.strip() for l in open(sys.argv[1]) if "::" in l]
try:
    reported = {(c.get("classname"), c.get("name")) for c in ET.parse(sys.argv[2]).iter("testcase") if c.get("name")}
    # (under --dist loadgroup a grouped test's name ends in "@group", as pytest-xdist renames it)
    reported = {(cls, name[:name.rfind("@")] if name.rfind("@") > name.rfind("]") else name) for cls, name in reported}
except (OSError, ET.ParseError) as e:
    sys.exit(f"no junit report ({e}): cannot say which tests ran")

def junit_name(test_id):
    """"tests/test_x.py::Cls::test_y[p]" as junit names it: ("tests.test_x.Cls", "test_y[p]")."""
    path, *inner, name = test_id.split("::")
    return ".".join([path.removesuffix(".py").replace("/", ".")] + inner), name

missing = [t for t in collected if junit_name(t) not in reported]
print(f"tests collected {len(collected)}, reported {len(reported)}, not reached {len(missing)}")
for t in missing:
    print("  not reached:", t)
EOF
echo "benchmark (exit $bench_rc):"
sed -n '/^| n |/,$p' "$OUT/bench.log"
exit $(( pytest_rc != 0 || bench_rc != 0 ))
