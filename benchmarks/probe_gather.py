"""Are ten-row gathers slow in themselves? (NOTES v19)

Session 19's timeline (probe_trace.py with trace_v19.patch) showed the 8192-Zipf call's first 40
us, while about a thousand long-run partials (ten grad rows each, one (partial, 1024 columns) item
per one-warp program) are in flight, moving 2.6-3.4 TB/s, against 3.7-4.2 TB/s for the single-row
items after them. This probe reads random grad rows with no plan around them, one item per
program, and reports the read rate, so that the item's shape can be judged apart from the partials
kernel:

- rows 1: one row's column block per item (the single-row items' reads);
- rows 10: ten rows' column blocks per item, positions loaded one by one as the frontend does;
- rows 10 + store: the same, and the fp32 sum stored (4 KB per item, as a long run's partial);
- rows 10 with 2 or 4 warps, or 512 columns per item;
- rows 10 with every load first (positions in one vector load, then all ten rows, then the
  adds), or with 2 or 4 warps, at a fixed number of programs per SM;
- rows 10 by 14, 8 or 4 resident programs per SM, each striding the items (the partials kernel
  fits about 14 one-warp programs per SM, and about 1000 long-run partials were in flight);
- rows 10 + store with L2 priority evict_last, then a CTA barrier and a release atomic on a
  counter shared by 1, 8 or 111 partials (a long run's arrival counter counts its partials'
  items; the hottest run at 8192 Zipf ids has 111 partials).

The grad here has 65536 rows (940 MB), so a random row is rarely still in L2. Each item's sum
is stored only under a condition that never holds (for the read-only cases), which keeps the loads.

    python benchmarks/probe_gather.py
"""

import torch
import triton
import triton.language as tl
from bench_torch import copy_bandwidth, graph_ms

from tests.cases import REAL_H

ROWS_IN_GRAD = 65536
READS = 81920  # row reads per case


@triton.jit
def _row(lane, pos_v, t, grad_ptr, hidden, cols, m):
    pos_t = tl.sum(tl.where(lane == t, pos_v, 0), axis=0).to(tl.int64)
    return tl.load(grad_ptr + pos_t * hidden + cols, mask=m, other=0.0)


@triton.jit
def _ten_first(pos_ptr, grad_ptr, hidden, cols, m):
    lane = tl.arange(0, 16)
    pos_v = tl.load(pos_ptr + lane, mask=lane < 10, other=0)
    g0 = _row(lane, pos_v, 0, grad_ptr, hidden, cols, m)
    g1 = _row(lane, pos_v, 1, grad_ptr, hidden, cols, m)
    g2 = _row(lane, pos_v, 2, grad_ptr, hidden, cols, m)
    g3 = _row(lane, pos_v, 3, grad_ptr, hidden, cols, m)
    g4 = _row(lane, pos_v, 4, grad_ptr, hidden, cols, m)
    g5 = _row(lane, pos_v, 5, grad_ptr, hidden, cols, m)
    g6 = _row(lane, pos_v, 6, grad_ptr, hidden, cols, m)
    g7 = _row(lane, pos_v, 7, grad_ptr, hidden, cols, m)
    g8 = _row(lane, pos_v, 8, grad_ptr, hidden, cols, m)
    g9 = _row(lane, pos_v, 9, grad_ptr, hidden, cols, m)
    acc = g0.to(tl.float32) + g1.to(tl.float32)
    acc += g2.to(tl.float32)
    acc += g3.to(tl.float32)
    acc += g4.to(tl.float32)
    acc += g5.to(tl.float32)
    acc += g6.to(tl.float32)
    acc += g7.to(tl.float32)
    acc += g8.to(tl.float32)
    acc += g9.to(tl.float32)
    return acc


