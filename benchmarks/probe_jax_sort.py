"""The JAX frontend's sort routes, whole calls (benchmarks/NOTES.md v6): the default route at
each point and, above 8192 tokens, lax.sort (the route above MERGE_SORT_MAX_TOKENS) forced.
Each variant is first checked against the core's NumPy reference on the touched rows, then
timed as a median of chains of donated calls (bench_jax.chain_ms).

    python benchmarks/probe_jax_sort.py [label]
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from bench_jax import chain_ms, exact_rows
from common import ids_for

from embwgrad_core import key_packing
from jax_frontend import embedding_wgrad as ew
from tests.cases import REAL_H, REAL_V

POINTS = [(4096, "uniform"), (8192, "uniform"), (8192, "zipf"), (16384, "uniform"), (32768, "uniform"), (32768, "zipf")]


def exact(ids, grad, main_grad, overrides) -> bool:
    """One call on a copy of main_grad, its touched rows against the core reference (bench_jax.exact_rows)."""
    ids_np = np.asarray(ids)
    rows = np.unique(ids_np)
    after = ew._accumulate(ids, grad, jnp.array(main_grad), overrides=overrides)
    return exact_rows(ids_np, np.asarray(grad), np.asarray(main_grad[rows]), np.asarray(after[rows]), REAL_V)


def main(argv):
    label = argv[0] if argv else ""
    key = jax.random.PRNGKey(0)
    main_grad = jax.random.normal(key, (REAL_V, REAL_H), jnp.float32)
    for n, dist in POINTS:
        grad = jax.random.normal(jax.random.fold_in(key, n), (n, REAL_H), jnp.float32).astype(jnp.bfloat16)
        ids = jnp.asarray(ids_for(dist, n, REAL_V), jnp.int32)
        library = ew.PACKED if key_packing(n, REAL_V).dtype == "uint32" else ew.PAIRS
        variants = [()] + ([(("sort", library),)] if n > 8192 else [])
        for overrides in variants:
            ok = exact(ids, grad, main_grad, overrides)
            ms, main_grad = chain_ms(lambda mg, o=overrides: ew._accumulate(ids, grad, mg, overrides=o), main_grad)
            print(f"{label} n={n:6d} {dist:7s} {str(dict(overrides)):20s} {ms * 1e3:8.1f} us exact={ok}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
