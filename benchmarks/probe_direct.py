"""The feature path (n <= 3072) in one kernel, with no plan (NOTES v34 item 2): measured, slower.

`_direct_kernel`, program (t, H block): reads every token's id (n int32, one vector load
beside its own grad row), counts the tokens of its id and finds the first. A token whose id
occurs once adds its row (+0 + row, rounded as PyTorch's per-chunk sum) into main_grad; the
token at an id's first position sums all of the id's rows in position order, BATCH at a time,
chunk by chunk (CHUNK positions), folding each chunk's sum as PyTorch does; the id's other
tokens stop. Bitwise against the core reference under the interpreter (12 cases: NaN, inf, -0,
padding, ids out of range, bf16 main_grad) and against the dense path on the H200.

`_block_kernel` (timing only, not exact: ids of several tokens are skipped): program (TB
tokens, H block) counts its tokens' ids against all n once (COUNT), then adds the lone ones.
With COUNT off it is the plan-free copy-add of this structure, a bound for any one-kernel
feature path. H200, graph replay, us (main: the frontend's three kernels):

    1024 uniform: main 34.3, _direct 33.1 (1024 columns, 8 warps), block without count 25.6,
                  block with count 31.5-63.4
    1024 Zipf:    main 40.1, _direct 79.9 (the first token's serial chain), block without count 22.4
    2048 uniform: main 56.3, _direct 74.0, block without count 43.7, with count 60.5-160
    3072 uniform: main 77.9, _direct 174.5, block without count 62.2, with count 98-319

The count is all-pairs in every (token block, H block) program, so it is repeated for every H
block, and every program reads all n ids (_direct at 3072 tokens and 7 H blocks: 260 MB from a
few KB of L2 lines): the one-kernel form loses from 2048 tokens, and at 1024 it saves 1 us on uniform
ids while Zipf ids' serial chains double the call.

    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/probe_direct.py   # CPU: bitwise against the core reference
    PYTHONPATH=. python benchmarks/probe_direct.py                      # GPU: graph times (_direct checked against the dense path)
"""

import os
import sys

import numpy as np
import torch
import triton
import triton.language as tl

import torch_frontend
from embwgrad_core import CHUNK
from embwgrad_core.dtypes import ROUNDING_CODE, bits, dtype_name, numpy_dtype
from torch_frontend.embedding_wgrad import _fold_step, _grad_row, _load_keys, _round


@triton.jit
def _direct_kernel(ids_ptr, grad_ptr, main_grad_ptr, n, num_embeddings, padding_idx, hidden, grad_dim1, grad_stride0, grad_stride1,
                   grad_stride_h, main_grad_stride, N_P2: tl.constexpr, CHUNK_SIZE: tl.constexpr, GRAD_ROUNDING: tl.constexpr,
                   MAIN_ROUNDING: tl.constexpr, BLOCK_H: tl.constexpr, BATCH: tl.constexpr):
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    live = cols < hidden
    key = _load_keys(ids_ptr, t, True, num_embeddings, padding_idx)
    g = tl.load(grad_ptr + _grad_row(t, grad_dim1, grad_stride0, grad_stride1) + cols * grad_stride_h, mask=live, other=0.0)
    idx = tl.arange(0, N_P2)
    keys = _load_keys(ids_ptr, idx, idx < n, num_embeddings, padding_idx)
    same = keys == key
    main_row = main_grad_ptr + key.to(tl.int64) * main_grad_stride
    old = tl.load(main_row + cols, mask=cols < tl.where(key >= 0, hidden, 0), other=0.0).to(tl.float32)
    count = tl.sum(same.to(tl.int32), axis=0)
    first = tl.min(tl.where(same, idx, N_P2), axis=0)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32) + g.to(tl.float32)  # 0 + row: -0 becomes +0, as in PyTorch
    gw = _round(acc, GRAD_ROUNDING)  # a lone token: +0 + round(row) is round(row)
    if count > 1:
        rank = tl.cumsum(same.to(tl.int32), axis=0)  # 1 at the first match
        gw = tl.zeros([BLOCK_H], dtype=tl.float32)
        cur = t // CHUNK_SIZE
        for k0 in range(1, tl.where(first == t, count, 1), BATCH):  # only the first token's program
            for u in tl.static_range(BATCH):
                take = k0 + u < count
                p = tl.sum(tl.where(same & (rank == k0 + u + 1), idx, 0), axis=0)
                gu = tl.load(grad_ptr + _grad_row(p, grad_dim1, grad_stride0, grad_stride1) + cols * grad_stride_h,
                             mask=cols < tl.where(take, hidden, 0), other=0.0).to(tl.float32)
                c = p // CHUNK_SIZE
                new_chunk = take & (c != cur)
                gw = tl.where(new_chunk, _fold_step(gw, acc, True, GRAD_ROUNDING), gw)
                acc = tl.where(new_chunk, tl.zeros([BLOCK_H], dtype=tl.float32) + gu, acc + gu)  # acc is never -0
                cur = tl.where(take, c, cur)
        gw = _fold_step(gw, acc, True, GRAD_ROUNDING)
    add = (key >= 0) & (first == t)
    new = _round(old + gw, MAIN_ROUNDING)
    tl.store(main_row + cols, new.to(main_grad_ptr.dtype.element_ty), mask=cols < tl.where(add, hidden, 0))


