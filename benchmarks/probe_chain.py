"""Long runs summed as chains, without scratch (NOTES v22; pipelined, v31).

The sort path sums a long run's partials (NROWS rows each) in parallel, stores them to a
scratch buffer and folds them in order. This probe asks whether a long run can instead be
summed by (run, W columns) chains: one program walks the whole run in order, G partials (G * 10
rows) in flight per step, keeps the running total in registers and adds it to main_grad. With W
small (64 columns: a row is one register per thread) a chain holds as many bytes in flight per
register as a copy-add, and the hot run gets H / W chains.

The plan is made on the host (torch.sort): the probe times the kernel only, beside the
frontend's whole call on the same inputs. One program per item: the chains first (longest runs
first), then every run of at most NROWS tokens as (run, 1024 columns) items, each finished in
place. Variants (W, G, chains only, short runs only, L1 prefetch of the next step's positions)
are given as "w64 g4", "w64 g4 chains", "w64 g4 short", "w64 g4 hot", "w64 g4 pf" (the pf prefetch
covers the next step's G * 10 positions: two lines before session 23, whatever G). The combined kernel's bits
are checked against the dense path for each variant.

Pipelined chains ("p64 s8", also with "chains", "hot", "short"): the chain's loop goes through
Triton's pipeliner (num_stages S: the rows S - 1 iterations ahead copied into shared memory by
cp.async, no registers held for them), "g2": two partials an iteration (default one); "q64 s4": each
partial's rows as one [W, 16] tile, split into rows, instead of five [W, 2] tiles (NOTES v31).

The long runs' partials alone, stored to scratch, no fold (NOTES v31 item 4): "rpart" (the
frontend's (partial, 1024 columns) item) against "pseg64 s4 P16" (segments of P partials over W
columns through the pipeliner), 12 resident programs per SM or "k8" etc.

Segmented chains ("w64 g0 seg16", "w64 g0 seg16 chains"): a long run is cut into segments of at most P
partials; each (segment, W columns) program sums its partials into registers (no wait), then waits for
the running total of the segment before it (a counter per segment, released by its programs), folds its
partials in order and publishes its own total (the last segment adds to main_grad). So only the
handoffs are serial, not the loads.

    PROBE_POINTS=8192:zipf python benchmarks/probe_chain.py "w64 g4,w128 g4"
"""

import sys

import numpy as np
import torch
import triton
import triton.language as tl
from bench_torch import graph_ms, probe_inputs, same_bits
from common import print_variant_table, probe_points

import torch_frontend
from torch_frontend.embedding_wgrad import _add_to_row, _prefetch_l1, _round, _wait_for


@triton.jit
def _p10(grad_ptr, pos_ptr, start, lo, hi, k: tl.constexpr, hidden, cols, live, W: tl.constexpr):
    """Partial k counted from row lo of a run (rows lo + 10k .., those below hi), summed from +0 in order (chains and segments)."""
    acc = tl.zeros([W], dtype=tl.float32)
    for u in tl.static_range(10):
        i = lo + k * 10 + u
        p = tl.load(pos_ptr + start + tl.minimum(i, hi - 1))
        row = tl.load(grad_ptr + p.to(tl.int64) * hidden + cols, mask=live, other=0.0)
        acc += tl.where(i < hi, row.to(tl.float32), 0.0)
    return acc


@triton.jit
def _fold_in(t, part, k: tl.constexpr, lo, hi):
    return tl.where(lo + k * 10 < hi, t + part, t)


