"""JAX under jax.jit with main_grad sharded over the local GPUs: the partitioning rule against none.

    PYTHONPATH=$PWD python benchmarks/sharded_jax.py      # on a machine with two or more GPUs

main_grad [V, H] fp32 is split by rows over every local device (mesh axis "x"), ids and grad
replicated, bf16 grad; V = 129280, H = 7168 unless PROBE_SHAPE says otherwise, the points of
PROBE_POINTS (default 8192 uniform, 8192 Zipf, 32768 uniform). Per point, ms per call (median of
5 chains of 50 donated calls, bench_jax.chain_ms):

- "sharded": `jax_frontend.accumulate`, whose rule (_partition) has each device add into its own rows;
- "no rule": the same kernels without the rule (`_stages` under jit, which is what accumulate
  did before it): XLA replicates the custom calls, so every device gathers all of main_grad;
- "one device": `accumulate` on one device with the whole main_grad, for scale;
- "XLA scatter": `main_grad.at[ids].add(grad)` on the sharded main_grad.

Exact: the sharded and no-rule results against the one-device call's, bit for bit (the
one-device call is tested against the core reference). A table last.
"""

import jax
import jax.numpy as jnp
import numpy as np
from bench_jax import chain_ms
from common import ids_for, probe_points, probe_shape
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_frontend
from embwgrad_core.dtypes import bits
from jax_frontend import embedding_wgrad as ew

REPS, REPEATS = 50, 5  # the no-rule call takes milliseconds, so shorter chains than bench_jax.py's


def same_bits(a, b) -> bool:
    return bool((bits(np.asarray(a)) == bits(np.asarray(b))).all())


def main():
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("x",))
    rows = NamedSharding(mesh, P("x", None))
    whole = NamedSharding(mesh, P())
    vocab, hidden = probe_shape()
    points = probe_points([(8192, "uniform"), (8192, "zipf"), (32768, "uniform")])
    print(f"{len(devices)} x {devices[0].device_kind}, jax {jax.__version__}, V = {vocab}, H = {hidden}")
    sharded = jax.jit(jax_frontend.accumulate, donate_argnums=2)
    no_rule = jax.jit(lambda i, g, m: ew._stages(i, g, m, None, False, None, (), ()), donate_argnums=2)
    scatter = jax.jit(lambda i, g, m: m.at[i].add(g.astype(jnp.float32)), donate_argnums=2)
    table = []
    for n, dist in points:
        key = jax.random.PRNGKey(n)
        ids_np = ids_for(dist, n, vocab).astype(np.int32)
        grad = jax.random.normal(key, (n, hidden), jnp.float32).astype(jnp.bfloat16)
        start = jax.random.normal(jax.random.fold_in(key, 1), (vocab, hidden), jnp.float32)
        ids1, grad1 = jnp.asarray(ids_np), grad
        one = jax_frontend.accumulate(ids1, grad1, start.copy())
        ids_r, grad_r = jax.device_put(ids_np, whole), jax.device_put(grad, whole)
        exact = {}
        for name, fn in (("sharded", sharded), ("no rule", no_rule)):
            out = fn(ids_r, grad_r, jax.device_put(start, rows))
            exact[name] = same_bits(out, one)
            del out
        del one
        ms = {}
        ms["one device"], state = chain_ms(lambda m: jax_frontend.accumulate(ids1, grad1, m), start.copy(), REPS, REPEATS)
        del state
        for name, fn in (("sharded", sharded), ("no rule", no_rule), ("XLA scatter", scatter)):
            ms[name], state = chain_ms(lambda m, fn=fn: fn(ids_r, grad_r, m), jax.device_put(start, rows), REPS, REPEATS)
            del state
        table.append((n, dist, ms, exact))
        print(n, dist, {k: round(v, 4) for k, v in ms.items()}, exact, flush=True)
    print(f"\n| n | ids | sharded ({len(devices)} devices) | no rule | one device | XLA scatter (sharded) | exact |")
    print("|---|---|---|---|---|---|---|")
    for n, dist, ms, exact in table:
        print(f"| {n} | {dist} | {ms['sharded']:.3f} ms | {ms['no rule']:.3f} ms ({ms['no rule'] / ms['sharded']:.1f}x) | "
              f"{ms['one device']:.3f} ms | {ms['XLA scatter']:.3f} ms | "
              f"{'bitwise' if all(exact.values()) else 'DIFFERS: ' + str(exact)} |")


if __name__ == "__main__":
    main()
