"""Whole calls of the working tree's frontends against an older copy of them, side by side in one process.

The old copy is each frontend's embedding_wgrad.py from a revision, written by

    mkdir -p ab_old && for f in torch jax; do git show REV:${f}_frontend/embedding_wgrad.py > ab_old/${f}.py; done

(ab_old/ is untracked, so the device gets it with the working tree). Torch: each call is first
checked bit for bit against the deterministic dense path, then timed in graph replay, old and
new alternating twice. JAX: the new call's result is checked bit for bit against the old one's,
then both are timed as chains of donated calls, alternating twice.

    python benchmarks/probe_ab.py torch      (or jax; PROBE_POINTS=1024:uniform,... picks the points)
"""

import importlib.util
import os
import sys

from common import ids_for, probe_points

from tests.cases import REAL_H, REAL_V

POINTS = probe_points([(1024, "uniform"), (1024, "zipf"), (2048, "zipf"), (3072, "zipf"), (4096, "uniform"), (8192, "zipf")])
OLD = os.environ.get("AB_OLD", "ab_old")


def _load(framework: str):
    """The old copy of a frontend's module, under a name of its own."""
    spec = importlib.util.spec_from_file_location(f"ab_old_{framework}", os.path.join(OLD, f"{framework}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_torch():
    from bench_torch import graph_ms, probe_inputs, same_bits

    from torch_frontend import embedding_wgrad as new

    old = _load("torch")
    for n, dist, _, ids, grad, main_grad, expected in probe_inputs(POINTS):
        cells = []
        for name, module in (("old", old), ("new", new)) * 2:
            work = main_grad.clone()
            module.accumulate(ids, grad, work)
            exact = same_bits(work, expected)
            us = graph_ms(lambda module=module, work=work: module.accumulate(ids, grad, work)) * 1e3
            cells.append(f"{name} {us:.1f}{'' if exact else ' DIFFERENT'}")
        print(f"torch n={n:6d} {dist:7s} graph us: " + ", ".join(cells), flush=True)


def run_jax():
    import jax
    import jax.numpy as jnp
    import numpy as np
    from bench_jax import chain_ms

    from jax_frontend import embedding_wgrad as new

    old = _load("jax")
    key = jax.random.PRNGKey(0)
    main_grad = jax.random.normal(key, (REAL_V, REAL_H), jnp.float32)
    for n, dist in POINTS:
        grad = jax.random.normal(jax.random.fold_in(key, n), (n, REAL_H), jnp.float32).astype(jnp.bfloat16)
        ids = jnp.asarray(ids_for(dist, n, REAL_V), jnp.int32)
        rows = np.unique(np.asarray(ids))
        outs = [np.asarray(module.accumulate(ids, grad, jnp.array(main_grad, copy=True))[rows]) for module in (old, new)]
        exact = bool((outs[0].view(np.int32) == outs[1].view(np.int32)).all())
        cells = []
        for name, module in (("old", old), ("new", new)) * 2:
            ms, main_grad = chain_ms(lambda mg, module=module: module.accumulate(ids, grad, mg), main_grad)
            cells.append(f"{name} {ms * 1e3:.1f}")
        print(f"jax   n={n:6d} {dist:7s} new {'==' if exact else 'DIFFERENT from'} old; chain us: " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    {"torch": run_torch, "jax": run_jax}[sys.argv[1]]()
