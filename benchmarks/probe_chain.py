"""Long runs summed as chains, without scratch (NOTES v22).

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
                  BLOCK_H: tl.constexpr):
    pid = tl.program_id(0)
    rec = items_ptr + pid * 4
    start = tl.load(rec)
    length = tl.load(rec + 1)
    key = tl.load(rec + 2)
    c = tl.load(rec + 3)
    if pid < n_chain:
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
            W = int(words[0][1:])
            G = int(words[1][1:])
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

                def call(target):
                    _probe_kernel[(len(items),)](items_t, n_chain, grad, target, pos, hidden, W=W, G=G, PF="pf" in words, BLOCK_H=1024,
                                                 num_warps=1, maxnreg=168, enable_fp_fusion=False)

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
