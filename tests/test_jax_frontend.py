"""jax_frontend: the Pallas kernels, bit for bit.

Both backends (Pallas interpret mode on CPU, the Triton kernels on a GPU): every shared CPU
case against the core reference, each stage against the core's plan, the four sorts, input
checks, empty inputs, a user's jit with lax.scan, the README's training-step recipe (jax.vjp),
donation, the CUDA lowering (Triton pinned, main_grad aliased), the distance to XLA's own dense
scatter-add. GPU only (skipped unless jax's default backend is "gpu"; EMBWGRAD_REQUIRE_GPU=1
makes a missing GPU a failure): the shared GPU cases against the core reference, absent rows,
extra memory.
"""

import contextlib
import dataclasses
import functools
import os
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jax_frontend
from embwgrad_core import FEATURE, FEATURE_PATH_MAX_TOKENS, FOLD_ROLE_MAX_TOKENS, MASKED_LOOKUP_ID, MASKED_MERGE_SORT_MAX_TOKENS, MERGE_MAX_BLOCKS, MERGE_SORT_MAX_TOKENS, NROWS, PARTIAL_PROGRAMS_PER_SM, SORT, key_packing, make_plan, masked_split, merge_block, merge_tiles, reference
from embwgrad_core.dtypes import numpy_dtype
from jax_frontend import embedding_wgrad as ew
from tests.cases import ITEM_RANGE_GRIDS, ITEM_RANGE_ITEMS, MASKED_ROUTE_EDGES, Case, assert_bits_equal, assert_item_ranges, assert_masked_flags, assert_partials_equal, cpu_cases, gpu_cases, item_range_folders, masked_arrays, masked_route_edge, masked_row0_tokens, masked_tokens, release_compiled_code, runs_ids, zipf_ids

ON_GPU = jax.default_backend() == "gpu"
requires_gpu = pytest.mark.skipif(not ON_GPU, reason="needs jax with a GPU backend")
SMALLEST_NORMAL = np.float32(2.0**-126)


def to_jax(a: np.ndarray) -> jax.Array:
    """A device copy; int64 ids become int32 unless x64 is on (every case's ids fit)."""
    if a.dtype == np.int64 and not jax.config.jax_enable_x64:
        a = a.astype(np.int32)
    return jnp.array(a)


def run_kernels(case: Case, ids, grad, main_grad, **overrides) -> np.ndarray:
    """The case through the public accumulate (path None, no overrides) or the forced path."""
    if case.path is None and not overrides:
        out = jax_frontend.accumulate(to_jax(ids), to_jax(grad), to_jax(main_grad), padding_idx=case.padding_idx)
    else:
        out = ew._accumulate(
            to_jax(ids),
            to_jax(grad),
            to_jax(main_grad),
            padding_idx=case.padding_idx,
            path=case.path,
            overrides=tuple(overrides.items()),
        )
    return np.asarray(out)


def flush_subnormals(a: np.ndarray) -> np.ndarray:
    """fp32 subnormals of a as signed zeros, in a's dtype: what XLA:CPU's FTZ/DAZ makes of them."""
    f = a.astype(np.float32)
    return np.where(np.abs(f) < SMALLEST_NORMAL, np.copysign(np.float32(0), f), f).astype(a.dtype)


# ----------------------------------------------------------------------------- every case, bitwise


@pytest.mark.parametrize("case", cpu_cases(), ids=lambda c: c.name)
def test_kernels_match_core_reference(case: Case):
    ids, grad, main_grad = case.arrays()
    expected = reference.accumulate(ids, grad, main_grad, padding_idx=case.padding_idx, path=case.path)
    assert_bits_equal(run_kernels(case, ids, grad, main_grad), expected)


@settings(max_examples=6, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 4), st.integers(1, 40)),
    vocab=st.integers(1, 30),
    hidden=st.integers(1, 20),
    padding=st.one_of(st.none(), st.integers(0, 29)),
    path=st.sampled_from([FEATURE, SORT]),
    dtypes=st.sampled_from([("bfloat16", "float32"), ("float32", "float16"), ("float16", "bfloat16")]),
    seed=st.integers(0, 2**16),
    mask_rate=st.sampled_from([0.0, 0.0, 0.5, 0.9]),
)
def test_random_cases_match_core_reference(shape, vocab, hidden, padding, path, dtypes, seed, mask_rate):
    """2-D ids with out-of-range ids (-2 .. V + 1) and any padding_idx, through either arithmetic;
    and (mask_rate > 0) a random masked with NaN in the masked rows."""
    release_compiled_code()  # (each example compiles its own shapes: a run of many examples needs it)
    rng = np.random.default_rng(seed)
    ids = rng.integers(-2, vocab + 2, size=shape)
    padding_idx = None if padding is None else padding % vocab
    case = Case("random", ids, hidden, vocab, *dtypes, padding_idx=padding_idx, path=path, seed=seed)
    ids, grad, main_grad = case.arrays()
    if mask_rate == 0:
        expected = reference.accumulate(ids, grad, main_grad, padding_idx=padding_idx, path=path)
        assert_bits_equal(run_kernels(case, ids, grad, main_grad), expected)
        return
    masked = rng.random(shape) < mask_rate
    grad = np.where(masked[..., None], np.asarray(np.nan, grad.dtype), grad)
    expected = reference.accumulate(ids, grad, main_grad, padding_idx=padding_idx, path=path, masked=masked)
    out = ew._accumulate(to_jax(ids), to_jax(grad), to_jax(main_grad), to_jax(masked), padding_idx=padding_idx, path=path)
    assert_bits_equal(np.asarray(out), expected)


SORT_CASES = [c for c in cpu_cases() if c.name in ("s-runs-f32-bf16", "s-padding", "ids-out-of-range")]


@pytest.mark.parametrize("tokens, per", [(5, 3), (10**6, 2)])
@pytest.mark.parametrize("case", SORT_CASES, ids=lambda c: c.name)
def test_rows_ahead_change_no_bit(case: Case, tokens, per):
    """The merge kernel's programs that read rows into L2 ahead (ROWS_AHEAD: off in interpret mode by default), forced on:
    a last program with fewer pieces than the others, and more positions asked for than the call has."""
    case = dataclasses.replace(case, path=SORT)
    ids, grad, main_grad = case.arrays()
    expected = reference.accumulate(ids, grad, main_grad, padding_idx=case.padding_idx, path=SORT)
    assert_bits_equal(run_kernels(case, ids, grad, main_grad, sort=ew.MERGE, rows_ahead=tokens, rows_ahead_per=per), expected)


@pytest.mark.parametrize("sort", [ew.PACKED, ew.PAIRS])
@pytest.mark.parametrize("case", SORT_CASES, ids=lambda c: c.name)
def test_lax_sorts_match_core_reference(case: Case, sort):
    """The sorts used above MERGE_SORT_MAX_TOKENS, forced on small cases, with keys of -1 (a padding id that occurs)."""
    case = dataclasses.replace(case, path=SORT, padding_idx=int(case.ids.flat[0]))
    ids, grad, main_grad = case.arrays()
    expected = reference.accumulate(ids, grad, main_grad, padding_idx=case.padding_idx, path=SORT)
    assert_bits_equal(run_kernels(case, ids, grad, main_grad, sort=sort), expected)


