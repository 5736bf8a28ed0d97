"""Compile every Triton kernel variant of torch_frontend for sm_90 (Hopper) on a machine without a GPU.

Triton's interpreter runs kernels in NumPy and forgives what the compiler rejects (globals
that are not constexpr, a variable whose type changes between branches, ...). This check
runs the real front end, optimiser and ptxas for the H200's target, so such errors show in
CI instead of on the GPU. It launches nothing.

    python scripts/compile_check.py            # sm_90
    python scripts/compile_check.py 80 100     # other compute capabilities (A100, B200)

Below 9.0 the variants are compiled as the launcher runs them there (_device_traits: no
programmatic dependent launch, so PDL and the partials kernel's L2 prefetch off).
"""

import itertools
import os
import sys
import time

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from embwgrad_core import CHUNK, NROWS, merge_tiles  # noqa: E402
from torch_frontend import embedding_wgrad as ew  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
DTYPES = {0: "fp32", 1: "bf16", 2: "fp16"}


def signature(fn, types: dict, constexprs: dict) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = types.get(name, "*i32")
        else:
            sig[name] = types.get(name, "i32")
    return sig


def compile_one(fn, types, constexprs, num_warps=4, divisible=(), **options):
    """fn compiled for TARGET; the arguments named in divisible are marked multiples of 16, as a launch specialises them."""
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) if name in divisible}
    src = ASTSource(fn=fn, signature=signature(fn, types, constexprs), constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=TARGET, options={"num_warps": num_warps, "enable_fp_fusion": False, **options})  # as _Launcher


