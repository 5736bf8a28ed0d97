"""Does the benchmark's L2 flush cost our calls? (benchmarks/NOTES.md, v19)

triton.testing.do_bench zeroes a 256 MB buffer before every repetition, so a timed call may start
with L2 full of dirty lines that it must write back. Here the torch call (graph replay) is timed
with that flush, with a flush that only reads 256 MB (L2 left holding clean lines), and with
none (L2 holding the previous call's lines, as in a JAX chain), under _Config variants
(probe_calls.VARIANTS).

    python benchmarks/probe_flush.py [variant,variant]     (PROBE_POINTS picks the points)
"""

import sys

import torch
import triton
from bench_torch import config_overrides, graph_ms, probe_inputs, same_bits
from common import probe_points
from probe_calls import VARIANTS

import torch_frontend

POINTS = probe_points([(4096, "uniform"), (8192, "uniform"), (8192, "zipf"), (32768, "uniform")])
DRIVER = triton.runtime.driver.active
ZERO = DRIVER.clear_cache
FLUSHES = {
    "zero": ZERO,  # do_bench's own: cache.zero_()
    "read": lambda cache: cache.sum(dtype=torch.int64),  # 256 MB read: L2 left holding clean lines
    "none": lambda cache: None,
}


def main(argv):
    names = argv[0].split(",") if argv else ["default"]
    for n, dist, _, ids, grad, main_grad, expected in probe_inputs(POINTS):
        for name in names:
            with config_overrides(**VARIANTS[name]):
                work = main_grad.clone()
                torch_frontend.accumulate(ids, grad, work)
                exact = same_bits(work, expected)
                cells = []
                for flush, fn in FLUSHES.items():
                    DRIVER.clear_cache = fn
                    try:
                        cells.append(f"{flush} {graph_ms(lambda work=work: torch_frontend.accumulate(ids, grad, work)) * 1e3:.1f}")
                    finally:
                        DRIVER.clear_cache = ZERO
            print(f"n={n:6d} {dist:7s} {name:12s} graph us by flush: {', '.join(cells)}{'' if exact else '  DIFFERENT'}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
