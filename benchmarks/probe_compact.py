"""How long the masked route's compaction takes (NOTES v55 items 4-5, 7), checked against the core.

    python benchmarks/probe_compact.py                          (GPU: Megatron's TP 8 ids, CUDA graphs)
    TRITON_INTERPRET=1 python benchmarks/probe_compact.py --check   (CPU: small cases, the interpreter)

The torch frontend's _compact_stage (two Triton kernels, one prefix count over positions; no
program waits on another) timed alone in a CUDA graph, beside the torch frontend's masked call
on the same input, and its output checked against embwgrad_core.masked_split. (Session 55 first
timed a twin of these kernels written here, 6.8-9.3 us alone at 4096-65536 tokens; the route's
own kernels replaced it.)
"""

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from embwgrad_core import SORT, masked_split  # noqa: E402
from torch_frontend import embedding_wgrad as ew  # noqa: E402


def compact(ids, masked_u8, main_grad, hidden_grad):
    """_compact_stage's output (int32 [_COMPACT_ARRAYS * n + 3]) for these tokens."""
    problem = ew._check(ids, hidden_grad, main_grad, None)
    cfg = ew._config(problem, SORT, ew._interpreting(), *((4, False) if ew._interpreting() else ew._device_traits(main_grad.device.index)),
                     zero_rows=True, masked=True)
    return ew._compact_stage(ids, masked_u8, problem, cfg, ew._Launcher())


def check(ids_np, masked_np, num_embeddings: int, out) -> bool:
    """_compact_stage's arrays and header against embwgrad_core.masked_split, exactly."""
    n = ids_np.size
    want = masked_split(ids_np, num_embeddings, masked_np)
    got = out.cpu().numpy()
    kept, real = want[0].size, want[2].size
    header_ok = got[ew._COMPACT_ARRAYS.value * n :].tolist() == [kept, real, n - kept]
    return header_ok and all(np.array_equal(got[a * n : a * n + w.size], w) for a, w in enumerate((want[1], want[0], want[2], want[3])))


def cpu_check():
    rng = np.random.default_rng(0)
    ok = True
    for n, share in [(1, 1.0), (300, 0.5), (1000, 0.875), (777, 0.0), (640, 1.0)]:
        masked = rng.random(n) < share
        ids = np.where(masked | (rng.random(n) < 0.2), 0, rng.integers(-2, 50, n))
        out = compact(torch.from_numpy(ids), torch.from_numpy(masked.astype(np.uint8)), torch.zeros(48, 4), torch.zeros(n, 4))
        good = check(ids, masked, 48, out)
        ok &= good
        print(f"n={n} masked share {share}: {'exact' if good else 'DIFFERENT'}", flush=True)
    return ok


def gpu_probe():
    from bench_torch import graph_ms
    from probe_tp import torch_inputs

    import torch_frontend

    points = [(int(p.split(":")[0]), int(p.split(":")[1])) for p in os.environ.get("PROBE_POINTS", "4096:8,8192:8,32768:8,65536:8").split(",")]
    print("| tokens, TP | masked call (us) | compaction alone (us) |\n|---|---|---|")
    for n, tp in points:
        ids, grad, main_grad, local, inside = torch_inputs(n, tp)
        masked = torch.from_numpy(~inside).cuda()
        t_masked = graph_ms(lambda: torch_frontend.accumulate(ids, grad, main_grad, masked=masked)) * 1e3
        good = check(local, ~inside, main_grad.shape[0], compact(ids, masked.view(torch.uint8), main_grad, grad))
        t = graph_ms(lambda: compact(ids, masked.view(torch.uint8), main_grad, grad)) * 1e3
        print(f"| {n}, {tp} | {t_masked:.1f} | {t:.1f}{'' if good else ' DIFFERENT'} |", flush=True)