def test_sort_choice_follows_threshold_and_packing():
    def config(n, vocab, path=SORT, overrides=()):
        return ew._config(ew.Problem(n, 8, vocab, -1, "bfloat16", "float32"), path, (("interpret", False),) + overrides)

    top = MERGE_SORT_MAX_TOKENS
    assert config(top, 129280).sort == ew.MERGE
    assert config(FEATURE_PATH_MAX_TOKENS + 1, 129280).sort == ew.MERGE
    assert key_packing(top + 1, 2**14).dtype == "uint32" and config(top + 1, 2**14).sort == ew.PACKED
    assert key_packing(top + 1, 129280).dtype != "uint32" and config(top + 1, 129280).sort == ew.PAIRS
    assert key_packing(2**16, 2**17).dtype != "uint32" and config(2**16, 2**17).sort == ew.PAIRS
    assert config(3000, 10, FEATURE).sort == ew.RANK

    # The merge tiles follow merge_block(n), or a merge_block forced by the overrides.
    for n in (FEATURE_PATH_MAX_TOKENS + 1, 8192, top):
        cfg = config(n, 129280)
        blocks = -(-n // cfg.merge_block)
        tiles = merge_tiles(cfg.merge_block)
        assert (cfg.merge_block, cfg.merge_tile, cfg.merge_block_i) == (merge_block(n), tiles.tile, tiles.block_i)
        assert blocks <= cfg.merge_blocks < 2 * blocks and cfg.merge_blocks <= MERGE_MAX_BLOCKS
        lanes = ew.FEW_MERGE_LANES if n <= ew.FEW_MERGE_LANES_MAX_TOKENS else ew.SMALL_MERGE_LANES if n <= ew.SMALL_MERGE_LANES_MAX_TOKENS else tiles.lanes
        assert cfg.merge_u * cfg.merge_blocks == lanes
        folds = n <= FOLD_ROLE_MAX_TOKENS  # two warps where the partials kernel folds, one-warp programs above
        per_sm = PARTIAL_PROGRAMS_PER_SM if folds else ew.LONG_PARTIAL_PROGRAMS_PER_SM
        assert (cfg.unroll, cfg.partial_warps, cfg.partial_programs) == (True, 2 if folds else 1, per_sm * ew._gpu_sms())
    cfg = config(200, 10, overrides=(("merge_block", 8), ("merge_tile", 8)))
    assert (cfg.merge_block, cfg.merge_tile, cfg.merge_blocks, cfg.merge_u) == (8, 8, 32, ew.FEW_MERGE_LANES // 32)
    cfg = config(8192, 129280, overrides=(("interpret", True),))  # one tile per block, loops
    assert (cfg.merge_tile, cfg.unroll) == (cfg.merge_block, False)

    small = ew.Problem(100, 8, 10, -1, "bfloat16", "float32")
    for path, overrides, field in [
        (FEATURE, (("sort", ew.PACKED),), "sort"),
        (FEATURE, (("sort", ew.MERGE),), "sort"),
        (SORT, (("block_i", 32), ("block_j", 128)), "block_i"),
        (SORT, (("merge_block", 24),), "merge_block"),
        (SORT, (("merge_block", 8), ("merge_tile", 16)), "merge_tile"),
        (SORT, (("merge_block", 8), ("merge_blocks", 8)), "merge_blocks"),
    ]:
        with pytest.raises(ValueError, match=field):
            ew._config(small, path, overrides)


@pytest.mark.parametrize("n, masked, per_sm", [(8192, True, 48), (8193, True, 64), (16384, True, 64), (16385, True, 96), (65536, True, 96), (8192, False, 128),
                                               (16384, False, 256), (65536, False, 256)])
def test_masked_route_launch_settings(n, masked, per_sm):
    """On a GPU's settings (not interpret mode) the masked route (masked on the merge sort) runs at most
    masked_partial_programs_per_sm(n) partials programs per SM (48 up to 8192 tokens, 64 up to 16384, 96 above); a call without masked keeps n's (PARTIAL_PROGRAMS_PER_SM
    up to FOLD_ROLE_MAX_TOKENS at H = 7168, LONG_PARTIAL_PROGRAMS_PER_SM above, and at 65536 the lax sort)."""
    cfg = ew._config(ew.Problem(n, 7168, 129280, -1, "bfloat16", "float32"), SORT, (("interpret", False),), zero_rows=True,
                     masked=masked)
    assert cfg.sort == (ew.MERGE if masked or n <= MERGE_SORT_MAX_TOKENS else ew.PAIRS)
    assert cfg.partial_programs == per_sm * ew._gpu_sms()


# ----------------------------------------------------------------------------- stages against the plan


STAGE_LENGTHS = (1, 9, 10, 11, 20, 21, 33, 45, 4)
STAGE_CASE = Case("stages", runs_ids(STAGE_LENGTHS, 300, seed=3), 24, 300, padding_idx=None, seed=3)


@functools.partial(jax.jit, static_argnames=("problem", "cfg"))
def _stages(ids, grad, main_grad, problem, cfg):
    return ew._run_stages(ids, grad, main_grad, problem, cfg)


# Each route's sort and tiles (_Config overrides). Small tiles: the sort, the run search and the
# H blocks cross program boundaries; merge-small's blocks of 8 tokens make 20 blocks of the
# 154-token case; merge-gpu runs the GPU's own merge kernels on a case of three GPU blocks.
STAGE_ROUTES = {
    "sort-merge-small": (SORT, (("sort", ew.MERGE), ("merge_block", 8), ("merge_tile", 8))),
    "sort-merge-gpu": (SORT, "gpu"),
    "sort-rank": (SORT, (("sort", ew.RANK), ("block_i", 16), ("block_j", 8))),
    "sort-packed": (SORT, (("sort", ew.PACKED), ("prefetch", False))),
    "sort-pairs": (SORT, (("sort", ew.PAIRS), ("partial_programs", 3))),
    # Long runs folded by _long_runs_kernel (as above FOLD_ROLE_MAX_TOKENS), and by 3 folding programs with more partials in flight.
    "sort-merge-fold-kernel": (SORT, (("sort", ew.MERGE), ("fold_programs", 0))),
    "sort-merge-fold-role": (SORT, (("sort", ew.MERGE), ("fold_programs", 3), ("fold_batch", 3), ("unroll", True))),
    # The other form of each fold: the sort path's batch by batch (each batch's loads waited for
    # before the next are issued), the feature path's with the next batch loaded ahead (_fold's ahead).
    "sort-merge-fold-kernel-batched": (SORT, (("sort", ew.MERGE), ("fold_programs", 0), ("long_batch", 3), ("long_ahead", False))),
    "sort-merge-fold-role-batched": (SORT, (("sort", ew.MERGE), ("fold_programs", 3), ("fold_batch", 2), ("fold_ahead", False))),
    "feature-rank-ahead": (FEATURE, (("block_i", 64), ("block_j", 32), ("long_batch", 4), ("long_ahead", True))),
    "feature-rank": (FEATURE, (("block_i", 64), ("block_j", 32), ("unroll", True), ("long_batch", 3), ("bf16_scratch", True))),
    "feature-rank-wide-steps": (FEATURE, (("block_i", 32), ("block_j", 128))),
}


@pytest.mark.parametrize("route", STAGE_ROUTES)
def test_stages_match_core_plan(route):
    path, overrides = STAGE_ROUTES[route]
    case = STAGE_CASE
    if overrides == "gpu":
        case = dataclasses.replace(case, ids=runs_ids(STAGE_LENGTHS + (3,) * 140, 300, seed=3))  # 574 tokens
        gpu = ew._config(ew.Problem(case.ids.size, case.hidden, case.num_embeddings, -1, "bfloat16", "float32"), path, (("interpret", False),))
        assert gpu.sort == ew.MERGE and 2 * gpu.merge_block < case.ids.size, "the case must cross two merge blocks"
        overrides = tuple((f, getattr(gpu, f)) for f in ("merge_block", "merge_block_i", "merge_tile", "merge_blocks", "merge_u", "unroll", "long_batch"))
    ids, grad, main_grad = case.arrays()
    padding_idx = int(ids[0])  # a run of keys -1 too
    ids_j, grad_j, main_j = to_jax(ids), to_jax(grad), to_jax(main_grad)
    problem = ew._check(ids_j, grad_j, main_j, padding_idx)
    overrides += (("runs_block", 64), ("block_h", 8), ("long_block_h", 16), ("long_programs", 3))
    cfg = ew._config(problem, path, overrides)
    stages = jax.tree.map(lambda a: None if a is None else np.asarray(a), _stages(ids_j, grad_j, main_j, problem, cfg))
    plan = make_plan(ids, case.num_embeddings, padding_idx=padding_idx, path=path)

    assert_bits_equal(stages.sorted_keys, plan.sorted_keys.astype(np.int32), "sorted_keys")
    assert_bits_equal(stages.sorted_pos, plan.sorted_pos.astype(np.int32), "sorted_pos")
    assert_bits_equal(stages.run_start, plan.run_start.astype(np.int32), "run_start")
    assert_bits_equal(stages.run_end, plan.run_end.astype(np.int32), "run_end")
    if path == FEATURE:
        assert_bits_equal(stages.partial_ord, plan.partial_ord.astype(np.int32), "partial_ord")
    else:  # one record per partial that adds to main_grad, in any order
        assert stages.partial_ord is None
        records = stages.records.reshape(-1, ew.REC_FIELDS)[:, :5]
        front, back = int(stages.counts[ew._FRONT]), int(stages.counts[ew._BACK])
        s = plan.partial_slot[plan.sorted_keys[plan.partial_slot] >= 0]
        in_long_run = plan.run_end[s] - plan.run_start[s] > NROWS  # long runs' records from the front, the others from the back
        for got, slots in ((records[:front], s[in_long_run]), (records[ids.size - back :], s[~in_long_run])):
            expected = np.stack([slots, plan.sorted_keys[slots], plan.sorted_pos[slots], plan.run_start[slots], plan.run_end[slots]], axis=1)
            assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, expected.tolist()))

    listed = stages.long_runs[: int(stages.counts[ew._LISTED])]
    expected_runs = plan.long_runs.astype(np.int32)
    assert_bits_equal(np.array(sorted(map(tuple, listed)), np.int32), np.array(sorted(map(tuple, expected_runs)), np.int32), "long runs")
    assert len(plan.long_runs) >= 3  # the case has long runs, and the three programs share them

    sums = reference.partial_sums(plan, grad.reshape(ids.size, -1))
    run = plan.partial_run
    long = (plan.run_partials[run] > 1) & (plan.run_key[run] >= 0)
    assert_partials_equal(stages.partials[plan.partial_rows[long]], sums[long], path, case.grad_dtype)  # (ew._to_scratch)

    expected = reference.accumulate(ids, grad, main_grad, padding_idx=padding_idx, path=path)
    assert_bits_equal(stages.main_grad, expected)


