"""How long an all-pairs counting kernel takes (NOTES v9, what should move next, item 1).

    python benchmarks/probe_count.py

For n tokens, each token's keys below its key (run start), keys up to it (run end) and equal
keys at earlier positions (slot = run start + those) by comparing against all n keys: the
first kernel of a plan that would know at once which tokens are their key's only token. Timed
alone in a CUDA graph against the torch frontend's plan kernels alone (block sort + merge),
and checked against NumPy. Variants: tokens per program x keys per step, warps, and whether
the steps are unrolled (all key loads issued first) or a loop.
"""

import sys

import numpy as np
import torch
import triton
import triton.language as tl
from bench_torch import graph_ms
from common import ids_for

from tests.cases import REAL_V
from torch_frontend import embedding_wgrad as ew


@triton.jit
def _count_kernel(ids_ptr, out_ptr, n, BLOCK_I: tl.constexpr, TILE: tl.constexpr, STEPS: tl.constexpr, UNROLL: tl.constexpr):
    """out[0, i] = keys < key_i, out[1, i] = keys <= key_i, out[2, i] = keys == key_i at positions < i."""
    i = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    live = i < n
    key_i = tl.load(ids_ptr + i, mask=live, other=0).to(tl.int32)
    lt = tl.zeros([BLOCK_I], dtype=tl.int32)
    le = tl.zeros([BLOCK_I], dtype=tl.int32)
    eq = tl.zeros([BLOCK_I], dtype=tl.int32)
    if UNROLL:
        for s in tl.static_range(STEPS):
            j = s * TILE + tl.arange(0, TILE)
            key_j = tl.load(ids_ptr + j, mask=j < n, other=2**31 - 1).to(tl.int32)
            lt += tl.sum((key_j[None, :] < key_i[:, None]).to(tl.int32), axis=1)
            le += tl.sum((key_j[None, :] <= key_i[:, None]).to(tl.int32), axis=1)
            eq += tl.sum(((key_j[None, :] == key_i[:, None]) & (j[None, :] < i[:, None])).to(tl.int32), axis=1)
    else:
        for j0 in range(0, n, TILE):
            j = j0 + tl.arange(0, TILE)
            key_j = tl.load(ids_ptr + j, mask=j < n, other=2**31 - 1).to(tl.int32)
            lt += tl.sum((key_j[None, :] < key_i[:, None]).to(tl.int32), axis=1)
            le += tl.sum((key_j[None, :] <= key_i[:, None]).to(tl.int32), axis=1)
            eq += tl.sum(((key_j[None, :] == key_i[:, None]) & (j[None, :] < i[:, None])).to(tl.int32), axis=1)
    tl.store(out_ptr + i, lt, mask=live)
    tl.store(out_ptr + n + i, le, mask=live)
    tl.store(out_ptr + 2 * n + i, eq, mask=live)


@triton.jit
def _count_stream_kernel(ids_ptr, out_ptr, n, BLOCK_I: tl.constexpr, WAYS: tl.constexpr, UNROLL: tl.constexpr):
    """The same counts, summed inside each thread: a [WAYS, BLOCK_I] tile, each of its WAYS rows
    (a warp, with WAYS = num_warps) streams its own slice of the keys one key at a time, each
    lane holding one token; one cross-row sum at the end."""
    i = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    live = i < n
    key_i = tl.load(ids_ptr + i, mask=live, other=0).to(tl.int32)[None, :]
    pos_i = i[None, :]
    way = tl.arange(0, WAYS)[:, None]
    share = tl.cdiv(n, WAYS)
    lt = tl.zeros([WAYS, BLOCK_I], dtype=tl.int32)
    le = tl.zeros([WAYS, BLOCK_I], dtype=tl.int32)
    eq = tl.zeros([WAYS, BLOCK_I], dtype=tl.int32)
    end = tl.minimum((way + 1) * share, n)  # [WAYS, 1]: one past this row's last key
    for j0 in range(0, share, UNROLL):
        for u in tl.static_range(UNROLL):
            j = way * share + j0 + u  # [WAYS, 1]: one key per row
            key_j = tl.load(ids_ptr + j, mask=j < end, other=2**31 - 1).to(tl.int32)
            lt += (key_j < key_i).to(tl.int32)
            le += (key_j <= key_i).to(tl.int32)
            eq += ((key_j == key_i) & (j < pos_i)).to(tl.int32)
    tl.store(out_ptr + i, tl.sum(lt, axis=0), mask=live)
    tl.store(out_ptr + n + i, tl.sum(le, axis=0), mask=live)
    tl.store(out_ptr + 2 * n + i, tl.sum(eq, axis=0), mask=live)


