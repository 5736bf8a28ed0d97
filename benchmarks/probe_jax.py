"""Where the JAX frontend's time goes (for benchmarks/NOTES.md): whole calls with each sort and
partials setting, and the merge-rank sort alone. Medians of chains of donated calls.

    python benchmarks/probe_jax.py
"""

import statistics
import sys
import time

import jax
import jax.numpy as jnp
from common import ids_for

from embwgrad_core import torch_path
from jax_frontend import embedding_wgrad as ew
from tests.cases import REAL_H, REAL_V


def chain_ms(step, state, reps=20, repeats=7):
    state = step(state)
    jax.block_until_ready(state)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(reps):
            state = step(state)
        jax.block_until_ready(state)
        times.append((time.perf_counter() - t) * 1e3 / reps)
    return statistics.median(times), state


def main():
    key = jax.random.PRNGKey(0)
    main_grad = jax.random.normal(key, (REAL_V, REAL_H), jnp.float32)
    for n in (8192, 16384, 32768):
        grad = jax.random.normal(jax.random.fold_in(key, n), (n, REAL_H), jnp.float32).astype(jnp.bfloat16)
        ids = jnp.asarray(ids_for("uniform", n, REAL_V), jnp.int32)
        problem = ew._check(ids, grad, main_grad, None)
        for overrides in ((), (("sort", ew.PACKED),), (("partial_warps", 2),), (("partial_warps", 4),), (("slot_major", False),)):
            ms, main_grad = chain_ms(lambda mg, o=overrides: ew._accumulate(ids, grad, mg, overrides=o), main_grad)
            print(f"n={n:6d} whole call {dict(overrides)}: {ms:.4f} ms", flush=True)
        cfg = ew._config(problem, torch_path(n))
        merge = jax.jit(lambda i: ew._merge_sort(i, problem, cfg))
        ms, _ = chain_ms(lambda state: merge(ids), ids)
        print(f"n={n:6d} merge sort alone {cfg.merge_block=} {cfg.merge_u=}: {ms:.4f} ms", flush=True)
        for block_i, lanes in ((64, 1024), (256, 1024), (64, 2048)):
            c = ew._config(problem, torch_path(n), (("merge_block_i", block_i), ("merge_u", max(1, lanes // cfg.merge_blocks))))
            merge = jax.jit(lambda i, c=c: ew._merge_sort(i, problem, c))
            ms, _ = chain_ms(lambda state: merge(ids), ids)
            print(f"n={n:6d} merge sort alone block_i={block_i} lanes={lanes}: {ms:.4f} ms", flush=True)


if __name__ == "__main__":
    sys.exit(main())