@pytest.mark.parametrize("n, hidden, per_sm", [(8192, 7168, 128), (8192, 8192, 128), (8192, 12288, 192), (8192, 16384, 256),
                                                (8192, 18432, 256), (4096, 12288, 128), (4096, 16384, 128), (6144, 16384, 192),
                                                (16384, 7168, 256), (16384, 16384, 256), (131072, 4096, 256)])
def test_partial_programs_follow_items(n, hidden, per_sm):
    """Up to FOLD_ROLE_MAX_TOKENS the partials programs per SM follow n x H blocks (PARTIAL_PROGRAM_ITEMS), from 128 to 256; above, 256."""
    problem = ew.Problem(n, hidden, 129280, -1, "bfloat16", "float32")
    assert ew._config(problem, SORT, (("interpret", False),)).partial_programs == per_sm * ew._gpu_sms()


@pytest.mark.parametrize("hidden, positions", [(4096, 256), (7168, 256), (16384, 112)])
def test_rows_ahead_bounded_by_elements(hidden, positions):
    """The merge kernel reads 256 positions' rows ahead up to H = 7168, fewer above (ROWS_AHEAD_ELEMENTS)."""
    problem = ew.Problem(8192, hidden, 129280, -1, "bfloat16", "float32")
    assert ew._config(problem, SORT, (("interpret", False),)).rows_ahead == positions


@pytest.mark.parametrize("zero_rows", [True, False])
def test_zero_rows_changes_no_bit(zero_rows):
    """accumulate's zero_rows only decides whether zero partials are skipped: the reference's bits either way."""
    ids, grad, main_grad = masked_arrays()
    problem = ew._check(to_jax(ids), to_jax(grad), to_jax(main_grad), None)
    assert ew._config(problem, SORT, (("interpret", False),), zero_rows=zero_rows).zero_skip == (ew.ZERO_SKIP_MIN_PARTIALS if zero_rows else 0)
    out = jax_frontend.accumulate(to_jax(ids), to_jax(grad), to_jax(main_grad), zero_rows=zero_rows)
    assert_bits_equal(np.asarray(out), reference.accumulate(ids, grad, main_grad))


def test_zero_rows_must_be_a_bool():
    ids, grad, main_grad = _good()
    before = np.asarray(main_grad)
    with pytest.raises(TypeError, match="zero_rows"):
        jax_frontend.accumulate(ids, grad, main_grad, zero_rows=1)
    assert not main_grad.is_deleted()
    assert_bits_equal(np.asarray(main_grad), before)


#: Each way a long run is folded, for the zero skip (as the torch twin's test): the partials
#: kernel's folders and the long-run kernel, each with the next batch loaded ahead and batch by batch.
ZERO_SKIP_ROUTES = {
    "folders-ahead": (("fold_programs", 2), ("fold_batch", 2)),
    "folders-batched": (("fold_programs", 2), ("fold_batch", 2), ("fold_ahead", False)),
    "fold-kernel-ahead": (("fold_programs", 0), ("long_batch", 3)),
    "fold-kernel-batched": (("fold_programs", 0), ("long_batch", 3), ("long_ahead", False)),
}


@pytest.mark.parametrize(("zero_skip", "skip_wide", "lead"), [(2, 2, 0), (2, 1, 0), (17, 2, 0), (2, 2, 80)])
@pytest.mark.parametrize("route", ZERO_SKIP_ROUTES)
def test_zero_partials_skipped_bitwise(route, zero_skip, skip_wide, lead):
    """Megatron's vocab-parallel input (tests.cases.masked_arrays): the flags say which long-run
    partials are nonzero in each H block, and main_grad gets the reference's bits though the zero
    partials are neither stored nor loaded. With zero_skip 17, row 0's 16 partials (most of them
    all +0) have no flags, so their folds read every partial: each must be stored, zero or not
    (Pallas leaves the scratch outputs unwritten, NaN in interpret mode; NOTES v49). The folds check
    2 blocks of 4 flags at once, or 1 (then row 0's third block, all zeros, is skipped alone). With
    lead 80 row 0's first wide block is of nonzero partials: summed as a span, the rest from its
    second wide block on."""
    ids, grad, main_grad = masked_arrays(lead=lead)
    ids_j, grad_j, main_j = to_jax(ids), to_jax(grad), to_jax(main_grad)
    problem = ew._check(ids_j, grad_j, main_j, None)
    # (2: interpret mode's zero skip, on the GPU too: runs of 2 partials or more, 4 flags a block)
    overrides = ZERO_SKIP_ROUTES[route] + (("block_h", 16), ("fold_h", 8), ("long_block_h", 8), ("zero_skip", zero_skip), ("skip_block", 4),
                                           ("skip_wide", skip_wide))
    cfg = ew._config(problem, SORT, overrides, zero_rows=True)
    stages = _stages(ids_j, grad_j, main_j, problem, cfg)
    assert_bits_equal(np.asarray(stages.main_grad), reference.accumulate(ids, grad, main_grad, path=SORT))
    if zero_skip == 2 and not lead:
        flags = np.asarray(stages.flags).reshape(3, -1).T  # (_flag: [H blocks, rows])
        assert_masked_flags(flags, np.asarray(stages.partials), ids, grad, cfg.zero_skip, cfg.skip_block, cfg.block_h)


#: Every kernel that reads grad rows, for masked (as the torch twin's): the feature path, the merge
#: sort with its rows-ahead programs, a lax sort with the rows in a loop, the long-run kernel
#: folding, and folding programs with the rows unrolled.
MASKED_ROUTES = {
    "feature": (FEATURE, (("block_h", 16),)),
    "merge-rows-ahead": (SORT, (("sort", ew.MERGE), ("rows_ahead", 10**6), ("rows_ahead_per", 2))),
    "packed-rows-in-a-loop": (SORT, (("sort", ew.PACKED), ("unroll", False))),
    "merge-fold-kernel": (SORT, (("sort", ew.MERGE), ("fold_programs", 0))),
    "merge-folders-unrolled": (SORT, (("sort", ew.MERGE), ("fold_programs", 2), ("unroll", True))),
}
#: (the zero skip's flags are per H block of the partials: the folds' blocks must not be wider)
_SMALL_BLOCKS = (("block_h", 16), ("fold_h", 8), ("long_block_h", 8))


