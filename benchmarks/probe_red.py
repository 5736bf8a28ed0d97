"""Can main_grad take its adds by fire-and-forget atomics, exactly? (NOTES v35)

Every kernel of both frontends adds a finished row gw into main_grad by a load, an add and a
store: main_grad's row travels to the SM and back. Where a row gets exactly one add, an atomic
add whose result is unused (`red.global.add.f32`, vectorised to F32x4 on Hopper) does the same
single IEEE addition in L2, so the SM neither waits for main_grad's row nor holds it. Two
questions, one call:

1. Exactness. fp32 atomics flush subnormal inputs and results to zero (SPEC.md); PyTorch's
   add_ does not. On paper a row block whose gw values are all finite with |gw| >= 2^-100 is
   safe: a subnormal main_grad value is then under a quarter of gw's ulp (flushing it changes
   no rounding), and the exact sum of two such values is 0 or at least 2^-125 (never
   subnormal). The table counts, for each class of main_grad value and gw value, the elements
   where one atomic add differs in its bits from torch's `m + g`.
2. Speed. The plain copy-add of NOTES v6/v17 (one program per (token, H block) item, no plan:
   repeated ids race, timing only) with its store, against the same with the atomic, and with
   the atomic behind a block-wide safety test (the form a kernel would need). Also checked bit
   for bit against the store form on distinct ids.

    python benchmarks/probe_red.py                   (every point)
    PROBE_POINTS=4096:uniform python benchmarks/probe_red.py
"""

import sys

import numpy as np
import torch
import triton
import triton.language as tl
from bench_torch import copy_bandwidth, graph_ms
from common import floor_bytes, ids_for, print_table, probe_points

from embwgrad_core import torch_path
from tests.cases import REAL_H, REAL_V
from torch_frontend import embedding_wgrad as ew

#: the smallest |gw| that the atomic form takes (2^-100); smaller, zero or not finite: load, add, store
SAFE_MIN = 2.0**-100


