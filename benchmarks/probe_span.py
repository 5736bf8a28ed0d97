"""Does the copy-add's speed depend on how far apart, in memory, the main_grad rows in flight lie? (NOTES v17)

Session 17's stream probe: the plain copy-add (probe_stream's baseline, one program per (token,
1024-column block)) runs 150.9 us at 8192 uniform ids, 147.2 with the ids sorted, 143.1 on 8192
consecutive rows, whose own floor is 138.1; at 32768 uniform ids 579.7 unsorted, 524.5 sorted.
Same bytes, different order: so the rows' order in memory matters, and this probe asks what
about it. Every case moves n distinct main_grad rows (no repeated ids, so no races and the same
bytes), and times the copy-add in graph replay:

- seq: rows 1000 .. 1000 + n, in order; local: the same rows shuffled (a span of n rows);
- sparse sorted: rows V/n apart over the whole [V, H] table, in order; sparse random: shuffled;
- sparse, shuffled in windows of W tokens (the sorted list cut into windows, each shuffled):
  how small the span of the rows in flight must be;
- the same with the grad rows read in a random order (the partials kernel reads grad rows by
  position, in key order);
- torch's device copy of the same bytes.

    python benchmarks/probe_span.py

Measured on the H200 (NOTES v17 item 3): 8192 consecutive rows in order 143.5 us, the same rows
shuffled 149.4, rows V/n apart 154.8 sorted and 155.3 shuffled (torch's copy 141.8): scattered
rows cost about 8% whatever their order.
"""

import sys

import torch
import triton
import triton.language as tl
from bench_torch import copy_bandwidth, graph_ms
from probe_stream import copy_us

from tests.cases import REAL_H, REAL_V


@triton.jit
def _stream_pos(ids_ptr, pos_ptr, grad_ptr, main_ptr, hidden, BLOCK_H: tl.constexpr):
    """main_grad[ids[i]] += grad[pos[i]] over (i, H block) items, H block fastest: one item per program."""
    w = tl.program_id(0)
    num_hb = tl.cdiv(hidden, BLOCK_H)
    i = w // num_hb
    cols = (w % num_hb) * BLOCK_H + tl.arange(0, BLOCK_H)
    m = cols < hidden
    row = tl.load(ids_ptr + i).to(tl.int64)
    p = tl.load(pos_ptr + i).to(tl.int64)
    g = tl.load(grad_ptr + p * hidden + cols, mask=m).to(tl.float32)
    old = tl.load(main_ptr + row * hidden + cols, mask=m)
    tl.store(main_ptr + row * hidden + cols, old + g, mask=m)


def windows_shuffled(rows: torch.Tensor, w: int, gen: torch.Generator) -> torch.Tensor:
    """rows cut into windows of w, each shuffled."""
    n = rows.numel()
    order = torch.cat([torch.randperm(min(w, n - s), generator=gen) + s for s in range(0, n, w)])
    return rows[order]


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    main_grad = torch.randn(REAL_V, REAL_H, device="cuda")
    bw = copy_bandwidth()
    print(f"copy bandwidth (1 GiB copy): {bw / 1e9:.3f} TB/s", flush=True)
    table = {}
    for n in (4096, 8192, 32768):
        grad = torch.randn(n, REAL_H, device="cuda").bfloat16()
        ident = torch.arange(n)
        shuffled = torch.randperm(n, generator=gen)
        seq = 1000 + ident
        sparse = ident * (REAL_V // n)
        cases = {
            "seq": (seq, ident),
            "local random": (seq[shuffled], ident),
            "sparse sorted": (sparse, ident),
            "sparse random": (sparse[shuffled], ident),
        }
        for w in (64, 256, 1024, 4096):
            if w < n:
                cases[f"sparse, windows of {w} shuffled"] = (windows_shuffled(sparse, w, gen), ident)
        cases["seq, grad random"] = (seq, shuffled)
        cases["sparse sorted, grad random"] = (sparse, shuffled)
        cases["sparse random, grad random"] = (sparse[shuffled], torch.randperm(n, generator=gen))
        nbytes = n * REAL_H * (2 + 8)
        res = {"floor (these bytes)": nbytes / bw * 1e3, "torch copy, same bytes": copy_us(nbytes)}
        for name, (ids, pos) in cases.items():
            ids_d, pos_d = ids.to(torch.int32).cuda(), pos.to(torch.int32).cuda()
            items = n * triton.cdiv(REAL_H, 1024)
            res[name] = graph_ms(lambda ids_d=ids_d, pos_d=pos_d: _stream_pos[(items,)](
                ids_d, pos_d, grad, main_grad, REAL_H, BLOCK_H=1024, num_warps=1)) * 1e3
        for k, v in res.items():
            print(f"n={n:6d} {k:36s} {v:8.1f} us", flush=True)
        table[n] = res
    names = list(next(iter(table.values())))
    print("| us | " + " | ".join(f"{n} distinct rows" for n in table) + " |")
    print("|---" * (len(table) + 1) + "|")
    for k in names:
        print(f"| {k} | " + " | ".join(f"{table[n][k]:.1f}" if k in table[n] else "-" for n in table) + " |")


if __name__ == "__main__":
    sys.exit(main())