@triton.jit
def _count_packed_kernel(ids_ptr, out_ptr, n, BLOCK_I: tl.constexpr, TILE: tl.constexpr, KSPLIT: tl.constexpr, POS_BITS: tl.constexpr):
    """The same counts from packed keys (id << POS_BITS | position: one compare gives the slot), (NOTES v24 item 5).

    Program (b, k) compares tokens [b * BLOCK_I, ...) with key chunk k of KSPLIT. The three
    compares of a pair go into one [BLOCK_I, TILE] accumulator as 10-bit fields (each element
    counts at most one key per step, so at most n / (KSPLIT * TILE) < 1024), reduced across
    lanes once at the end; with KSPLIT > 1 the chunks' counts are added atomically (out zeroed).
    out[0] = keys < id (run start), out[1] = keys <= id (run end), out[2] = slot.
    """
    i = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    live = i < n
    id_i = tl.load(ids_ptr + i, mask=live, other=0).to(tl.int32)
    slot_at = (id_i << POS_BITS) | i  # a key sorts before token i: below its packed key
    start_at = id_i << POS_BITS  # below: a smaller id
    end_at = (id_i + 1) << POS_BITS  # below: an id up to id_i
    chunk = tl.cdiv(n, KSPLIT)
    j_lo = tl.program_id(1) * chunk
    acc = tl.zeros([BLOCK_I, TILE], dtype=tl.int32)
    for j0 in range(j_lo, tl.minimum(j_lo + chunk, n), TILE):
        j = j0 + tl.arange(0, TILE)
        pj = ((tl.load(ids_ptr + j, mask=j < n, other=0).to(tl.int32) << POS_BITS) | j)[None, :]
        pj = tl.where((j < tl.minimum(j_lo + chunk, n))[None, :], pj, 2**31 - 1)
        acc += (pj < slot_at[:, None]).to(tl.int32) + ((pj < start_at[:, None]).to(tl.int32) << 10) + ((pj < end_at[:, None]).to(tl.int32) << 20)
    slot = tl.sum(acc & 1023, axis=1)
    start = tl.sum((acc >> 10) & 1023, axis=1)
    end = tl.sum(acc >> 20, axis=1)
    if KSPLIT == 1:
        tl.store(out_ptr + i, start, mask=live)
        tl.store(out_ptr + n + i, end, mask=live)
        tl.store(out_ptr + 2 * n + i, slot, mask=live)
    else:
        tl.atomic_add(out_ptr + i, start, mask=live, sem="relaxed")
        tl.atomic_add(out_ptr + n + i, end, mask=live, sem="relaxed")
        tl.atomic_add(out_ptr + 2 * n + i, slot, mask=live, sem="relaxed")


PACKED_VARIANTS = [  # (BLOCK_I, TILE, KSPLIT, warps)
    (16, 256, 1, 4),
    (32, 128, 1, 4),
    (64, 64, 1, 4),
    (16, 256, 4, 4),
    (32, 128, 4, 4),
    (32, 256, 8, 4),
    (64, 128, 8, 4),
    (128, 64, 16, 4),
    (64, 64, 16, 2),
]