@triton.jit
def _chain(grad_ptr, main_ptr, pos_ptr, start, length, key, col0, hidden, W: tl.constexpr, G: tl.constexpr, PF: tl.constexpr):
    cols = col0 + tl.arange(0, W)
    live = cols < hidden
    t = tl.zeros([W], dtype=tl.float32)
    for r0 in range(0, length, G * 10):
        if PF:  # the next step's G * 10 positions: every 128-byte line they may touch
            for q in tl.static_range((G * 10 + 31) // 32 + 1):
                _prefetch_l1(pos_ptr + start + r0 + G * 10 + 32 * q)
        for g in tl.static_range(G):
            t = _fold_in(t, _p10(grad_ptr, pos_ptr, start, r0, length, g, hidden, cols, live, W), g, r0, length)
    _add_to_row(main_ptr + key.to(tl.int64) * hidden, cols, live, _round(t, 1), 0)


@triton.jit
def _halves(x, W: tl.constexpr, K: tl.constexpr):
    """x [W, 2K] -> (x[:, 0::2], x[:, 1::2])."""
    return tl.split(tl.reshape(x, [W, K, 2]))


@triton.jit
def _add10(s, grad_ptr, pos_ptr, start, r, length, cols, live, hidden, W: tl.constexpr, TILE16: tl.constexpr):
    """s plus rows r .. r + 9 of the run (those below length), one at a time in position order.
    A masked row adds +0, which leaves s as it is (s starts at +0, so it is never -0)."""
    if TILE16:  # one [16] position load and one [W, 16] tile, split into rows (bit-reversed halves)
        k = tl.arange(0, 16)
        i = r + k
        ok = (k < 10) & (i < length)
        p = tl.load(pos_ptr + start + i, mask=ok, other=0)
        tile = tl.load(grad_ptr + p[None, :].to(tl.int64) * hidden + cols[:, None], mask=live[:, None] & ok[None, :], other=0.0)
        x0, x1 = _halves(tile.to(tl.float32), W, 8)  # j even, j odd
        x00, x01 = _halves(x0, W, 4)  # j = 4k, 4k + 2
        x10, x11 = _halves(x1, W, 4)  # j = 4k + 1, 4k + 3
        x000, x001 = _halves(x00, W, 2)  # j = 8k, 8k + 4
        x010, x011 = _halves(x01, W, 2)  # j = 8k + 2, 8k + 6
        x100, x101 = _halves(x10, W, 2)  # j = 8k + 1, 8k + 5
        x110, x111 = _halves(x11, W, 2)  # j = 8k + 3, 8k + 7
        r0, r8 = tl.split(x000)
        r4, r12 = tl.split(x001)
        r2, r10 = tl.split(x010)
        r6, r14 = tl.split(x011)
        r1, r9 = tl.split(x100)
        r5, r13 = tl.split(x101)
        r3, r11 = tl.split(x110)
        r7, r15 = tl.split(x111)
        s += r0
        s += r1
        s += r2
        s += r3
        s += r4
        s += r5
        s += r6
        s += r7
        s += r8
        s += r9
    else:  # five [2] position loads and five [W, 2] tiles
        j = tl.arange(0, 2)
        for m in tl.static_range(5):
            i = r + 2 * m + j
            ok = i < length
            p = tl.load(pos_ptr + start + i, mask=ok, other=0)
            tile = tl.load(grad_ptr + p[None, :].to(tl.int64) * hidden + cols[:, None], mask=live[:, None] & ok[None, :], other=0.0)
            a, b = tl.split(tile.to(tl.float32))
            s += a
            s += b
    return s


@triton.jit
def _pipe_chain(grad_ptr, main_ptr, pos_ptr, start, length, key, col0, hidden, W: tl.constexpr, S: tl.constexpr, G: tl.constexpr,
                TILE16: tl.constexpr):
    """A (run, W columns) chain whose rows go through Triton's loop pipeliner (cp.async into shared
    memory, S - 1 iterations ahead); one iteration is G partials of 10 rows, each summed from +0 row
    by row in position order and added to the running total (a partial past the run adds +0)."""
    cols = col0 + tl.arange(0, W)
    live = cols < hidden
    t = tl.zeros([W], dtype=tl.float32)
    for r0 in tl.range(0, length, 10 * G, num_stages=S):
        for g in tl.static_range(G):
            s = _add10(tl.zeros([W], dtype=tl.float32), grad_ptr, pos_ptr, start, r0 + 10 * g, length, cols, live, hidden, W, TILE16)
            t += s
    _add_to_row(main_ptr + key.to(tl.int64) * hidden, cols, live, _round(t, 1), 0)


@triton.jit
def _part_item(items_ptr, it, hidden, W: tl.constexpr):
    """Item it of the long-partials probes (rows of 4 int32: first slot, one past the run's last slot,
    column block): (first slot, run end, the block's W columns, which of them are below hidden)."""
    rec = items_ptr + it * 4
    start = tl.load(rec)
    end = tl.load(rec + 1)
    cols = tl.load(rec + 2) * W + tl.arange(0, W)
    return start, end, cols, cols < hidden


@triton.jit
def _seg_pipe_kernel(items_ptr, n_items, grad_ptr, scratch_ptr, pos_ptr, hidden, W: tl.constexpr, S: tl.constexpr, P: tl.constexpr):
    """Programs stride (segment of at most P partials of a long run, W columns) items: each partial summed
    as _add10's [W, 16] form through the pipeliner (S stages) and stored to its scratch row (the row of
    its first slot)."""
    for it in range(tl.program_id(0), n_items, tl.num_programs(0)):
        start, end, cols, live = _part_item(items_ptr, it, hidden, W)
        for r in tl.range(start, tl.minimum(start + 10 * P, end), 10, num_stages=S):
            part = _add10(tl.zeros([W], dtype=tl.float32), grad_ptr, pos_ptr, 0, r, end, cols, live, hidden, W, True)
            tl.store(scratch_ptr + r * hidden + cols, part, mask=live)  # (n * H below 2**31 in this probe)


@triton.jit
def _reg_part_kernel(items_ptr, n_items, grad_ptr, scratch_ptr, pos_ptr, hidden, BLOCK_H: tl.constexpr):
    """The frontend's form of a long run's partial: programs stride (partial, BLOCK_H columns) items, each's
    positions by scalar loads and its rows in registers, summed from +0 and stored to its scratch row."""
    for it in range(tl.program_id(0), n_items, tl.num_programs(0)):
        r, end, cols, live = _part_item(items_ptr, it, hidden, BLOCK_H)
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        for u in tl.static_range(10):
            p = tl.load(pos_ptr + tl.minimum(r + u, end - 1))
            row = tl.load(grad_ptr + p.to(tl.int64) * hidden + cols, mask=cols < tl.where(r + u < end, hidden, 0), other=0.0)
            acc += row.to(tl.float32)
        tl.store(scratch_ptr + r.to(tl.int64) * hidden + cols, acc, mask=live)


@triton.jit
def _short(grad_ptr, main_ptr, pos_ptr, start, length, key, hb, hidden, BLOCK_H: tl.constexpr):
    cols = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    live = cols < hidden
    p0 = tl.load(pos_ptr + start)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32) + tl.load(grad_ptr + p0.to(tl.int64) * hidden + cols, mask=live, other=0.0).to(tl.float32)
    gw = acc
    if length > 1:
        for u in tl.static_range(1, 10):
            p = tl.load(pos_ptr + start + tl.minimum(u, length - 1))
            row = tl.load(grad_ptr + p.to(tl.int64) * hidden + cols, mask=live, other=0.0)
            acc += tl.where(u < length, row.to(tl.float32), 0.0)
        gw = _round(acc, 1)
    _add_to_row(main_ptr + key.to(tl.int64) * hidden, cols, live, gw, 0)