@pytest.mark.parametrize("zero_skip", [2, 0], ids=["deferred", "planned"])
@pytest.mark.parametrize("route", MASKED_ROUTES)
def test_masked_rows_are_not_read(route, zero_skip):
    """accumulate's masked: the masked tokens' rows (NaN here) are never read, and main_grad gets the
    reference's bits with those rows taken as +0; the masked tokens' ids still count (row 0's
    partials, id 7's run, lone ids whose row gets +0). With the zero skip (interpret mode's 2, as
    accumulate's masked sets it) the records of runs with flags are deferred, and a partial of
    masked tokens only gets none (_masked_records_kernel); without, the plan publishes them all."""
    path, overrides = MASKED_ROUTES[route]
    overrides = overrides if path == FEATURE else overrides + _SMALL_BLOCKS + (("zero_skip", zero_skip),)
    ids, grad, main_grad, masked = masked_tokens()
    expected = reference.accumulate(ids, grad, main_grad, path=path, masked=masked)
    assert not np.isnan(expected).any()
    if path == FEATURE:
        out = ew._accumulate(to_jax(ids), to_jax(grad), to_jax(main_grad), to_jax(masked), path=path, overrides=overrides)
        assert_bits_equal(np.asarray(out), expected)
    else:  # (the stages, as _accumulate runs them, to see the records too)
        ids_j, grad_j, main_j = to_jax(ids), to_jax(grad), to_jax(main_grad)
        problem = ew._check(ids_j, grad_j, main_j, None)
        cfg = ew._config(problem, SORT, overrides, zero_rows=True)
        stages = ew._run_stages(ids_j, grad_j.reshape(ids.size, -1), main_j, problem, cfg, to_jax(masked.astype(np.int8)))
        assert_bits_equal(np.asarray(stages.main_grad), expected)
        if cfg.sort == ew.MERGE and cfg.compact:  # the masked route: the plan is of the tokens not at row 0, no deferral
            kept = np.flatnonzero(ids.reshape(-1) != MASKED_LOOKUP_ID)
            core = make_plan(ids.reshape(-1)[kept], main_grad.shape[0], path=SORT)
            np.testing.assert_array_equal(np.asarray(stages.sorted_pos)[: kept.size], kept[core.sorted_pos])
            listed = np.asarray(stages.records).reshape(ids.size, -1)[: int(stages.counts[ew._FRONT]), 0]
            assert sorted(listed.tolist()) == core.partial_slot[core.run_partials[core.partial_run] > 1].tolist()
            return
        core = make_plan(ids, main_grad.shape[0], path=SORT)
        ends = np.minimum(core.partial_slot + NROWS, core.run_end[core.partial_slot])
        flagged = (core.run_partials[core.partial_run] >= zero_skip) & (zero_skip > 0)
        all_masked = np.array([masked[core.sorted_pos[a:b]].all() for a, b in zip(core.partial_slot, ends)])
        listed = np.asarray(stages.records).reshape(ids.size, -1)[: int(stages.counts[ew._FRONT]), 0]
        assert sorted(listed.tolist()) == core.partial_slot[(core.run_partials[core.partial_run] > 1) & ~(flagged & all_masked)].tolist()
        assert (flagged & all_masked).sum() >= (10 if zero_skip else 0)  # row 0's


@pytest.mark.parametrize("seed", range(2))
def test_masked_route_groups_row0_by_rank(seed):
    """The masked route on the merge sort (as the torch twin's test): row 0's unmasked tokens summed in the
    partials of their ranks among all of row 0's tokens (_row0_kernel), the masked rows (NaN) never read."""
    ids, grad, main_grad, masked = masked_row0_tokens(seed)
    problem = ew._check(to_jax(ids), to_jax(grad), to_jax(main_grad), None)
    compact, n, stride = np.asarray(ew._compact(to_jax(ids), to_jax(masked.astype(np.int8)), problem, ew._config(problem, SORT))), ids.size, ew._compact_stride(ids.size)
    kept, kept_keys, real, rank = masked_split(ids, main_grad.shape[0], masked)  # the compaction, as the core defines it
    assert compact[4 * stride : 4 * stride + 3].tolist() == [kept.size, real.size, n - kept.size]
    for array, want in enumerate((kept_keys, kept, real, rank)):
        np.testing.assert_array_equal(compact[array * stride : array * stride + want.size], want)
    out = ew._accumulate(to_jax(ids), to_jax(grad), to_jax(main_grad), to_jax(masked), path=SORT)
    assert_bits_equal(np.asarray(out), reference.accumulate(ids, grad, main_grad, path=SORT, masked=masked))


@pytest.mark.parametrize("name", MASKED_ROUTE_EDGES)
def test_masked_route_edges(name):
    """The masked route at its edges (tests.cases.masked_route_edge), as the torch twin's test."""
    ids, grad, main_grad, masked, padding_idx = masked_route_edge(name)
    problem = ew._check(to_jax(ids), to_jax(grad), to_jax(main_grad), padding_idx)
    assert ew._config(problem, SORT, (), zero_rows=True).sort == ew.MERGE
    out = ew._accumulate(to_jax(ids), to_jax(grad), to_jax(main_grad), to_jax(masked), padding_idx=padding_idx, path=SORT)
    assert_bits_equal(np.asarray(out), reference.accumulate(ids, grad, main_grad, path=SORT, masked=masked, padding_idx=padding_idx))


def test_masked_gives_megatrons_bits():
    """Public accumulate on Megatron's input (masked_arrays: zero rows at row 0, +0 and -0): masked
    marking exactly those rows gives the bits of the call without it, i.e. of the dense path."""
    ids, grad, main_grad = masked_arrays()
    masked = (ids == 0) & ~np.isin(np.arange(ids.size), np.flatnonzero(ids == 0)[[5, 55]])
    out = jax_frontend.accumulate(to_jax(ids.reshape(4, 80)), to_jax(grad.reshape(4, 80, -1)), to_jax(main_grad),
                                  masked=to_jax(masked.reshape(4, 80)))
    assert_bits_equal(np.asarray(out), reference.accumulate(ids, grad, main_grad))


@pytest.mark.parametrize("programs, folders, tail", ITEM_RANGE_GRIDS)
@pytest.mark.parametrize("items", ITEM_RANGE_ITEMS)
def test_item_ranges_cover_every_item_once_and_start_inside(programs, folders, tail, items):
    """The partials programs' item ranges (_item_range; tests.cases.assert_item_ranges, as the torch
    twin's test), and no range starting below 0: a program loads its first record ahead, masked
    from `items` on only (session 22's first tail read before the records when there were fewer
    items than tail programs)."""
    p = jnp.arange(programs + folders, dtype=jnp.int32)
    fold_lo, folder = item_range_folders(programs, folders, items)
    q = jnp.where(folder, items, p - (p >= fold_lo + folders).astype(jnp.int32) * folders)
    lo, hi, stride = ew._item_range(q, jnp.asarray(folder), jnp.int32(items), programs, tail)
    lo, hi, stride = (np.broadcast_to(np.asarray(a), p.shape) for a in (lo, hi, stride))
    assert (lo >= 0).all()
    assert_item_ranges(lo, hi, stride, folder, items)


# ----------------------------------------------------------------------------- API


def _good():
    rng = np.random.default_rng(0)
    return (
        jnp.array([1, 2, 1]),
        jnp.array(rng.standard_normal((3, 4), dtype=np.float32)),
        jnp.array(rng.standard_normal((5, 4), dtype=np.float32)),
    )


@pytest.mark.parametrize(
    "change, error, name",
    [
        (lambda i, g, m: (i.astype(jnp.float32), g, m), TypeError, "ids"),
        (lambda i, g, m: (i.astype(jnp.int16), g, m), TypeError, "ids"),
        (lambda i, g, m: ([1, 2, 1], g, m), TypeError, "ids"),
        (lambda i, g, m: (i, g.astype(jnp.int32), m), TypeError, "grad"),
        (lambda i, g, m: (i, g, m.astype(jnp.int32)), TypeError, "main_grad"),
        (lambda i, g, m: (i, g[:2], m), ValueError, "grad"),
        (lambda i, g, m: (i, g[:, :3], m), ValueError, "main_grad"),
        (lambda i, g, m: (i, g, m.reshape(-1)), ValueError, "main_grad"),
    ],
)
def test_bad_input_raises_and_leaves_main_grad(change, error, name):
    ids, grad, main_grad = _good()
    ids, grad, main_grad = change(ids, grad, main_grad)
    before = np.asarray(main_grad)
    with pytest.raises(error, match=name):
        jax_frontend.accumulate(ids, grad, main_grad)
    assert not main_grad.is_deleted()  # raised while tracing: nothing donated
    assert_bits_equal(np.asarray(main_grad), before)


@pytest.mark.parametrize(
    "masked, error",
    [
        (lambda i: i > 1, None),
        (lambda i: (i > 1).astype(jnp.int8), TypeError),
        (lambda i: (i > 1)[:2], ValueError),
        (lambda i: (i > 1).reshape(3, 1), ValueError),
        (lambda i: [True, False, True], TypeError),
    ],
)
def test_bad_masked_raises_and_leaves_main_grad(masked, error):
    ids, grad, main_grad = _good()
    before = np.asarray(main_grad)
    if error is None:  # the good one, for contrast: it adds the rows of ids 2 (masked: +0) and 1
        expected = reference.accumulate(np.asarray(ids), np.asarray(grad), before, masked=np.asarray(masked(ids)))
        assert_bits_equal(np.asarray(jax_frontend.accumulate(ids, grad, main_grad, masked=masked(ids))), expected)
        return
    with pytest.raises(error, match="masked"):
        jax_frontend.accumulate(ids, grad, main_grad, masked=masked(ids))
    assert not main_grad.is_deleted()
    assert_bits_equal(np.asarray(main_grad), before)


@pytest.mark.parametrize("padding_idx, error", [(5, ValueError), (-6, ValueError), (2.0, TypeError)])
def test_bad_padding_idx(padding_idx, error):
    ids, grad, main_grad = _good()
    before = np.asarray(main_grad)
    with pytest.raises(error, match="padding_idx"):
        jax_frontend.accumulate(ids, grad, main_grad, padding_idx=padding_idx)
    assert_bits_equal(np.asarray(main_grad), before)


