"""Megatron's vocab-parallel embedding on one tensor-parallel rank: the ids as the rank looks them up.

`VocabParallelEmbedding` on rank r of TP holds rows [r * V / TP, (r + 1) * V / TP); it looks up
`masked_input` (an in-shard id minus the shard's start, 0 for every other token) and zeroes the
other tokens' output rows, so the grad rows of those tokens are zero and, with TP = 8, about
7/8 of the tokens fall into one run at row 0. This probe times that input, the form every
Megatron user with TP > 1 hands `accumulate` (with zero_rows=True, as the README asks; the
variant "skip off" is a call without it), against the dense path on the shard's main_grad
[V / TP, H] and the floor, each call first checked bit for bit against the deterministic dense path.

    python benchmarks/probe_tp.py                    (torch; default points, DEFAULT_VARIANTS)
    python benchmarks/probe_tp.py "default,fold_h 64"  (those variants of probe_calls.VARIANTS)
    PROBE_POINTS=8192:8,8192:2 python benchmarks/probe_tp.py   (n:TP)
    python benchmarks/probe_tp.py --bound            (zero_rows against masked, the other ranks' tokens dropped, the own tokens alone)
    python benchmarks/probe_tp.py --jax [variants]   (the JAX frontend, chains of donated calls; probe_jax.VARIANTS)
    python benchmarks/probe_tp.py --jax --bound      (--bound through the JAX frontend, the own tokens alone too)
    python benchmarks/probe_tp.py --masked [variants]         (torch, those variants with masked=input_mask)
    python benchmarks/probe_tp.py --stages [--masked]         (torch, each stage alone in its own graph)
    python benchmarks/probe_tp.py --stages --dropped          (the same for --bound's dropped tokens, ids -1)
    python benchmarks/probe_tp.py --gap                       (torch, masked against dropped, kernel by kernel)
    python benchmarks/probe_tp.py --jax --masked [variants]   (those variants with masked=input_mask)
    python benchmarks/probe_tp.py --jax ... --unrolled        (JAX: 20 calls unrolled in one jit a dispatch, bench_jax.unrolled_ms)
    PROBE_POINTS=65536:uniform,65536:zipf python benchmarks/probe_tp.py --none-masked   (masked given, none set; both frontends)
"""

import dataclasses
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import floor_bytes, print_variant_table  # noqa: E402

from tests.cases import REAL_H, REAL_V, tp_ids  # noqa: E402

RANK = 1  # not rank 0: the frequent ids are spread over V (tests.cases.zipf_ids), so every rank looks alike

#: The variants run when none are named (any of probe_calls.VARIANTS may be).
DEFAULT_VARIANTS = ("default", "skip off", "skip block 256")


def tp_inputs(n: int, tp: int):
    """(local ids, in-shard mask, shard rows) of rank RANK for Zipf(1.1) ids over the whole vocabulary."""
    local, zeros, shard = tp_ids(n, tp, RANK)
    inside = np.ones(n, bool)
    inside[zeros] = False
    return local, inside, shard


def torch_inputs(n: int, tp: int):
    """(local ids, bf16 grad with the other ranks' rows zeroed, main_grad [V / TP, H], in-shard mask) on the GPU."""
    import torch

    local, inside, shard = tp_inputs(n, tp)
    torch.manual_seed(n)
    grad = torch.randn(n, REAL_H, device="cuda").bfloat16()
    grad[torch.from_numpy(~inside).cuda()] = 0  # Megatron zeroes the other ranks' tokens
    return torch.from_numpy(local).cuda(), grad, torch.randn(shard, REAL_H, device="cuda"), local, inside


def points():
    spec = os.environ.get("PROBE_POINTS", "4096:8,8192:8,8192:2,16384:8,32768:8")
    return [(int(p.split(":")[0]), int(p.split(":")[1])) for p in spec.split(",")]


