"""Does XLA's programmatic dependent launch (PDL) change the JAX frontend's calls? (NOTES v17)

XLA (2026) can launch its GPU kernels with PDL (`xla_gpu_enable_pdl`, and
`xla_gpu_enable_pdl_launch` for early triggers), inserting `griddepcontrol.wait` at their
start. Each variant is the frontend's call on its own (as ``accumulate``, one command buffer)
compiled with these debug options; each is first checked bit for bit against the default
compile from the same main_grad, then timed as chains of donated calls (bench_jax.chain_ms).
A variant whose options XLA does not know is reported and skipped. (Variant names hold no
commas: the command line lists them comma-separated.)

Session 17 also let each kernel trigger its successor's launch itself (a temporary
`pdl_trigger` field of the frontend's _Config: inline-PTX `griddepcontrol.launch_dependents`
before each program's body); NOTES v17 item 5 has what it measured, and the field is gone.

    python benchmarks/probe_jax_pdl.py

Measured with jax 0.11.2 on the H200 (NOTES v17 item 5): PDL is on by default; off costs
about 1 us a call; the other options change nothing beyond noise.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from bench_jax import chain_ms
from common import ids_for, print_variant_table, probe_points

from jax_frontend import embedding_wgrad as ew
from tests.cases import REAL_H, REAL_V

POINTS = probe_points([(4096, "uniform"), (8192, "uniform"), (8192, "zipf"), (32768, "uniform")])
#: name -> XLA debug options added to the frontend's own (xla_gpu_graph_min_graph_size 1)
VARIANTS = {
    "default": {},
    "pdl off": {"xla_gpu_enable_pdl": False},
    "pdl on": {"xla_gpu_enable_pdl": True},
    "pdl on launch off": {"xla_gpu_enable_pdl": True, "xla_gpu_enable_pdl_launch": False},
    "pdl on launch on": {"xla_gpu_enable_pdl": True, "xla_gpu_enable_pdl_launch": True},
    "no command buffer": {"xla_gpu_enable_command_buffer": ""},
    "no command buffer pdl on": {"xla_gpu_enable_command_buffer": "", "xla_gpu_enable_pdl": True},
}


def compiled(options):
    return jax.jit(ew._accumulate_impl, static_argnames=("padding_idx", "path", "overrides"), donate_argnames=("main_grad",),
                   compiler_options={"xla_gpu_graph_min_graph_size": 1, **options})


def main(argv):
    print("jax", jax.__version__, jax.devices()[0].device_kind, flush=True)
    only = argv[0].split(",") if argv else list(VARIANTS)
    key = jax.random.PRNGKey(0)
    main_grad = jax.random.normal(key, (REAL_V, REAL_H), jnp.float32)
    fns = {name: compiled(VARIANTS[name]) for name in only}
    results = {}
    for n, dist in POINTS:
        grad = jax.random.normal(jax.random.fold_in(key, n), (n, REAL_H), jnp.float32).astype(jnp.bfloat16)
        ids_np = ids_for(dist, n, REAL_V)
        ids = jnp.asarray(ids_np, jnp.int32)
        rows = jnp.asarray(np.unique(ids_np))
        got = {}
        for name in only:  # one call each from the same main_grad, before any chain changes it
            try:
                out = fns[name](ids, grad, jnp.copy(main_grad))
                got[name] = np.asarray(out[rows]).view(np.int32)
                del out
            except Exception as e:  # options XLA does not know, or a failed compile
                print(f"n={n:6d} {dist:7s} {name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
        first = next(iter(got.values()), None)
        for name in only:
            if name not in got:
                results[(n, dist, name)] = (float("nan"), None)
                continue
            exact = bool((got[name] == first).all())
            ms, main_grad = chain_ms(lambda mg, f=fns[name]: f(ids, grad, mg), main_grad)
            results[(n, dist, name)] = (ms * 1e3, exact)
            print(f"n={n:6d} {dist:7s} {name:28s} {ms * 1e3:8.1f} us  same bits as the first: {exact}", flush=True)
    print_variant_table("variant (us)", POINTS, only, results, "NOT SAME")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
