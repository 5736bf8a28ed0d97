"""A target for Nsight Compute: calls of the JAX frontend at one point, three per variant.

    ncu -k regex:embwgrad --launch-skip 8 --launch-count 4 ... python benchmarks/ncu_target_jax.py 8192 uniform
    ncu -k regex:merge_rank ... python benchmarks/ncu_target_jax.py 8192 uniform merge

The variants (_Config overrides) are printed in launch order.
"""

import sys

import jax
import jax.numpy as jnp
from common import ids_for

from jax_frontend import embedding_wgrad as ew
from tests.cases import REAL_H, REAL_V

VARIANTS = {
    "default": ((),),
    "merge": (
        (),
        (("merge_u", 16),),
        (("merge_u", 8),),
        (("merge_u", 64),),
        (("num_warps", 8),),
        (("num_warps", 2), ("merge_u", 16)),
        (("unroll", False),),
    ),
}


def main(argv):
    n, dist = int(argv[0]), argv[1]
    key = jax.random.PRNGKey(0)
    main_grad = jax.random.normal(key, (REAL_V, REAL_H), jnp.float32)
    grad = jax.random.normal(jax.random.fold_in(key, n), (n, REAL_H), jnp.float32).astype(jnp.bfloat16)
    ids = jnp.asarray(ids_for(dist, n, REAL_V), jnp.int32)
    for overrides in VARIANTS[argv[2] if len(argv) > 2 else "default"]:
        print("variant", dict(overrides), flush=True)
        for _ in range(3):
            main_grad = ew._accumulate(ids, grad, main_grad, overrides=overrides)
        main_grad.block_until_ready()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