def test_empty_inputs_leave_main_grad():
    main_grad = jnp.array(np.random.default_rng(1).standard_normal((5, 4), dtype=np.float32))
    before = np.asarray(main_grad)
    out = jax_frontend.accumulate(jnp.zeros((0, 3), jnp.int32), jnp.zeros((0, 3, 4), jnp.bfloat16), main_grad)
    assert_bits_equal(np.asarray(out), before)
    out = jax_frontend.accumulate(jnp.array([1, 2]), jnp.zeros((2, 0)), jnp.zeros((5, 0), jnp.bfloat16))
    assert out.shape == (5, 0) and out.dtype == jnp.bfloat16


def test_int64_ids_under_x64():
    case = Case("x64", np.array([3, -1, 7, 2**40, 3, 2**31 - 1, 0, -(2**40) + 3, 7]), 12, 8, seed=12)
    ids, grad, main_grad = case.arrays()
    expected = reference.accumulate(ids, grad, main_grad, padding_idx=7, path=SORT)
    with jax.enable_x64(True):
        ids_j = to_jax(ids)
        assert ids_j.dtype == jnp.int64
        for sort in (ew.MERGE, ew.RANK, ew.PAIRS):
            out = ew._accumulate(ids_j, to_jax(grad), to_jax(main_grad), padding_idx=7, path=SORT, overrides=(("sort", sort),))
            assert_bits_equal(np.asarray(out), expected, f"main_grad ({sort})")


def test_numpy_int64_ids_without_x64():
    """jax converts a NumPy int64 array to int32 by wrapping, silently (2**32 + 3 -> 3): accumulate
    given such ids skips those outside int32, as every id outside [0, V), rather than adding them
    into the row they wrap to."""
    assert not jax.config.jax_enable_x64
    ids = np.array([3, 2**32 + 3, 7, -(2**32) + 5, 5, 2**40 + 1, 2**31 - 1, 3, -(2**31)])
    case = Case("wrapping", ids, 12, 8, seed=13)
    ids, grad, main_grad = case.arrays()
    expected = reference.accumulate(ids, grad, main_grad)
    assert not np.array_equal(expected, reference.accumulate(ids.astype(np.int32), grad, main_grad))  # wrapped, they would add
    out = jax_frontend.accumulate(ids, to_jax(grad), to_jax(main_grad))
    assert_bits_equal(np.asarray(out), expected)


def test_subnormals_kept_on_gpu_flushed_by_xla_cpu():
    """2^-130 + 2^-130 = 2^-129 (SPEC.md "Edges"): the GPU keeps it; XLA:CPU runs with FTZ/DAZ.

    This pins the one known difference of interpret mode, so a change either way shows up.
    """
    ids = np.array([3, 3, 1])
    grad = np.full((3, 4), 2.0**-130, np.float32)
    main_grad = np.zeros((5, 4), np.float32)
    expected = reference.accumulate(ids, grad, main_grad)
    assert expected[3, 0] == np.float32(2.0**-129)
    out = np.asarray(jax_frontend.accumulate(to_jax(ids), to_jax(grad), to_jax(main_grad)))
    if ON_GPU:
        assert_bits_equal(out, expected)
    else:
        assert_bits_equal(out, reference.accumulate(ids, flush_subnormals(grad), main_grad), "main_grad (FTZ)")


# ----------------------------------------------------------------------------- in place


def test_donated_main_grad_is_updated_in_place():
    case = cpu_cases()[0]
    ids, grad, main_grad = case.arrays()
    donated = to_jax(main_grad)
    pointer = donated.unsafe_buffer_pointer()
    out = jax_frontend.accumulate(to_jax(ids), to_jax(grad), donated)
    assert donated.is_deleted()
    assert out.unsafe_buffer_pointer() == pointer  # CPU and GPU both honour donation
    assert_bits_equal(np.asarray(out), reference.accumulate(ids, grad, main_grad))


def _scan_micro_batches(ids, grad, main_grad, padding_idx, accumulate=jax_frontend.accumulate):
    """A user's training step: main_grad carried through lax.scan over micro-batches [m, ...]."""

    def step(acc, batch):
        return accumulate(*batch, acc, padding_idx=padding_idx), None

    return lax.scan(step, main_grad, (ids, grad))[0]


def test_inside_user_jit_and_scan_over_micro_batches():
    vocab, hidden = 64, 24
    ids = np.stack([zipf_ids(40, vocab, seed=s).reshape(4, 10) for s in range(3)])
    padding_idx = int(ids[1, 0, 0])
    grad = np.random.default_rng(2).standard_normal((3, 4, 10, hidden), dtype=np.float32).astype(numpy_dtype("bfloat16"))
    main_grad = np.random.default_rng(3).standard_normal((vocab, hidden), dtype=np.float32)
    expected = main_grad
    for m in range(3):
        expected = reference.accumulate(ids[m], grad[m], expected, padding_idx=padding_idx)

    train = jax.jit(_scan_micro_batches, static_argnums=3, donate_argnums=2)
    donated = to_jax(main_grad)
    pointer = donated.unsafe_buffer_pointer()
    out = train(to_jax(ids), to_jax(grad), donated, padding_idx)
    assert out.unsafe_buffer_pointer() == pointer
    assert_bits_equal(np.asarray(out), expected)


def _train_step(params, main_grads, ids, targets):
    """The README's recipe: the lookup outside jax.vjp, its cotangent into accumulate."""
    x = jnp.take(params["embed"], ids, axis=0)

    def rest(x, w_out):  # the model after the lookup
        logits = jnp.einsum("bsh,vh->bsv", x.astype(jnp.float32), w_out)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1))

    loss, vjp = jax.vjp(rest, x, params["out"])
    g_x, g_out = vjp(jnp.ones_like(loss))
    main_grads = {"embed": jax_frontend.accumulate(ids, g_x, main_grads["embed"]), "out": main_grads["out"] + g_out}
    return loss, main_grads, g_x


def test_training_step_recipe_with_jax_vjp():
    vocab, hidden = 64, 16
    rng = np.random.default_rng(5)
    ids = zipf_ids(40, vocab, seed=5).reshape(4, 10)
    targets = rng.integers(0, vocab, size=ids.shape)
    params = {"embed": rng.standard_normal((vocab, hidden), dtype=np.float32).astype(numpy_dtype("bfloat16")),
              "out": rng.standard_normal((vocab, hidden), dtype=np.float32)}
    main_grads = {k: rng.standard_normal((vocab, hidden), dtype=np.float32) for k in params}
    step = jax.jit(_train_step, donate_argnums=1)
    donated = {k: to_jax(v) for k, v in main_grads.items()}
    pointer = donated["embed"].unsafe_buffer_pointer()
    loss, new, g_x = step({k: to_jax(v) for k, v in params.items()}, donated, to_jax(ids), to_jax(targets))
    assert new["embed"].unsafe_buffer_pointer() == pointer
    assert np.isfinite(float(loss)) and g_x.dtype == jnp.bfloat16 and g_x.shape == (4, 10, hidden)
    assert_bits_equal(np.asarray(new["embed"]), reference.accumulate(ids, np.asarray(g_x), main_grads["embed"]))


def _cuda_module(fn, *args, **static) -> str:
    return jax.jit(fn, static_argnames=tuple(static), donate_argnums=2).trace(*args, **static).lower(lowering_platforms=("cuda",)).as_text()


TRITON_CALL = re.compile(r'custom_call @"?(__gpu\$xla\.gpu\.triton|triton_kernel_call_ffi)"?\(')


MERGE_KERNELS = ["embwgrad_block_sort", "embwgrad_merge_rank"]
FEATURE_KERNELS = ["embwgrad_rank"]  # the whole feature-path plan


