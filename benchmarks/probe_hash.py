"""A plan without a sort for ids that occur at most K times (NOTES v15): is it faster than main?

Every token counts its id with an integer atomic into a zeroed [V] array and, if it is among
the id's first K arrivals, writes its position into the id's K slots of a [V, K] table. Then
each (token, H block) item reads its id's count: a lone token adds its own row; of a run of
2..K tokens only the one at the smallest position adds, summing the run's rows in position
order (their positions sorted in registers), which is the sort path's arithmetic for a run
of at most NROWS tokens; ids that occur more than K times are skipped (this probe has no
long runs, so only points whose ids all occur at most K times are checked bit for bit).

Variants (comma-separated names; all of VARIANTS when none): "hash" (the whole design: count,
the long route kernel for ids that occur more than K times, stream; "lrN" N long-route programs
per SM, at most 4: its grid barriers need every program resident; "tjA tiB" its rank tiles, "fhC fbD" its fold columns and batch; "stopN" (with "alone"): only its first N phases; "seg": its sort by segments (each long id's
tokens placed at their arrival ranks, then ranked inside the segment only); "queue" (with "seg"):
the long partials and folds go to a queue that the stream's programs (after their own item) and
the long route's take from ("lrtakes": on the CPU, the long route takes all; "lronly": the
stream never looks, the long route takes all; "everyN": only every N-th stream program looks);
"any": it returns at once when no id is long; "early": the stream launches before the long route
waits; "alone": no stream, timing only); "count+stream" (memset, count
kernel, stream kernel with PDL; "lazy": rows loaded only where used, "w1" one warp, "h2048" 2048
columns, "nopdl"); "fused" (the count programs first in the stream's grid, items spin on their
counter; "zero kernel": a zeroing kernel instead of the memset); "plan+stream" (main's block sort
and merge between count and stream); "empty N before/after" (N kernels that only read a flag);
"two streams" and "long alone [field=value ...]" (main's call on the tokens of ids that occur more
than K times, beside the stream or alone, with _Config overrides). Points: PROBE_POINTS.

    PYTHONPATH=.:benchmarks python benchmarks/probe_hash.py ["count+stream w4,fused w4"]

Without a GPU it checks its kernels under Triton's interpreter against the core reference.
"""

import os
import sys

import numpy as np
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from embwgrad_core import reference
from torch_frontend.embedding_wgrad import _add_to_row, _partial_row, _round, _wait_for

ON_GPU = torch.cuda.is_available()
# The long route's control words (after the counts and the done counter, zeroed with them): long
# tokens, partials, runs listed; three barrier counters; whether any id occurs more than K times.
_L, _P, _R, _B1, _B2, _B3, _ANY, _B4, _B5, _READY, _TAKEN, _DRAINED = (tl.constexpr(i) for i in range(12))
K = 8  # slots per id; at most NROWS, so a run of at most K tokens is one partial
_COUNT_BLOCK = 1024  # tokens per counting program


# Rounding codes of torch_frontend's _round and _add_to_row: bf16 grad, fp32 main_grad.
_BF16 = tl.constexpr(1)
_FP32 = tl.constexpr(0)


