"""Temporary diagnostic (lone tokens in the JAX merge kernel on the GPU)."""
import sys, numpy as np, jax, jax.numpy as jnp
from jax import lax
sys.path.insert(0, "benchmarks")
from common import ids_for
from jax_frontend import embedding_wgrad as ew
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

import os
n, V, H = (int(x) for x in os.environ.get("DIAG", "4096,129280,7168").split(","))
ids_np = ids_for("uniform", n, V)
ids = jnp.asarray(ids_np, jnp.int32)
grad = jax.random.normal(jax.random.PRNGKey(0), (n, H), jnp.float32).astype(jnp.bfloat16)
main_grad = jnp.zeros((V, H), jnp.float32)
problem = ew._check(ids, grad, main_grad, None)
orig_count = ew._count_ids


def scalar_count(block_keys_ref, counts_ref, lone_counts_ref, c, *, n, count_programs, interpret):
    def one(u, carry):
        key = block_keys_ref[u]
        plgpu.atomic_add(lone_counts_ref, jnp.where(key >= 0, key, 0), (key >= 0).astype(jnp.int32))
        return carry
    lax.fori_loop(jnp.int32(0), jnp.where(c == 0, n, 0).astype(jnp.int32), one, None)
    if jax.default_backend() != "cpu":
        plgpu.debug_barrier()
    plgpu.atomic_add(counts_ref, jnp.int32(ew._COUNTED), jnp.int32(1))


for name in ("vector", "scalar"):
    ew._count_ids = orig_count if name == "vector" else scalar_count
    cfg = ew._config(problem, "sort", (("lone_tokens", 2048),))
    # _merge_sort without its [:9]
    orig_call = ew._call
    grabbed = {}

    def call(kernel, cfg_, **kw):
        f = orig_call(kernel, cfg_, **kw)
        if kw.get("name") == "embwgrad_merge_rank" and "lone" in kw:
            def g(*a):
                outs = f(*a)
                grabbed["outs"] = outs
                return outs
            return g
        return f

    ew._call = call
    def run(i, g, m):
        ew._merge_sort(i, g, m, problem, cfg)
        return grabbed["outs"]
    full = jax.jit(run)(ids, grad, main_grad)
    ew._call = orig_call
    counts = np.asarray(full[4]); lone_counts = np.asarray(full[9]); mg = np.asarray(full[8])
    keys = ids_np
    lc = lone_counts[keys]
    print(name, "counts", counts.tolist(), "lone_counts at keys: ==1", int((lc == 1).sum()), "==0", int((lc == 0).sum()), ">1", int((lc > 1).sum()),
          "min/max", int(lc.min()), int(lc.max()), "rows written by merge kernel", int(np.any(mg != 0, axis=1).sum()), flush=True)