@pytest.mark.parametrize(
    "n, x64, plan_kernels",
    [
        (8192, False, MERGE_KERNELS),
        (MERGE_SORT_MAX_TOKENS, False, MERGE_KERNELS),
        (MERGE_SORT_MAX_TOKENS + 1, False, ["embwgrad_runs"]),  # after a lax.sort
        (8192, True, MERGE_KERNELS),
        (FEATURE_PATH_MAX_TOKENS, False, FEATURE_KERNELS),
    ],
)
def test_cuda_lowering_is_triton_and_aliases_main_grad(n, x64, plan_kernels):
    """Lowered for CUDA (works without a GPU): Triton custom calls with pinned warps, main_grad aliased."""
    with jax.enable_x64(x64):
        ids = jax.ShapeDtypeStruct((n,), jnp.int64 if x64 else jnp.int32)
        grad = jax.ShapeDtypeStruct((n, 7168), jnp.bfloat16)
        main_grad = jax.ShapeDtypeStruct((129280, 7168), jnp.float32)
        text = _cuda_module(ew._accumulate, ids, grad, main_grad, overrides=(("interpret", False),))
    calls = [line for line in text.splitlines() if TRITON_CALL.search(line)]
    names = [re.search(r'name = "(\w+)"', line).group(1) for line in calls]
    # The sort path up to FOLD_ROLE_MAX_TOKENS folds the long runs in the partials kernel.
    long_runs = plan_kernels == FEATURE_KERNELS or n > FOLD_ROLE_MAX_TOKENS
    assert names == plan_kernels + ["embwgrad_partials"] + ["embwgrad_long_runs"] * long_runs
    warps = [int(re.search(r"num_warps = (\d+)", line).group(1)) for line in calls]
    partial_warps = 1 if plan_kernels != FEATURE_KERNELS and n > FOLD_ROLE_MAX_TOKENS else 2
    assert warps == [4] * len(plan_kernels) + [partial_warps] + [1] * long_runs  # _Config.partial_warps, long_warps
    assert all("num_stages = 2" in line for line in calls)
    assert ("stablehlo.sort" in text) == (plan_kernels == ["embwgrad_runs"])
    assert re.search(r"%arg2: tensor<129280x7168xf32> \{[^}]*tf\.aliasing_output = 0", text)  # donated
    writers = [line for line in calls if "embwgrad_partials" in line or "embwgrad_long_runs" in line]
    assert all("output_operand_aliases" in line for line in writers)


def _masked_cuda_module(n: int) -> tuple[str, list[str], list[str]]:
    """accumulate with masked on n tokens at the real shape, lowered for CUDA: (text, its Triton calls, their names)."""
    ids = jax.ShapeDtypeStruct((n,), jnp.int32)
    grad = jax.ShapeDtypeStruct((n, 7168), jnp.bfloat16)
    main_grad = jax.ShapeDtypeStruct((129280, 7168), jnp.float32)
    masked = jax.ShapeDtypeStruct((n,), jnp.bool_)
    text = _cuda_module(ew._accumulate, ids, grad, main_grad, masked, overrides=(("interpret", False),))
    calls = [line for line in text.splitlines() if TRITON_CALL.search(line)]
    return text, calls, [re.search(r'name = "(\w+)"', line).group(1) for line in calls]


@pytest.mark.parametrize("n", [8192, MERGE_SORT_MAX_TOKENS + 1, MASKED_MERGE_SORT_MAX_TOKENS])
def test_cuda_lowering_of_the_masked_route(n):
    """Lowered for CUDA with masked on the merge sort (to MASKED_MERGE_SORT_MAX_TOKENS): the compaction's two
    kernels before the plan, row 0's kernel last, with main_grad aliased through all (no deferred records)."""
    text, calls, names = _masked_cuda_module(n)
    long_runs = n > FOLD_ROLE_MAX_TOKENS
    assert names == ["embwgrad_compact_counts", "embwgrad_compact"] + MERGE_KERNELS + ["embwgrad_partials"] + ["embwgrad_long_runs"] * long_runs + ["embwgrad_row0"]
    assert "stablehlo.sort" not in text
    assert "output_operand_aliases" in calls[-1]
    assert re.search(r"%arg2: tensor<129280x7168xf32> \{[^}]*tf\.aliasing_output = 0", text)


@pytest.mark.parametrize("n, plan_kernels", [(MASKED_MERGE_SORT_MAX_TOKENS + 1, ["embwgrad_runs"])])
def test_cuda_lowering_with_masked_defers_records(n, plan_kernels):
    """Lowered for CUDA with masked above the merge sort: the deferred records' kernel between the plan and
    the partials, whose flags output it fills in (aliased); main_grad aliased as without masked."""
    text, calls, names = _masked_cuda_module(n)
    long_runs = n > FOLD_ROLE_MAX_TOKENS
    assert names == plan_kernels + ["embwgrad_masked_records", "embwgrad_partials"] + ["embwgrad_long_runs"] * long_runs
    records, partials = calls[len(plan_kernels)], calls[len(plan_kernels) + 1]
    assert "num_warps = 4" in records and "output_operand_aliases" in records
    assert "output_tuple_indices = [5], operand_index = 10," in partials  # the flags, as _masked_records left them
    assert re.search(r"%arg2: tensor<129280x7168xf32> \{[^}]*tf\.aliasing_output = 0", text)


def test_cuda_lowering_of_user_scan_aliases_main_grad():
    ids = jax.ShapeDtypeStruct((3, 4096), jnp.int32)
    grad = jax.ShapeDtypeStruct((3, 4096, 1024), jnp.bfloat16)
    main_grad = jax.ShapeDtypeStruct((129280, 1024), jnp.float32)
    kernels = functools.partial(ew._accumulate, overrides=(("interpret", False),))
    text = _cuda_module(_scan_micro_batches, ids, grad, main_grad, padding_idx=None, accumulate=kernels)
    assert re.search(r"%arg2: tensor<129280x1024xf32> \{[^}]*tf\.aliasing_output = 0", text)
    assert "stablehlo.while" in text
    writers = [line for line in text.splitlines() if TRITON_CALL.search(line) and re.search("embwgrad_(partials|long_runs)", line)]
    assert len(writers) == 1 and all("output_operand_aliases" in line for line in writers)  # 4096 tokens: no long-run kernel


# ----------------------------------------------------------------------------- inside jax.shard_map


SHARD_MAP = getattr(jax, "shard_map", None)
if SHARD_MAP is None:  # jax < 0.7
    from jax.experimental.shard_map import shard_map as SHARD_MAP


def _per_device(fn, check_vma: bool, mesh, main_grad_spec=P("dp")):
    """fn(ids, grad, main_grad) on each device of mesh's "dp" axis, its own slice of each (a data-parallel step)."""
    body = (lambda i, g, m: fn(i[0], g[0], m[0])[None]) if main_grad_spec == P("dp") else (lambda i, g, m: fn(i[0], g[0], m))
    return SHARD_MAP(body, mesh=mesh, in_specs=(P("dp"), P("dp"), main_grad_spec), out_specs=main_grad_spec, check_vma=check_vma)


# Routes inside shard_map: the feature path, the merge sort with small tiles, and a lax.sort (as above MERGE_SORT_MAX_TOKENS).
SHARD_ROUTES = {
    "feature": (60, None, ()),
    "sort-merge-small": (150, SORT, (("sort", ew.MERGE), ("merge_block", 8), ("merge_tile", 8))),
    "sort-packed": (150, SORT, (("sort", ew.PACKED),)),
}


@pytest.mark.parametrize("route", SHARD_ROUTES)
def test_inside_shard_map_each_device_its_own_main_grad(route):
    """Data parallel with jax.shard_map over every device (two CPU devices: tests/conftest.py): each
    device's main_grad gets its own ids and grad, with PyTorch's bits. check_vma (shard_map's
    default) on a GPU; in Pallas interpret mode jax 0.10.2's interpreter fails its own checks under
    it (a pad of a varying block with an invariant pad value), so the CPU run turns it off and
    test_cuda_lowering_inside_shard_map_checks_vma covers the typing there."""
    n, path, overrides = SHARD_ROUTES[route]
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("dp",))
    ranks = len(devices)
    rng = np.random.default_rng(7)
    ids = np.stack([zipf_ids(n, 40, seed=r) for r in range(ranks)]).astype(np.int32)
    grad = rng.standard_normal((ranks, n, 16), dtype=np.float32).astype(numpy_dtype("bfloat16"))
    main_grad = rng.standard_normal((ranks, 40, 16), dtype=np.float32)
    step = functools.partial(ew._accumulate, path=path, overrides=overrides) if path or overrides else jax_frontend.accumulate
    out = np.asarray(jax.jit(_per_device(step, ON_GPU, mesh), donate_argnums=2)(to_jax(ids), to_jax(grad), to_jax(main_grad)))
    for r in range(ranks):
        assert_bits_equal(out[r], reference.accumulate(ids[r], grad[r], main_grad[r], path=path))


