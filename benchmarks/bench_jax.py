"""JAX side of the benchmark: the JAX frontend and XLA's scatter-add, both into a donated main_grad.

Each time is the median, over 7 repeats, of a chain of 300 donated calls ended by
block_until_ready, divided by 300: the steady cost per call of a training loop that issues one
call per micro-batch, dispatch included. The chain's start (the first dispatch) and end (the
wait) are paid once per chain: over 20 calls they added 4-19 us per call to both series
(benchmarks/NOTES.md, v8), which no loop of many calls pays. Exactness:
the rows of ids against the core reference on the host (up to 32768 tokens; beyond, the
host reference takes too long and the torch process's dense check stands). On a CPU the
kernels run in Pallas interpret mode at a small shape.
"""

import statistics
import sys
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from common import Record, ids_for, parse_args, sizes, write

import jax_frontend
from embwgrad_core import reference, torch_path
from embwgrad_core.dtypes import round_to

ON_GPU = jax.default_backend() == "gpu"


def chain_ms(step, state, reps=300, repeats=7):
    state = step(state)
    state.block_until_ready()
    if not ON_GPU:  # the interpreter: one call, to show it runs
        reps, repeats = 1, 1
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(reps):
            state = step(state)
        state.block_until_ready()
        times.append((time.perf_counter() - t) * 1e3 / reps)
    return statistics.median(times), state


def unrolled_ms(step, state, args=(), k=20, calls=300, repeats=7):
    """A probe's time per call with the host's dispatch taken out: step(state, *args) (traceable:
    call the frontend's traced form, e.g. ew._accumulate) k times in one jit, unrolled, state
    donated, so one dispatch issues k calls' kernels back to back; chain_ms over calls // k such
    jits, divided by k. Each of the k steps gets its own copy of args, passed in as separate
    buffers: with one set of args XLA would compute the plan (a function of ids alone) once for
    all k steps, and the probe would time the partials only (NOTES v60). Not the benchmark's
    method (chains of single calls, as a training loop issues them): for comparing kernels where
    a call's GPU time is near the host's 30-75 us of dispatch (benchmarks/NOTES.md v59).
    Returns (ms per call, state, the custom calls in the compiled jit: k times one call's)."""
    per_step = [tuple(None if a is None else jnp.array(a, copy=True) for a in args) for _ in range(k)]

    def body(s, per_step):
        for a in per_step:
            s = step(s, *a)
        return s

    many = jax.jit(body, donate_argnums=0).lower(state, per_step).compile()  # (run as compiled: counted and timed once)
    custom_calls = many.as_text().count(" custom-call(")
    ms, state = chain_ms(lambda s: many(s, per_step), state, reps=max(1, calls // k), repeats=repeats)
    return ms / k, state, custom_calls


def exact_rows(ids_np, grad, before_rows, after_rows, vocab) -> bool:
    rows, values = reference.weight_grad_rows(ids_np, np.asarray(grad), vocab)
    expected = round_to(before_rows.astype(np.float32) + values.astype(np.float32), "float32")
    return bool((np.asarray(after_rows).view(np.int32) == expected.view(np.int32)).all())


def main(argv=None):
    args = parse_args(argv)
    ns, vocab, hidden = sizes(args, ON_GPU)
    key = jax.random.PRNGKey(0)
    main_grad = jax.random.normal(key, (vocab, hidden), jnp.float32)
    scatter = jax.jit(lambda mg, ids, g: mg.at[ids].add(g.astype(jnp.float32)), donate_argnums=0)
    records = []
    for n in ns:
        grad = jax.random.normal(jax.random.fold_in(key, n), (n, hidden), jnp.float32).astype(jnp.bfloat16)
        for dist in args.dists:
            ids_np = ids_for(dist, n, vocab)
            ids = jnp.asarray(ids_np, jnp.int32)
            rows = np.unique(ids_np)
            exact = None
            if n <= 32768:
                before = np.asarray(main_grad[rows])
                main_grad = jax_frontend.accumulate(ids, grad, main_grad)
                after = np.asarray(main_grad[rows])
                exact = exact_rows(ids_np, np.asarray(grad).view(ml_dtypes.bfloat16), before, after, vocab)
            ms, main_grad = chain_ms(lambda mg: jax_frontend.accumulate(ids, grad, mg), main_grad)
            records.append(Record("jax", "embwgrad", n, dist, ms, exact=exact, note=torch_path(n), device="gpu" if ON_GPU else "cpu"))
            if ON_GPU:
                ms, main_grad = chain_ms(lambda mg: scatter(mg, ids, grad), main_grad)
                records.append(Record("jax", "xla_scatter", n, dist, ms, device="gpu"))
    write(records, args.json)


if __name__ == "__main__":
    sys.exit(main())
