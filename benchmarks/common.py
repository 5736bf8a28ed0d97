"""What both framework benchmarks share: the grid, the ids, the floor, the record format.

Framework-neutral (NumPy only), like embwgrad_core: each framework's process draws the same
ids from the same seeds and writes records of the same shape.
"""

import json
import os
import sys
from dataclasses import asdict, dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.cases import REAL_H, REAL_V, uniform_ids, zipf_ids  # noqa: E402

GPU_NS = (1024, 4096, 8192, 16384, 32768, 131072)
CPU_NS = (300, 3100)  # under the interpreters: one feature-path and one sort-path size
CPU_V, CPU_H = 1000, 64
DISTS = ("uniform", "zipf")


@dataclass
class Record:
    framework: str  #: "torch" or "jax"
    series: str  #: "embwgrad", "dense", "index_add", "xla_scatter", "floor", ...
    n: int
    dist: str
    ms: float  #: median milliseconds
    exact: bool | None = None  #: bitwise equal to the reference (None: not checked, or not meant to be)
    note: str = ""
    device: str = ""  #: "gpu", or "cpu" (the kernels in the interpreters: times say nothing of a GPU)


def ids_for(dist: str, n: int, vocab: int) -> np.ndarray:
    return (uniform_ids if dist == "uniform" else zipf_ids)(n, vocab, seed=n)


def probe_points(default: list) -> list:
    """The (n, ids) points of a probe: PROBE_POINTS (e.g. 4096:uniform,8192:zipf) where set, else default."""
    if not os.environ.get("PROBE_POINTS"):
        return default
    return [(int(p.split(":")[0]), p.split(":")[1]) for p in os.environ["PROBE_POINTS"].split(",")]


def probe_shape() -> tuple[int, int]:
    """(V, H) of a probe: PROBE_SHAPE (e.g. 128256,16384) where set, else the real shape (REAL_V, REAL_H)."""
    if not os.environ.get("PROBE_SHAPE"):
        return REAL_V, REAL_H
    vocab, hidden = (int(x) for x in os.environ["PROBE_SHAPE"].split(","))
    return vocab, hidden


def floor_bytes(ids: np.ndarray, hidden: int, grad_bytes: int = 2, main_grad_bytes: int = 4) -> int:
    """Bytes that must move: every grad row read once, every touched main_grad row read and written."""
    return ids.size * hidden * grad_bytes + 2 * np.unique(ids).size * hidden * main_grad_bytes


def print_variant_table(head: str, points: list, names: list, results: dict, flag: str) -> None:
    """A probe's variants as a Markdown table: results[(n, dist, name)] = (value, ok) -> one column
    per point, one row per variant, flag after each value whose ok is not true."""
    print(f"| {head} | " + " | ".join(f"{n} {d}" for n, d in points) + " |")
    print("|---" * (len(points) + 1) + "|")
    for name in names:
        cells = [f"{results[(n, d, name)][0]:.1f}" + ("" if results[(n, d, name)][1] else f" {flag}") for n, d in points]
        print(f"| {name} | " + " | ".join(cells) + " |")


def print_table(table: dict, head: str = "us", scale: float = 1.0) -> None:
    """A probe's figures as a Markdown table: {(n, dist): {name: value}} -> one column per point,
    one row per name (the first point's names, in order), each value times scale to one decimal."""
    names = list(next(iter(table.values())))
    print(f"| {head} | " + " | ".join(f"{n} {d}" for n, d in table) + " |")
    print("|---" * (len(table) + 1) + "|")
    for k in names:
        print(f"| {k} | " + " | ".join(f"{table[p][k] * scale:.1f}" for p in table) + " |")


def parse_args(argv=None):
    import argparse

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ns", type=lambda s: tuple(int(x) for x in s.split(",")), default=None)
    p.add_argument("--dists", type=lambda s: tuple(s.split(",")), default=DISTS)
    p.add_argument("--vocab", type=int, default=None)
    p.add_argument("--hidden", type=int, default=None)
    p.add_argument("--json", default=None, help="write records here")
    return p.parse_args(argv)


def sizes(args, on_gpu: bool):
    ns = args.ns or (GPU_NS if on_gpu else CPU_NS)
    vocab = args.vocab or (REAL_V if on_gpu else CPU_V)
    hidden = args.hidden or (REAL_H if on_gpu else CPU_H)
    return ns, vocab, hidden


def write(records, path):
    if path:
        with open(path, "w") as f:
            json.dump([asdict(r) for r in records], f, indent=1)
    for r in records:
        print(f"{r.framework:5s} {r.series:14s} n={r.n:7d} {r.dist:7s} {r.ms:9.4f} ms exact={r.exact} {r.note}", flush=True)
