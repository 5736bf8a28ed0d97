"""The feature path (n <= 3072 tokens) in the torch frontend: its stage times, and the rows a
partial loads at once (_FEATURE_BATCH) (NOTES v17).

At 1024 tokens the call took 50 us (uniform ids) and 70 us (Zipf ids) in graph replay against
a floor of 17 and 10 us, and XLA's scatter-add 42 us; this probe found the long-run folds'
padded batches (NOTES v17 item 8: now 41 and 47 us). This prints, per point, the whole call,
each stage alone in its own graph (without PDL), and whether the call is bitwise equal to the
deterministic dense path. The batch (argv[1], default 4) is set before the first compile.

    python benchmarks/probe_feature.py 8
"""

import sys

import triton.language as tl
from bench_torch import graph_ms, probe_inputs, same_bits
from probe_stream import stage_us

import torch_frontend
from embwgrad_core import torch_path
from torch_frontend import embedding_wgrad as ew

POINTS = [(1024, "uniform"), (1024, "zipf"), (2048, "zipf"), (3072, "zipf")]


def main(argv):
    batch = int(argv[0]) if argv else 4
    ew._FEATURE_BATCH = tl.constexpr(batch)  # before the first compile
    for n, dist, _, ids, grad, main_grad, expected in probe_inputs(POINTS):
        work = main_grad.clone()
        torch_frontend.accumulate(ids, grad, work)
        exact = same_bits(work, expected)
        res = {"call (graph)": graph_ms(lambda: torch_frontend.accumulate(ids, grad, work)) * 1e3}
        res.update(stage_us(ids, grad, work))
        print(f"batch {batch} n={n:5d} {dist:7s} path {torch_path(n)} exact={exact} " + ", ".join(f"{k} {v:.1f} us" for k, v in res.items()),
              flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
