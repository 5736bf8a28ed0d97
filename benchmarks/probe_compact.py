"""How long the masked route's compaction pass takes (NOTES v55 items 4-5), checked against the core.

    python benchmarks/probe_compact.py                          (GPU: Megatron's TP 8 ids, CUDA graphs)
    TRITON_INTERPRET=1 python benchmarks/probe_compact.py --check   (CPU: small cases, the interpreter)

`embwgrad_core.masked_compaction` as two Triton kernels, one prefix count over positions: the
first counts each block's masked tokens of MASKED_LOOKUP_ID; the second sums the counts of the
blocks before its own (at most a few hundred int32), adds its block's exclusive cumsum, and
writes each kept token's position, key and left-out count at its slot (position less its
left-out count), and m. No program waits on another, so no spin and nothing the interpreter
cannot run. Timed alone in a CUDA graph, beside the torch frontend's masked call on the same
input, for the cost a masked route would add before a plan over m tokens.
"""

import os
import sys

import numpy as np
import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from embwgrad_core import MASKED_LOOKUP_ID, masked_compaction  # noqa: E402
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: E402

from torch_frontend import embedding_wgrad as ew  # noqa: E402
from torch_frontend.embedding_wgrad import _load_keys  # noqa: E402


@triton.jit
def _marked_counts_kernel(
    ids_ptr,  # [n] int32/int64 token ids
    masked_ptr,  # [n] uint8, nonzero where masked
    counts_ptr,  # [blocks] int32 out: masked tokens of MASKED_ID in each block
    n,
    num_embeddings,
    padding_idx,
    MASKED_ID: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:  # (the compact kernel's loads of its own block need nothing from this one)
        gdc_launch_dependents()
        gdc_wait()
    t = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = t < n
    key = _load_keys(ids_ptr, t, live, num_embeddings, padding_idx)
    marked = (tl.load(masked_ptr + t, mask=live, other=0) != 0) & (key == MASKED_ID)
    tl.store(counts_ptr + tl.program_id(0), tl.sum(marked.to(tl.int32), axis=0))


@triton.jit
def _compact_kernel(
    ids_ptr,  # [n] int32/int64 token ids
    masked_ptr,  # [n] uint8
    counts_ptr,  # [blocks] int32: _marked_counts_kernel's
    kept_pos_ptr,  # [n] int32 out: kept positions, ascending (first m)
    kept_keys_ptr,  # [n] int32 out: their keys
    before_ptr,  # [n] int32 out: left-out tokens before each
    m_ptr,  # [1] int32 out: kept tokens
    n,
    num_embeddings,
    padding_idx,
    MASKED_ID: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCKS_P2: tl.constexpr,  # next power of two of the number of blocks
    PDL: tl.constexpr,  # launched while the counts kernel runs: its own block read first, then the wait
):
    b = tl.program_id(0)
    t = b * BLOCK + tl.arange(0, BLOCK)
    live = t < n
    key = _load_keys(ids_ptr, t, live, num_embeddings, padding_idx)
    marked = ((tl.load(masked_ptr + t, mask=live, other=0) != 0) & (key == MASKED_ID)).to(tl.int32)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    blocks = tl.arange(0, BLOCKS_P2)
    e0 = tl.sum(tl.load(counts_ptr + blocks, mask=blocks < b, other=0), axis=0)
    e = e0 + tl.cumsum(marked, axis=0) - marked  # marked tokens before each position
    before = tl.maximum(e - 1, 0)
    kept = live & ((marked == 0) | (e == 0))
    slot = t - before
    tl.store(kept_pos_ptr + slot, t, mask=kept)
    tl.store(kept_keys_ptr + slot, key, mask=kept)
    tl.store(before_ptr + slot, before, mask=kept)
    if b == tl.num_programs(0) - 1:
        total = e0 + tl.sum(marked, axis=0)
        tl.store(m_ptr, n - tl.maximum(total - 1, 0))


def compact(ids, masked_u8, num_embeddings: int, padding_idx: int, block: int, warps: int, pdl: bool = False, out=None):
    """(kept_pos, kept_keys, before, m, counts) on the device; out reuses the buffers. pdl: both
    kernels launched with programmatic dependent launch (the torch frontend's _Launcher)."""
    n = ids.numel()
    blocks = triton.cdiv(n, block)
    if out is None:
        out = tuple(torch.empty(n, dtype=torch.int32, device=ids.device) for _ in range(3)) + (
            torch.empty(1, dtype=torch.int32, device=ids.device), torch.empty(blocks, dtype=torch.int32, device=ids.device))
    kept_pos, kept_keys, before, m, counts = out
    launch = ew._Launcher()
    launch(_marked_counts_kernel, (blocks,), (ids, masked_u8, counts, n, num_embeddings, padding_idx), warps, pdl=pdl,
           MASKED_ID=MASKED_LOOKUP_ID, BLOCK=block)
    launch(_compact_kernel, (blocks,), (ids, masked_u8, counts, kept_pos, kept_keys, before, m, n, num_embeddings, padding_idx), warps,
           pdl=pdl, MASKED_ID=MASKED_LOOKUP_ID, BLOCK=block, BLOCKS_P2=triton.next_power_of_2(blocks))
    return out


def check(ids_np, masked_np, num_embeddings, padding_idx, block, warps, device, pdl=False) -> bool:
    """The kernels' outputs against embwgrad_core.masked_compaction, exactly."""
    want_pos, want_keys, want_before = masked_compaction(ids_np, num_embeddings, masked_np, padding_idx=padding_idx)
    ids = torch.from_numpy(ids_np).to(device)
    masked_u8 = torch.from_numpy(masked_np.astype(np.uint8)).to(device)
    kept_pos, kept_keys, before, m, _ = compact(ids, masked_u8, num_embeddings, padding_idx, block, warps, pdl)
    m = int(m.item())
    return (m == want_pos.size and np.array_equal(kept_pos[:m].cpu().numpy(), want_pos)
            and np.array_equal(kept_keys[:m].cpu().numpy(), want_keys) and np.array_equal(before[:m].cpu().numpy(), want_before))


def cpu_check():
    rng = np.random.default_rng(0)
    ok = True
    for n, share, block, padding_idx in [(1, 1.0, 64, -1), (300, 0.5, 64, -1), (1000, 0.875, 128, -1), (1000, 0.875, 128, 0),
                                         (777, 0.0, 64, 3), (640, 1.0, 64, -1)]:
        masked = rng.random(n) < share
        ids = np.where(masked | (rng.random(n) < 0.2), 0, rng.integers(-2, 50, n))
        good = check(ids, masked, 48, padding_idx, block, 4, "cpu")
        ok &= good
        print(f"n={n} masked share {share} BLOCK={block} padding_idx={padding_idx}: {'exact' if good else 'DIFFERENT'}", flush=True)
    return ok


def gpu_probe():
    from bench_torch import graph_ms
    from probe_tp import torch_inputs

    import torch_frontend

    points = [(int(p.split(":")[0]), int(p.split(":")[1])) for p in os.environ.get("PROBE_POINTS", "8192:8,32768:8,65536:8").split(",")]
    variants = [(256, 4, False), (512, 4, False), (256, 4, True), (512, 4, True), (1024, 4, True)]
    rows = []
    for n, tp in points:
        ids, grad, main_grad, local, inside = torch_inputs(n, tp)
        masked = torch.from_numpy(~inside).cuda()
        masked_u8 = masked.view(torch.uint8)
        t_masked = graph_ms(lambda: torch_frontend.accumulate(ids, grad, main_grad, masked=masked)) * 1e3
        cells = []
        for block, warps, pdl in variants:
            good = check(local, ~inside, main_grad.shape[0], -1, block, warps, "cuda", pdl)
            out = compact(ids, masked_u8, main_grad.shape[0], -1, block, warps, pdl)
            t = graph_ms(lambda: compact(ids, masked_u8, main_grad.shape[0], -1, block, warps, pdl, out)) * 1e3
            cells.append(f"{t:.1f}{'' if good else ' DIFFERENT'}")
        rows.append((n, tp, t_masked, cells))
        print(f"n={n} TP={tp}: masked call {t_masked:.1f} us; compaction {dict(zip(variants, cells))}", flush=True)
    print("\n| tokens, TP | masked call | " + " | ".join(f"compaction {b} x {w} warps{', PDL' if p else ''}" for b, w, p in variants) + " |")
    print("|---|---|" + "---|" * len(variants))
    for n, tp, t_masked, cells in rows:
        print(f"| {n}, {tp} | {t_masked:.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if "--check" in sys.argv:
        sys.exit(0 if cpu_check() else 1)
    gpu_probe()
