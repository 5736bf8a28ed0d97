"""The JAX twin of probe_hash.py's count + stream (NOTES v15): can Pallas do the sort-free plan?

A count kernel adds 1 per token into a zeroed int32 [V] array with one scalar Pallas atomic per
token (a vector of indices did not count on the H200, NOTES v13 item 2), the old value being
the token's arrival rank, and writes the position into the id's rank-th slot of a [V, K] table.
A stream kernel takes one (token, 1024 columns) item per program: a count of 1 adds the row, a
run of 2..K tokens is added by its token at the smallest position, summing the rows in position
order from +0. Ids occurring more than K times are skipped (no long route here), so only points
whose ids all occur at most K times are checked bit for bit (against the core reference).
Timed as bench_jax times the frontend: chains of donated calls, beside the frontend's own call.

    PYTHONPATH=.:benchmarks python benchmarks/probe_hash_jax.py ["count+stream,count+stream t64"]

Without a GPU it checks its kernels in Pallas interpret mode against the core reference.
"""

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from embwgrad_core import reference
from jax_frontend import embedding_wgrad as ew

ON_GPU = jax.default_backend() == "gpu"
K = 8


def _count_kernel(ids_ref, counts_in_ref, counts_ref, table_ref, *, n: int, tokens: int, branchless: bool):
    """Program c counts tokens [c * tokens, (c + 1) * tokens), one scalar atomic each (unrolled).

    branchless (n a multiple of tokens): no pl.when around the atomic and the table store (a
    masked one-element store instead), so that the next token's atomic need not wait for this
    one's value. On the H200 it made no difference: a Pallas atomic (acquire-release) costs a
    round trip, one after another within a program, about 0.77 us each (NOTES v16 item 2).
    """
    del counts_in_ref
    c = pl.program_id(0)

    def count(u):
        key = ids_ref[u].astype(jnp.int32)
        rank = plgpu.atomic_add(counts_ref, key, jnp.int32(1))
        if branchless:
            slot = key * K + jnp.minimum(rank, K - 1)
            plgpu.store(table_ref.at[pl.ds(slot, 1)], jnp.full((1,), u, jnp.int32), mask=jnp.full((1,), rank < K))
        else:

            @pl.when(rank < K)
            def _():
                table_ref[key * K + rank] = u

    for t in range(tokens):
        u = c * tokens + t
        if branchless:
            count(u)
        else:
            pl.when(u < n)(functools.partial(count, u))


def _stream_kernel(ids_ref, grad_ref, counts_ref, table_ref, main_in_ref, main_ref, *, hidden: int, block_h: int):
    """Item (token i, H block): a lone token adds its row; the first token of a run of 2..K adds the run."""
    del main_in_ref
    num_hb = pl.cdiv(hidden, block_h)
    w = pl.program_id(0)
    i = w // num_hb
    h0 = (w % num_hb) * block_h
    cols = h0 + lax.iota(jnp.int32, block_h)
    live = cols < hidden
    block = pl.ds(h0, block_h)
    key = ids_ref[i].astype(jnp.int32)
    g = plgpu.load(grad_ref.at[i, block], mask=live, other=0).astype(jnp.float32)
    c = counts_ref[key]

    @pl.when(c == 1)
    def _():
        ew._add_to_row(main_ref, key, h0, live, ew._round(g + 0.0, "bfloat16"), "float32")

    @pl.when((c > 1) & (c <= K))
    def _():
        slots = lax.iota(jnp.int32, K)
        p = plgpu.load(table_ref.at[key * K + slots], mask=slots < c, other=jnp.iinfo(jnp.int32).max)

        @pl.when(jnp.min(p) == i)
        def _():
            rank = jnp.sum((p[None, :] < p[:, None]).astype(jnp.int32), axis=1)
            s = jnp.zeros((block_h,), jnp.float32) + g  # its own row is the first
            for j in range(1, K):
                pj = jnp.sum(jnp.where(rank == j, p, 0))
                take = live & (j < c)
                s = s + plgpu.load(grad_ref.at[jnp.where(j < c, pj, 0), block], mask=take, other=0).astype(jnp.float32)
            ew._add_to_row(main_ref, key, h0, live, ew._round(s, "bfloat16"), "float32")


def _params(warps: int):
    return plgpu.CompilerParams(num_warps=warps, num_stages=1)


