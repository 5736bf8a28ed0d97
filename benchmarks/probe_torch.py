"""Where the torch frontend's time goes (for benchmarks/NOTES.md): host cost per call and per
launch, the whole call's GPU time (CUDA-graph replay), stage times, kernel variants, and a
plain streaming kernel at the same bytes (the ceiling for this access pattern).

    python benchmarks/probe_torch.py
"""

import sys
import time
from dataclasses import replace

import torch
import triton
import triton.language as tl
from bench_torch import copy_bandwidth, graph_ms
from bench_torch import median_ms as bench
from common import floor_bytes, ids_for

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


@triton.jit
def _stream_kernel(ids_ptr, grad_ptr, main_ptr, n, hidden, BLOCK_H: tl.constexpr, SLOT_MAJOR: tl.constexpr):
    """main[ids[i]] += grad[i] over one row block: the bytes of the partials stage, no plan."""
    num_hb = tl.cdiv(hidden, BLOCK_H)
    if SLOT_MAJOR:
        i = tl.program_id(0) // num_hb
        hb = tl.program_id(0) % num_hb
    else:
        i = tl.program_id(0) % n
        hb = tl.program_id(0) // n
    cols = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    m = cols < hidden
    row = tl.load(ids_ptr + i).to(tl.int64)
    g = tl.load(grad_ptr + i.to(tl.int64) * hidden + cols, mask=m).to(tl.float32)
    old = tl.load(main_ptr + row * hidden + cols, mask=m)
    tl.store(main_ptr + row * hidden + cols, old + g, mask=m)


def line(name, n, dist, value, unit="ms"):
    print(f"{name:40s} n={n:6d} {dist:7s} {value:9.4f} {unit}", flush=True)


def main():
    torch.manual_seed(0)
    vocab, hidden = REAL_V, REAL_H
    main_grad = torch.randn(vocab, hidden, device="cuda")
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e9:.3f} TB/s")
    points = [(1024, "uniform"), (4096, "uniform"), (8192, "zipf"), (8192, "uniform"), (32768, "uniform")]
    for n, dist in points:
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
        plan = ew._plan_stage(ids, problem, base)
        partials = ew._partials_stage(plan, grad, work, problem, base)
        line("host: _check", n, dist, host_us(lambda: ew._check(ids, grad, work, None), 1000), "us")
        line("host: _config", n, dist, host_us(lambda: ew._config(problem, path, False), 1000), "us")
        line("host: plan stage", n, dist, host_us(lambda: ew._plan_stage(ids, problem, base)), "us")
        line("host: partials stage", n, dist, host_us(lambda: (plan.long_count.zero_(), ew._partials_stage(plan, grad, work, problem, base))), "us")
        line("host: long stage", n, dist, host_us(lambda: ew._long_runs_stage(plan, partials, work, problem, base)), "us")
        line("plan graph " + base.sort, n, dist, graph_ms(lambda: ew._plan_stage(ids, problem, base)))
        if path == "sort":
            line("plan graph torch.sort", n, dist, graph_ms(lambda: ew._plan_stage(ids, problem, replace(base, sort="torch"))))
            variants = []
            for block in ((256,) if n <= 8192 else (512, 1024)):
                blocks = triton.next_power_of_2(triton.cdiv(n, block))
                if blocks > 128 or blocks < 2:
                    continue
                for lanes, bi, warps in ((1024, 64, 4), (1024, 32, 4), (2048, 64, 8)):
                    variants.append((block, blocks, max(1, lanes // blocks), bi, warps))
            for block, blocks, u, bi, warps in variants:
                cfg = replace(base, sort="merge", merge_block=block, merge_blocks=blocks, merge_u=u, merge_block_i=bi, merge_warps=warps)
                line(f"plan merge b{block} u{u} bi{bi} w{warps}", n, dist, graph_ms(lambda cfg=cfg: ew._plan_stage(ids, problem, cfg)))
            replay = ew._CALLS[ew._call_key(ids, grad, work, problem, path)]
            launcher = ew._Launcher(replay)
            line("host: replayed launch (long runs)", n, dist, host_us(lambda: (setattr(launcher, "recorded", list(replay[:3])), ew._long_runs_stage(plan, partials, work, problem, base, launcher))), "us")
            line("host: generic launch (long runs)", n, dist, host_us(lambda: ew._long_runs_stage(plan, partials, work, problem, base)), "us")

        def run_partials(cfg):
            plan.long_count.zero_()
            ew._partials_stage(plan, grad, work, problem, cfg)

        plan = ew._plan_stage(ids, problem, base)  # a fresh long-run list: the timings above appended to it
        partials = ew._partials_stage(plan, grad, work, problem, base)
        line("long runs graph", n, dist, graph_ms(lambda: ew._long_runs_stage(plan, partials, work, problem, base)))
        print("long runs listed:", int(plan.long_count), plan.long_runs[: 2 * int(plan.long_count)].tolist()[:16], flush=True)
        for batch, programs in ((1, base.long_programs), (4, base.long_programs), (8, 36), (16, base.long_programs)):
            cfg = replace(base, long_batch=batch, long_programs=programs)
            line(f"long runs batch{batch} programs{programs}", n, dist, graph_ms(lambda cfg=cfg: ew._long_runs_stage(plan, partials, work, problem, cfg)))
        if n > 32768:
            continue
        for bh, w in ((1024, 1), (1024, 2), (2048, 2), (512, 1)):
            cfg = replace(base, block_h=bh, partial_warps=w)
            line(f"partials h{bh}w{w}", n, dist, graph_ms(lambda cfg=cfg: run_partials(cfg)))
        for bh, w, sm in ((1024, 1, True),):
            s = lambda bh=bh, w=w, sm=sm: _stream_kernel[(n * triton.cdiv(hidden, bh),)](ids, grad, work, n, hidden, BLOCK_H=bh, SLOT_MAJOR=sm, num_warps=w)  # noqa: E731
            line(f"stream h{bh}w{w} slot_major={sm}", n, dist, graph_ms(s))
        del work


if __name__ == "__main__":
    sys.exit(main())
