"""How fast can a Triton kernel move the partials stage's bytes, with no plan at all? (NOTES v6)

main_grad[ids[i]] += grad[i] for every position i, over H blocks: the access pattern of a
uniform-ids call (almost every token its key's only one), with variants of the item size,
warps, programs in flight, loop shape and cache hints. Timing only: repeated keys race, so
no result is checked. Also the stage times of the real call (plan, partials, long runs, whole)
in graph replay, and torch's copy at the same bytes.

    python benchmarks/probe_stream.py                          (every variant)
    python benchmarks/probe_stream.py "h1024 w1 item,h1024 w1 128/SM"   (those named)
"""

import sys
from dataclasses import replace

import torch
import triton
import triton.language as tl
from bench_torch import copy_bandwidth, graph_ms
from common import floor_bytes, ids_for, print_table

from embwgrad_core import torch_path
from tests.cases import REAL_H, REAL_V
from torch_frontend import embedding_wgrad as ew

SMS = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 4


@triton.jit
def _add_item(ids_ptr, grad_ptr, main_ptr, w, items, num_hb, hidden, BLOCK_H: tl.constexpr, GRAD_EVICT: tl.constexpr,
              MAIN_EVICT: tl.constexpr):
    i = w // num_hb
    cols = (w % num_hb) * BLOCK_H + tl.arange(0, BLOCK_H)
    m = cols < tl.where(w < items, hidden, 0)  # not a scalar & vector mask: the interpreter mistypes those
    row = tl.load(ids_ptr + i, mask=w < items, other=0).to(tl.int64)
    g = tl.load(grad_ptr + i.to(tl.int64) * hidden + cols, mask=m, eviction_policy=GRAD_EVICT).to(tl.float32)
    old = tl.load(main_ptr + row * hidden + cols, mask=m, eviction_policy=MAIN_EVICT)
    return row, cols, m, old + g


@triton.jit
def _stream(ids_ptr, grad_ptr, main_ptr, n, hidden, BLOCK_H: tl.constexpr, DEPTH: tl.constexpr, GRAD_EVICT: tl.constexpr,
            MAIN_EVICT: tl.constexpr, STORE_CACHE: tl.constexpr):
    """Programs stride the (token, H block) items, H block fastest; DEPTH items' loads in flight before their stores."""
    num_hb = tl.cdiv(hidden, BLOCK_H)
    items = n * num_hb
    step = tl.num_programs(0)
    for w0 in range(tl.program_id(0), items, step * DEPTH):
        if DEPTH == 1:
            row, cols, m, v = _add_item(ids_ptr, grad_ptr, main_ptr, w0, items, num_hb, hidden, BLOCK_H, GRAD_EVICT, MAIN_EVICT)
            tl.store(main_ptr + row * hidden + cols, v, mask=m, cache_modifier=STORE_CACHE)
        else:
            row0, cols0, m0, v0 = _add_item(ids_ptr, grad_ptr, main_ptr, w0, items, num_hb, hidden, BLOCK_H, GRAD_EVICT, MAIN_EVICT)
            row1, cols1, m1, v1 = _add_item(ids_ptr, grad_ptr, main_ptr, w0 + step, items, num_hb, hidden, BLOCK_H, GRAD_EVICT, MAIN_EVICT)
            tl.store(main_ptr + row0 * hidden + cols0, v0, mask=m0, cache_modifier=STORE_CACHE)
            tl.store(main_ptr + row1 * hidden + cols1, v1, mask=m1, cache_modifier=STORE_CACHE)


@triton.jit
def _stream_tma(ids_ptr, grad_desc, main_desc, hidden, BLOCK_H: tl.constexpr, STAGES: tl.constexpr):
    """One program per token: its grad row and its main_grad row moved by the tensor memory
    accelerator (TMA) in [1, BLOCK_H] boxes, the column loop software-pipelined over STAGES, so
    a program keeps several boxes in flight through shared memory instead of registers (NOTES
    v16, "What should move next" item 1). Hopper and later only; timing only, as _stream."""
    i = tl.program_id(0)
    row = tl.load(ids_ptr + i).to(tl.int32)
    for col in tl.range(0, hidden, BLOCK_H, num_stages=STAGES):
        g = grad_desc.load([i, col])
        m = main_desc.load([row, col])
        main_desc.store([row, col], m + g.to(tl.float32))