@pytest.mark.parametrize(
    "n, kernels",
    [
        (8192, MERGE_KERNELS + ["embwgrad_partials"]),
        (MERGE_SORT_MAX_TOKENS + 1, ["embwgrad_runs", "embwgrad_partials", "embwgrad_long_runs"]),  # after a lax.sort
        (FEATURE_PATH_MAX_TOKENS, FEATURE_KERNELS + ["embwgrad_partials", "embwgrad_long_runs"]),
    ],
)
def test_cuda_lowering_inside_shard_map_checks_vma(n, kernels):
    """Lowered for CUDA inside jax.shard_map with check_vma (works without a GPU): every kernel's
    outputs vary over the mesh axis as main_grad does (a lax.sort's zeroed counters included), the
    Triton kernels are there, and main_grad is donated."""
    mesh = Mesh(np.array(jax.devices()), ("dp",))
    ranks = mesh.shape["dp"]
    step = functools.partial(ew._accumulate, overrides=(("interpret", False),))
    args = (jax.ShapeDtypeStruct((ranks, n), jnp.int32), jax.ShapeDtypeStruct((ranks, n, 256), jnp.bfloat16),
            jax.ShapeDtypeStruct((ranks, 1000, 256), jnp.float32))
    text = jax.jit(_per_device(step, True, mesh), donate_argnums=2).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    names = [re.search(r'name = "(\w+)"', line).group(1) for line in text.splitlines() if TRITON_CALL.search(line)]
    assert names == kernels
    assert re.search(r"%arg2: tensor<[^>]*> \{[^}]*(jax\.buffer_donor = true|tf\.aliasing_output = 0)", text)


def test_inside_shard_map_vocab_shards():
    """Tensor parallel with jax.shard_map: ids and grad replicated, main_grad's rows split over the
    devices; each device passes ids less its first row, so the others' ids fall outside its
    shard and add nothing. Each shard gets the bits of its own rows' sums."""
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("tp",))
    ranks, rows, n = len(devices), 24, 150
    ids = zipf_ids(n, ranks * rows, seed=5).astype(np.int32)
    grad = np.random.default_rng(8).standard_normal((n, 16), dtype=np.float32).astype(numpy_dtype("bfloat16"))
    main_grad = np.random.default_rng(9).standard_normal((ranks * rows, 16), dtype=np.float32)

    def shard(i, g, m):
        return ew._accumulate(i - lax.axis_index("tp") * rows, g, m, path=SORT, overrides=(("sort", ew.MERGE), ("merge_block", 8), ("merge_tile", 8)))

    fn = SHARD_MAP(shard, mesh=mesh, in_specs=(P(), P(), P("tp")), out_specs=P("tp"), check_vma=ON_GPU)
    out = np.asarray(jax.jit(fn, donate_argnums=2)(to_jax(ids), to_jax(grad), to_jax(main_grad)))
    for r in range(ranks):
        local = slice(r * rows, (r + 1) * rows)
        assert_bits_equal(out[local], reference.accumulate(ids - r * rows, grad, main_grad[local], path=SORT))


def test_shard_map_main_grad_must_vary_with_ids():
    """Inside shard_map, ids that differ across a mesh axis cannot add into one replicated main_grad."""
    mesh = Mesh(np.array(jax.devices()), ("dp",))
    ranks = mesh.shape["dp"]
    fn = _per_device(jax_frontend.accumulate, True, mesh, main_grad_spec=P())
    main_grad = jnp.zeros((40, 8), jnp.float32)
    with pytest.raises(ValueError, match="main_grad must vary"):
        jax.jit(fn)(jnp.zeros((ranks, 64), jnp.int32), jnp.zeros((ranks, 64, 8), jnp.bfloat16), main_grad)
    assert not main_grad.is_deleted()


# ----------------------------------------------------------------------------- under jax.jit with sharded arrays

TWO_DEVICES = pytest.mark.skipif(len(jax.devices()) < 2, reason="needs two devices (CPU: tests/conftest.py gives two; GPU: a two-GPU machine)")
COLLECTIVE = re.compile(r"= (\S+) (all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)(-start)?\(")

# (main_grad's spec, ids' and grad's spec over tokens) on a mesh of two devices along "x".
JIT_SHARDINGS = {
    "rows": (P("x", None), P()),
    "rows-tokens-split": (P("x", None), P("x")),
    "columns": (P(None, "x"), P()),
    "columns-tokens-split": (P(None, "x"), P("x")),
    "replicated-tokens-split": (P(), P("x")),
}


def _two_device_mesh(explicit: bool):
    if not explicit:
        return Mesh(np.array(jax.devices()[:2]), ("x",)), contextlib.nullcontext()
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
    return mesh, jax.set_mesh(mesh)


@TWO_DEVICES
@pytest.mark.parametrize("route", ["feature", "sort-merge-small"])
@pytest.mark.parametrize("sharding", JIT_SHARDINGS)
@pytest.mark.parametrize("axes", ["auto", "explicit"])
def test_under_jit_each_device_adds_into_its_own_shard(axes, sharding, route):
    """accumulate under jax.jit with main_grad sharded over two devices (by rows, by columns, or
    not at all) and ids and grad replicated or split over tokens: every bit as in one call on one
    device (padding_idx and ids outside [0, V) included), main_grad keeps its sharding and each
    device's shard is donated (updated in place on a GPU), and no collective moves main_grad: only
    ids and grad are gathered. Auto mesh axes: the partitioning rule (_partition); Explicit ones (jax.set_mesh):
    the same split by shard_map (_in_explicit_mesh)."""
    n, path, overrides = SHARD_ROUTES[route]
    mesh, context = _two_device_mesh(axes == "explicit")
    main_spec, token_spec = JIT_SHARDINGS[sharding]
    vocab, hidden, padding_idx = 40, 24, 7
    ids = zipf_ids(n, vocab + 4, seed=3).astype(np.int32) - 2  # a few ids outside [0, V) on both sides
    grad = np.random.default_rng(4).standard_normal((n, hidden), dtype=np.float32).astype(numpy_dtype("bfloat16"))
    main_grad = np.random.default_rng(5).standard_normal((vocab, hidden), dtype=np.float32)
    expected = reference.accumulate(ids, grad, main_grad, padding_idx=padding_idx, path=path)

    put = lambda a, spec: jax.device_put(to_jax(a), jax.sharding.NamedSharding(mesh, spec))
    with context:
        args = (put(ids, token_spec), put(grad, token_spec), put(main_grad, main_spec))
        step = jax.jit(functools.partial(ew._accumulate, padding_idx=padding_idx, path=path, overrides=overrides), donate_argnums=2)
        text = step.lower(*args).compile().as_text()
        moved = [shape for shape, *_ in COLLECTIVE.findall(text)]
        assert not [shape for shape in moved if f"[{vocab}," in shape or f"[{vocab // 2}," in shape], moved  # no main_grad rows
        if token_spec == P():
            assert moved == []  # nothing to gather
        assert "input_output_alias={ {}: (2, {}" in text  # main_grad's shard donated to the output
        pointers = {s.device: s.data.unsafe_buffer_pointer() for s in args[2].addressable_shards}
        out = step(*args)
    assert out.sharding.is_equivalent_to(args[2].sharding, 2)
    if ON_GPU:  # the kernels write main_grad in place (on CPU the interpreter's copies decide)
        assert {s.device: s.data.unsafe_buffer_pointer() for s in out.addressable_shards} == pointers
    assert_bits_equal(np.asarray(out), expected)


@TWO_DEVICES
@pytest.mark.parametrize("names", [("s-zipf-2d", "specials-8192"), ("f-zipf-2d", "feature-zipf-3072")], ids=["sort", "feature"])
def test_arrays_on_the_second_device(names):
    """ids, grad and main_grad on jax.devices()[1], not the default device (a process that drives
    several GPUs by hand): the call runs there and its result stays there, bitwise against the
    core. (CPU: a small case of the named path on the second host device; GPU: the second GPU.)"""
    case = next(c for c in (gpu_cases() if ON_GPU else cpu_cases()) if c.name == names[ON_GPU])
    ids, grad, main_grad = case.arrays()
    second = jax.devices()[1]
    out = ew._accumulate(*(jax.device_put(to_jax(a), second) for a in (ids, grad, main_grad)), padding_idx=case.padding_idx,
                         path=case.path)
    assert out.devices() == {second}
    expected = reference.accumulate(ids, grad, main_grad, padding_idx=case.padding_idx, path=case.path)
    assert_bits_equal(np.asarray(out), expected)


@TWO_DEVICES
@pytest.mark.parametrize("axes", ["auto", "explicit"])
def test_masked_under_jit_with_main_grad_split_by_rows(axes):
    """masked, split over tokens as ids and grad are, under jax.jit with main_grad split by rows over
    two devices: gathered as ids (the rule's fourth operand), and the bits of one call on one device."""
    mesh, context = _two_device_mesh(axes == "explicit")
    ids, grad, main_grad, masked = masked_tokens()
    expected = reference.accumulate(ids, grad, main_grad, masked=masked)
    put = lambda a, spec: jax.device_put(to_jax(a), jax.sharding.NamedSharding(mesh, spec))
    with context:
        args = (put(ids, P("x")), put(grad, P("x")), put(main_grad, P("x", None)), put(masked, P("x")))
        step = jax.jit(lambda i, g, m, k: jax_frontend.accumulate(i, g, m, masked=k), donate_argnums=2)
        out = step(*args)
    assert out.sharding.is_equivalent_to(args[2].sharding, 2)
    assert_bits_equal(np.asarray(out), expected)