@functools.partial(jax.jit, static_argnames=("tokens", "warps", "block_h", "branchless"), donate_argnames=("main_grad",))
def count_stream(ids, grad, main_grad, *, tokens: int = 32, warps: int = 4, block_h: int = 1024, branchless: bool = False):
    n, hidden = grad.shape
    if branchless and n % tokens:
        raise ValueError(f"branchless needs n={n} to be a multiple of tokens={tokens}")
    vocab = main_grad.shape[0]
    interpret = not ON_GPU
    counts, table = pl.pallas_call(
        functools.partial(_count_kernel, n=n, tokens=tokens, branchless=branchless),
        out_shape=(jax.ShapeDtypeStruct((vocab,), jnp.int32), jax.ShapeDtypeStruct((vocab * K,), jnp.int32)),
        grid=(pl.cdiv(n, tokens),),
        input_output_aliases={1: 0},
        compiler_params=_params(1),
        interpret=interpret,
        name="hash_count",
    )(ids, jnp.zeros((vocab,), jnp.int32))
    return pl.pallas_call(
        functools.partial(_stream_kernel, hidden=hidden, block_h=block_h),
        out_shape=jax.ShapeDtypeStruct(main_grad.shape, main_grad.dtype),
        grid=(n * pl.cdiv(hidden, block_h),),
        input_output_aliases={4: 0},
        compiler_params=_params(warps),
        interpret=interpret,
        name="hash_stream",
    )(ids, grad, counts, table, main_grad)


VARIANTS = {"count+stream": {}, "count+stream t64": {"tokens": 64}, "count+stream t16": {"tokens": 16},
            "count+stream w1": {"warps": 1}, "count+stream t4": {"tokens": 4}, "count+stream t1": {"tokens": 1},
            "count+stream t32 branchless": {"branchless": True}, "count+stream t4 branchless": {"tokens": 4, "branchless": True}}


def check(ids_np, grad, main_grad, **kw):
    """count_stream against the core reference, bit for bit (every id at most K times)."""
    expected = reference.accumulate(ids_np, np.asarray(grad), np.asarray(main_grad), path="sort")
    got = count_stream(jnp.asarray(ids_np), grad, jnp.array(main_grad), **kw)
    return bool((np.asarray(got).view(np.int32) == np.asarray(expected).view(np.int32)).all())


def cpu_check():
    vocab, hidden = 50, 80
    rng = np.random.default_rng(0)
    for name, kw in VARIANTS.items():
        for n in (64, 128):
            ids_np = rng.integers(0, vocab, n)
            while np.bincount(ids_np).max() > K:
                ids_np = rng.integers(0, vocab, n)
            key = jax.random.PRNGKey(n)
            grad = jax.random.normal(key, (n, hidden), jnp.float32).astype(jnp.bfloat16)
            main_grad = jax.random.normal(jax.random.fold_in(key, 1), (vocab, hidden), jnp.float32)
            ok = check(ids_np, grad, main_grad, **kw)
            print(f"cpu {name:18s} n={n:4d}: {'bitwise' if ok else 'DIFFERENT'}", flush=True)
            assert ok


def main():
    if not ON_GPU:
        return cpu_check()
    from bench_jax import chain_ms, exact_rows
    from common import ids_for, print_table, probe_points

    from tests.cases import REAL_H, REAL_V

    names = [v for v in (sys.argv[1] if len(sys.argv) > 1 else "").split(",") if v] or list(VARIANTS)
    key = jax.random.PRNGKey(0)
    main_grad = jax.random.normal(key, (REAL_V, REAL_H), jnp.float32)
    rows = {}
    for n, dist in probe_points([(4096, "uniform"), (8192, "uniform"), (16384, "uniform"), (8192, "zipf")]):
        ids_np = ids_for(dist, n, REAL_V)
        ids = jnp.asarray(ids_np)
        grad = jax.random.normal(jax.random.fold_in(key, n), (n, REAL_H), jnp.float32).astype(jnp.bfloat16)
        fits = np.bincount(ids_np).max() <= K
        res = {}
        res["frontend"], main_grad = chain_ms(lambda m: ew.accumulate(ids, grad, m), main_grad)
        for name in names:
            kw = VARIANTS[name]
            note = "timing only (ids above K skipped)"
            if fits:
                rows_np = np.unique(ids_np)
                before = np.asarray(main_grad[rows_np])
                after = count_stream(ids, grad, main_grad, **kw)
                main_grad = after
                note = "bitwise" if exact_rows(ids_np, grad, before, np.asarray(after[rows_np]), REAL_V) else "DIFFERENT"
            res[name], main_grad = chain_ms(lambda m, kw=kw: count_stream(ids, grad, m, **kw), main_grad)
            print(f"n={n:6d} {dist:7s} {name:20s} {res[name] * 1e3:8.1f} us  {note}", flush=True)
        print(f"n={n:6d} {dist:7s} frontend {res['frontend'] * 1e3:.1f} us", flush=True)
        rows[(n, dist)] = res
    print_table(rows, "us (JAX chains)", 1e3)


if __name__ == "__main__":
    sys.exit(main())