#: (name, BLOCK_H, num_warps, STAGES) of _stream_tma (BLOCK_H <= 256, TMA's largest box side)
TMA_VARIANTS = [
    ("tma h256 w4 s1", 256, 4, 1),
    ("tma h256 w4 s3", 256, 4, 3),
    ("tma h256 w4 s4", 256, 4, 4),
    ("tma h256 w1 s3", 256, 1, 3),
    ("tma h128 w1 s4", 128, 1, 4),
]


def stream_tma(ids, grad, main_grad, n: int, block_h: int, warps: int, stages: int) -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    grad_desc = TensorDescriptor.from_tensor(grad, [1, block_h])
    main_desc = TensorDescriptor.from_tensor(main_grad, [1, block_h])
    _stream_tma[(n,)](ids, grad_desc, main_desc, grad.shape[1], BLOCK_H=block_h, STAGES=stages, num_warps=warps)


#: (name, BLOCK_H, num_warps, programs per SM or None for one per item, DEPTH, grad eviction,
#: main_grad eviction, store cache modifier); session 6 measured the first 14, session 7 the rest
VARIANTS = [
    ("h1024 w1 item", 1024, 1, None, 1, "", "", ""),
    ("h1024 w1 128/SM", 1024, 1, 128, 1, "", "", ""),
    ("h1024 w1 16/SM", 1024, 1, 16, 1, "", "", ""),
    ("h1024 w1 16/SM depth2", 1024, 1, 16, 2, "", "", ""),
    ("h1024 w1 32/SM depth2", 1024, 1, 32, 2, "", "", ""),
    ("h1024 w1 128/SM evict_first", 1024, 1, 128, 1, "evict_first", "", ""),
    ("h1024 w2 128/SM", 1024, 2, 128, 1, "", "", ""),
    ("h2048 w2 item", 2048, 2, None, 1, "", "", ""),
    ("h2048 w2 64/SM", 2048, 2, 64, 1, "", "", ""),
    ("h2048 w4 64/SM", 2048, 4, 64, 1, "", "", ""),
    ("h512 w1 128/SM", 512, 1, 128, 1, "", "", ""),
    ("h512 w1 32/SM depth2", 512, 1, 32, 2, "", "", ""),
    ("h8192 w8 item", 8192, 8, None, 1, "", "", ""),
    ("h4096 w4 item", 4096, 4, None, 1, "", "", ""),
    # Cache policy of the main_grad row: read once, written once, never read again by us.
    ("h1024 w1 item, main evict_first", 1024, 1, None, 1, "evict_first", "evict_first", ""),
    ("h1024 w1 item, store .cs", 1024, 1, None, 1, "evict_first", "evict_first", ".cs"),
    ("h1024 w1 item, store .wt", 1024, 1, None, 1, "", "", ".wt"),
    ("h1024 w1 item, main evict_last", 1024, 1, None, 1, "evict_first", "evict_last", ""),
    # Four-warp items: the shapes a kernel whose other role needs four warps could use.
    ("h1024 w4 item", 1024, 4, None, 1, "", "", ""),
    ("h2048 w4 item", 2048, 4, None, 1, "", "", ""),
    ("h8192 w4 item", 8192, 4, None, 1, "", "", ""),
    ("h8192 w4 item, store .cs", 8192, 4, None, 1, "evict_first", "evict_first", ".cs"),
]
POINTS = [(4096, "uniform"), (8192, "uniform"), (8192, "zipf"), (32768, "uniform")]
#: the VARIANTS to time (argv[1], comma-separated names); all when empty
STREAM_NAMES = [v for v in (sys.argv[1] if len(sys.argv) > 1 else "").split(",") if v]


def stream_add(ids, grad, main_grad, n: int, hidden: int) -> None:
    """The baseline copy-add (1024 columns, one warp, one program per item), as probe_torch and
    ncu_target time it beside the real call."""
    _stream[(n * triton.cdiv(hidden, 1024),)](ids, grad, main_grad, n, hidden, BLOCK_H=1024, DEPTH=1, GRAD_EVICT="",
                                               MAIN_EVICT="", STORE_CACHE="", num_warps=1)


