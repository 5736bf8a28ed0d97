"""Where the torch frontend's time goes (for benchmarks/NOTES.md): host cost per call and per
launch, the whole call's GPU time (CUDA-graph replay), stage times, kernel variants, and a
plain streaming kernel at the same bytes (the ceiling for this access pattern).

    python benchmarks/probe_torch.py
"""

import sys
import time
from dataclasses import replace

import torch
from bench_torch import copy_bandwidth, graph_ms
from bench_torch import median_ms as bench
from common import floor_bytes, ids_for
from probe_stream import stream_add

import torch_frontend
from embwgrad_core import torch_path
from tests.cases import REAL_H, REAL_V
from torch_frontend import embedding_wgrad as ew


def host_us(fn, reps=100):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return dt / reps * 1e6


def line(name, n, dist, value, unit="ms"):
    print(f"{name:40s} n={n:6d} {dist:7s} {value:9.4f} {unit}", flush=True)


POINTS = [(4096, "uniform"), (8192, "uniform"), (8192, "zipf"), (32768, "uniform")]
#: _partials_kernel (block_h, num_warps, maxnreg) variants
PARTIALS = ((1024, 1, None), (512, 1, 64), (1024, 2, 64))
#: _long_runs_kernel (block_h, num_warps, batch, programs) variants
LONG_RUNS = ((256, 4, 8, 146), (128, 1, 16, 64), (128, 1, 32, 64), (256, 2, 16, 64), (256, 4, 16, 64), (512, 4, 16, 64), (128, 1, 64, 64))
#: _block_sort_kernel (block_i, tile, num_warps of both merge kernels) variants
PLANS = ((64, 32, 4), (16, 256, 4), (32, 256, 4), (16, 256, 2), (16, 256, 8))


def main():
    torch.manual_seed(0)
    vocab, hidden = REAL_V, REAL_H
    main_grad = torch.randn(vocab, hidden, device="cuda")
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e9:.3f} TB/s")
    for n, dist in POINTS:
        grad = torch.randn(n, hidden, device="cuda").bfloat16()
        ids_np = ids_for(dist, n, vocab)
        ids = torch.from_numpy(ids_np).cuda()
        line("floor", n, dist, floor_bytes(ids_np, hidden) / bw)
        work = main_grad.clone()
        call = lambda: torch_frontend.accumulate(ids, grad, work)  # noqa: E731
        call()
        line("call (do_bench)", n, dist, bench(call))
        line("call (graph replay)", n, dist, graph_ms(call))
        line("call host", n, dist, host_us(call), "us")
        problem = ew._check(ids, grad, work, None)
        path = torch_path(n)
        base = ew._config(problem, path, False)
        line("host: _check", n, dist, host_us(lambda: ew._check(ids, grad, work, None), 1000), "us")
        for bi, tile, w in PLANS:
            cfg = replace(base, merge_block_i=bi, merge_tile=min(tile, base.merge_block), merge_warps=w)
            line(f"plan graph {base.sort} bi{bi} tile{tile} w{w}", n, dist, graph_ms(lambda cfg=cfg: ew._plan_stage(ids, problem, cfg)))

        def run_partials(cfg):
            plan.long_count.zero_()
            ew._partials_stage(plan, grad, work, problem, cfg)

        plan = ew._plan_stage(ids, problem, base)
        for bh, w, reg in PARTIALS:
            cfg = replace(base, block_h=bh, partial_warps=w, partial_maxnreg=reg)
            line(f"partials h{bh} w{w} maxnreg {reg}", n, dist, graph_ms(lambda cfg=cfg: run_partials(cfg)))
        line("stream h1024 w1", n, dist, graph_ms(lambda: stream_add(ids, grad, work, n, hidden)))
        plan = ew._plan_stage(ids, problem, base)  # a fresh long-run list: the timings above appended to it
        partials, flags = ew._partials_stage(plan, grad, work, problem, base)
        print("long runs listed:", int(plan.long_count), flush=True)
        for bh, w, batch, programs in LONG_RUNS:
            cfg = replace(base, long_block_h=bh, long_warps=w, long_batch=batch, long_programs=programs)
            line(f"long runs h{bh} w{w} batch{batch} programs{programs}", n, dist, graph_ms(lambda cfg=cfg: ew._long_runs_stage(plan, partials, flags, work, problem, cfg)))
        del work


if __name__ == "__main__":
    sys.exit(main())