def run_torch(names, with_mask=False):
    import torch
    from bench_torch import config_overrides, copy_bandwidth, dense, dense_expected, graph_ms, same_bits
    from probe_calls import VARIANTS

    import torch_frontend

    bw = copy_bandwidth()
    pts = points()
    results = {}
    for n, tp in pts:
        ids, grad, main_grad, local, inside = torch_inputs(n, tp)
        expected = dense_expected(ids, grad, main_grad)
        kw = dict(masked=torch.from_numpy(~inside).cuda()) if with_mask else dict(zero_rows=True)
        top = np.bincount(local).max()
        print(f"n={n} TP={tp}: {inside.sum()} tokens in the shard, {np.unique(local).size} rows, longest run {top}", flush=True)
        results[(n, tp, "floor")] = (floor_bytes(local, REAL_H) / bw, True)
        mg = main_grad.clone()
        results[(n, tp, "dense")] = (graph_ms(lambda: dense(ids, grad, mg)), True)
        for name in names:
            with config_overrides(**VARIANTS[name]):
                out = main_grad.clone()
                torch_frontend.accumulate(ids, grad, out, **kw)
                ok = same_bits(out, expected)
                results[(n, tp, name)] = (graph_ms(lambda: torch_frontend.accumulate(ids, grad, out, **kw)) * 1e3, ok)
            print(f"  {name}: {results[(n, tp, name)][0]:.1f} us{'' if ok else ' DIFFERENT'}", flush=True)
        results[(n, tp, "floor")] = (results[(n, tp, "floor")][0] * 1e3, True)
        results[(n, tp, "dense")] = (results[(n, tp, "dense")][0] * 1e3, True)
    kind = ", masked" if with_mask else ""
    print(f"\ncopy {bw / 1e9:.2f} TB/s; torch CUDA graph, us{kind}; rank {RANK} of TP, Zipf(1.1) ids over V = {REAL_V}")
    print_variant_table("variant", [(n, f"TP{tp}") for n, tp in pts], ["floor", "dense", *names],
                        {(n, f"TP{tp}", k): v for (n, tp, k), v in results.items()}, "DIFFERENT")


def run_stages(with_mask=False, dropped=False):
    """Each stage alone in its own CUDA graph (no PDL between them), the long runs folded by the
    long-run kernel (fold_programs 0): plan, partials (without folds; with masked, after the masked
    records kernel), folds; then the whole call. dropped: run_bound's bound, the other ranks'
    tokens as ids -1 with zero_rows, to set stage against stage."""
    import torch
    from bench_torch import config_overrides, graph_ms

    import torch_frontend
    from torch_frontend import embedding_wgrad as ew

    for n, tp in points():
        ids, grad, main_grad, _, inside = torch_inputs(n, tp)
        if dropped:
            ids = ids.masked_fill(torch.from_numpy(~inside).cuda(), -1)
        flat = torch.from_numpy(~inside).cuda().view(torch.uint8) if with_mask else None
        kw = dict(masked=flat.view(torch.bool)) if with_mask else dict(zero_rows=True)
        kind = " masked" if with_mask else " dropped" if dropped else ""
        for fields in ({"fold_programs": 0}, {"fold_programs": 0, "long_block_h": 32, "long_batch": 128}):
            with config_overrides(**fields):
                problem = ew._check(ids, grad, main_grad, None)
                cfg = ew._config(problem, ew.torch_path(n), False, *ew._device_traits(0), zero_rows=True, masked=with_mask)
                cfg = dataclasses.replace(cfg, pdl=False)
                plan = ew._plan_stage(ids, problem, cfg, masked=flat)
                partials, flags = ew._partials_stage(plan, grad, main_grad, problem, cfg, ids=ids, masked=flat)
                ew._long_runs_stage(plan, partials, flags, main_grad, problem, cfg)
                t_plan = graph_ms(lambda: ew._plan_stage(ids, problem, cfg, masked=flat))
                plan = ew._plan_stage(ids, problem, cfg, masked=flat)
                # The stage moves the plan's counters (arrivals; with masked, the records' count
                # too), so each repetition starts from a copy of the plan, timed alone and taken off.
                saved = plan.workspace.clone()
                t_copy = graph_ms(lambda: plan.workspace.copy_(saved))

                def partials_stage():
                    plan.workspace.copy_(saved)
                    ew._partials_stage(plan, grad, main_grad, problem, cfg, ids=ids, masked=flat)

                t_part = graph_ms(partials_stage) - t_copy
                t_fold = graph_ms(lambda: ew._long_runs_stage(plan, partials, flags, main_grad, problem, cfg))
                t_call = graph_ms(lambda: torch_frontend.accumulate(ids, grad, main_grad, **kw))
            print(f"n={n} TP={tp}{kind} {fields}: plan {t_plan * 1e3:.1f} us, partials {t_part * 1e3:.1f}, folds {t_fold * 1e3:.1f}, "
                  f"whole call {t_call * 1e3:.1f}", flush=True)


