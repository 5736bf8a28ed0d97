#!/usr/bin/env bash
# Two trees timed in one device call, alternated, each run from its own directory.
#
#   bash scripts/ab.sh prepare REF                    (here: REF, a commit or branch, copied whole into ab_ref/)
#   bash scripts/ab.sh run ROUNDS COMMAND...          (on the device, with carry ["ab_ref"]: ab_ref/ is git-ignored)
#   e.g.  bash scripts/ab.sh prepare main
#         run(command="bash scripts/ab.sh run 2 python3 benchmarks/probe_tp.py --bound", carry=["ab_ref"])
#
# COMMAND runs ROUNDS times in each tree, the working tree first, each in its own process and
# from its own directory, so that what a probe imports is that tree's: benchmarks/common.py puts
# its own repository root first on sys.path, which is why a copy of the frontends put first on
# PYTHONPATH measured one tree twice (benchmarks/NOTES.md, "How to compare two trees in one
# call"). Each run first prints the frontend files its tree imports.
set -u
cd "$(dirname "$0")/.."
case "${1:-}" in
  prepare)
    want=$(git rev-parse "$2^{commit}") || exit 2
    rm -rf ab_ref && mkdir ab_ref && git archive "$want" | tar -x -C ab_ref && echo "$2 $want" >ab_ref/.ab_ref
    echo "ab_ref/ holds $(cat ab_ref/.ab_ref)"
    ;;
  run)
    rounds=$2
    shift 2
    [ -f ab_ref/.ab_ref ] || { echo "ab_ref/ missing: scripts/ab.sh prepare REF here, then carry ab_ref" >&2; exit 2; }
    for round in $(seq "$rounds"); do
      for tree in . ab_ref; do
        echo "=== round $round: $([ "$tree" = . ] && echo "working tree" || cut -c1-60 ab_ref/.ab_ref)"
        (cd "$tree" && PYTHONPATH=$PWD python3 -c "
import importlib.util as u
print('imports', *(u.find_spec(m).origin for m in ('torch_frontend', 'jax_frontend')))" && PYTHONPATH=$PWD "$@")
      done
    done
    ;;
  *)
    echo "usage: scripts/ab.sh prepare REF | scripts/ab.sh run ROUNDS COMMAND..." >&2
    exit 2
    ;;
esac
