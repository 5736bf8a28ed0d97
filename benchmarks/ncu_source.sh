#!/usr/bin/env bash
# Nsight Compute on the GPU machine: per-kernel details (stall reasons included) and SASS with
# per-instruction stall samples, for either frontend's kernels at the given points.
#
#   OUT=/some/dir bash benchmarks/ncu_source.sh "merge_rank|partials" 4096:uniform 8192:zipf
#   NCU_TARGET=benchmarks/ncu_target_jax.py NCU_RANGE="--launch-skip 2 --launch-count 1" \
#       OUT=/some/dir bash benchmarks/ncu_source.sh partials 4096 uniform      (the JAX frontend's third call)
#
# Writes $OUT/ncu.tar.gz (the report, the details page and each kernel's SASS page, as CSV).
# Caches are not flushed between kernels (--cache-control none), so each kernel finds in L2
# what the one before it left there, as in a real call; the kernels run one at a time.
set -u
REGEX=$1; shift
NCU=$(command -v ncu || ls -d /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu on this machine"; exit 1; }
DIR=$(mktemp -d)
cd "$(dirname "$0")/.." || exit 1
# shellcheck disable=SC2086  # NCU_RANGE is several options
PYTHONPATH=$PWD:$PWD/benchmarks "$NCU" ${NCU_RANGE:---profile-from-start off} --clock-control none --cache-control none \
    --kernel-name "regex:$REGEX" --set full --import-source no -f -o "$DIR/prof" \
    python "${NCU_TARGET:-benchmarks/ncu_target.py}" "$@" > "$DIR/ncu_run.log" 2>&1
tail -5 "$DIR/ncu_run.log"
"$NCU" -i "$DIR/prof.ncu-rep" --page details --csv > "$DIR/details.csv" 2> "$DIR/details.err"
"$NCU" -i "$DIR/prof.ncu-rep" --page source --csv --print-source sass > "$DIR/source.csv" 2> "$DIR/source.err"
"$NCU" -i "$DIR/prof.ncu-rep" --page raw --csv > "$DIR/raw.csv" 2> "$DIR/raw.err"
ls -la "$DIR"
tar -czf "${OUT:-.}/ncu.tar.gz" -C "$DIR" .