@triton.jit
def _block_kernel(ids_ptr, grad_ptr, main_grad_ptr, n, num_embeddings, padding_idx, hidden, grad_stride0, grad_stride_h,
                  main_grad_stride, TB: tl.constexpr, TJ: tl.constexpr, BLOCK_H: tl.constexpr, COUNT: tl.constexpr):
    """Timing only: program (TB tokens, H block) counts its tokens' ids once, adds the lone ones' rows (others skipped)."""
    tok = tl.program_id(0) * TB + tl.arange(0, TB)
    tmask = tok < n
    keyv = _load_keys(ids_ptr, tok, tmask, num_embeddings, padding_idx)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    live = cols < hidden
    g = tl.load(grad_ptr + tok.to(tl.int64)[:, None] * grad_stride0 + cols[None, :] * grad_stride_h, mask=tmask[:, None] & live[None, :],
                other=0.0)
    add = tmask & (keyv >= 0)
    old = tl.load(main_grad_ptr + keyv.to(tl.int64)[:, None] * main_grad_stride + cols[None, :], mask=add[:, None] & live[None, :],
                  other=0.0)
    if COUNT:
        count = tl.zeros([TB], dtype=tl.int32)
        for j0 in range(0, n, TJ):
            jj = j0 + tl.arange(0, TJ)
            kj = _load_keys(ids_ptr, jj, jj < n, num_embeddings, padding_idx)
            count += tl.sum((keyv[:, None] == kj[None, :]).to(tl.int32), axis=1)
        add = add & (count == 1)
    acc = tl.zeros([TB, BLOCK_H], dtype=tl.float32) + g.to(tl.float32)
    tl.store(main_grad_ptr + keyv.to(tl.int64)[:, None] * main_grad_stride + cols[None, :], acc + old, mask=add[:, None] & live[None, :])


def block(ids, grad, main_grad, tb=32, tj=128, block_h=256, warps=4, count=True):
    n, hidden = grad.shape
    _block_kernel[(triton.cdiv(n, tb), triton.cdiv(hidden, block_h))](
        ids, grad, main_grad, n, main_grad.shape[0], -1, hidden, grad.stride(0), grad.stride(1), main_grad.stride(0), TB=tb, TJ=tj,
        BLOCK_H=block_h, COUNT=count, num_warps=warps)


def direct(ids, grad, main_grad, padding_idx=None, block_h=1024, warps=4, batch=8):
    """main_grad += embedding_dense_backward(grad, ids) (feature-path arithmetic), in one launch. ids 1-D, grad [n, H]."""
    n, hidden = grad.shape
    if n == 0 or hidden == 0:
        return
    block_h = min(block_h, triton.next_power_of_2(hidden))
    _direct_kernel[(n, triton.cdiv(hidden, block_h))](
        ids, grad, main_grad, n, main_grad.shape[0], -1 if padding_idx is None else padding_idx, hidden, 1, grad.stride(0), 0,
        grad.stride(1), main_grad.stride(0), N_P2=max(16, triton.next_power_of_2(n)), CHUNK_SIZE=CHUNK, GRAD_ROUNDING=ROUNDING_CODE[dtype_name(grad.dtype)],
        MAIN_ROUNDING=ROUNDING_CODE[dtype_name(main_grad.dtype)], BLOCK_H=block_h, BATCH=batch, num_warps=warps)