def stage_us(ids, grad, main_grad) -> dict:
    """The torch frontend's stages for this call, each alone in its own graph without PDL, in us
    (main_grad gets each stage's additions, as often as the graphs replay)."""
    n = ids.numel()
    problem = ew._check(ids, grad, main_grad, None)
    cfg = replace(ew._config(problem, torch_path(n), False, *ew._device_traits(0)), pdl=False)
    res = {"plan alone": graph_ms(lambda: ew._plan_stage(ids, problem, cfg)) * 1e3}
    plan = ew._plan_stage(ids, problem, cfg)

    def partials():
        plan.long_count.zero_()
        return ew._partials_stage(plan, grad, main_grad, problem, cfg)

    res["partials alone (+ a memset)"] = graph_ms(partials) * 1e3
    plan = ew._plan_stage(ids, problem, cfg)
    parts, flags = ew._partials_stage(plan, grad, main_grad, problem, cfg)
    res["long runs alone"] = graph_ms(lambda: ew._long_runs_stage(plan, parts, flags, main_grad, problem, cfg)) * 1e3
    return res


def copy_us(nbytes: int) -> float:
    """torch's device copy moving nbytes (read plus write), graph replay."""
    src = torch.empty(nbytes // 8, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    return graph_ms(lambda: dst.copy_(src)) * 1e3


def main():
    torch.manual_seed(0)
    main_grad = torch.randn(REAL_V, REAL_H, device="cuda")
    bw = copy_bandwidth()
    print(f"copy bandwidth (1 GiB copy): {bw / 1e9:.3f} TB/s", flush=True)
    table = {}
    for n, dist in POINTS:
        grad = torch.randn(n, REAL_H, device="cuda").bfloat16()
        ids_np = ids_for(dist, n, REAL_V)
        ids = torch.from_numpy(ids_np).cuda()
        fb = floor_bytes(ids_np, REAL_H)
        res = {"floor": fb / bw * 1e3, "torch copy, same bytes": copy_us(fb)}
        # Stages of the real call.
        problem = ew._check(ids, grad, main_grad, None)
        res["call (graph)"] = graph_ms(lambda: ew._launch(ids, grad, main_grad, problem, torch_path(n))) * 1e3
        res.update(stage_us(ids, grad, main_grad))
        for name, bh, warps, per_sm, depth, evict, main_evict, store in [v for v in VARIANTS if v[0] in STREAM_NAMES or not STREAM_NAMES]:
            items = n * triton.cdiv(REAL_H, bh)
            grid = items if per_sm is None else min(items, per_sm * SMS)
            fn = lambda: _stream[(grid,)](ids, grad, main_grad, n, REAL_H, BLOCK_H=bh, DEPTH=depth, GRAD_EVICT=evict,
                                         MAIN_EVICT=main_evict, STORE_CACHE=store, num_warps=warps)  # noqa: E731
            res["stream " + name] = graph_ms(fn) * 1e3
        for name, bh, warps, stages in [v for v in TMA_VARIANTS if v[0] in STREAM_NAMES or not STREAM_NAMES]:
            res["stream " + name] = graph_ms(lambda bh=bh, warps=warps, stages=stages: stream_tma(
                ids, grad, main_grad, n, bh, warps, stages)) * 1e3
        # Session 14: does the order of the rows matter? The baseline shape on the same ids sorted
        # (ascending main_grad rows, same bytes), and on n distinct consecutive rows (its own floor).
        for order, ids_o in (("ids sorted", torch.sort(ids).values), ("ids consecutive", torch.arange(n, device="cuda") + 1000)):
            res[f"stream h1024 w1 item, {order}"] = graph_ms(lambda ids_o=ids_o: stream_add(ids_o, grad, main_grad, n, REAL_H)) * 1e3
        res["floor, consecutive ids"] = floor_bytes(torch.arange(n).numpy(), REAL_H) / bw * 1e3
        for k, v in res.items():
            print(f"n={n:6d} {dist:7s} {k:32s} {v:8.1f} us", flush=True)
        table[(n, dist)] = res
    print_table(table)


if __name__ == "__main__":
    sys.exit(main())