@triton.jit
def _segment(grad_ptr, main_ptr, pos_ptr, tot_ptr, cnt_ptr, start, lo, hi, key, c, seg, prev, last, slices, hidden,
             W: tl.constexpr, P: tl.constexpr):
    """Segment [lo, hi) of a run (at most P partials) over W columns: its partials in registers, then the
    running total of the segment before it (waited for), folded in order; the last one adds to main_grad."""
    cols = c * W + tl.arange(0, W)
    live = cols < hidden
    s0 = _p10(grad_ptr, pos_ptr, start, lo, hi, 0, hidden, cols, live, W)
    s1 = _p10(grad_ptr, pos_ptr, start, lo, hi, 1, hidden, cols, live, W)
    s2 = _p10(grad_ptr, pos_ptr, start, lo, hi, 2, hidden, cols, live, W)
    s3 = _p10(grad_ptr, pos_ptr, start, lo, hi, 3, hidden, cols, live, W)
    s4 = _p10(grad_ptr, pos_ptr, start, lo, hi, 4, hidden, cols, live, W)
    s5 = _p10(grad_ptr, pos_ptr, start, lo, hi, 5, hidden, cols, live, W)
    s6 = _p10(grad_ptr, pos_ptr, start, lo, hi, 6, hidden, cols, live, W)
    s7 = _p10(grad_ptr, pos_ptr, start, lo, hi, 7, hidden, cols, live, W)
    if P > 8:
        s8 = _p10(grad_ptr, pos_ptr, start, lo, hi, 8, hidden, cols, live, W)
        s9 = _p10(grad_ptr, pos_ptr, start, lo, hi, 9, hidden, cols, live, W)
        s10 = _p10(grad_ptr, pos_ptr, start, lo, hi, 10, hidden, cols, live, W)
        s11 = _p10(grad_ptr, pos_ptr, start, lo, hi, 11, hidden, cols, live, W)
        s12 = _p10(grad_ptr, pos_ptr, start, lo, hi, 12, hidden, cols, live, W)
        s13 = _p10(grad_ptr, pos_ptr, start, lo, hi, 13, hidden, cols, live, W)
        s14 = _p10(grad_ptr, pos_ptr, start, lo, hi, 14, hidden, cols, live, W)
        s15 = _p10(grad_ptr, pos_ptr, start, lo, hi, 15, hidden, cols, live, W)
    t = tl.zeros([W], dtype=tl.float32)
    if prev >= 0:
        _wait_for(cnt_ptr + prev, slices)
        t = tl.load(tot_ptr + prev.to(tl.int64) * hidden + cols, mask=live, other=0.0, cache_modifier=".cg")
    t = _fold_in(t, s0, 0, lo, hi)
    t = _fold_in(t, s1, 1, lo, hi)
    t = _fold_in(t, s2, 2, lo, hi)
    t = _fold_in(t, s3, 3, lo, hi)
    t = _fold_in(t, s4, 4, lo, hi)
    t = _fold_in(t, s5, 5, lo, hi)
    t = _fold_in(t, s6, 6, lo, hi)
    t = _fold_in(t, s7, 7, lo, hi)
    if P > 8:
        t = _fold_in(t, s8, 8, lo, hi)
        t = _fold_in(t, s9, 9, lo, hi)
        t = _fold_in(t, s10, 10, lo, hi)
        t = _fold_in(t, s11, 11, lo, hi)
        t = _fold_in(t, s12, 12, lo, hi)
        t = _fold_in(t, s13, 13, lo, hi)
        t = _fold_in(t, s14, 14, lo, hi)
        t = _fold_in(t, s15, 15, lo, hi)
    if last:
        _add_to_row(main_ptr + key.to(tl.int64) * hidden, cols, live, _round(t, 1), 0)
    else:
        tl.store(tot_ptr + seg.to(tl.int64) * hidden + cols, t, mask=live)
        tl.debug_barrier()
        tl.atomic_add(cnt_ptr + seg, 1, sem="release", scope="gpu")