def jax_probe():
    """The JAX twin on the GPU, stage by stage (chains of donated calls, bench_jax.chain_ms): the masked call
    with the route and without it (compact off: main's deferral), _compact alone, _compact + the merge sort
    (the plan of the kept tokens), and _row0 alone. Each chain's per-call time includes its dispatch;
    each jit is one command buffer, as accumulate's."""
    import functools

    import jax
    import jax.numpy as jnp
    from bench_jax import chain_ms
    from probe_tp import REAL_H, tp_inputs

    from embwgrad_core import reference
    from jax_frontend import embedding_wgrad as jw

    points = [(int(p.split(":")[0]), int(p.split(":")[1])) for p in os.environ.get("PROBE_POINTS", "4096:8,8192:8,16384:8,32768:8").split(",")]
    print("| tokens, TP | masked call | route off | compaction | compaction + merge sort | row 0 | one tiny kernel (us) |\n|---|---|---|---|---|---|---|")
    for n, tp in points:
        local, inside, shard = tp_inputs(n, tp)
        rng = np.random.default_rng(n)
        grad_np = (rng.standard_normal((n, REAL_H), dtype=np.float32) * inside[:, None]).astype(jnp.bfloat16)
        ids, grad = jnp.asarray(local.astype(np.int32)), jnp.asarray(grad_np)
        masked = jnp.asarray(~inside)
        masked8 = masked.astype(jnp.int8)
        mg0 = rng.standard_normal((shard, REAL_H), dtype=np.float32)
        touched = np.unique(local)
        want = reference.accumulate(local, grad_np, mg0)[touched].view(np.int32)
        problem = jw._check(ids, grad, jax.ShapeDtypeStruct(mg0.shape, jnp.float32), None)
        cfg = jw._config(problem, SORT, (), zero_rows=True, masked=True)
        marks = []
        for o in ((), (("compact", False),)):
            call = functools.partial(jw._accumulate_alone, ids, grad, masked=masked, zero_rows=True, overrides=o)
            ok = np.array_equal(np.asarray(call(main_grad=jnp.asarray(mg0)))[touched].view(np.int32), want)
            marks.append(("" if ok else " DIFFERENT"))
            t, _ = chain_ms(lambda mg: call(main_grad=mg), jnp.asarray(mg0))
            marks[-1] = f"{t * 1e3:.1f}{marks[-1]}"
        graph = dict(compiler_options={"xla_gpu_graph_min_graph_size": 1}) if jax.default_backend() == "gpu" else {}  # as accumulate
        compact = jax.jit(lambda i, m: jw._compact(i, m, problem, cfg), **graph)
        out = compact(ids, masked8)
        t_c, _ = chain_ms(lambda o: compact(ids, masked8), out)
        tiny = jax.jit(lambda i: i + 1, **graph)  # a chain's floor: one small kernel, dispatch included
        t_0, _ = chain_ms(tiny, ids)
        sort = jax.jit(lambda mg, i, g, m: jw._merge_sort(i, g, mg, m, problem, cfg, 0, jw._compact(i, m, problem, cfg))[-1],
                       donate_argnums=0, **graph)
        t_s, _ = chain_ms(lambda mg: sort(mg, ids, grad, masked8), jnp.asarray(mg0))
        row0 = jax.jit(lambda mg, c, g: jw._row0(c, g, mg, problem, cfg), donate_argnums=0, **graph)
        t_r, _ = chain_ms(lambda mg: row0(mg, out, grad), jnp.asarray(mg0))
        print(f"| {n}, {tp} | {marks[0]} | {marks[1]} | {t_c * 1e3:.1f} | {t_s * 1e3:.1f} | {t_r * 1e3:.1f} | {t_0 * 1e3:.1f} |", flush=True)


if __name__ == "__main__":
    if "--jax" in sys.argv:
        jax_probe()
        sys.exit(0)
    if "--check" in sys.argv:
        sys.exit(0 if cpu_check() else 1)
    gpu_probe()
