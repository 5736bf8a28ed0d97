"""A kernel timeline of whole calls: where each kernel of one call starts and ends on the GPU.

    python benchmarks/timeline_target.py [trace.json]
    PROBE_POINTS=32768:8 python benchmarks/timeline_target.py --tp [trace]   (Megatron TP ids, masked)

The H200 image has no Nsight Systems, so this records the GPU's kernel activity with
torch.profiler (CUPTI, process-wide: JAX's kernels too) and writes a Chrome trace. Inside the
profiled range: per point, three replays of one torch call captured in a CUDA graph
(the GPU's time, no host launches), then three calls of the JAX frontend in a donated chain
(nothing waits in between, as in the benchmark). It prints, for each call (a gap of more than
20 us ends one), each kernel's, copy's and memset's start and end relative to the call's first,
in us: the gaps and overlaps between them (NOTES v7 item 8). With --tp, the same for
probe_tp.py's Megatron TP points (rank RANK's shard, its input_mask as masked) instead of POINTS,
and three JAX calls of probe_tp's "dropped" bound after them: where the JAX masked call's time
goes beside torch's and beside the bound's (NOTES v56).
"""

import json
import os
import sys
import time

POINTS = [(4096, "uniform"), (8192, "uniform"), (8192, "zipf")]


def profile(trace):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax.numpy as jnp
    import torch
    from bench_torch import capture_graph
    from common import ids_for

    import jax_frontend
    import torch_frontend
    from tests.cases import REAL_H, REAL_V

    main_grad = torch.randn(REAL_V, REAL_H, device="cuda")
    jmain = jnp.zeros((REAL_V, REAL_H), jnp.float32)
    for n, dist in POINTS:
        ids_np = ids_for(dist, n, REAL_V)
        grad = torch.randn(n, REAL_H, device="cuda").bfloat16()
        ids = torch.from_numpy(ids_np).cuda()
        graph = capture_graph(lambda: torch_frontend.accumulate(ids, grad, main_grad))
        jids = jnp.asarray(ids_np, jnp.int32)
        jgrad = jnp.asarray(grad.float().cpu().numpy()).astype(jnp.bfloat16)
        jmain = timeline(f"{trace}.{n}{dist[0]}.json", f"{n} {dist}", graph, [lambda m: jax_frontend.accumulate(jids, jgrad, m)], jmain)
        print("profiled", n, dist, flush=True)


def profile_tp(trace):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax.numpy as jnp
    import torch
    from bench_torch import capture_graph
    from probe_tp import points, torch_inputs

    import jax_frontend
    import torch_frontend

    for n, tp in points():
        ids, grad, main_grad, local, inside = torch_inputs(n, tp)
        masked = torch.from_numpy(~inside).cuda()
        graph = capture_graph(lambda: torch_frontend.accumulate(ids, grad, main_grad, masked=masked))
        jids, jmasked = jnp.asarray(local.astype("int32")), jnp.asarray(~inside)
        jgrad = jnp.asarray(grad.float().cpu().numpy()).astype(jnp.bfloat16)
        jdropped = jnp.where(jmasked, -1, jids)  # probe_tp's "dropped" bound, for kernel against kernel
        steps = [lambda m: jax_frontend.accumulate(jids, jgrad, m, masked=jmasked),
                 lambda m: jax_frontend.accumulate(jdropped, jgrad, m, zero_rows=True)]
        timeline(f"{trace}.{n}tp{tp}.json", f"{n} TP{tp}: 3 torch masked, 3 JAX masked, 3 JAX dropped", graph, steps,
                 jnp.asarray(main_grad.cpu().numpy()))
        print("profiled", n, "TP", tp, flush=True)


def timeline(path, title, graph, steps, jmain):
    """Three replays of a captured torch call, then three chained calls of each JAX step (main_grad ->
    main_grad, donated; as the benchmark times them, nothing waits in between; a gap between steps, so
    that the report cuts them apart), all profiled; the trace written to path and reported. Returns the
    last main_grad."""
    import torch

    for step in steps:  # compiled and warm before the profile
        for _ in range(2):
            jmain = step(jmain)
        jmain.block_until_ready()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
        for i, step in enumerate(steps):
            if i:
                time.sleep(0.001)
            for _ in range(3):
                jmain = step(jmain)
            jmain.block_until_ready()
    prof.export_chrome_trace(path)
    report(path, title)
    return jmain


def report(path, title):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    kernels = sorted((e["ts"], e["dur"], e["name"]) for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    calls, current = [], []
    for k in kernels:  # a new call starts after a gap of more than 20 us
        if current and k[0] - max(s + d for s, d, _ in current) > 20:
            calls.append(current)
            current = []
        current.append(k)
    if current:
        calls.append(current)
    for c, call in enumerate(calls):
        t0 = call[0][0]
        end = max(s + d for s, d, _ in call)
        print(f"{title} call {c}: {end - t0:.1f} us, {len(call)} kernels")
        for s, d, name in call:
            print(f"    {s - t0:7.1f} -> {s + d - t0:7.1f}  {d:6.1f}  {name[:60]}")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    sys.exit((profile_tp if "--tp" in sys.argv else profile)(args[0] if args else "timeline"))