@triton.jit
def _seg_kernel(items_ptr, n_chain, grad_ptr, main_ptr, pos_ptr, tot_ptr, cnt_ptr, slices, hidden, W: tl.constexpr, P: tl.constexpr,
                BLOCK_H: tl.constexpr):
    pid = tl.program_id(0)
    if pid < n_chain:
        rec = items_ptr + pid * 10
        _segment(grad_ptr, main_ptr, pos_ptr, tot_ptr, cnt_ptr, tl.load(rec), tl.load(rec + 4), tl.load(rec + 5), tl.load(rec + 2),
                 tl.load(rec + 3), tl.load(rec + 6), tl.load(rec + 7), tl.load(rec + 8), slices, hidden, W, P)
    else:
        rec = items_ptr + n_chain * 10 + (pid - n_chain) * 4
        _short(grad_ptr, main_ptr, pos_ptr, tl.load(rec), tl.load(rec + 1), tl.load(rec + 2), tl.load(rec + 3), hidden, BLOCK_H)


@triton.jit
def _probe_kernel(items_ptr, n_chain, grad_ptr, main_ptr, pos_ptr, hidden, W: tl.constexpr, G: tl.constexpr, PF: tl.constexpr,
                  S: tl.constexpr, TILE16: tl.constexpr, BLOCK_H: tl.constexpr):
    """One item a program: chains first (S > 0: pipelined over S stages, _pipe_chain; else _chain), then short runs."""
    pid = tl.program_id(0)
    rec = items_ptr + pid * 4
    start = tl.load(rec)
    length = tl.load(rec + 1)
    key = tl.load(rec + 2)
    c = tl.load(rec + 3)
    if pid < n_chain:
        if S > 0:
            _pipe_chain(grad_ptr, main_ptr, pos_ptr, start, length, key, c * W, hidden, W, S, G, TILE16)
        else:
            _chain(grad_ptr, main_ptr, pos_ptr, start, length, key, c * W, hidden, W, G, PF)
    else:
        _short(grad_ptr, main_ptr, pos_ptr, start, length, key, c, hidden, BLOCK_H)


