"""Timelines of the torch partials kernel from %globaltimer stamps (NOTES v19).

The stamps are not in the frontend: apply them first, on a scratch checkout,

    git apply benchmarks/trace_v19.patch     (made against commit 0c8e2da's torch frontend)

With torch_frontend.embedding_wgrad.TRACE_BUF set, the partials kernel stamps each program's
start, end of its wait on the plan and end, each item's start and end (with its run length and
offset in the run), and each fold item's start, arrival of its run's partials and end. The call
is captured in a CUDA graph and replayed after do_bench's flush; the stamps of several replays
give: when the plan ended, when the long runs' partials and folds ended, when the last item
ended, the DRAM bytes the items moved per time bin (each item's bytes spread over its span), and
how many items of each kind were in flight.

    python benchmarks/probe_trace.py        (PROBE_POINTS picks the points)
"""

import numpy as np
import torch
from bench_torch import capture_graph, graph_ms, probe_inputs, same_bits
from common import probe_points

import torch_frontend
from torch_frontend import embedding_wgrad as ew
from tests.cases import REAL_H

POINTS = probe_points([(8192, "zipf"), (8192, "uniform"), (4096, "uniform")])
REPLAYS = 7
BIN = 4.0  # us
T_ITEMS, T_FOLDS = 60000, 300000


def one_replay(graph, buf, cache):
    buf.zero_()
    cache.zero_()  # do_bench's flush
    graph.replay()
    torch.cuda.synchronize()
    return buf.cpu().numpy()


def analyse(t, lone_bytes, hb_bytes):
    progs = t[: 3 * 20000].reshape(-1, 3)
    progs = progs[progs[:, 0] != 0]
    base = progs[:, 0].min()
    us = lambda x: (x - base) / 1e3  # noqa: E731
    items = t[T_ITEMS:T_FOLDS].reshape(-1, 4)
    items = items[items[:, 0] != 0]
    folds = t[T_FOLDS : T_FOLDS + 4 * 20000].reshape(-1, 4)
    folds = folds[folds[:, 0] != 0]
    run_len, k = items[:, 2], items[:, 3]
    long = run_len > 10
    nrows = np.where(long, np.minimum(run_len - k, 10), run_len)
    grad_b, main_b = hb_bytes
    nbytes = nrows * grad_b + np.where(long, 0, 2 * main_b)
    waited = progs[progs[:, 1] != 0]
    out = {
        "plan end": us(waited[:, 1].min()) if len(waited) else float("nan"),
        "last long item": us(items[long, 1].max()) if long.any() else float("nan"),
        "last fold": us(folds[:, 2].max()) if len(folds) else float("nan"),
        "last item": us(items[:, 1].max()),
        "kernel end": us(progs[:, 2].max()),
    }
    t0, t1 = us(items[:, 0]), us(items[:, 1])
    end = out["kernel end"]
    bins = np.arange(0, end + BIN, BIN)
    moved = np.zeros(len(bins))
    active = {c: np.zeros(len(bins)) for c in ("long", "short", "one")}
    cls = np.where(long, "long", np.where(run_len > 1, "short", "one"))
    for a, b, nb, c in zip(t0, t1, nbytes, cls):
        span = max(b - a, 1e-3)
        lo, hi = int(a // BIN), int(b // BIN)
        for i in range(lo, min(hi, len(bins) - 1) + 1):
            overlap = min(b, (i + 1) * BIN) - max(a, i * BIN)
            if overlap > 0:
                moved[i] += nb * overlap / span
                active[c][i] += overlap / BIN
    lone = progs[(progs[:, 1] == 0) & (progs[:, 2] != 0)]  # the lone programs: no wait stamp
    if len(lone) and lone_bytes:
        per = lone_bytes / len(lone)
        for a, b in zip(us(lone[:, 0]), us(lone[:, 2])):
            span = max(b - a, 1e-3)
            for i in range(int(a // BIN), min(int(b // BIN), len(bins) - 1) + 1):
                overlap = min(b, (i + 1) * BIN) - max(a, i * BIN)
                if overlap > 0:
                    moved[i] += per * overlap / span
    durations = {c: float(np.median(t1[cls == c] - t0[cls == c])) for c in ("long", "short", "one") if (cls == c).any()}
    fold_wait = float(np.median(us(folds[:, 1]) - us(folds[:, 0]))) if len(folds) else float("nan")
    fold_work = float(np.median(us(folds[:, 2]) - us(folds[:, 1]))) if len(folds) else float("nan")
    return out, bins, moved / (BIN * 1e-6) / 1e12, active, durations, (fold_wait, fold_work, len(folds)), len(lone)


def main():
    if not hasattr(ew, "TRACE_BUF"):
        raise SystemExit("the partials kernel has no stamps here: git apply benchmarks/trace_v19.patch first")
    cache = torch.empty(2**26, dtype=torch.int32, device="cuda")
    for n, dist, ids_np, ids, grad, main_grad, expected in probe_inputs(POINTS):
        keys, counts = np.unique(ids_np, return_counts=True)
        lone_ids = set(keys[counts == 1].tolist())
        cfg = ew._config(ew._check(ids, grad, main_grad, None), "sort", False, torch.cuda.get_device_properties(0).multi_processor_count, True)
        lone_pos = sum(1 for p in range(min(n, cfg.lone_tokens)) if int(ids_np[p]) in lone_ids)
        lone_bytes = lone_pos * REAL_H * (2 + 8)
        ew.TRACE_BUF = None
        ew._CALLS.clear()
        work = main_grad.clone()
        plain = graph_ms(lambda: torch_frontend.accumulate(ids, grad, work)) * 1e3
        ew.TRACE_BUF = torch.zeros(400000, dtype=torch.int64, device="cuda")
        ew._CALLS.clear()
        work.copy_(main_grad)
        torch_frontend.accumulate(ids, grad, work)
        exact = same_bits(work, expected)
        traced = graph_ms(lambda: torch_frontend.accumulate(ids, grad, work)) * 1e3
        graph = capture_graph(lambda: torch_frontend.accumulate(ids, grad, work))
        runs = [analyse(one_replay(graph, ew.TRACE_BUF, cache), lone_bytes, (cfg.block_h * 2, cfg.block_h * 4)) for _ in range(REPLAYS)]
        print(f"\nn={n} {dist}: graph {plain:.1f} us untraced, {traced:.1f} traced, exact={exact}; lone positions {lone_pos}, "
              f"lone programs {runs[0][6]}, fold items {runs[0][5][2]}", flush=True)
        for key in runs[0][0]:
            print(f"  {key:15s} " + " ".join(f"{r[0][key]:6.1f}" for r in runs))
        print("  median item us " + ", ".join(f"{c} {np.median([r[4].get(c, np.nan) for r in runs]):.2f}" for c in ("long", "short", "one")))
        print(f"  folds: wait {np.median([r[5][0] for r in runs]):.2f} us, work {np.median([r[5][1] for r in runs]):.2f} us (medians)")
        r = runs[REPLAYS // 2]
        print("  bin(us)  TB/s  long short one (items in flight)")
        for i, b in enumerate(r[1]):
            print(f"  {b:6.0f} {r[2][i]:5.2f} {r[3]['long'][i]:6.0f} {r[3]['short'][i]:5.0f} {r[3]['one'][i]:5.0f}")
    ew.TRACE_BUF = None


if __name__ == "__main__":
    main()