@triton.jit
def _nap():
    """nanosleep between polls of a counter, so that spinning programs do not crowd its L2 slice."""
    tl.inline_asm_elementwise("nanosleep.u32 200; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _count(ids_ptr, counts_ptr, table_ptr, n, pid, BLOCK: tl.constexpr, K: tl.constexpr, arr_ptr=None):
    idx = pid * BLOCK + tl.arange(0, BLOCK)
    m = idx < n
    key = tl.load(ids_ptr + idx, mask=m, other=0).to(tl.int32)
    rank = tl.atomic_add(counts_ptr + key, tl.full([BLOCK], 1, tl.int32), mask=m, sem="relaxed")
    tl.store(table_ptr + key.to(tl.int64) * K + rank, idx, mask=m & (rank < K))
    if arr_ptr is not None:
        tl.store(arr_ptr + idx, rank, mask=m)
    return tl.sum((m & (rank == K)).to(tl.int32), axis=0)  # ids of this block that just became long


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, table_ptr, n, done_ptr, BLOCK: tl.constexpr, K: tl.constexpr, PDL: tl.constexpr,
                  RELEASE: tl.constexpr, arr_ptr=None):
    if PDL:
        gdc_launch_dependents()
    longs = _count(ids_ptr, counts_ptr, table_ptr, n, tl.program_id(0), BLOCK, K, arr_ptr)
    if longs > 0:  # the long route's flag (control word _ANY, after the done counter)
        tl.store(done_ptr + 8 + _ANY, 1)
    if RELEASE:
        tl.atomic_add(done_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _zero_kernel(counts_ptr, size, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_launch_dependents()
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(counts_ptr + idx, tl.zeros([BLOCK], tl.int32), mask=idx < size)


@triton.jit
def _empty_kernel(flag_ptr):
    """What a kernel of the sort path would cost when a device flag says it has nothing to do."""
    gdc_launch_dependents()
    gdc_wait()
    if tl.load(flag_ptr) != 0:
        tl.store(flag_ptr, 0)


@triton.jit
def _item(ids_ptr, grad_ptr, main_ptr, counts_ptr, table_ptr, w, hidden, BLOCK_H: tl.constexpr, K: tl.constexpr,
          WAIT: tl.constexpr, done_ptr, num_counters, LAZY: tl.constexpr = False):
    num_hb = tl.cdiv(hidden, BLOCK_H)
    i = w // num_hb
    cols = (w % num_hb) * BLOCK_H + tl.arange(0, BLOCK_H)
    m = cols < hidden
    key = tl.load(ids_ptr + i).to(tl.int64)
    grad_row = grad_ptr + i.to(tl.int64) * hidden + cols
    if not LAZY:
        g = tl.load(grad_row, mask=m).to(tl.float32)
    if WAIT == 1:
        gdc_wait()
    elif (WAIT == 2) | (WAIT == 4):
        _wait_for(done_ptr, num_counters)
    c = tl.load(counts_ptr + key)
    row = main_ptr + key * hidden
    if c == 1:
        if LAZY:
            g = tl.load(grad_row, mask=m).to(tl.float32)
        _add_to_row(row, cols, m, _round(g + 0.0, _BF16), _FP32)
    elif c <= K:
        slots = tl.arange(0, K)
        p = tl.load(table_ptr + key * K + slots, mask=slots < c, other=2147483647)
        if tl.min(p, axis=0) == i:
            rank = tl.sum((p[None, :] < p[:, None]).to(tl.int32), axis=1)
            if LAZY:
                g = tl.load(grad_row, mask=m).to(tl.float32)
            s = tl.zeros([BLOCK_H], tl.float32) + g  # its own row is the first
            for j in tl.static_range(1, K):
                if j < c:
                    pj = tl.sum(tl.where(rank == j, p, 0), axis=0)
                    s += tl.load(grad_ptr + pj.to(tl.int64) * hidden + cols, mask=m).to(tl.float32)
            _add_to_row(row, cols, m, _round(s, _BF16), _FP32)


@triton.jit
def _long_partial(grad_ptr, main_ptr, counts_ptr, spos_ptr, plist_ptr, scratch_ptr, d, cols, hidden, arrive_ptr=None):
    """Partial d of the list over these columns: its at most NROWS rows summed from +0 in slot
    order (every row's load issued before the adds: masked, not branched). A run of one partial
    adds into main_grad; the others store the sum at their scratch row and, with arrive_ptr,
    count themselves in the run's arrival counter (after a CTA barrier, with release)."""
    m = cols < hidden
    s0 = tl.load(plist_ptr + 4 * d)
    length = tl.load(plist_ptr + 4 * d + 1)
    key = tl.load(plist_ptr + 4 * d + 2)
    r0 = tl.load(plist_ptr + 4 * d + 3)
    q16 = tl.arange(0, 16)
    ps = tl.load(spos_ptr + s0 + q16, mask=q16 < length, other=0)
    sacc = tl.zeros(cols.shape, tl.float32)
    for q in tl.static_range(0, 10):
        pos = tl.sum(tl.where(q16 == q, ps, 0), axis=0)
        sacc += tl.load(grad_ptr + pos.to(tl.int64) * hidden + cols, mask=cols < tl.where(q < length, hidden, 0),
                        other=0.0).to(tl.float32)
    c = tl.load(counts_ptr + key)
    if c <= _NROWS:
        _add_to_row(main_ptr + key.to(tl.int64) * hidden, cols, m, _round(sacc, _BF16), _FP32)
    else:
        srow = _partial_row(r0, (s0 - r0) // _NROWS, False, _NROWS)
        tl.store(scratch_ptr + srow.to(tl.int64) * hidden + cols, sacc, mask=m)
        if arrive_ptr is not None:
            tl.debug_barrier()
            tl.atomic_add(arrive_ptr + r0, 1, sem="release", scope="gpu")


@triton.jit
def _long_fold(main_ptr, counts_ptr, rlist_ptr, scratch_ptr, d, cols, hidden, FOLD_BATCH: tl.constexpr, arrive_ptr=None,
               arrivals_per_partial=0):
    """Run d of the list over these columns, if it has more than one partial: its partials added
    in order from +0 (loads issued together, FOLD_BATCH at a time), then into main_grad. With
    arrive_ptr, first waits (acquire) until all its partials have counted themselves."""
    key = tl.load(rlist_ptr + 2 * d)
    r0 = tl.load(rlist_ptr + 2 * d + 1)
    c = tl.load(counts_ptr + key)
    if c > _NROWS:
        num = tl.cdiv(c, _NROWS)
        if arrive_ptr is not None:
            _wait_napping(arrive_ptr + r0, num * arrivals_per_partial)
        t_acc = tl.zeros(cols.shape, tl.float32)
        for k0 in range(0, num, FOLD_BATCH):
            for q in tl.static_range(0, FOLD_BATCH):
                k = k0 + q
                srow = _partial_row(r0, k, False, _NROWS)
                t_acc += tl.load(scratch_ptr + srow.to(tl.int64) * hidden + cols, mask=cols < tl.where(k < num, hidden, 0),
                                 other=0.0)  # +0.0 past the last partial: t_acc is never -0.0, so no change
        _add_to_row(main_ptr + key.to(tl.int64) * hidden, cols, cols < hidden, _round(t_acc, _BF16), _FP32)


@triton.jit
def _long_work(grad_ptr, main_ptr, counts_ptr, ctl_ptr, spos_ptr, plist_ptr, rlist_ptr, scratch_ptr, arrive_ptr, hidden,
               LONG_H: tl.constexpr, FOLD_H: tl.constexpr, FOLD_BATCH: tl.constexpr):
    """Take long-route items from a queue until it is empty ("queue" variants): first every (partial,
    LONG_H columns), then every (run, FOLD_H columns). A partial of a run of more than NROWS tokens
    stores its sum and counts itself in the run's arrival counter (after a CTA barrier, with
    release); a fold waits (acquire) until all of its run's partials have arrived: they were taken
    before it, by programs that wait on nothing, so the wait ends."""
    num_p = tl.load(ctl_ptr + _P)
    num_r = tl.load(ctl_ptr + _R)
    num_lh = tl.cdiv(hidden, LONG_H)
    num_fh = tl.cdiv(hidden, FOLD_H)
    part_items = num_p * num_lh
    total = part_items + num_r * num_fh
    w = tl.atomic_add(ctl_ptr + _TAKEN, 1)
    while w < total:
        if w < part_items:
            _long_partial(grad_ptr, main_ptr, counts_ptr, spos_ptr, plist_ptr, scratch_ptr, w // num_lh,
                          (w % num_lh) * LONG_H + tl.arange(0, LONG_H), hidden, arrive_ptr)
        else:
            f = w - part_items
            _long_fold(main_ptr, counts_ptr, rlist_ptr, scratch_ptr, f // num_fh, (f % num_fh) * FOLD_H + tl.arange(0, FOLD_H),
                       hidden, FOLD_BATCH, arrive_ptr, num_lh)
        w = tl.atomic_add(ctl_ptr + _TAKEN, 1)
    tl.store(ctl_ptr + _DRAINED, 1)


@triton.jit
def _stream_kernel(ids_ptr, grad_ptr, main_ptr, counts_ptr, table_ptr, hidden, done_ptr, num_counters, BLOCK_H: tl.constexpr,
                   K: tl.constexpr, WAIT: tl.constexpr, LAZY: tl.constexpr, QUEUE: tl.constexpr = False, ctl_ptr=None,
                   spos_ptr=None, plist_ptr=None, rlist_ptr=None, scratch_ptr=None, arrive_ptr=None, LONG_H: tl.constexpr = 256,
                   FOLD_H: tl.constexpr = 128, FOLD_BATCH: tl.constexpr = 16, QUEUE_EVERY: tl.constexpr = 1):
    _item(ids_ptr, grad_ptr, main_ptr, counts_ptr, table_ptr, tl.program_id(0), hidden, BLOCK_H, K, WAIT, done_ptr,
          num_counters, LAZY)
    # Then long-route items, once the long route has sorted (plain loads first: no atomics while
    # nothing is ready); only every QUEUE_EVERY-th program looks (v15 item 10: all of them crowd
    # the word's L2 slice).
    if QUEUE:  # nested, not `QUEUE & ...`: Triton 3.6 compiles that body with ctl_ptr None
        if tl.program_id(0) % QUEUE_EVERY == 0:
            if (tl.load(ctl_ptr + _READY, volatile=True) > 0) & (tl.load(ctl_ptr + _DRAINED, volatile=True) == 0):
                if tl.atomic_add(ctl_ptr + _READY, 0, sem="acquire", scope="gpu") > 0:
                    _long_work(grad_ptr, main_ptr, counts_ptr, ctl_ptr, spos_ptr, plist_ptr, rlist_ptr, scratch_ptr,
                               arrive_ptr, hidden, LONG_H, FOLD_H, FOLD_BATCH)
    if (WAIT == 3) | (WAIT == 4):  # launched after the long route: wait for it at the end only (stream order)
        if tl.program_id(0) == 0:
            gdc_wait()


@triton.jit
def _fused_kernel(ids_ptr, grad_ptr, main_ptr, counts_ptr, table_ptr, n, hidden, num_counters, done_ptr,
                  BLOCK: tl.constexpr, BLOCK_H: tl.constexpr, K: tl.constexpr, PDL: tl.constexpr):
    """Programs [0, num_counters) count BLOCK tokens each and release done_ptr; the others are items
    that wait for all of them. The counting programs come first in the grid, so they run first."""
    pid = tl.program_id(0)
    if pid < num_counters:
        if PDL:
            gdc_wait()
        _count(ids_ptr, counts_ptr, table_ptr, n, pid, BLOCK, K)
        tl.atomic_add(done_ptr, 1, sem="release", scope="gpu")
    else:
        if PDL:
            gdc_wait()
        _item(ids_ptr, grad_ptr, main_ptr, counts_ptr, table_ptr, pid - num_counters, hidden, BLOCK_H, K, 2, done_ptr,
              num_counters)


# ----------------------------------------------------------------------------- the long route
# Ids that occur more than K times: one persistent kernel of LR_PER_SM programs per SM, launched
# with PDL after the count and before the stream, in four phases separated by grid barriers
# (counters; every program is resident before the stream launches). (1) compact the long
# tokens' (key, position) into a list; (2) rank each entry by (key, position) against all the
# list (all pairs), which gives its sorted slot and its run's first slot; write the sorted
# positions, and list each partial (NROWS slots) and each run; (3) sum each (partial, H block)
# from +0 in slot order: a run of one partial adds into main_grad, the others store the sum in
# the scratch row embwgrad_core.partial_row gives; (4) fold each (run, columns) in partial order
# and add. Control words (after the counts, zeroed by the same memset):
_NROWS = tl.constexpr(10)
_QUEUE_LONG_H = tl.constexpr(256)  # "queue": columns of a long partial item, and of a fold item
_QUEUE_FOLD_H = tl.constexpr(128)


@triton.jit
def _wait_napping(ctr_ptr, target):
    """torch_frontend's _wait_for (acquire), with a nap between polls."""
    while tl.atomic_add(ctr_ptr, 0, sem="acquire", scope="gpu") < target:
        _nap()


@triton.jit
def _barrier(ctr_ptr, target):
    tl.debug_barrier()
    tl.atomic_add(ctr_ptr, 1, sem="release", scope="gpu")
    _wait_napping(ctr_ptr, target)


@triton.jit
def _append_at(flags, counter_ptr):
    """Places in a list for the flagged lanes (int32 0/1): one atomic on the list's counter for all
    of them (none when none is flagged), the order among them by cumsum."""
    total = tl.sum(flags, axis=0)
    base = total * 0
    if total > 0:
        base = tl.atomic_add(counter_ptr, total)
    return base + tl.cumsum(flags, axis=0) - flags


@triton.jit
def _list_partials(ctl_ptr, plist_ptr, live, key, slot, run_first, count):
    """List (first sorted slot, rows, key, run's first sorted slot) for each live entry that starts
    a partial: its slot in its run (sorted by position) is a multiple of NROWS."""
    head = (live & (slot % _NROWS == 0)).to(tl.int32)
    at = _append_at(head, ctl_ptr + _P) * 4
    hm = head == 1
    tl.store(plist_ptr + at, run_first + slot, mask=hm)
    tl.store(plist_ptr + at + 1, tl.minimum(count - slot, _NROWS), mask=hm)
    tl.store(plist_ptr + at + 2, key, mask=hm)
    tl.store(plist_ptr + at + 3, run_first, mask=hm)


@triton.jit
def _segmented_rank(ids_ptr, counts_ptr, ctl_ptr, skey_ptr, sp_ptr, spos_ptr, plist_ptr, rlist_ptr, arr_ptr, segb_ptr, n, pid,
                    P, K: tl.constexpr, PHASE: tl.constexpr, TILE: tl.constexpr, TILE_I: tl.constexpr, arrive_ptr=None):
    """The long route's sort, by segments: (1) list each long id once (its first arrival) ->
    barrier -> (11) program 0 gives each listed id a segment of its count (a prefix over the
    list) -> (12) every long token goes to its segment at its arrival rank -> barrier -> (2) each
    entry's place in its segment is the number of its segment's entries at smaller positions
    (only its own segment is compared), which gives the sorted positions and the partials."""
    if (PHASE == 0) | (PHASE == 1):
        for t in range(pid, tl.cdiv(n, TILE_I), P):
            idx = t * TILE_I + tl.arange(0, TILE_I)
            m = idx < n
            key = tl.load(ids_ptr + idx, mask=m, other=0).to(tl.int32)
            c = tl.load(counts_ptr + key, mask=m, other=0)
            first = (m & (c > K) & (tl.load(arr_ptr + idx, mask=m, other=1) == 0)).to(tl.int32)
            tl.store(rlist_ptr + 2 * _append_at(first, ctl_ptr + _R), key, mask=first == 1)
        if PHASE == 0:
            _barrier(ctl_ptr + _B1, P)
    if (PHASE == 0) | (PHASE == 11):
        if pid == 0:
            runs = tl.atomic_add(ctl_ptr + _R, 0, sem="acquire", scope="gpu")
            acc = 0
            for r0 in range(0, runs, TILE_I):
                r = r0 + tl.arange(0, TILE_I)
                mr = r < runs
                key = tl.load(rlist_ptr + 2 * r, mask=mr, other=0)
                c = tl.load(counts_ptr + key, mask=mr, other=0)
                base = acc + tl.cumsum(c, axis=0) - c
                tl.store(rlist_ptr + 2 * r + 1, base, mask=mr)
                tl.store(segb_ptr + key, base, mask=mr)
                if arrive_ptr is not None:
                    tl.store(arrive_ptr + base, tl.zeros([TILE_I], tl.int32), mask=mr)
                acc += tl.sum(c, axis=0)
            tl.store(ctl_ptr + _L, acc)
            if PHASE == 0:
                tl.debug_barrier()
                tl.atomic_add(ctl_ptr + _B4, 1, sem="release", scope="gpu")
        if PHASE == 0:
            _wait_napping(ctl_ptr + _B4, 1)
    if (PHASE == 0) | (PHASE == 12):
        for t in range(pid, tl.cdiv(n, TILE_I), P):
            idx = t * TILE_I + tl.arange(0, TILE_I)
            m = idx < n
            key = tl.load(ids_ptr + idx, mask=m, other=0).to(tl.int32)
            c = tl.load(counts_ptr + key, mask=m, other=0)
            lm = m & (c > K)
            slot = tl.load(segb_ptr + key, mask=lm, other=0) + tl.load(arr_ptr + idx, mask=lm, other=0)
            tl.store(skey_ptr + slot, key, mask=lm)
            tl.store(sp_ptr + slot, idx, mask=lm)
        if PHASE == 0:
            _barrier(ctl_ptr + _B5, P)
    if (PHASE == 0) | (PHASE == 2):
        L = tl.atomic_add(ctl_ptr + _L, 0, sem="acquire", scope="gpu")
        ar = tl.arange(0, TILE)
        for t in range(pid, tl.cdiv(L, TILE), P):
            j = t * TILE + ar
            mj = j < L
            kj = tl.load(skey_ptr + j, mask=mj, other=0)
            pj = tl.load(sp_ptr + j, mask=mj, other=0)
            bj = tl.load(segb_ptr + kj, mask=mj, other=0)
            c = tl.load(counts_ptr + kj, mask=mj, other=0)
            lo = tl.min(tl.where(mj, bj, 2147483647), axis=0)
            hi = tl.max(tl.where(mj, bj + c, 0), axis=0)
            place = tl.zeros([TILE], tl.int32)
            for i0 in range(lo, hi, TILE_I):
                i = i0 + tl.arange(0, TILE_I)
                mi = i < hi
                ki = tl.load(skey_ptr + i, mask=mi, other=-1)
                pi = tl.load(sp_ptr + i, mask=mi, other=0)
                place += tl.sum(((ki[None, :] == kj[:, None]) & (pi[None, :] < pj[:, None])).to(tl.int32), axis=1)
            tl.store(spos_ptr + bj + place, pj, mask=mj)
            _list_partials(ctl_ptr, plist_ptr, mj, kj, place, bj, c)
        if PHASE == 0:
            _barrier(ctl_ptr + _B2, P)


@triton.jit
def _lr_kernel(ids_ptr, grad_ptr, main_ptr, counts_ptr, ctl_ptr, lkey_ptr, lpos_ptr, spos_ptr, plist_ptr, rlist_ptr,
               scratch_ptr, n, hidden, K: tl.constexpr, PHASE: tl.constexpr, PDL: tl.constexpr, TILE: tl.constexpr, TILE_I: tl.constexpr,
               BLOCK_H: tl.constexpr, FOLD_H: tl.constexpr, FOLD_BATCH: tl.constexpr, EARLY: tl.constexpr = False,
               CHECK_ANY: tl.constexpr = False, STOP: tl.constexpr = 0, arr_ptr=None, segb_ptr=None, SEG: tl.constexpr = False,
               QUEUE: tl.constexpr = False, arrive_ptr=None):
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    if PDL:
        if EARLY:  # the stream launches now and waits on the count's counter itself
            gdc_launch_dependents()
            gdc_wait()
        else:
            gdc_wait()  # the count is done; only then may the stream launch
            gdc_launch_dependents()
    ar = tl.arange(0, TILE)
    if CHECK_ANY:
        if tl.load(ctl_ptr + _ANY) == 0:
            return
    if SEG:
        _segmented_rank(ids_ptr, counts_ptr, ctl_ptr, lkey_ptr, lpos_ptr, spos_ptr, plist_ptr, rlist_ptr, arr_ptr, segb_ptr,
                        n, pid, P, K, PHASE, TILE, TILE_I, arrive_ptr)
        if STOP == 2:
            return
        if QUEUE:
            if ((PHASE == 0) | (PHASE == 5) | (PHASE == 6)) & (pid == 0):  # 6: publish only (the interpreter)
                tl.atomic_xchg(ctl_ptr + _READY, 1, sem="release", scope="gpu")
            if (PHASE == 0) | (PHASE == 5):
                tl.atomic_add(ctl_ptr + _READY, 0, sem="acquire", scope="gpu")
                _long_work(grad_ptr, main_ptr, counts_ptr, ctl_ptr, spos_ptr, plist_ptr, rlist_ptr, scratch_ptr, arrive_ptr,
                           hidden, _QUEUE_LONG_H, _QUEUE_FOLD_H, FOLD_BATCH)
            return
    if ((PHASE == 0) | (PHASE == 1)) & (not SEG):
        for t in range(pid, tl.cdiv(n, TILE_I), P):
            idx = t * TILE_I + tl.arange(0, TILE_I)
            m = idx < n
            key = tl.load(ids_ptr + idx, mask=m, other=0).to(tl.int32)
            c = tl.load(counts_ptr + key, mask=m, other=0)
            flag = (m & (c > K)).to(tl.int32)
            at = _append_at(flag, ctl_ptr + _L)
            tl.store(lkey_ptr + at, key, mask=flag == 1)
            tl.store(lpos_ptr + at, idx, mask=flag == 1)
        if PHASE == 0:
            _barrier(ctl_ptr + _B1, P)
        if STOP == 1:  # timing of the first phases only
            return
    if ((PHASE == 0) | (PHASE == 2)) & (not SEG):
        L = tl.atomic_add(ctl_ptr + _L, 0, sem="acquire", scope="gpu")
        for t in range(pid, tl.cdiv(L, TILE), P):
            j = t * TILE + ar
            mj = j < L
            kj = tl.load(lkey_ptr + j, mask=mj, other=0)
            pj = tl.load(lpos_ptr + j, mask=mj, other=0)
            rank = tl.zeros([TILE], tl.int32)
            below = tl.zeros([TILE], tl.int32)
            for u in range(0, tl.cdiv(L, TILE_I)):
                i = u * TILE_I + tl.arange(0, TILE_I)
                mi = i < L
                ki = tl.load(lkey_ptr + i, mask=mi, other=2147483647)
                pi = tl.load(lpos_ptr + i, mask=mi, other=0)
                key_below = ki[None, :] < kj[:, None]
                rank += tl.sum((key_below | ((ki[None, :] == kj[:, None]) & (pi[None, :] < pj[:, None]))).to(tl.int32), axis=1)
                below += tl.sum(key_below.to(tl.int32), axis=1)
            tl.store(spos_ptr + rank, pj, mask=mj)
            c = tl.load(counts_ptr + kj, mask=mj, other=0)
            slot = rank - below
            _list_partials(ctl_ptr, plist_ptr, mj, kj, slot, below, c)
            first = (mj & (slot == 0) & (c > _NROWS)).to(tl.int32)
            at = _append_at(first, ctl_ptr + _R) * 2
            tl.store(rlist_ptr + at, kj, mask=first == 1)
            tl.store(rlist_ptr + at + 1, below, mask=first == 1)
        if PHASE == 0:
            _barrier(ctl_ptr + _B2, P)
        if STOP == 2:  # timing of the first phases only
            return
    if (PHASE == 0) | (PHASE == 3):
        num_p = tl.atomic_add(ctl_ptr + _P, 0, sem="acquire", scope="gpu")
        num_hb = tl.cdiv(hidden, BLOCK_H)
        for w in range(pid, num_p * num_hb, P):
            _long_partial(grad_ptr, main_ptr, counts_ptr, spos_ptr, plist_ptr, scratch_ptr, w // num_hb,
                          (w % num_hb) * BLOCK_H + tl.arange(0, BLOCK_H), hidden)
        if PHASE == 0:
            _barrier(ctl_ptr + _B3, P)
        if STOP == 3:  # timing of the first phases only
            return
    if (PHASE == 0) | (PHASE == 4):
        num_r = tl.atomic_add(ctl_ptr + _R, 0, sem="acquire", scope="gpu")
        num_fh = tl.cdiv(hidden, FOLD_H)
        for w in range(pid, num_r * num_fh, P):
            _long_fold(main_ptr, counts_ptr, rlist_ptr, scratch_ptr, w // num_fh, (w % num_fh) * FOLD_H + tl.arange(0, FOLD_H),
                       hidden, FOLD_BATCH)


class HashPlan:
    """One probe variant: its buffers (kept across calls) and its launches."""

    def __init__(self, name, n, vocab, hidden, device):
        self.name = name
        self.n, self.vocab, self.hidden = n, vocab, hidden
        # after the counts: [vocab] the done counter of "fused" and "plan+stream", [vocab + 8:] the long route's control words
        self.counts = torch.zeros(vocab + 24, dtype=torch.int32, device=device)
        if name.startswith("hash"):
            self.lkey, self.lpos, self.spos = (torch.empty(n, dtype=torch.int32, device=device) for _ in range(3))
            self.plist = torch.empty(4 * n, dtype=torch.int32, device=device)
            self.rlist = torch.empty(2 * n, dtype=torch.int32, device=device)
            self.scratch = torch.empty(2 * (n // 10 + 1) + 2, hidden, dtype=torch.float32, device=device)
            self.arr = torch.empty(n, dtype=torch.int32, device=device)  # arrival ranks ("seg")
            self.segb = torch.empty(vocab, dtype=torch.int32, device=device)  # long ids' segment starts ("seg")
            self.arrive = torch.empty(n, dtype=torch.int32, device=device)  # per run (at its segment start): partials done ("queue")
        self.table = torch.empty(vocab * K, dtype=torch.int32, device=device)
        self.warps = 1 if " w1" in name else 4
        self.block_h = 2048 if "h2048" in name else 1024
        self.pdl = ON_GPU and "nopdl" not in name

    def _option(self, prefix: str, default: int) -> int:
        """The number after prefix in one of the name's words ("lr2", "tj8", "every64"), else default."""
        return int(next((w[len(prefix):] for w in self.name.split() if w.startswith(prefix) and w[len(prefix):].isdigit()), default))

    def _count(self, ids, pdl: bool, release: bool, arr=None):
        """Zero the counts (and the control words after them), then count ids (_count_kernel)."""
        self.counts.zero_()
        _count_kernel[(self.counters,)](ids, self.counts, self.table, self.n, self.done, BLOCK=_COUNT_BLOCK, K=K, PDL=pdl,
                                        RELEASE=release, num_warps=4, arr_ptr=arr)

    def _stream(self, ids, grad, main_grad, wait: int, lazy: bool, launch_pdl: bool, **queue):
        """The stream kernel over every (token, block_h columns) item."""
        _stream_kernel[(self.items,)](ids, grad, main_grad, self.counts, self.table, self.hidden, self.done, self.counters,
                                      BLOCK_H=self.block_h, K=K, WAIT=wait, LAZY=lazy, num_warps=self.warps, **queue,
                                      **({"launch_pdl": True} if launch_pdl else {}))

    def __call__(self, ids, grad, main_grad):
        n, hidden = self.n, self.hidden
        self.items = n * triton.cdiv(hidden, self.block_h)
        self.counters = triton.cdiv(n, _COUNT_BLOCK)
        self.done = self.counts[self.vocab:]
        lazy = "lazy" in self.name
        if self.name.startswith("count+stream"):
            self._count(ids, self.pdl, False)
            self._stream(ids, grad, main_grad, 1 if self.pdl else 0, lazy, self.pdl)
        elif self.name.startswith("hash"):
            # the whole design: count, the long route (PDL), the stream (PDL, waits at its end only)
            lr = self._option("lr", 2)
            if lr > 4:  # 127 registers at 4 warps: 4 programs fill an SM, and a grid barrier with more hangs
                raise ValueError(f"{self.name}: at most 4 long-route programs per SM")
            ctl = self.counts[self.vocab + 8:]
            early = " early" in self.name
            segmented = " seg" in self.name
            queue = " queue" in self.name
            self._count(ids, self.pdl, early, self.arr if segmented else None)
            lr_args = (ids, grad, main_grad, self.counts, ctl, self.lkey, self.lpos, self.spos, self.plist, self.rlist,
                       self.scratch, n, hidden)
            fold_batch = self._option("fb", 8)
            lr_kw = dict(QUEUE=queue, arrive_ptr=self.arrive if queue else None, SEG=segmented, arr_ptr=self.arr if segmented else None,
                         segb_ptr=self.segb if segmented else None, STOP=self._option("stop", 0), CHECK_ANY=" any" in self.name, K=K,
                         TILE=self._option("tj", 16), TILE_I=self._option("ti", 256), BLOCK_H=1024, FOLD_H=self._option("fh", 256),
                         FOLD_BATCH=fold_batch, num_warps=4)
            if self.pdl:
                _lr_kernel[(lr * self.sms,)](*lr_args, PHASE=0, PDL=True, EARLY=early, launch_pdl=True, **lr_kw)
            else:  # the interpreter runs programs one at a time: one launch per phase, no barriers
                phases = (1, 11, 12, 2) + (((5,) if "lrtakes" in self.name or "lronly" in self.name else (6,)) if queue else (3, 4))
                for phase in phases if segmented else (1, 2, 3, 4):
                    _lr_kernel[(lr * self.sms,)](*lr_args, PHASE=phase, PDL=False, **lr_kw)
            if " alone" in self.name:  # the count and the long route only: timing only
                return
            qargs = dict(QUEUE=True, ctl_ptr=ctl, spos_ptr=self.spos, plist_ptr=self.plist, rlist_ptr=self.rlist,
                         scratch_ptr=self.scratch, arrive_ptr=self.arrive, FOLD_BATCH=fold_batch,
                         QUEUE_EVERY=self._option("every", 1)) if queue and "lronly" not in self.name else {}
            self._stream(ids, grad, main_grad, (4 if early else 3) if self.pdl else 0, lazy, self.pdl, **qargs)
        elif self.name.startswith("empty"):
            # "empty 3 after" / "empty 3 before": count, stream and three kernels that find nothing to do
            empties = int(self.name.split()[1])
            before = "before" in self.name
            self._count(ids, True, False)
            for _ in range(empties if before else 0):
                _empty_kernel[(self.sms,)](self.counts[self.vocab - 1:], num_warps=4, launch_pdl=True)
            self._stream(ids, grad, main_grad, 1, False, True)
            for _ in range(0 if before else empties):
                _empty_kernel[(self.sms,)](self.counts[self.vocab - 1:], num_warps=4, launch_pdl=True)
        elif self.name.startswith("long alone"):
            # main's call on the tokens of ids that occur more than K times; "long alone field=value ..."
            # overrides _Config fields (per SM where the field counts programs)
            from bench_torch import config_overrides
            from torch_frontend import embedding_wgrad as ew

            per_sm = ("partial_programs", "fold_programs", "tail_programs")
            fields = {f: int(v) * (self.sms if f in per_sm else 1) for f, v in (w.split("=") for w in self.name.split()[2:])}
            if self.long_ids is not None:
                with config_overrides(**fields):
                    ew._launch(self.long_ids, self.long_grad, main_grad, self.long_problem, self.long_path)
        elif self.name.startswith("plan+stream"):
            # main's plan (block sort, merge) between the count and the stream, which waits on the count's
            # counter instead: how much does the plan running beside it cost the stream?
            from torch_frontend import embedding_wgrad as ew

            self._count(ids, False, True)
            ew._plan_stage(ids, self.problem, self.cfg)
            self._stream(ids, grad, main_grad, 2, lazy, True)
        elif self.name.startswith("fused"):
            pdl = self.pdl and "zero kernel" in self.name
            if pdl:
                _zero_kernel[(triton.cdiv(self.vocab + 1, 4096),)](self.counts, self.vocab + 1, BLOCK=4096, PDL=True, num_warps=4)
            else:
                self.counts.zero_()
            _fused_kernel[(self.counters + self.items,)](ids, grad, main_grad, self.counts, self.table, n, hidden, self.counters,
                                                         self.done, BLOCK=_COUNT_BLOCK, BLOCK_H=self.block_h, K=K, PDL=pdl,
                                               num_warps=self.warps, **({"launch_pdl": True} if pdl else {}))
        elif self.name.startswith("two streams"):
            # Timing estimate for ids that occur more than K times: main's whole call on those tokens
            # alone (a subset in position order keeps each run's arithmetic), on a side stream beside
            # the count and the short stream (lazy: long tokens load no row). Graph capture forks and joins.
            from torch_frontend import embedding_wgrad as ew

            cur = torch.cuda.current_stream()
            self.side.wait_stream(cur)
            with torch.cuda.stream(self.side):
                if self.long_ids is not None:
                    ew._launch(self.long_ids, self.long_grad, main_grad, self.long_problem, self.long_path)
            self._count(ids, self.pdl, False)
            self._stream(ids, grad, main_grad, 1, True, True)
            cur.wait_stream(self.side)
        else:
            raise ValueError(self.name)

    def set_long(self, ids_np, grad, main_grad):
        """The tokens of ids that occur more than K times, for the two-stream variant."""
        from embwgrad_core import torch_path
        from torch_frontend import embedding_wgrad as ew

        self.side = torch.cuda.Stream()
        keep = np.bincount(ids_np)[ids_np] > K
        self.long_ids = None
        if keep.any():
            idx = torch.from_numpy(np.nonzero(keep)[0]).cuda()
            self.long_ids = torch.from_numpy(ids_np[keep]).cuda()
            self.long_grad = grad[idx].contiguous()
            self.long_problem = ew._check(self.long_ids, self.long_grad, main_grad, None)
            self.long_path = torch_path(int(keep.sum()))
            runs = np.bincount(ids_np[keep])
            print(f"long tokens {keep.sum()}, long ids {np.count_nonzero(runs)}, longest {runs.max()}", flush=True)


VARIANTS = ["hash lr2", "hash lr4", "hash early lr2", "hash early lr4", "hash lr4 tj8 ti1024", "hash lazy lr2", "count+stream w4", "count+stream lazy w4", "plan+stream w4", "plan+stream lazy w4", "two streams w4",
            "empty 3 after", "empty 3 before", "empty 1 after", "long alone", "count+stream w1", "count+stream nopdl w4", "count+stream h2048 w4", "fused w4",
            "fused zero kernel w4", "fused w1"]


def max_count(ids_np):
    return int(np.bincount(ids_np).max())


def cpu_check():
    assert os.environ.get("TRITON_INTERPRET") == "1", "without a GPU, run under TRITON_INTERPRET=1"
    vocab, hidden = 50, 80
    rng = np.random.default_rng(0)
    from tests.cases import zipf_ids

    for name in ["hash seg queue lr1", "hash seg queue lrtakes lr1", "hash seg queue lronly lr1", "hash seg queue every3 lr1", "hash seg lr1", "hash lr1", "hash any lr1", "hash lazy lr1", "count+stream w4", "count+stream lazy w4", "fused w4"]:
        for n in (40, 300, 700) if name.startswith("hash") else (40, 300):
            if name.startswith("hash"):  # long runs: of 9-10 tokens (one partial) and longer
                ids_np = np.concatenate([zipf_ids(n - 19, vocab, seed=n), np.full(9, vocab - 1), np.full(10, vocab - 2)])
                ids_np = ids_np[rng.permutation(n)]
            else:
                ids_np = rng.integers(0, vocab, n)
                while max_count(ids_np) > K:
                    ids_np = rng.integers(0, vocab, n)
            grad = torch.randn(n, hidden).bfloat16()
            main = torch.randn(vocab, hidden)
            expected = reference.accumulate(ids_np, _np_bf16(grad), main.numpy().copy(), path="sort")
            got = main.clone()
            plan = HashPlan(name, n, vocab, hidden, "cpu")
            plan.sms = 4
            plan(torch.from_numpy(ids_np), grad, got)
            ok = np.array_equal(got.numpy().view(np.int32), np.asarray(expected).view(np.int32))
            print(f"cpu {name:24s} n={n:4d} max count {max_count(ids_np)}: {'bitwise' if ok else 'DIFFERENT'}")
            assert ok


def _np_bf16(t):
    import ml_dtypes

    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)


def main():
    if not ON_GPU:
        return cpu_check()
    from bench_torch import copy_bandwidth, dense_expected, graph_ms, same_bits
    from common import floor_bytes, ids_for, print_table, probe_points

    from embwgrad_core import torch_path
    from tests.cases import REAL_H, REAL_V
    from torch_frontend import embedding_wgrad as ew

    names = [v for v in (sys.argv[1] if len(sys.argv) > 1 else "").split(",") if v] or VARIANTS
    torch.manual_seed(0)
    main_grad = torch.randn(REAL_V, REAL_H, device="cuda")
    bw = copy_bandwidth()
    print(f"copy bandwidth: {bw / 1e9:.3f} TB/s")
    rows = {}
    for n, dist in probe_points([(4096, "uniform"), (4096, "zipf"), (8192, "uniform"), (8192, "zipf"), (16384, "uniform"),
                                  (32768, "uniform"), (32768, "zipf")]):
        grad = torch.randn(n, REAL_H, device="cuda").bfloat16()
        ids_np = ids_for(dist, n, REAL_V)
        ids = torch.from_numpy(ids_np).cuda()
        mc = max_count(ids_np)
        res = {"floor": floor_bytes(ids_np, REAL_H) / bw * 1e3}
        problem = ew._check(ids, grad, main_grad, None)
        res["main"] = graph_ms(lambda: ew._launch(ids, grad, main_grad, problem, torch_path(n))) * 1e3
        for name in names:
            plan = HashPlan(name, n, REAL_V, REAL_H, "cuda")
            plan.problem = problem
            plan.cfg = ew._config(problem, torch_path(n), False, *ew._device_traits(0))
            plan.sms = torch.cuda.get_device_properties(0).multi_processor_count
            if name.startswith("two streams") or name.startswith("long alone"):
                plan.set_long(ids_np, grad, main_grad)
            note = ""
            if (mc <= K or name.startswith(("two streams", "hash"))) and "alone" not in name:
                expected = dense_expected(ids, grad, main_grad)
                got = main_grad.clone()
                plan(ids, grad, got)
                torch.cuda.synchronize()
                note = "bitwise" if same_bits(got, expected) else "DIFFERENT"
                del got, expected
            else:
                note = f"max count {mc} > {K}: long ids skipped, timing only"
            res[name] = graph_ms(lambda: plan(ids, grad, main_grad)) * 1e3
            print(f"n={n:6d} {dist:7s} {name:28s} {res[name]:8.1f} us  {note}", flush=True)
        print(f"n={n:6d} {dist:7s} main {res['main']:.1f} floor {res['floor']:.1f} (max count {mc})", flush=True)
        rows[(n, dist)] = res
    print_table(rows)


if __name__ == "__main__":
    sys.exit(main())
