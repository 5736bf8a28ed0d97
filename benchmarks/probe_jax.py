"""Where the JAX frontend's time goes (for benchmarks/NOTES.md): whole calls under _Config
variants, medians of chains of donated calls (bench_jax.chain_ms).

    python benchmarks/probe_jax.py                  (every variant)
    python benchmarks/probe_jax.py default,fold32   (those named)
    python benchmarks/probe_jax.py graph            (XLA's command buffer, fresh grad arrays)
    python benchmarks/probe_jax.py dispatch         (host time per call against chain time per call)
    python benchmarks/probe_jax.py chain            (time per call against the chain's length)

``graph`` times ``accumulate`` called on its own (one command buffer for its kernels) against
the plain jit, both with a new grad array every call, as in training, where XLA must update
the command buffer's arguments each time.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from bench_jax import chain_ms
from common import ids_for, probe_points, probe_shape

from jax_frontend import embedding_wgrad as ew

REAL_V, REAL_H = probe_shape()  # (V, H): the real shape, or PROBE_SHAPE

POINTS = probe_points([(4096, "uniform"), (8192, "uniform"), (8192, "zipf"), (32768, "uniform"), (32768, "zipf")])  # or PROBE_POINTS
# The settings this frontend takes up to FOLD_ROLE_MAX_TOKENS, as overrides (v48's variants above it).
_FOLDERS = (("fold_programs", ew.FOLD_PROGRAMS_PER_SM * ew._gpu_sms()),)
_TAIL = (("tail_programs", ew.TAIL_PROGRAMS_PER_SM * ew._gpu_sms()),)
_TWO_WARPS = (("partial_warps", 2),)

#: name -> _Config overrides
VARIANTS = {
    "default": (),
    # v40: the merge sort's positions and records kept in L2 with evict_last (PLAN_EVICT_LAST), or not.
    "no plan evict last": (("plan_evict_last", False),),
    # v41: extra merge-kernel programs read the first positions' rows into L2 (evict_last) while the merge runs
    # (the default since v41: ROWS_AHEAD = 256).
    "no rows ahead": (("rows_ahead", 0),),
    "rows ahead 256": (("rows_ahead", 256),),
    "rows ahead 512": (("rows_ahead", 512),),
    "rows ahead 512 2": (("rows_ahead", 512),),
    "rows ahead 1024": (("rows_ahead", 1024),),
    "rows ahead 512 per 8": (("rows_ahead", 512), ("rows_ahead_per", 8)),
    "rows ahead 128": (("rows_ahead", 128),),
    "rows ahead 128 2": (("rows_ahead", 128),),
    "rows ahead 96": (("rows_ahead", 96),),
    "rows ahead 192": (("rows_ahead", 192),),
    "rows ahead 256 2": (("rows_ahead", 256),),
    "rows ahead 256 per 2": (("rows_ahead", 256), ("rows_ahead_per", 2)),
    "rows ahead 256 per 8": (("rows_ahead", 256), ("rows_ahead_per", 8)),
    "rows ahead 384": (("rows_ahead", 384),),
    "default 2": (),
    # v29: zero partials (Megatron's masked tokens) skipped by the folds: off, more flags a block, more runs flagged
    "skip off": (("zero_skip", 0),),
    # v50: masked without the deferred records (v49's plan: every partial of row 0's run an item)
    "no masked defer": (("masked_defer", False),),
    "no compact": (("compact", False),),
    "no masked defer 2": (("masked_defer", False),),
    "skip block 256": (("skip_block", 256),),
    "skip block 128": (("skip_block", 128),),
    "skip min 32": (("zero_skip", 32),),
    "skip block 512": (("skip_block", 512),),
    "skip block 1024": (("skip_block", 1024),),
    "skip block 2048": (("skip_block", 2048),),
    # session 53: zero checks on skip_wide blocks of flags at once, first only until a block with a
    # 0; a block's nonzero partials gathered from its flags (_fold)
    "wide 1": (("skip_wide", 1),),
    "wide 4": (("skip_wide", 4),),
    "wide 8": (("skip_wide", 8),),
    # v8 (branch jax-fold-role): long runs folded by _long_runs_kernel instead of the partials kernel's folding programs.
    "fold kernel": (("fold_programs", 0),),
    "no prefetch": (("prefetch", False),),
    "partials 32/SM": (("partial_programs", 32 * ew._gpu_sms()),),
    "partials 48/SM": (("partial_programs", 48 * ew._gpu_sms()),),
    "partials 64/SM": (("partial_programs", 64 * ew._gpu_sms()),),
    "partials 96/SM": (("partial_programs", 96 * ew._gpu_sms()),),
    "partials 192/SM": (("partial_programs", 192 * ew._gpu_sms()),),
    "partials 1 warp": (("partial_warps", 1),),
    "partials 512 columns 1 warp": (("block_h", 512), ("partial_warps", 1)),
    "fold 256 columns, 4 warps, batch 16": (("long_batch", 16), ("long_block_h", 256), ("long_warps", 4)),
    # The long-run fold with all of a run's partials in flight at once (v7).
    "fold32": (("long_block_h", 32), ("long_batch", 128)),
    "fold32 b64": (("long_block_h", 32), ("long_batch", 64)),
    "fold64 b64": (("long_block_h", 64), ("long_batch", 64)),
    # v9 (not yet measured): fewer merge lanes per program, so more merge programs (tokens per
    # merge program; the default is 1024 lanes over the blocks: 64 at 4096 tokens, 32 at 8192).
    "merge_u 16": (("merge_u", 16),),
    "merge_u 8": (("merge_u", 8),),
    "merge_u 32": (("merge_u", 32),),
    "merge_u 64": (("merge_u", 64),),
    # v11: the long-run kernel folds and the partials kernel has one warp, as above FOLD_ROLE_MAX_TOKENS.
    "fold kernel 1 warp": (("fold_programs", 0), ("partial_warps", 1)),
    "merge_u 4": (("merge_u", 4),),
    # v43: more programs at large H (items per program grow with H's blocks: NOTES v42 item 9).
    "partials 192/SM 2": (("partial_programs", 192 * ew._gpu_sms()),),
    "partials 256/SM": (("partial_programs", 256 * ew._gpu_sms()),),
    "partials 256/SM 2": (("partial_programs", 256 * ew._gpu_sms()),),
    "partials 384/SM": (("partial_programs", 384 * ew._gpu_sms()),),
    "partials 128/SM": (("partial_programs", 128 * ew._gpu_sms()),),
    "partials 128/SM 2": (("partial_programs", 128 * ew._gpu_sms()),),
    "fold 2/SM": (("fold_programs", 2 * ew._gpu_sms()),),
    "block_h 2048": (("block_h", 2048),),
    "block_h 2048 4 warps": (("block_h", 2048), ("partial_warps", 4)),
    # v17, measured in v18 item 1 (slower in JAX: default kept): the feature path's rank kernel, as probe_calls' twins.
    "rank warps 8": (("rank_warps", 8),),
    "rank warps 16": (("rank_warps", 16),),
    "rank warps 8 bj 512": (("rank_warps", 8), ("block_j", 512)),
    "rank warps 16 bj 1024": (("rank_warps", 16), ("block_j", 1024)),
    # v19 (as probe_calls.py): merge blocks of 512 tokens
    "merge_block 512": (("merge_block", 512),),
    # v20: Triton's software-pipelining stages for every kernel of the call (default 2), never varied.
    "stages 1": (("num_stages", 1),),
    "stages 3": (("num_stages", 3),),
    # v22: the last programs take one item each, as the torch twin's (default 24 per SM).
    "tail 0": (("tail_programs", 0),),
    "tail 12/SM": (("tail_programs", 12 * ew._gpu_sms()),),
    "tail 48/SM": (("tail_programs", 48 * ew._gpu_sms()),),
    # v28: the folds load the next batch while they add this one (_fold's ahead), at register
    # footprints near the defaults' (long: 128 columns x 32 partials a warp; folders: 256 x 16 on two warps).
    "long ahead 16": (("long_ahead", True), ("long_batch", 16)),
    "long ahead 32 w64": (("long_ahead", True), ("long_batch", 32), ("long_block_h", 64)),
    "long ahead 64 w32": (("long_ahead", True), ("long_batch", 64), ("long_block_h", 32)),
    "fold ahead 8": (("fold_ahead", True), ("fold_batch", 8)),
    "fold ahead 16 h128": (("fold_ahead", True), ("fold_batch", 16), ("fold_h", 128)),
    "fold ahead 32 h64": (("fold_ahead", True), ("fold_batch", 32), ("fold_h", 64)),
    "fold 64x64": (("fold_batch", 64), ("fold_h", 64)),
    "ahead": (("long_ahead", True), ("long_batch", 16), ("fold_ahead", True), ("fold_batch", 16), ("fold_h", 128)),
    "default again": (),
    # v44: launch settings at 4096 tokens, each twice (v21 item 7 read 0.3-0.4 us for some, within noise).
    "tail 0 2": (("tail_programs", 0),),
    "fold 2/SM 2": (("fold_programs", 2 * ew._gpu_sms()),),
    "partials 96/SM 2": (("partial_programs", 96 * ew._gpu_sms()),),
    "small combo": (("tail_programs", 0), ("fold_programs", 2 * ew._gpu_sms()), ("partial_programs", 96 * ew._gpu_sms())),
    "small combo 2": (("tail_programs", 0), ("fold_programs", 2 * ew._gpu_sms()), ("partial_programs", 96 * ew._gpu_sms())),
    "merge_u 8 2": (("merge_u", 8),),
    "merge_u 8 3": (("merge_u", 8),),
    "m8 combo": (("merge_u", 8), ("tail_programs", 0), ("partial_programs", 96 * ew._gpu_sms())),
    "m8 combo 2": (("merge_u", 8), ("tail_programs", 0), ("partial_programs", 96 * ew._gpu_sms())),
    "m8 combo 3": (("merge_u", 8), ("tail_programs", 0), ("partial_programs", 96 * ew._gpu_sms())),
    "default 3": (),
    "long batched": (("long_ahead", False), ("long_batch", 32)),  # v28: the long-run kernel as before (feature path too)
    # v48: above FOLD_ROLE_MAX_TOKENS, folder programs in the partials kernel (torch's FOLDERS_MAX_TOKENS, v47 item 6)
    # instead of the long-run kernel: as torch (one warp, no tail), and with the forms this frontend takes up to 8192 tokens.
    "folders": _FOLDERS,
    "folders tail": _FOLDERS + _TAIL,
    "folders 2w tail": _FOLDERS + _TWO_WARPS + _TAIL,
    "folders 2w tail 192/SM": _FOLDERS + _TWO_WARPS + _TAIL + (("partial_programs", 192 * ew._gpu_sms()),),
    "folders 2": _FOLDERS,
    "folders 2w tail 2": _FOLDERS + _TWO_WARPS + _TAIL,
}


def graph(key, main_grad):
    """The command-buffer jit against the plain one (XLA's own launches), with the same grad every
    call (as bench_jax) and with four grad arrays taken in turn (as in training, where XLA must
    update the command buffer's arguments); each twice, alternating. PROBE_POINTS picks the points."""
    points = probe_points([(1024, "uniform"), (1024, "zipf"), (4096, "uniform"), (8192, "uniform"), (8192, "zipf"), (32768, "uniform")])
    names = [f"{jit} {grads}" for grads in ("same grad", "fresh grads") for jit in ("plain jit", "command buffer")]
    results = {}
    for n, dist in points:
        grads = [jax.random.normal(jax.random.fold_in(key, n + r), (n, REAL_H), jnp.float32).astype(jnp.bfloat16) for r in range(4)]
        ids = jnp.asarray(ids_for(dist, n, REAL_V), jnp.int32)
        for name in names * 2:
            fn = ew._accumulate_alone if "command" in name else ew._accumulate
            turn = [0]

            def step(mg, fn=fn, turn=turn, fresh="fresh" in name):
                turn[0] += fresh
                return fn(ids, grads[turn[0] % 4], mg)

            ms, main_grad = chain_ms(step, main_grad)
            results.setdefault((n, dist, name), []).append(ms * 1e3)
            print(f"n={n:6d} {dist:7s} {name:26s}: {ms * 1e3:.1f} us", flush=True)
    print("| us per call (two chains) | " + " | ".join(f"{n} {d}" for n, d in points) + " |")
    print("|---" * (len(points) + 1) + "|")
    for name in names:
        print(f"| {name} | " + " | ".join(" / ".join(f"{v:.1f}" for v in results[(n, d, name)]) for n, d in points) + " |")


def dispatch(key, main_grad):
    """Host time per call (20 calls issued, not waited for) against the chain's time per call."""
    import time

    touch = jax.jit(lambda mg: mg.at[0, 0].add(1.0), donate_argnums=0)  # a donated call of one tiny kernel
    for n, dist in [(1024, "uniform"), (4096, "uniform"), (8192, "uniform")]:
        grad = jax.random.normal(jax.random.fold_in(key, n), (n, REAL_H), jnp.float32).astype(jnp.bfloat16)
        ids = jnp.asarray(ids_for(dist, n, REAL_V), jnp.int32)
        calls = (("accumulate", lambda mg: ew.accumulate(ids, grad, mg)), ("plain jit", lambda mg: ew._accumulate(ids, grad, mg)),
                 ("tiny donated jit", touch))
        for name, fn in calls * 2:
            main_grad = fn(main_grad)
            main_grad.block_until_ready()
            t0 = time.perf_counter()
            for _ in range(20):
                main_grad = fn(main_grad)
            t1 = time.perf_counter()
            main_grad.block_until_ready()
            t2 = time.perf_counter()
            print(f"n={n:6d} {dist:7s} {name:17s} host {(t1 - t0) / 20 * 1e6:6.1f} us/call, chain {(t2 - t0) / 20 * 1e6:6.1f} us/call",
                  flush=True)


def chain(key, main_grad):
    """Time per call of chains of 20, 100 and 300 donated calls: what the chain's start and end add."""
    scatter = jax.jit(lambda mg, ids, g: mg.at[ids].add(g.astype(jnp.float32)), donate_argnums=0)
    for n, dist in POINTS:
        grad = jax.random.normal(jax.random.fold_in(key, n), (n, REAL_H), jnp.float32).astype(jnp.bfloat16)
        ids = jnp.asarray(ids_for(dist, n, REAL_V), jnp.int32)
        for name, fn in (("accumulate", lambda mg: ew.accumulate(ids, grad, mg)), ("xla scatter", lambda mg: scatter(mg, ids, grad))):
            cells = []
            for reps in (20, 100, 300, 20, 100, 300):
                ms, main_grad = chain_ms(fn, main_grad, reps=reps)
                cells.append(f"{reps}: {ms * 1e3:.1f}")
            print(f"n={n:6d} {dist:7s} {name:12s} us/call by chain length " + ", ".join(cells), flush=True)


def main(argv):
    key = jax.random.PRNGKey(0)
    main_grad = jax.random.normal(key, (REAL_V, REAL_H), jnp.float32)
    if argv and argv[0] == "graph":
        return graph(key, main_grad)
    if argv and argv[0] == "dispatch":
        return dispatch(key, main_grad)
    if argv and argv[0] == "chain":
        return chain(key, main_grad)
    only = argv[0].split(",") if argv else list(VARIANTS)
    results = {}
    for n, dist in POINTS:
        grad = jax.random.normal(jax.random.fold_in(key, n), (n, REAL_H), jnp.float32).astype(jnp.bfloat16)
        ids = jnp.asarray(ids_for(dist, n, REAL_V), jnp.int32)
        rows = np.unique(np.asarray(ids))
        start = jnp.array(main_grad, copy=True)  # each variant's bits against the default's from it (the chains change main_grad)
        base = np.asarray(ew._accumulate(ids, grad, jnp.array(start, copy=True))[rows]).view(np.int32)
        for name in only:
            try:
                out = np.asarray(ew._accumulate(ids, grad, jnp.array(start, copy=True), overrides=VARIANTS[name])[rows]).view(np.int32)
                if not (out == base).all():
                    print(f"n={n:6d} {dist:7s} {name}: DIFFERENT from the default", flush=True)
                ms, main_grad = chain_ms(lambda mg, o=VARIANTS[name]: ew._accumulate(ids, grad, mg, overrides=o), main_grad)
            except Exception as e:  # a variant that does not compile: report it, go on
                print(f"n={n:6d} {dist:7s} {name}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
                ms = float("nan")
            results[(n, dist, name)] = ms * 1e3
            print(f"n={n:6d} {dist:7s} {name}: {ms * 1e3:.1f} us", flush=True)
    print("| variant (us) | " + " | ".join(f"{n} {d}" for n, d in POINTS) + " |")
    print("|---" * (len(POINTS) + 1) + "|")
    for name in only:
        print(f"| {name} | " + " | ".join(f"{results[(n, d, name)]:.1f}" for n, d in POINTS) + " |")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