@triton.jit
def _gather(pos_ptr, grad_ptr, out_ptr, counters_ptr, group, hidden, items, ROWS: tl.constexpr, BLOCK_H: tl.constexpr, STORE: tl.constexpr,
            POLICY: tl.constexpr, RELEASE: tl.constexpr, FIRST: tl.constexpr):
    num_hb = tl.cdiv(hidden, BLOCK_H)
    for w in range(tl.program_id(0), items, tl.num_programs(0)):  # one item per program, or a stride (resident programs)
        p = w // num_hb
        cols = (w % num_hb) * BLOCK_H + tl.arange(0, BLOCK_H)
        m = cols < hidden
        if FIRST:  # ten rows: positions in one vector load, then every row's load, then the adds
            acc = _ten_first(pos_ptr + p * ROWS, grad_ptr, hidden, cols, m)
        else:  # positions one by one, each row added after its load (ptxas interleaves them)
            acc = tl.zeros([BLOCK_H], dtype=tl.float32)
            for t in tl.static_range(ROWS):
                pos_t = tl.load(pos_ptr + p * ROWS + t).to(tl.int64)
                acc += tl.load(grad_ptr + pos_t * hidden + cols, mask=m, other=0.0).to(tl.float32)
        if STORE:
            tl.store(out_ptr + p.to(tl.int64) * hidden + cols, acc, mask=m, eviction_policy=POLICY)
            if RELEASE:  # as a long run's partial: the CTA barrier, then a release atomic on its run's counter
                tl.debug_barrier()
                tl.atomic_add(counters_ptr + p // group, 1, sem="release", scope="gpu")
        else:  # never true: keeps the loads without writing
            tl.store(out_ptr + p.to(tl.int64) * hidden + cols, acc, mask=m & (acc == -1234.5))


@triton.jit
def _gather_flat(pos_ptr, grad_ptr, out_ptr, hidden, items, rec_ptr, counters_ptr, ROWS: tl.constexpr, BLOCK_H: tl.constexpr,
                 STAGES: tl.constexpr, STORE: tl.constexpr, RECORD: tl.constexpr = False, RELEASE: tl.constexpr = False):
    """Resident programs striding the items, as _gather, but one loop over (item, row) pairs that
    Triton's pipeliner takes (num_stages on tl.range): each row goes to shared memory by an
    asynchronous copy, STAGES - 1 rows ahead, across item boundaries, so a warp keeps rows in flight
    without holding them in registers (NOTES v26). Timing only: a partial starts from its first row,
    not from +0 (the frontend's arithmetic differs for a first row of -0.0)."""
    num_hb = tl.cdiv(hidden, BLOCK_H)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    mine = tl.cdiv(items - pid, nprog)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for k in tl.range(0, mine * ROWS, num_stages=STAGES):
        w = pid + (k // ROWS) * nprog
        t = k % ROWS
        p = w // num_hb
        if RECORD:  # the partial's first slot from a record, as the frontend's items (one more round trip)
            p = tl.load(rec_ptr + p)
        cols = (w % num_hb) * BLOCK_H + tl.arange(0, BLOCK_H)
        m = cols < hidden
        pos_t = tl.load(pos_ptr + p * ROWS + t).to(tl.int64)
        row = tl.load(grad_ptr + pos_t * hidden + cols, mask=m, other=0.0).to(tl.float32)
        acc = tl.where((cols * 0 + t) == 0, row, acc + row)
        last = m & ((cols * 0 + t) == ROWS - 1)
        if STORE:
            tl.store(out_ptr + p.to(tl.int64) * hidden + cols, acc, mask=last)
        else:  # never true: keeps the loads without writing
            tl.store(out_ptr + p.to(tl.int64) * hidden + cols, acc, mask=last & (acc == -1234.5))
        if RELEASE:  # as _long_partials_piped: the warp meets, then the last row's release atomic
            tl.inline_asm_elementwise("bar.warp.sync -1; mov.u32 $0, 0;", "=r,r", [t], dtype=tl.int32, is_pure=False, pack=1)
            tl.atomic_add(counters_ptr + p // 111, 1, mask=t == ROWS - 1, sem="release", scope="gpu")


#: (name, BLOCK_H, warps, programs per SM, STAGES, store) of _gather_flat
FLAT_CASES = [
    ("flat, 8 per SM, 1 stage", 1024, 1, 8, 1, False),
    ("flat, 8 per SM, 4 stages", 1024, 1, 8, 4, False),
    ("flat, 8 per SM, 8 stages", 1024, 1, 8, 8, False),
    ("flat, 8 per SM, 11 stages", 1024, 1, 8, 11, False),
    ("flat, 14 per SM, 4 stages", 1024, 1, 14, 4, False),
    ("flat, 14 per SM, 8 stages", 1024, 1, 14, 8, False),
    ("flat, 4 per SM, 11 stages", 1024, 1, 4, 11, False),
    ("flat, 8 per SM, 8 stages, store", 1024, 1, 8, 8, True),
    ("flat, 8 per SM, 512 cols, 11 stages", 512, 1, 8, 11, False),
    ("flat, 16 per SM, 512 cols, 8 stages", 512, 1, 16, 8, False),
]
#: (name, programs per SM, STAGES, store, record, release): the frontend's form step by step
FLAT_FRONTEND = [
    ("flat 8/SM s4 + record", 8, 4, False, True, False),
    ("flat 8/SM s8 + record", 8, 8, False, True, False),
    ("flat 8/SM s4 + store + release", 8, 4, True, False, True),
    ("flat 8/SM s4 + record + store + release", 8, 4, True, True, True),
    ("flat 8/SM s8 + record + store + release", 8, 8, True, True, True),
    ("flat 4/SM s4 + record + store + release", 4, 4, True, True, True),
    ("flat 12/SM s4 + record + store + release", 12, 4, True, True, True),
]


CASES = [  # (name, rows per item, BLOCK_H, warps, store, store's L2 policy, release atomic, partials per counter,
    #         programs per SM or 0 for one per item, ten rows' loads first)
    ("rows 1", 1, 1024, 1, False, "", False, 1, 0, False),
    ("rows 10", 10, 1024, 1, False, "", False, 1, 0, False),
    ("rows 10, 2 warps", 10, 1024, 2, False, "", False, 1, 0, False),
    ("rows 10, 4 warps", 10, 1024, 4, False, "", False, 1, 0, False),
    ("rows 10, 512 columns", 10, 512, 1, False, "", False, 1, 0, False),
    ("rows 5", 5, 1024, 1, False, "", False, 1, 0, False),
    ("rows 10 + store", 10, 1024, 1, True, "", False, 1, 0, False),
    ("rows 10 + store evict_last", 10, 1024, 1, True, "evict_last", False, 1, 0, False),
    ("+ release, 1 partial per counter", 10, 1024, 1, True, "evict_last", True, 1, 0, False),
    ("+ release, 8 per counter", 10, 1024, 1, True, "evict_last", True, 8, 0, False),
    ("+ release, 111 per counter", 10, 1024, 1, True, "evict_last", True, 111, 0, False),
    ("rows 10, 14 per SM", 10, 1024, 1, False, "", False, 1, 14, False),
    ("rows 10, 8 per SM", 10, 1024, 1, False, "", False, 1, 8, False),
    ("rows 10, 4 per SM", 10, 1024, 1, False, "", False, 1, 4, False),
    ("+ release, 111, 8 per SM", 10, 1024, 1, True, "evict_last", True, 111, 8, False),
    ("rows 10, 8 per SM, loads first", 10, 1024, 1, False, "", False, 1, 8, True),
    ("rows 10, 8 per SM, 512 columns, first", 10, 512, 1, False, "", False, 1, 8, True),
    ("rows 10, 8 per SM, 2 warps", 10, 1024, 2, False, "", False, 1, 8, False),
    ("rows 10, 8 per SM, 2 warps, first", 10, 1024, 2, False, "", False, 1, 8, True),
    ("rows 10, 4 per SM, 4 warps", 10, 1024, 4, False, "", False, 1, 4, False),
    ("rows 10, 4 per SM, 4 warps, first", 10, 1024, 4, False, "", False, 1, 4, True),
    ("rows 10, 14 per SM, loads first", 10, 1024, 1, False, "", False, 1, 14, True),
    ("+ release, 111, 8 per SM, first", 10, 1024, 1, True, "evict_last", True, 111, 8, True),
    ("rows 1", 1, 1024, 1, False, "", False, 1, 0, False),
]


def main():
    torch.manual_seed(0)
    grad = torch.randn(ROWS_IN_GRAD, REAL_H, device="cuda").bfloat16()
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e9:.2f} TB/s", flush=True)
    counters = torch.zeros(READS, dtype=torch.int32, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for name, rows, block_h, warps, store, policy, release, group, per_sm, first in CASES:
        pos = torch.randint(0, ROWS_IN_GRAD, (READS,), device="cuda", dtype=torch.int32)
        partials = READS // rows
        out = torch.empty(partials, REAL_H, device="cuda")
        items = partials * triton.cdiv(REAL_H, block_h)
        grid = (min(items, per_sm * sms) if per_sm else items,)

        def run():
            _gather[grid](pos, grad, out, counters, group, REAL_H, items, ROWS=rows, BLOCK_H=block_h, STORE=store, POLICY=policy, RELEASE=release,
                          FIRST=first, num_warps=warps)

        us = graph_ms(run) * 1e3
        read = READS * REAL_H * 2
        written = partials * REAL_H * 4 if store else 0
        print(f"{name:34s} {us:8.1f} us  reads {read / us / 1e6:.2f} TB/s  (reads + writes {(read + written) / us / 1e6:.2f} TB/s)",
              flush=True)
    cases = [(*c, False, False) for c in FLAT_CASES] + [(n, 1024, 1, ps, st, sto, rec, rel) for n, ps, st, sto, rec, rel in FLAT_FRONTEND]
    for name, block_h, warps, per_sm, stages, store, record, release in cases:
        pos = torch.randint(0, ROWS_IN_GRAD, (READS,), device="cuda", dtype=torch.int32)
        partials = READS // 10
        out = torch.empty(partials, REAL_H, device="cuda")
        items = partials * triton.cdiv(REAL_H, block_h)
        rec = torch.randperm(partials, device="cuda", dtype=torch.int32)

        def run():
            _gather_flat[(per_sm * sms,)](pos, grad, out, REAL_H, items, rec, counters, ROWS=10, BLOCK_H=block_h, STAGES=stages, STORE=store,
                                          RECORD=record, RELEASE=release, num_warps=warps)

        us = graph_ms(run) * 1e3
        read = READS * REAL_H * 2
        written = partials * REAL_H * 4 if store else 0
        print(f"{name:34s} {us:8.1f} us  reads {read / us / 1e6:.2f} TB/s  (reads + writes {(read + written) / us / 1e6:.2f} TB/s)",
              flush=True)


if __name__ == "__main__":
    main()