# ----------------------------------------------------------------------------- against XLA's dense route


def _gamma(m):
    u = np.float64(2.0**-24)
    return m * u / (1 - m * u)


@pytest.mark.parametrize("grad_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("path", [SORT, FEATURE])
def test_error_against_exact_sum_vs_xla_scatter_add(path, grad_dtype):
    """Against JAX's own dense route, main_grad + zeros.at[ids].add(float32(grad)) (run on the CPU).

    The two are not bit-equal by construction, and neither is element-wise closer to the exact
    (float64) sum: both add the same fp32 terms in different orders (on fp32 grads ours is the
    closer one at about a third of the elements, XLA's at about as many). What does hold, over
    the rows that occur, with A = sum |g| of a row's terms, k their number, gamma_m =
    m u / (1 - m u), u = 2^-24, and M the old main_grad:

    * both results lie within the worst-case error of fp32 summation in any order,
      gamma_(k+1) (|M| + A), of the exact sum (for bf16 grads ours adds PyTorch's roundings of
      the row's gradient to bf16: one on the sort path, two per chunk on the feature path,
      each within 2^-8 of a value below A (1 + gamma));
    * on fp32 grads, rows whose id occurs once are bit-identical (one add into main_grad). From
      two occurrences on they differ: XLA folds the add into the scatter, adding each grad row
      into main_grad in turn, where PyTorch sums the grad rows first.
    """
    vocab, hidden, n = 1000, 48, 1500
    case = Case("vs-xla", zipf_ids(n, vocab, seed=4), hidden, vocab, grad_dtype, "float32", path=path, seed=4)
    ids, grad, main_grad = case.arrays()
    ours = run_kernels(case, ids, grad, main_grad)
    g32 = grad.astype(np.float32).reshape(n, hidden)
    cpu = jax.devices("cpu")[0]
    dense = jax.jit(lambda m, i, g: m + jnp.zeros_like(m).at[i].add(g))
    xla = np.asarray(dense(*(jax.device_put(a, cpu) for a in (main_grad, ids.astype(np.int32), g32))))

    exact = main_grad.astype(np.float64)
    mass = np.abs(exact)
    np.add.at(exact, ids, g32.astype(np.float64))
    np.add.at(mass, ids, np.abs(g32.astype(np.float64)))
    plan = make_plan(ids, vocab, path=path)
    rows, count, chunks = plan.run_key, plan.run_len, plan.run_partials
    fp32_bound = _gamma(count + 1)[:, None] * mass[rows]
    roundings = 0 if grad_dtype == "float32" else (1 if path == SORT else 2 * chunks)
    ours_bound = fp32_bound + (1.01 * np.float64(2.0**-8) * roundings * (1 + _gamma(count + 1)))[:, None] * mass[rows]
    for name, result, bound in (("xla", xla, fp32_bound), ("ours", ours, ours_bound)):
        error = np.abs(result[rows].astype(np.float64) - exact[rows])
        assert (error <= bound).all(), f"{name}: error {error.max()} beyond the bound at {np.argwhere(error > bound)[:4].tolist()}"
    if grad_dtype == "float32":
        once = rows[count == 1]
        assert once.size >= 10
        assert_bits_equal(ours[once], xla[once], "rows of ids that occur once")
    else:  # PyTorch's bf16 rounding makes ours the farther one: the bound above is not vacuous
        assert np.abs(ours[rows] - exact[rows]).mean() > np.abs(xla[rows] - exact[rows]).mean()


# ----------------------------------------------------------------------------- GPU


def test_required_gpu_is_seen_by_jax():
    if os.environ.get("EMBWGRAD_REQUIRE_GPU") == "1":
        assert ON_GPU, f"EMBWGRAD_REQUIRE_GPU=1 but jax's default backend is {jax.default_backend()!r}"


def _bits(x):
    return lax.bitcast_convert_type(x, jnp.uint16 if x.dtype.itemsize == 2 else jnp.uint32)


@jax.jit
def first_differing_rows(a, b, skip):
    """Up to 8 rows where a and b [V, H] differ bitwise (NaN equals NaN), rows in skip left out, -1
    padded: a check on the device, so that no [V, H] array is copied to the host."""
    both_nan = jnp.isnan(a.astype(jnp.float32)) & jnp.isnan(b.astype(jnp.float32))
    differ = jnp.any((_bits(a) != _bits(b)) & ~both_nan, axis=1)
    differ &= ~jnp.zeros(a.shape[0], bool).at[skip].set(True)
    return jnp.nonzero(differ, size=8, fill_value=-1)[0]


def assert_rows_equal_on_device(actual, expected, skip=np.zeros(0, np.int32), what="main_grad"):
    """assert_bits_equal for two device arrays [V, H], copying only differing rows to the host."""
    rows = np.asarray(first_differing_rows(actual, expected, jnp.asarray(skip, jnp.int32)))
    rows = rows[rows >= 0]
    if rows.size:
        assert_bits_equal(np.asarray(actual[rows]), np.asarray(expected[rows]), f"{what}, rows {rows.tolist()}")


def test_rows_equal_on_device_finds_differences():
    a = jnp.arange(40, dtype=jnp.float32).reshape(10, 4).at[2, 1].set(jnp.nan)
    b = a.at[2, 1].set(-jnp.nan)  # NaN equals NaN
    assert_rows_equal_on_device(a, b)
    b = b.at[7, 3].set(-0.0).at[4, 0].set(100.0)
    with pytest.raises(AssertionError, match=r"rows \[4, 7\]"):
        assert_rows_equal_on_device(a, b)
    assert_rows_equal_on_device(a, b, skip=np.array([4, 7]))


@requires_gpu
@pytest.mark.parametrize("case", gpu_cases(), ids=lambda c: c.name)
def test_gpu_cases_match_core_reference(case: Case):
    ids, grad = case.ids_and_grad()
    shape, dtype = (case.num_embeddings, case.hidden), numpy_dtype(case.main_grad_dtype)
    main_grad = jax.random.normal(jax.random.key(case.seed), shape, jnp.float32).astype(dtype)
    before = jnp.copy(main_grad)
    rows, new = case.expected_rows(ids, grad, lambda r: np.asarray(before[r]))
    out = jax_frontend.accumulate(to_jax(ids), to_jax(grad), main_grad, padding_idx=case.padding_idx, zero_rows=case.zero_positions is not None)
    assert_bits_equal(np.asarray(out[rows]), new, "rows that occur")
    assert_rows_equal_on_device(out, before, skip=rows, what="absent rows")


@requires_gpu
@pytest.mark.gpu_memory  # main_grad at the real shape (tests/conftest.py)
def test_gpu_in_place_extra_memory_is_a_few_n_h():
    vocab, hidden, n = 129280, 7168, 8192
    per_nh = n * hidden * 4
    ids = jnp.asarray(np.random.default_rng(0).integers(0, vocab, n).astype(np.int32))
    grad = jax.random.normal(jax.random.key(1), (n, hidden), jnp.bfloat16)
    main_grad = jnp.zeros((vocab, hidden), jnp.float32)

    stats = ew._accumulate.trace(ids, grad, main_grad).lower().compile().memory_analysis()
    assert stats.alias_size_in_bytes == vocab * hidden * 4, stats
    assert stats.temp_size_in_bytes <= 2 * per_nh, stats
    micro = (jnp.stack([ids] * 3), jnp.stack([grad] * 3))
    train = jax.jit(_scan_micro_batches, static_argnums=3, donate_argnums=2)
    stats = train.trace(*micro, main_grad, None).lower().compile().memory_analysis()
    assert stats.alias_size_in_bytes == vocab * hidden * 4, stats
    assert stats.temp_size_in_bytes <= 2 * per_nh, stats

    main_grad = jax_frontend.accumulate(ids, grad, main_grad).block_until_ready()  # warm
    device = main_grad.devices().pop()
    start = device.memory_stats()
    pointer = main_grad.unsafe_buffer_pointer()
    main_grad = jax_frontend.accumulate(ids, grad, main_grad).block_until_ready()
    end = device.memory_stats()
    assert main_grad.unsafe_buffer_pointer() == pointer
    assert end["bytes_in_use"] <= start["bytes_in_use"] + per_nh, (start, end)
    assert end["peak_bytes_in_use"] <= max(start["peak_bytes_in_use"], start["bytes_in_use"] + 3 * per_nh), (start, end)