def run_gap():
    """Where masked's time over the dropped bound goes (torch, each kernel alone in its own graph, no
    PDL, the long-run kernel folding): the masked records kernel alone; the partials stage (with
    masked, the records kernel and the partials kernel) with and without the mask bytes read
    (masked_reads, exact here only because the masked rows are zero); the long-run kernel on the
    plan's list, without row 0's run, and on row 0's run alone (the list patched in a copy of the
    workspace); the same stages of the dropped bound (ids -1, zero_rows)."""
    import torch

    for n, tp in points():
        ids, grad, main_grad, _, inside = torch_inputs(n, tp)
        flat = torch.from_numpy(~inside).cuda().view(torch.uint8)
        for kind in ("masked", "dropped"):
            these = ids if kind == "masked" else ids.masked_fill(torch.from_numpy(~inside).cuda(), -1)
            try:
                row = _gap_kind(these, grad, main_grad, flat if kind == "masked" else None)
            except Exception as e:  # noqa: BLE001  (a probe: the other points still run)
                print(f"n={n} TP={tp} {kind}: {type(e).__name__}: {e}", flush=True)
                continue
            print(f"n={n} TP={tp} {kind}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)


def _gap_kind(ids, grad, main_grad, mask):
    """run_gap's figures for one call (mask None: the dropped bound), us, by name."""
    from bench_torch import graph_ms

    from torch_frontend import embedding_wgrad as ew

    n = ids.numel()
    problem = ew._check(ids, grad, main_grad, None)
    cfg = ew._config(problem, ew.torch_path(n), False, *ew._device_traits(0), zero_rows=True, masked=mask is not None)
    cfg = dataclasses.replace(cfg, pdl=False, fold_programs=0)
    plan = ew._plan_stage(ids, problem, cfg, masked=mask)
    saved = plan.workspace.clone()  # the plan's counters, for each repetition of a stage that moves them
    partials, flags = ew._partials_stage(plan, grad, main_grad, problem, cfg, ids=ids, masked=mask)
    done = plan.workspace.clone()  # after the partials: the list final
    t_copy = graph_ms(lambda: plan.workspace.copy_(saved))
    row = {}

    def stage(c):
        plan.workspace.copy_(saved)
        ew._partials_stage(plan, grad, main_grad, problem, c, ids=ids, masked=mask)

    row["partials stage"] = (graph_ms(lambda: stage(cfg)) - t_copy) * 1e3
    if mask is not None:
        row["without mask reads"] = (graph_ms(lambda: stage(dataclasses.replace(cfg, masked_reads=False))) - t_copy) * 1e3

        def records():
            plan.workspace.copy_(saved)
            ew._masked_records_stage(plan, mask, flags, problem.hidden, cfg, ew._Launcher())

        row["records kernel"] = (graph_ms(records) - t_copy) * 1e3
    base = ew._LONG.value * n  # the long-run counter; the list from _HEADER on (ew._listed)
    listed_at = base + ew._HEADER.value
    count = int(done[base])
    entries = done[listed_at : listed_at + 2 * count].view(-1, 2).clone()
    row["long runs"] = count
    lists = {"folds": entries}
    zero = entries[:, 0] == 0  # row 0's run starts at slot 0 (the smallest key)
    if mask is not None and bool(zero.any()):
        lists["folds without row 0"], lists["folds of row 0 alone"] = entries[~zero], entries[zero]
    for name, listed in lists.items():
        ws = done.clone()
        ws[base] = listed.shape[0]
        ws[listed_at : listed_at + 2 * listed.shape[0]] = listed.flatten()
        plan.workspace.copy_(ws)
        row[name] = graph_ms(lambda: ew._long_runs_stage(plan, partials, flags, main_grad, problem, cfg)) * 1e3
    return row


def run_jax(names, with_mask=False, unrolled=False):
    import jax.numpy as jnp
    from bench_jax import chain_ms, unrolled_ms
    from probe_jax import VARIANTS

    from embwgrad_core import reference
    from jax_frontend import embedding_wgrad as ew

    pts = points()
    results = {}
    for n, tp in pts:
        local, inside, shard = tp_inputs(n, tp)
        rng = np.random.default_rng(n)
        grad_np = (rng.standard_normal((n, REAL_H), dtype=np.float32) * inside[:, None]).astype(jnp.bfloat16)
        ids, grad = jnp.asarray(local.astype(np.int32)), jnp.asarray(grad_np)
        masked = jnp.asarray(~inside) if with_mask else None
        # With masked, the call as accumulate makes it (one command buffer): ew._accumulate launches
        # its kernels one by one below five (convert, block sort, merge, partials without the deferral).
        call = ew._accumulate_alone if with_mask else ew._accumulate
        touched = np.unique(local)
        mg0 = rng.standard_normal((shard, REAL_H), dtype=np.float32)
        want = reference.accumulate(local, grad_np, mg0)[touched]
        for name in names:
            o = VARIANTS[name]
            got = np.asarray(call(ids, grad, jnp.asarray(mg0), masked, zero_rows=True, overrides=o))[touched]
            ok = np.array_equal(got.view(np.int32), want.view(np.int32))
            if unrolled:  # inside the probe's jit: the traced form, the same kernels
                ms, _, kernels = unrolled_ms(lambda mg, i, g, m, o=o: ew._accumulate(i, g, mg, m, zero_rows=True, overrides=o),
                                             jnp.asarray(mg0), (ids, grad, masked))
                print(f"JAX n={n} TP={tp} {name}: {kernels} custom calls in 20 unrolled calls", flush=True)
            else:
                ms, _ = chain_ms(lambda mg, o=o: call(ids, grad, mg, masked, zero_rows=True, overrides=o), jnp.asarray(mg0))
            results[(n, f"TP{tp}", name)] = (ms * 1e3, ok)
            print(f"JAX n={n} TP={tp} {name}: {ms * 1e3:.1f} us {'exact' if ok else 'DIFFERENT'}", flush=True)
    print_variant_table("JAX variant (us)", [(n, f"TP{tp}") for n, tp in pts], names, results, "DIFFERENT")


def run_bound():
    """The other ranks' zero rows, not read: the call on Megatron's input with zero_rows=True, the
    same call with masked=input_mask (checked bit for bit against the dense path), and a bound: the
    call with those tokens dropped (ids -1, which add nothing: no row read, no run at row 0; row 0's
    bits may then differ, so not checked); the call on the shard's own tokens alone (compacted
    beforehand, on the sort path: a bound for a plan over them only); the floor, and the floor of the shard's own tokens
    (their grad rows, their main_grad rows and row 0's)."""
    import torch
    from bench_torch import copy_bandwidth, dense_expected, graph_ms, same_bits

    import torch_frontend
    from embwgrad_core.constants import SORT
    from torch_frontend import embedding_wgrad as ew

    bw = copy_bandwidth()
    for n, tp in points():
        ids, grad, main_grad, local, inside = torch_inputs(n, tp)
        expected = dense_expected(ids, grad, main_grad)
        masked = torch.from_numpy(~inside).cuda()
        dropped = ids.masked_fill(masked, -1)
        out = main_grad.clone()
        torch_frontend.accumulate(ids, grad, out, masked=masked)
        ok = same_bits(out, expected)
        t_call = graph_ms(lambda: torch_frontend.accumulate(ids, grad, out, zero_rows=True)) * 1e3
        t_masked = graph_ms(lambda: torch_frontend.accumulate(ids, grad, out, masked=masked)) * 1e3
        t_drop = graph_ms(lambda: torch_frontend.accumulate(dropped, grad, out, zero_rows=True)) * 1e3
        # The shard's own tokens only, compacted beforehand (untimed), on the sort path whatever
        # their number: a bound for a plan over those tokens alone (row 0's bits not checked).
        own_ids, own_grad = ids[~masked], grad[~masked]
        own_problem = ew._check(own_ids, own_grad, out, None)
        t_own = graph_ms(lambda: ew._launch(own_ids, own_grad, out, own_problem, SORT, True)) * 1e3
        own = local[inside]
        own_bytes = own.size * REAL_H * 2 + 2 * np.unique(np.concatenate([own, [0]])).size * REAL_H * 4
        print(f"n={n} TP={tp}: zero_rows {t_call:.1f} us, masked {t_masked:.1f}{'' if ok else ' DIFFERENT'}, dropped {t_drop:.1f}, "
              f"own tokens alone {t_own:.1f}, floor {floor_bytes(local, REAL_H) / bw * 1e3:.1f}, own tokens' floor {own_bytes / bw * 1e3:.1f}", flush=True)


def run_bound_jax():
    """run_bound's calls through the JAX frontend (chains of donated calls), masked's checked bit for
    bit against the core reference on the rows it touches."""
    import jax.numpy as jnp
    from bench_jax import chain_ms

    import jax_frontend
    from embwgrad_core import reference
    from embwgrad_core.constants import SORT
    from jax_frontend import embedding_wgrad as ew

    for n, tp in points():
        local, inside, shard = tp_inputs(n, tp)
        rng = np.random.default_rng(n)
        grad_np = (rng.standard_normal((n, REAL_H), dtype=np.float32) * inside[:, None]).astype(jnp.bfloat16)
        ids, grad, masked = jnp.asarray(local.astype(np.int32)), jnp.asarray(grad_np), jnp.asarray(~inside)
        dropped = jnp.where(masked, -1, ids)
        touched = np.unique(local)
        mg0 = rng.standard_normal((shard, REAL_H), dtype=np.float32)
        got = np.asarray(jax_frontend.accumulate(ids, grad, jnp.asarray(mg0), masked=masked))[touched]
        ok = np.array_equal(got.view(np.int32), reference.accumulate(local, grad_np, mg0)[touched].view(np.int32))
        t_call, _ = chain_ms(lambda mg: jax_frontend.accumulate(ids, grad, mg, zero_rows=True), jnp.asarray(mg0))
        t_masked, _ = chain_ms(lambda mg: jax_frontend.accumulate(ids, grad, mg, masked=masked), jnp.asarray(mg0))
        t_drop, _ = chain_ms(lambda mg: jax_frontend.accumulate(dropped, grad, mg, zero_rows=True), jnp.asarray(mg0))
        own_ids, own_grad = ids[np.flatnonzero(inside)], grad[np.flatnonzero(inside)]  # run_bound's own tokens alone, sort path
        t_own, _ = chain_ms(lambda mg: ew._accumulate_alone(own_ids, own_grad, mg, zero_rows=True, path=SORT), jnp.asarray(mg0))
        print(f"JAX n={n} TP={tp}: zero_rows {t_call * 1e3:.1f} us, masked {t_masked * 1e3:.1f}{'' if ok else ' DIFFERENT'}, "
              f"dropped {t_drop * 1e3:.1f}, own tokens alone {t_own * 1e3:.1f}", flush=True)


def run_none_masked():
    """The masked route's worst case: masked given with no token masked (a TP = 1 caller that passes
    its all-False mask), so the route sorts all n tokens on the merge sort, where the call without
    masked takes the library sort above MERGE_SORT_MAX_TOKENS. PROBE_POINTS here are n:ids (ids over
    the whole vocabulary, uniform or zipf): torch in CUDA graphs, JAX in chains of donated calls,
    each checked bit for bit (torch against the deterministic dense path on the rows of ids that occur,
    the other rows against main_grad; JAX against the core, every row)."""
    import jax.numpy as jnp
    import torch
    from bench_jax import chain_ms
    from bench_torch import dense_expected, graph_ms, same_bits
    from common import ids_for

    import jax_frontend
    import torch_frontend
    from embwgrad_core import reference

    for spec in os.environ.get("PROBE_POINTS", "65536:uniform,65536:zipf").split(","):
        n, dist = int(spec.split(":")[0]), spec.split(":")[1]
        ids_np = ids_for(dist, n, REAL_V)
        rng = np.random.default_rng(n)
        grad_np = rng.standard_normal((n, REAL_H), dtype=np.float32).astype(jnp.bfloat16)
        mg0 = rng.standard_normal((REAL_V, REAL_H), dtype=np.float32)
        ids, main_grad = torch.from_numpy(ids_np).cuda(), torch.from_numpy(mg0).cuda()
        grad = torch.from_numpy(grad_np.view(np.int16)).cuda().view(torch.bfloat16)
        none = torch.zeros(n, dtype=torch.bool, device="cuda")
        # The rows of ids that occur against the dense path; the others must keep their bits, which the dense
        # path changes where they hold -0 (NumPy's float32 normals hold a few: 47 in this main_grad at 65536).
        touched = torch.from_numpy(np.unique(ids_np)).cuda()
        expected = dense_expected(ids, grad, main_grad)
        out = main_grad.clone()
        torch_frontend.accumulate(ids, grad, out, masked=none)
        untouched = torch.ones(REAL_V, dtype=torch.bool, device="cuda")
        untouched[touched] = False
        ok = same_bits(out[touched], expected[touched]) and same_bits(out[untouched], main_grad[untouched])
        t_without = graph_ms(lambda: torch_frontend.accumulate(ids, grad, out, zero_rows=True)) * 1e3
        t_none = graph_ms(lambda: torch_frontend.accumulate(ids, grad, out, masked=none)) * 1e3
        del out, main_grad, expected
        torch.cuda.empty_cache()
        jids, jgrad, jnone = jnp.asarray(ids_np.astype(np.int32)), jnp.asarray(grad_np), jnp.zeros(n, bool)
        got = np.asarray(jax_frontend.accumulate(jids, jgrad, jnp.asarray(mg0), masked=jnone))
        jok = np.array_equal(got.view(np.int32), reference.accumulate(ids_np, grad_np, mg0).view(np.int32))  # (the core keeps every other row)
        j_without, _ = chain_ms(lambda mg: jax_frontend.accumulate(jids, jgrad, mg, zero_rows=True), jnp.asarray(mg0))
        j_none, _ = chain_ms(lambda mg: jax_frontend.accumulate(jids, jgrad, mg, masked=jnone), jnp.asarray(mg0))
        print(f"n={n} {dist}: torch without masked {t_without:.1f} us, none masked {t_none:.1f}{'' if ok else ' DIFFERENT'}; "
              f"JAX without masked {j_without * 1e3:.1f}, none masked {j_none * 1e3:.1f}{'' if jok else ' DIFFERENT'}", flush=True)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if "--none-masked" in sys.argv:
        run_none_masked()
    elif "--jax" in sys.argv and "--bound" in sys.argv:
        run_bound_jax()
    elif "--jax" in sys.argv:
        run_jax(args[0].split(",") if args else ["default"], with_mask="--masked" in sys.argv, unrolled="--unrolled" in sys.argv)
    elif "--bound" in sys.argv:
        run_bound()
    elif "--gap" in sys.argv:
        run_gap()
    elif "--stages" in sys.argv:
        run_stages(with_mask="--masked" in sys.argv, dropped="--dropped" in sys.argv)
    else:
        run_torch(args[0].split(",") if args else list(DEFAULT_VARIANTS), with_mask="--masked" in sys.argv)