def variants():
    for ids in ("*i32", "*i64"):
        yield f"rank ids={ids}", ew._rank_kernel, {"ids_ptr": ids}, {"PDL": True, "CHUNK_SIZE": CHUNK, "BLOCK_I": ew.RANK_TILES[0], "BLOCK_J": ew.RANK_TILES[1]}
        for block in (256, 512, 2048):
            tiles = merge_tiles(block)
            consts = {"BLOCK": block, "BLOCK_I": tiles.block_i, "TILE": tiles.tile, "COUNT": True, "COMPACT": False, "PDL": True}
            yield f"block_sort {block} ids={ids}", ew._block_sort_kernel, {"ids_ptr": ids}, consts
        # accumulate's masked on the merge sort: the masked route's compaction, its block sort (on the compacted keys) and row 0.
        yield f"compact_counts ids={ids}", ew._compact_counts_kernel, {"ids_ptr": ids, "masked_ptr": "*u8"}, {"BLOCK": ew.COMPACT_BLOCK, "PDL": True}
        for blocks_p2 in (64, 128):  # up to MERGE_SORT_MAX_TOKENS, and up to MASKED_MERGE_SORT_MAX_TOKENS
            yield (f"compact ids={ids} blocks {blocks_p2}", ew._compact_kernel, {"ids_ptr": ids, "masked_ptr": "*u8"},
                   {"BLOCK": ew.COMPACT_BLOCK, "BLOCKS_P2": blocks_p2, "PDL": True})
    for block in (512, 1024):  # merge_block(MERGE_SORT_MAX_TOKENS), merge_block(MASKED_MERGE_SORT_MAX_TOKENS)
        tiles = merge_tiles(block)
        for count in (False, True):  # (with the lone tokens' counts zeroed: up to MERGE_SORT_MAX_TOKENS)
            yield (f"block_sort compact {block}" + (" count" if count else ""), ew._block_sort_kernel, {},
                   {"BLOCK": block, "BLOCK_I": tiles.block_i, "TILE": tiles.tile, "COUNT": count, "COMPACT": True, "PDL": True})
    for grad, main in ((1, 0), (0, 0), (2, 1)):
        types = {"grad_ptr": "*" + DTYPES[grad], "main_grad_ptr": "*" + DTYPES[main]}
        types.update({k: "i64" for k in ("grad_stride0", "grad_stride1", "grad_stride_h", "main_grad_stride")})
        yield (f"row0 grad={DTYPES[grad]} main_grad={DTYPES[main]}", ew._row0_kernel, types,
               {"SPAN": NROWS, "GRAD_ROUNDING": grad, "MAIN_ROUNDING": main, "BLOCK_H": ew.ROW0_BLOCK_H, "PDL": True})
    for block, blocks in ((256, 32), (512, 64), (2048, 64)):
        consts = {"BLOCK": block, "NUM_BLOCKS": blocks, "STEPS": 5, "BLOCK_U": 1024 // blocks, "SPAN": NROWS,
                  "GROUP_P2": 32, "WINDOW": 16, "COUNT": True, "PDL": True, "COUNT_AGGREGATE": ew.COUNT_AGGREGATE,
                  "PLAN_POLICY": "evict_last" if ew.PLAN_EVICT_LAST else "", "DEFER": 0, "COMPACT": False}
        yield f"merge_rank {block}x{blocks}", ew._merge_rank_kernel, {}, consts
    # accumulate's masked: the records of runs with flags deferred to _masked_records_kernel (torch.sort),
    # and the masked route's merge of the compacted tokens.
    yield "merge_rank masked", ew._merge_rank_kernel, {}, {**consts, "DEFER": ew.ZERO_SKIP_MIN_PARTIALS}
    yield "merge_rank compact", ew._merge_rank_kernel, {}, {**consts, "COUNT": False, "COMPACT": True}
    yield "merge_rank compact count", ew._merge_rank_kernel, {}, {**consts, "COUNT": True, "COMPACT": True}
    for defer in (0, ew.ZERO_SKIP_MIN_PARTIALS):
        yield f"runs defer={defer}", ew._runs_kernel, {}, {"BLOCK": 1024, "SPAN": NROWS, "PDL": True, "DEFER": defer}  # after torch.sort only
    yield "masked_records", ew._masked_records_kernel, {"masked_ptr": "*u8"}, {"BLOCK": ew.MASKED_RECORDS_BLOCK, "SPAN": NROWS, "SPAN_P2": 16, "DEFER": ew.ZERO_SKIP_MIN_PARTIALS,
                                                                             "POLICY": "evict_last", "PDL": True}
    # Scratch: fp32, or bf16 bits in int16 on the feature path with bf16 grads (ew._Config.bf16_scratch).
    scratches = [(f, g, m, "fp32") for f, g, m in itertools.product((True, False), DTYPES, DTYPES)]
    scratches += [(True, g, m, "i16") for g, m in itertools.product(DTYPES, DTYPES) if DTYPES[g] == "bf16"]
    # The sort path with and without accumulate's zero_rows (flags, _Config.zero_skip); with them
    # only for bf16 grads into fp32 main_grad: the flags' code does not depend on the dtypes.
    # And accumulate's masked (MASKED, which implies zero_rows on the sort path) on both paths.
    runs = [(f, g, m, sc, 0, False) for f, g, m, sc in scratches]
    runs += [(False, 1, 0, "fp32", ew.ZERO_SKIP_MIN_PARTIALS, False)]  # (DTYPES codes: bf16 grad, fp32 main_grad)
    runs += [(False, 1, 0, "fp32", ew.ZERO_SKIP_MIN_PARTIALS, True), (True, 1, 0, "i16", 0, True)]
    for feature, grad, main, scratch, skip_min, masked in runs:
        span = CHUNK if feature else NROWS
        common = {"PDL": True, "FEATURE_PATH": feature, "SPAN": span, "GRAD_ROUNDING": grad, "MAIN_ROUNDING": main}
        skip = {"SKIP_MIN": skip_min, "SKIP_BLOCK": ew.ZERO_SKIP_BLOCK, "SKIP_WIDE": ew.ZERO_SKIP_WIDE}
        tag = f"feature={feature} grad={DTYPES[grad]} main_grad={DTYPES[main]} scratch={scratch}" + (" zero_rows" if skip_min else "") + (" masked" if masked else "")
        types = {"grad_ptr": "*" + DTYPES[grad], "main_grad_ptr": "*" + DTYPES[main], "partials_ptr": "*" + scratch, "ids_ptr": "*i64"}
        types.update({k: "i64" for k in ("grad_stride0", "grad_stride1", "grad_stride_h", "main_grad_stride")})
        yield (
            f"partials {tag}",
            ew._partials_kernel,
            types,
            {**common, "CHUNK_SIZE": CHUNK, "BLOCK_H": 1024, "PREFETCH": True, "RECORD_HINT": ew.RECORD_HINT, "L1_HINT": ew.RECORD_HINT, "FOLD_H": 256, "FOLD_BATCH": 16,
             "PREFETCH_L2": not feature, "LONE": not feature, "SCRATCH_POLICY": "" if feature else "evict_last", "FOLD_STAGES": 0, **skip,
             "PLAN_POLICY": "" if feature or not ew.PLAN_EVICT_LAST else "evict_last", "PREFETCH_EVICT_LAST": 0 if feature else ew.PREFETCH_EVICT_LAST,
             "MASKED": masked, "KEPT": False},
        )
        # The masked route: its first kept tokens (lone ones, rows prefetched) read from the compaction.
        if masked and not feature:
            yield (
                f"partials {tag} route",
                ew._partials_kernel,
                {**types, "ids_ptr": "*i32"},
                {**common, "CHUNK_SIZE": CHUNK, "BLOCK_H": 1024, "PREFETCH": True, "RECORD_HINT": ew.RECORD_HINT, "L1_HINT": ew.RECORD_HINT,
                 "FOLD_H": 256, "FOLD_BATCH": 16, "PREFETCH_L2": True, "LONE": True, "SCRATCH_POLICY": "evict_last", "FOLD_STAGES": 0,
                 **skip, "PLAN_POLICY": "evict_last" if ew.PLAN_EVICT_LAST else "", "PREFETCH_EVICT_LAST": ew.PREFETCH_EVICT_LAST,
                 "MASKED": True, "KEPT": True},
            )
        yield (
            f"long_runs {tag}",
            ew._long_runs_kernel,
            types,
            {**common, "BLOCK_H": 128, "BATCH": 32 if feature else ew.LONG_FOLD[1], "STAGES": 0 if feature else ew.LONG_FOLD[0],
             "PARTIAL_BLOCK_H": 1024, **skip},
        )


def main(archs=(90,)):
    global TARGET
    failures = 0
    for arch, (name, fn, types, constexprs) in ((a, v) for a in archs for v in variants()):
        TARGET = GPUTarget("cuda", arch, 32)
        if arch < 90:  # as _device_traits launches there: no PDL, so no L2 prefetch either
            constexprs = {**constexprs, "PDL": False, **({"PREFETCH_L2": False} if "PREFETCH_L2" in constexprs else {})}
        if len(archs) > 1 or arch != 90:
            name = f"sm_{arch} {name}"
        t = time.perf_counter()
        # The sort path's partials kernel is launched with a register target (_config's partial_maxnreg).
        options = {"maxnreg": ew.PARTIAL_MAXNREG} if fn is ew._partials_kernel and not constexprs["FEATURE_PATH"] else {}
        try:
            kernel = compile_one(fn, types, constexprs, **options)
            meta = kernel.metadata
            print(f"ok   {name}: {meta.num_warps} warps, {meta.shared} B shared, {time.perf_counter() - t:.1f}s", flush=True)
        except Exception as e:  # report every variant, then fail
            failures += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(tuple(int(a) for a in sys.argv[1:]) or (90,)))
