"""Where the JAX frontend's time goes (for benchmarks/NOTES.md): whole calls with each partials,
long-run and merge setting. Medians of chains of donated calls (bench_jax.chain_ms).

    python benchmarks/probe_jax.py
"""

import sys

import jax
import jax.numpy as jnp
from bench_jax import chain_ms
from common import ids_for

from jax_frontend import embedding_wgrad as ew
from tests.cases import REAL_H, REAL_V

POINTS = [(4096, "uniform"), (8192, "uniform"), (8192, "zipf"), (32768, "uniform")]
VARIANTS = (
    (),
    (("prefetch", False),),
    (("partial_programs", 64 * ew._gpu_sms()),),
    (("partial_warps", 1),),
    (("block_h", 512), ("partial_warps", 1)),
    (("long_batch", 16), ("long_block_h", 256), ("long_warps", 4)),
    (),
)


def main():
    key = jax.random.PRNGKey(0)
    main_grad = jax.random.normal(key, (REAL_V, REAL_H), jnp.float32)
    for n, dist in POINTS[:3]:
        grad = jax.random.normal(jax.random.fold_in(key, n), (n, REAL_H), jnp.float32).astype(jnp.bfloat16)
        ids = jnp.asarray(ids_for(dist, n, REAL_V), jnp.int32)
        for overrides in VARIANTS:
            ms, main_grad = chain_ms(lambda mg, o=overrides: ew._accumulate(ids, grad, mg, overrides=o), main_grad)
            print(f"n={n:6d} {dist:7s} whole call {dict(overrides)}: {ms:.4f} ms", flush=True)


if __name__ == "__main__":
    sys.exit(main())
