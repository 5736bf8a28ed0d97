"""The benchmark at other models' shapes: run.py's series, bits and floor at a few public (V, H).

Issue 5's table is one shape (V = 129280, H = 7168: DeepSeek-V3). A user training another
model asks what it does at theirs, so this runs the same two processes (bench_torch.py,
bench_jax.py: the frontends, torch's dense path, `index_add_`, XLA's scatter, the floor, each
embwgrad point checked bitwise) once per shape below, bf16 grad into fp32 main_grad, and prints
one table: each shape's points, the torch frontend's CUDA-graph time and the JAX chains' time
with their ratio to the floor, and each peer with its ratio to ours (torch peers over the
torch graph, XLA's scatter over JAX), and draws one panel per shape (shapes.png). GPU only (on
a CPU, run.py's small shape is the check).

    python benchmarks/shapes.py [--shapes mixtral-8x7b,llama3-405b] [--ns 8192,32768] [--dists zipf] [--json out.json] [--png out.png]
"""

import argparse
import json
import os
import sys

from run import FRAMEWORKS, bits_cell, over_floor, over_ours, plot_on, run_framework

HERE = os.path.dirname(os.path.abspath(__file__))

#: name -> (V, H): each model's embedding as published (GPT-3's vocabulary padded to 51200, as Megatron pads it).
SHAPES = {
    "mixtral-8x7b": (32000, 4096),
    "llama3-70b": (128256, 8192),
    "gpt3-175b": (51200, 12288),
    "llama3-405b": (128256, 16384),
    "nemotron4-340b": (256000, 18432),
}


def summary(records: list[dict]) -> str:
    """One Markdown table of every shape's points (records carry shape, vocab, hidden)."""
    by = {(r["shape"], r["framework"], r["series"], r["n"], r["dist"]): r for r in records if "shape" in r}
    points = list(dict.fromkeys((r["shape"], r["vocab"], r["hidden"], r["n"], r["dist"]) for r in records if r["series"] == "embwgrad"))
    cols = ["model", "V", "H", "n", "ids", "torch, CUDA graph", "jax embwgrad", "floor", "torch dense", "index_add_", "XLA scatter", "exact"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for shape, vocab, hidden, n, dist in points:
        ms = lambda fw, series: by.get((shape, fw, series, n, dist), {}).get("ms")  # noqa: E731
        floor, graph, mine_jax = ms("torch", "floor"), ms("torch", "embwgrad_graph"), ms("jax", "embwgrad")
        lines.append("| " + " | ".join([
            shape, str(vocab), str(hidden), str(n), dist, over_floor(graph, floor), over_floor(mine_jax, floor),
            "-" if floor is None else f"{floor:.3f} ms",
            over_ours(ms("torch", "dense"), graph), over_ours(ms("torch", "index_add"), graph), over_ours(ms("jax", "xla_scatter"), mine_jax),
            bits_cell([by[(shape, fw, "embwgrad", n, dist)]["exact"] for fw in FRAMEWORKS if (shape, fw, "embwgrad", n, dist) in by]),
        ]) + " |")
    return "\n".join(lines)


def plot(records: list[dict], path: str) -> None:
    """One panel per shape: time against n, log axes, one line a series (run.py's plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys((r["shape"], r["vocab"], r["hidden"]) for r in records if "shape" in r))
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.2 * len(shapes), 4.8), squeeze=False)
    for i, (ax, (name, vocab, hidden)) in enumerate(zip(axes[0], shapes)):
        plot_on(ax, [r for r in records if r.get("shape") == name], f"{name}: V = {vocab}, H = {hidden}", legend=i == len(shapes) - 1)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES), help="names from SHAPES, comma-separated")
    p.add_argument("--ns", default="8192,32768")
    p.add_argument("--dists", default="uniform,zipf")
    p.add_argument("--json", default=os.path.join(HERE, "shapes.json"))
    p.add_argument("--png", default=os.path.join(HERE, "shapes.png"))
    args = p.parse_args(argv)
    unknown = [s for s in args.shapes.split(",") if s not in SHAPES]
    if unknown:
        p.error(f"--shapes: unknown {unknown}; known: {list(SHAPES)}")
    records = []
    for name in args.shapes.split(","):
        vocab, hidden = SHAPES[name]
        passthrough = ["--vocab", str(vocab), "--hidden", str(hidden), "--ns", args.ns, "--dists", args.dists]
        mine = [r for fw in FRAMEWORKS for r in run_framework(fw, passthrough)]
        for r in mine:
            r.update(shape=name, vocab=vocab, hidden=hidden)
        records += mine
    with open(args.json, "w") as f:
        json.dump(records, f, indent=1)
    plot(records, args.png)
    print(f"\nrecords: {args.json}; plot: {args.png}")
    print(summary(records))
    failed = [r for r in records if r["series"] == "FAILED" or r.get("exact") is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