def host_plan(ids_np, hidden, W, block_h=1024):
    order = np.argsort(ids_np, kind="stable").astype(np.int32)
    keys = ids_np[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    lengths = np.diff(np.r_[starts, keys.size])
    chains, shorts = [], []
    for i in np.argsort(-lengths, kind="stable"):
        s, ln, k = int(starts[i]), int(lengths[i]), int(keys[starts[i]])
        if ln > 10:
            chains += [(s, ln, k, c) for c in range(triton.cdiv(hidden, W))]
    for s, ln, k in zip(starts, lengths, keys[starts]):
        if ln <= 10:
            shorts += [(int(s), int(ln), int(k), hb) for hb in range(triton.cdiv(hidden, block_h))]
    return order, np.array(chains, dtype=np.int32).reshape(-1, 4), np.array(shorts, dtype=np.int32).reshape(-1, 4)


def seg_items(chains_runs, hidden, W, P):
    """(start, length, key, slice, lo, hi, segment, previous segment or -1, last, 0) per (segment, slice):
    run by run (longest first), each run's segments in order, so that a segment's items come after
    those of the segment before it (one program per item: programs start in order)."""
    items, seg = [], 0
    for s, ln, k in chains_runs:
        prev = -1
        for lo in range(0, ln, 10 * P):
            hi = min(ln, lo + 10 * P)
            items += [(s, ln, k, c, lo, hi, seg, prev, int(hi == ln), 0) for c in range(triton.cdiv(hidden, W))]
            prev, seg = seg, seg + 1
    return np.array(items, dtype=np.int32).reshape(-1, 10), seg


def long_partials_alone(ids_np, grad, words):
    """(us, exact) of every long run's partials stored to a scratch buffer (row: the partial's first slot),
    "pseg64 s4 P16": segments of P partials over W columns through the pipeliner; "rpart": the
    frontend's form, (partial, 1024 columns) items; "k8": 8 resident programs per SM striding the items
    (default 12, the frontend's partials kernel's). Checked against the core's partial sums."""
    from embwgrad_core import SORT, make_plan, reference

    hidden = grad.shape[1]
    order, chains, _ = host_plan(ids_np, hidden, 64)
    pos = torch.from_numpy(order).cuda()
    runs = [tuple(int(v) for v in r[:2]) for r in chains[chains[:, 3] == 0]]  # (start, length) of each run of more than 10
    scratch = torch.zeros(ids_np.size, hidden, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    per_sm = int(next((w[1:] for w in words[1:] if w.startswith("k")), 12))  # resident programs per SM ("k8"), as the frontend's 12
    # rpart: (partial, 1024 columns) items, the P = 1 case of the segments' (segment, W columns) items.
    rpart = words[0] == "rpart"
    W, S, P = (1024, 0, 1) if rpart else (int(words[0][4:]), int(words[1][1:]), int(words[2][1:]))
    items = [(s + lo, s + ln, c, 0) for s, ln in runs for lo in range(0, ln, 10 * P) for c in range(triton.cdiv(hidden, W))]
    items_t = torch.from_numpy(np.array(items, dtype=np.int32)).cuda()
    kernel, widths = (_reg_part_kernel, dict(BLOCK_H=W)) if rpart else (_seg_pipe_kernel, dict(W=W, S=S, P=P))

    def call():
        kernel[(min(len(items), per_sm * sms),)](items_t, len(items), grad, scratch, pos, hidden, **widths, num_warps=1, maxnreg=168,
                                                 enable_fp_fusion=False)

    call()
    plan = make_plan(ids_np, int(ids_np.max()) + 1, path=SORT)
    sums = reference.partial_sums(plan, grad.float().cpu().numpy())
    long = plan.run_partials[plan.partial_run] > 1
    got = scratch[torch.from_numpy(plan.partial_slot[long]).cuda()].cpu().numpy()
    exact = np.array_equal(got.view(np.int32), sums[long].astype(np.float32).view(np.int32))
    return graph_ms(call) * 1e3, exact


def main():
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else ["w64 g4"]
    points = probe_points([(8192, "zipf"), (16384, "zipf"), (4096, "zipf"), (32768, "zipf")])
    results = {}
    for n, dist, ids_np, ids, grad, main_grad, expected in probe_inputs(points):
        hidden = grad.shape[1]
        mg = main_grad.clone()
        results[(n, dist, "frontend")] = (graph_ms(lambda: torch_frontend.accumulate(ids, grad, mg)) * 1e3, True)
        for name in names:
            words = name.split()
            if words[0].startswith(("pseg", "rpart")):  # long runs' partials alone, to scratch (no fold)
                results[(n, dist, name)] = long_partials_alone(ids_np, grad, words)
                print(n, dist, name, f"{results[(n, dist, name)][0]:.1f}", "exact" if results[(n, dist, name)][1] else "DIFFERENT", flush=True)
                continue
            W = int(words[0][1:])
            G = int(words[1][1:])
            piped = words[0][0] in "pq"  # "p64 s8": pipelined chains, W 64, 8 stages; "q": [W, 16] tiles
            pg = int(next((w[1:] for w in words[2:] if w.startswith("g")), 1))  # "p64 s4 g2": two partials an iteration
            order, chains, shorts = host_plan(ids_np, hidden, W)
            pos = torch.from_numpy(order).cuda()
            if words[2:3] and words[2].startswith("seg"):
                P = int(words[2][3:])
                runs = [tuple(r[:3]) for r in chains[chains[:, 3] == 0]]
                segs, nseg = seg_items(runs, hidden, W, P)
                if "chains" in words:
                    shorts = shorts[:0]
                flat = torch.from_numpy(np.concatenate([segs.ravel(), shorts.ravel()]).astype(np.int32)).cuda()
                tot = torch.empty(max(nseg, 1), hidden, device="cuda")
                cnt = torch.zeros(max(nseg, 1), dtype=torch.int32, device="cuda")
                grid = len(segs) + len(shorts)

                def call(target):
                    cnt.zero_()
                    _seg_kernel[(grid,)](flat, len(segs), grad, target, pos, tot, cnt, triton.cdiv(hidden, W), hidden, W=W, P=P,
                                         BLOCK_H=1024, num_warps=1, maxnreg=168, enable_fp_fusion=False)

                check, counts = "chains" not in words, (len(segs), len(shorts))
            else:
                part = "all"
                if "chains" in words:
                    items, part = chains, "chains"
                elif "hot" in words:  # the hottest run's chains alone
                    items, part = chains[chains[:, 0] == chains[0, 0]] if len(chains) else chains, "hot"
                elif "short" in words:
                    items, part = shorts, "short"
                else:
                    items = np.concatenate([chains, shorts])
                if len(items) == 0:
                    results[(n, dist, name)] = (0.0, True)
                    continue
                n_chain = 0 if part == "short" else len(chains)
                items_t = torch.from_numpy(np.ascontiguousarray(items)).cuda()

                def call(target):  # piped: "s<S>" is the stages, "g<G>" the partials an iteration
                    _probe_kernel[(len(items),)](items_t, n_chain, grad, target, pos, hidden, W=W, G=pg if piped else G, PF="pf" in words,
                                                 S=G if piped else 0, TILE16=words[0][0] == "q", BLOCK_H=1024, num_warps=1, maxnreg=168,
                                                 enable_fp_fusion=False)

                check, counts = part == "all", (len(chains), len(shorts))
            ok = True
            if check:  # only the variants that do the whole call
                got = main_grad.clone()
                call(got)
                ok = same_bits(got, expected)
            mg = main_grad.clone()
            results[(n, dist, name)] = (graph_ms(lambda: call(mg)) * 1e3, ok)
            print(n, dist, name, f"{results[(n, dist, name)][0]:.1f}", "exact" if ok else "DIFFERENT", *counts, flush=True)
    print_variant_table("us", points, ["frontend"] + names, results, "DIFFERENT")


if __name__ == "__main__":
    main()
