"""The main job: exactness and speed of embwgrad on this machine, printed as a table last.

Runs one process per framework (bench_torch.py, bench_jax.py), merges their records into
JSON, draws a PNG (time against n, log axes, one line a series) and prints a markdown table
with each embwgrad time's ratio to the floor and to each peer measured in the same run.
On a GPU: V = 129280, H = 7168, bf16 grad into fp32 main_grad. On a CPU: a small shape
through Triton's interpreter and Pallas interpret mode (exactness; times are the
interpreters', not a GPU's).

    python benchmarks/run.py [--ns 4096,8192] [--dists uniform] [--json out.json] [--png out.png]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FRAMEWORKS = ("torch", "jax")
PEERS = {"torch": ("dense", "index_add"), "jax": ("xla_scatter",)}


def run_framework(framework: str, passthrough: list[str]) -> list[dict]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    cmd = [sys.executable, os.path.join(HERE, f"bench_{framework}.py"), "--json", path, *passthrough]
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, env=env, cwd=HERE)
    if proc.returncode != 0:
        print(f"bench_{framework}.py failed with exit code {proc.returncode}", flush=True)
        return [{"framework": framework, "series": "FAILED", "n": 0, "dist": "-", "ms": float("nan"), "exact": False, "note": ""}]
    with open(path) as f:
        return json.load(f)


def over_floor(ms: float | None, floor: float | None) -> str:
    """A table cell: an embwgrad time and its ratio to the floor ("-": not measured)."""
    if ms is None:
        return "-"
    return f"{ms:.3f} ms" + (f" ({ms / floor:.2f}x floor)" if floor else "")


def over_ours(ms: float | None, mine: float | None) -> str:
    """A table cell: a peer's time and its ratio to ours ("-": not measured)."""
    if ms is None:
        return "-"
    return f"{ms:.3f} ms" + (f" ({ms / mine:.1f}x ours)" if mine else "")


def bits_cell(exact: list) -> str:
    """A table cell from the embwgrad records' exact flags at a point (None: not checked there)."""
    checked = [e for e in exact if e is not None]
    return ("bitwise" if all(checked) else "NO") if checked else "not checked"


def table(records: list[dict]) -> str:
    by = {(r["framework"], r["series"], r["n"], r["dist"]): r for r in records}
    points = sorted({(r["n"], r["dist"]) for r in records if r["series"] == "embwgrad"})
    floor = {p: by.get(("torch", "floor", *p), {}).get("ms") for p in points}
    cols = ["n", "ids", "torch embwgrad", "torch, CUDA graph", "jax embwgrad", "floor", "torch dense", "index_add_", "XLA scatter", "exact"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]

    def ms(fw, series, p):
        return by.get((fw, series, *p), {}).get("ms")

    for p in points:
        lines.append(
            "| "
            + " | ".join(
                [
                    str(p[0]),
                    p[1],
                    over_floor(ms("torch", "embwgrad", p), floor[p]),
                    over_floor(ms("torch", "embwgrad_graph", p), floor[p]),
                    over_floor(ms("jax", "embwgrad", p), floor[p]),
                    f"{floor[p]:.3f} ms" if floor[p] else "-",
                    over_ours(ms("torch", "dense", p), ms("torch", "embwgrad", p)),
                    over_ours(ms("torch", "index_add", p), ms("torch", "embwgrad", p)),
                    over_ours(ms("jax", "xla_scatter", p), ms("jax", "embwgrad", p)),
                    bits_cell([by[(fw, "embwgrad", *p)]["exact"] for fw in FRAMEWORKS if (fw, "embwgrad", *p) in by]),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def plot(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    plot_on(ax, records, "embedding weight gradient into fp32 main_grad")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_on(ax, records: list[dict], title: str, legend: bool = True) -> None:
    """Time against n on ax, log axes, one line a series (one colour a series, one line style a distribution)."""
    series = sorted({(r["framework"], r["series"]) for r in records if ":" not in r["series"] and r["series"] != "FAILED"})
    colors = {s: f"C{i}" for i, s in enumerate(series)}  # one colour a series, one line style a distribution
    for dist, style in (("uniform", "-"), ("zipf", "--")):
        for fw, name in series:
            pts = sorted((r["n"], r["ms"]) for r in records if (r["framework"], r["series"], r["dist"]) == (fw, name, dist))
            if pts:
                label = f"{name} ({fw}), {dist}" if name != "floor" else f"floor, {dist}"
                ax.plot(*zip(*pts), style, color=colors[(fw, name)], marker="o" if dist == "uniform" else "s", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens n")
    ax.set_ylabel("median time (ms)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if legend:
        ax.legend(fontsize=7)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="default: benchmarks/results.json from a GPU, results-cpu.json from the interpreters")
    p.add_argument("--png", help="default: benchmarks/results.png from a GPU, results-cpu.png from the interpreters")
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    args, passthrough = p.parse_known_args()
    records = []
    for fw in args.frameworks.split(","):
        records += run_framework(fw, passthrough)
    # The README's table and plot are drawn from results.json and results.png: a run on a CPU
    # (interpreter times) writes beside them, git-ignored, rather than over them.
    on_gpu = any(r.get("device") == "gpu" for r in records)
    args.json = args.json or os.path.join(HERE, "results.json" if on_gpu else "results-cpu.json")
    args.png = args.png or os.path.join(HERE, "results.png" if on_gpu else "results-cpu.png")
    with open(args.json, "w") as f:
        json.dump(records, f, indent=1)
    plot(records, args.png)
    failed = [r for r in records if r["series"] == "FAILED" or r.get("exact") is False]
    print(f"\nrecords: {args.json}; plot: {args.png}")
    print(table(records))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