@triton.jit
def _red_all(main_ptr, g_ptr, n, BLOCK: tl.constexpr):
    """main[i] += g[i] by one atomic each, unconditionally: the atomics' own arithmetic."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(main_ptr + i, tl.load(g_ptr + i, mask=i < n), mask=i < n, sem="relaxed")


@triton.jit
def _copy_add(ids_ptr, grad_ptr, main_ptr, hidden, BLOCK_H: tl.constexpr, MODE: tl.constexpr, SAFE_MIN: tl.constexpr):
    """One (token, BLOCK_H columns) item: main[ids[i]] += float(grad[i]).
    MODE 0: load, add, store; 1: an atomic add; 2: an atomic add where the whole block is safe, else MODE 0."""
    w = tl.program_id(0)
    num_hb = tl.cdiv(hidden, BLOCK_H)
    i = w // num_hb
    cols = (w % num_hb) * BLOCK_H + tl.arange(0, BLOCK_H)
    m = cols < hidden
    row = tl.load(ids_ptr + i).to(tl.int64)
    g = tl.load(grad_ptr + i.to(tl.int64) * hidden + cols, mask=m, other=1.0).to(tl.float32)
    ptrs = main_ptr + row * hidden + cols
    if MODE == 1:
        tl.atomic_add(ptrs, g, mask=m, sem="relaxed")
    elif MODE == 2:
        a = tl.abs(g)
        unsafe = tl.sum(((a < SAFE_MIN) | (a == float("inf")) | (g != g)).to(tl.int32), axis=0)
        if unsafe == 0:
            tl.atomic_add(ptrs, g, mask=m, sem="relaxed")
        else:
            tl.store(ptrs, tl.load(ptrs, mask=m) + g, mask=m)
    else:
        tl.store(ptrs, tl.load(ptrs, mask=m) + g, mask=m)


def copy_add(ids, grad, main_grad, mode: int, block_h: int, warps: int) -> None:
    n, hidden = grad.shape
    _copy_add[(n * triton.cdiv(hidden, block_h),)](ids, grad, main_grad, hidden, BLOCK_H=block_h, MODE=mode,
                                                   SAFE_MIN=SAFE_MIN, num_warps=warps)


def value_classes(rng, size: int) -> dict:
    """fp32 test values by class, as int32 bit patterns."""
    def f2i(x):
        return np.asarray(x, dtype=np.float32).view(np.int32)

    sign = rng.integers(0, 2, size).astype(np.int64) << 31
    mant = rng.integers(1, 1 << 23, size).astype(np.int64)
    return {
        "normal": f2i(rng.standard_normal(size)),
        "near 2^-126": f2i(rng.standard_normal(size) * 2.0**-125),
        "2^-100 .. 2^-99": f2i(rng.choice([-1.0, 1.0], size) * rng.uniform(1.0, 2.0, size) * 2.0**-100),
        "2^-110": f2i(rng.choice([-1.0, 1.0], size) * rng.uniform(1.0, 2.0, size) * 2.0**-110),
        "subnormal": (sign | mant).astype(np.uint32).view(np.int32),
        "+0": np.zeros(size, np.int32),
        "-0": np.full(size, np.int32(-2**31)),
        "+-inf": f2i(rng.choice([-np.inf, np.inf], size)),
        "NaN (payloads)": rng.choice(np.array([0x7FC00000, 0x7FFFFFFF, 0xFFC00001, 0x7F800001, 0x7FA00000], np.uint32), size).view(np.int32),
    }


def atomic_table(size: int = 1 << 16):
    """For each (main_grad class, gw class): elements where one atomic add's bits differ from torch's m + g."""
    rng = np.random.default_rng(0)
    ms, gs = value_classes(rng, size), value_classes(np.random.default_rng(1), size)
    rows = {}
    for mk, mv in ms.items():
        row = {}
        for gk, gv in gs.items():
            m = torch.from_numpy(mv.copy()).cuda().view(torch.float32)
            g = torch.from_numpy(gv.copy()).cuda().view(torch.float32)
            expected = (m + g).view(torch.int32)
            got = m.clone()
            _red_all[(triton.cdiv(size, 1024),)](got, g, size, BLOCK=1024, num_warps=4)
            row[gk] = int((got.view(torch.int32) != expected).sum())
        rows[mk] = row
    return rows, size


def main():
    rows, size = atomic_table()
    print(f"elements ({size} per cell) where one atomic add differs from torch's m + g; rows: main_grad, columns: gw")
    names = list(next(iter(rows.values())))
    print("| main_grad \\ gw | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for mk, row in rows.items():
        print(f"| {mk} | " + " | ".join(str(row[g]) for g in names) + " |")
    safe_cols = ["normal", "2^-100 .. 2^-99"]
    bad = sum(row[g] for mk, row in rows.items() for g in safe_cols if mk != "NaN (payloads)")
    nan_bad = sum(rows["NaN (payloads)"][g] for g in safe_cols)
    print(f"safe gw (|gw| >= 2^-100, finite), non-NaN main_grad: {bad} differ; NaN main_grad: {nan_bad} differ", flush=True)

    torch.manual_seed(0)
    main_grad = torch.randn(REAL_V, REAL_H, device="cuda")
    bw = copy_bandwidth()
    print(f"copy bandwidth (1 GiB copy): {bw / 1e9:.3f} TB/s", flush=True)

    # Bit for bit on distinct ids (no race): the atomic forms against the store form.
    n = 4096
    grad = torch.randn(n, REAL_H, device="cuda").bfloat16()
    grad[7, 100] = 2.0**-110  # one unsafe block, so MODE 2 takes its other branch there
    ids = torch.randperm(REAL_V, device="cuda")[:n]
    want = main_grad.clone()
    copy_add(ids, grad, want, 0, 1024, 1)
    for mode in (1, 2):
        got = main_grad.clone()
        copy_add(ids, grad, got, mode, 1024, 1)
        differ = int((got.view(torch.int32) != want.view(torch.int32)).sum())
        print(f"distinct ids, mode {mode} against the store form: {differ} elements differ "
              f"({'may be 0: main_grad is normal where the 2^-110 input is flushed' if mode == 1 else 'must be 0'})", flush=True)

    variants = [("store h1024 w1", 0, 1024, 1), ("red h1024 w1", 1, 1024, 1), ("red-safe h1024 w1", 2, 1024, 1),
                ("store h2048 w2", 0, 2048, 2), ("red h2048 w2", 1, 2048, 2), ("red-safe h2048 w2", 2, 2048, 2),
                ("store h512 w1", 0, 512, 1), ("red-safe h512 w1", 2, 512, 1)]
    table = {}
    for n, dist in probe_points([(1024, "uniform"), (4096, "uniform"), (8192, "uniform"), (8192, "zipf"), (32768, "uniform")]):
        grad = torch.randn(n, REAL_H, device="cuda").bfloat16()
        ids_np = ids_for(dist, n, REAL_V)
        ids = torch.from_numpy(ids_np).cuda()
        res = {"floor": floor_bytes(ids_np, REAL_H) / bw * 1e3}
        problem = ew._check(ids, grad, main_grad, None)
        res["call (graph)"] = graph_ms(lambda: ew._launch(ids, grad, main_grad, problem, torch_path(n))) * 1e3
        for name, mode, bh, warps in variants:
            res[name] = graph_ms(lambda mode=mode, bh=bh, warps=warps: copy_add(ids, grad, main_grad, mode, bh, warps)) * 1e3
        for k, v in res.items():
            print(f"n={n:6d} {dist:7s} {k:24s} {v:8.1f} us", flush=True)
        table[(n, dist)] = res
    print_table(table)


if __name__ == "__main__":
    sys.exit(main())