STREAM_VARIANTS = [  # (BLOCK_I, WAYS = warps, UNROLL)
    (32, 4, 16),
    (32, 8, 16),
    (64, 4, 16),
    (32, 4, 64),
    (32, 16, 16),
]

VARIANTS = [  # (BLOCK_I, TILE, warps, unroll)
    (16, 256, 4, True),
    (16, 512, 4, True),
    (8, 512, 4, True),
    (32, 256, 4, True),
    (16, 256, 4, False),
    (16, 1024, 8, True),
    (8, 256, 2, True),
]


def main(argv):
    for n in (4096, 8192):
        ids_np = ids_for("uniform", n, REAL_V)
        ids = torch.from_numpy(ids_np.astype(np.int32)).cuda()
        keys = ids_np.astype(np.int64)
        order = np.argsort(keys, kind="stable")
        lt_ref = np.searchsorted(np.sort(keys), keys, side="left")
        le_ref = np.searchsorted(np.sort(keys), keys, side="right")
        slot_ref = np.empty(n, np.int64)
        slot_ref[order] = np.arange(n)
        out = torch.empty(3 * n, dtype=torch.int32, device="cuda")
        # The torch frontend's plan alone (block sort + merge, records), for comparison.
        grad = torch.empty(n, 7168, dtype=torch.bfloat16, device="cuda")
        main_grad = torch.empty(REAL_V, 7168, dtype=torch.float32, device="cuda")
        problem = ew._check(ids, grad, main_grad, None)
        sms, pdl = ew._device_traits(0)
        cfg = ew._config(problem, "sort", False, sms, pdl)
        plan_us = graph_ms(lambda: ew._plan_stage(ids, problem, cfg)) * 1e3
        print(f"n={n}: plan kernels alone (block sort + merge) {plan_us:.1f} us", flush=True)

        def report(label, run, third_is_slot=False):
            """Run once, check the three counts against NumPy (out[2]: the slot, or the equal keys
            before the token, which the run start turns into the slot), then time it in a graph."""
            run()
            got = out.view(3, n).cpu().numpy()
            slots = got[2] if third_is_slot else got[0] + got[2]
            exact = (got[0] == lt_ref).all() and (got[1] == le_ref).all() and (slots == slot_ref).all()
            print(f"n={n}: {label}: {graph_ms(run) * 1e3:.1f} us, exact={exact}", flush=True)

        pos_bits = max(1, (n - 1).bit_length())
        for block_i, tile, ksplit, warps in PACKED_VARIANTS:
            grid = (triton.cdiv(n, block_i), ksplit)

            def run(block_i=block_i, tile=tile, ksplit=ksplit, warps=warps, grid=grid):
                if ksplit > 1:
                    out.zero_()
                _count_packed_kernel[grid](ids, out, n, BLOCK_I=block_i, TILE=tile, KSPLIT=ksplit, POS_BITS=pos_bits, num_warps=warps)

            report(f"packed count {block_i}x{tile} split {ksplit} w{warps}", run, third_is_slot=True)
        if "packed" in argv:
            continue
        for block_i, tile, warps, unroll in VARIANTS:
            steps = triton.cdiv(n, tile)
            grid = (triton.cdiv(n, block_i),)

            def run(block_i=block_i, tile=tile, warps=warps, unroll=unroll, steps=steps, grid=grid):
                _count_kernel[grid](ids, out, n, BLOCK_I=block_i, TILE=tile, STEPS=steps, UNROLL=unroll, num_warps=warps)

            report(f"count {block_i}x{tile} w{warps} {'unrolled' if unroll else 'loop'}", run)
        for block_i, ways, unroll in STREAM_VARIANTS:
            grid = (triton.cdiv(n, block_i),)

            def run(block_i=block_i, ways=ways, unroll=unroll, grid=grid):
                _count_stream_kernel[grid](ids, out, n, BLOCK_I=block_i, WAYS=ways, UNROLL=unroll, num_warps=ways)

            report(f"count, streamed keys, {block_i} tokens x {ways} ways, unroll {unroll}", run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