def cpu_check():
    from embwgrad_core import reference
    from tests.test_torch_frontend import to_numpy, to_torch

    rng = np.random.default_rng(0)
    bad = 0
    cases = 0
    for n, vocab, hidden, gdt, mdt, pad in [(1, 5, 16, "bfloat16", "float32", None), (40, 6, 24, "bfloat16", "float32", None),
                                            (97, 9, 33, "float32", "float32", 3), (130, 4, 16, "float16", "bfloat16", None),
                                            (200, 300, 40, "bfloat16", "float32", None), (150, 2, 8, "bfloat16", "float32", 0)]:
        ids = rng.integers(0, vocab, n).astype(np.int64)
        if n > 10:
            ids[5] = -1 if pad is None else pad  # out of range / padding
        grad = rng.standard_normal((n, hidden)).astype(np.float32)
        grad[0, :3] = [-0.0, np.nan, np.inf]
        grad = grad.astype(numpy_dtype(gdt))
        main = rng.standard_normal((vocab, hidden)).astype(numpy_dtype(mdt))
        want = bits(reference.accumulate(ids, grad, main, padding_idx=pad, path="feature"))
        for bh, batch in [(16, 8), (8, 3)]:
            work = to_torch(main, "cpu")
            direct(to_torch(ids, "cpu"), to_torch(grad, "cpu"), work, pad, block_h=bh, batch=batch)
            got = bits(to_numpy(work))
            cases += 1
            if not np.array_equal(got, want):
                bad += 1
                print("DIFFERENT", n, vocab, hidden, gdt, mdt, pad, bh, batch, int((got != want).sum()))
    print(f"cpu: {cases - bad} of {cases} bitwise")
    return bad == 0


def gpu_probe():
    sys.path.insert(0, os.path.dirname(__file__))
    from bench_torch import graph_ms, probe_inputs, same_bits

    points = [(1024, "uniform"), (1024, "zipf"), (2048, "uniform"), (3072, "uniform")]
    variants = [(1024, 8, 8), (2048, 8, 8)]
    blocks = [(32, 128, 256, 4, True), (32, 128, 256, 4, False), (16, 128, 512, 4, True), (32, 64, 512, 8, True), (64, 64, 256, 8, True),
              (8, 256, 1024, 4, True), (32, 256, 256, 4, True)]
    for n, dist, _, ids, grad, main_grad, expected in probe_inputs(points):
        work = main_grad.clone()
        res = {"main": graph_ms(lambda: torch_frontend.accumulate(ids, grad, work)) * 1e3}
        for bh, warps, batch in variants:
            work = main_grad.clone()
            direct(ids, grad, work, None, bh, warps, batch)
            ok = same_bits(work, expected)
            ms = graph_ms(lambda: direct(ids, grad, work, None, bh, warps, batch))
            res[f"h{bh} w{warps} b{batch}{'' if ok else ' DIFFERENT'}"] = ms * 1e3
        for tb, tj, bh, warps, count in blocks:
            res[f"blk tb{tb} tj{tj} h{bh} w{warps}{'' if count else ' nocount'}"] = graph_ms(
                lambda: block(ids, grad, work, tb, tj, bh, warps, count)) * 1e3
        res["main again"] = graph_ms(lambda: torch_frontend.accumulate(ids, grad, work)) * 1e3
        print(f"n={n:5d} {dist:7s} " + ", ".join(f"{k} {v:.1f}" for k, v in res.items()), flush=True)


if __name__ == "__main__":
    if torch.cuda.is_available():
        gpu_probe()
    else:
        sys.exit(0 if cpu_check() else 1)
