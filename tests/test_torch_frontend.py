"""torch_frontend: the Triton kernels, bit for bit.

CPU (TRITON_INTERPRET=1): every shared case against the core reference, each stage against
the core's plan, input checks, strides. GPU (skipped without CUDA; the GPU script makes a
missing GPU an error): the shared GPU cases against PyTorch's own dense path with
deterministic algorithms and against the core reference, CUDA-graph capture, no host
synchronisation, extra memory.
"""

import dataclasses
import unittest.mock
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

import torch_frontend
from embwgrad_core import CHUNK, FEATURE, MASKED_LOOKUP_ID, MASKED_MERGE_SORT_MAX_TOKENS, NROWS, SORT, make_plan, masked_split, reference, torch_path
from tests.cases import ITEM_RANGE_GRIDS, ITEM_RANGE_ITEMS, Case, assert_bits_equal, assert_item_ranges, assert_partials_equal, assert_masked_flags, core_checked_on_gpu, cpu_cases, gpu_cases, gpu_cases_by_name, item_range_folders, MASKED_ROUTE_EDGES, masked_arrays, masked_route_edge, masked_row0_tokens, masked_tokens, runs_ids
from torch_frontend import embedding_wgrad as ew

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
cpu_only = pytest.mark.skipif(HAS_CUDA, reason="interpreter test; the GPU runs the GPU cases")
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def to_torch(a: np.ndarray, device=DEVICE) -> torch.Tensor:
    """A copy on device (never a view of the NumPy array's memory)."""
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).to(device)
    return torch.from_numpy(a.copy()).to(device)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


@pytest.fixture(autouse=True)
def poisoned_scratch(monkeypatch):
    """Every scratch tensor a stage allocates comes filled with 0xFF bytes (NaN, -1), so that a
    kernel reading scratch it never wrote shows in the bits (fresh memory is often zeros, which
    hid such a read: the zero-skip bug of NOTES v49). A replay's own scratch is not poisoned."""
    monkeypatch.setattr(ew._Launcher, "empty", poisoning(ew._Launcher.empty))


def poisoning(empty):
    """_Launcher.empty made to fill what it allocates with 0xFF bytes."""
    def poisoned(self, *shape, dtype, device):
        t = empty(self, *shape, dtype=dtype, device=device)
        t.view(torch.uint8).fill_(0xFF)
        return t

    return poisoned


def run_kernels(case: Case, ids, grad, main_grad):
    """The four stages with the case's forced path (public accumulate when path is None)."""
    if case.path is None:
        torch_frontend.accumulate(ids, grad, main_grad, padding_idx=case.padding_idx)
    else:
        problem = ew._check(ids, grad, main_grad, case.padding_idx)
        ew._launch(ids.reshape(-1), grad, main_grad, problem, case.path)


def in_flat_buffer(t: torch.Tensor, offset: int, canary: int = 0x5A):
    """(view, buffer): t's values in a view at element `offset` of a flat buffer of t's dtype,
    as Megatron's DDP hands out main_grad (one grad buffer for all parameters, each at its own
    offset, so its data pointer need not be 16-byte aligned). The buffer's elements around the
    view hold `canary` bytes, so that a write outside the view shows."""
    buffer = torch.empty(offset + t.numel() + 40, dtype=t.dtype, device=t.device)
    buffer.view(torch.uint8).fill_(canary)
    view = buffer[offset:offset + t.numel()].view(t.shape)
    view.copy_(t)
    return view, buffer


def assert_canaries_kept(buffer: torch.Tensor, view: torch.Tensor, canary: int = 0x5A) -> None:
    start = view.storage_offset() - buffer.storage_offset()
    raw = buffer.view(torch.uint8).reshape(buffer.numel(), -1)
    outside = torch.cat([raw[:start], raw[start + view.numel():]])
    assert bool((outside == canary).all()), "a write outside main_grad's view of the buffer"


# ----------------------------------------------------------------------------- CPU: interpreter


@cpu_only
@pytest.mark.parametrize("case", cpu_cases(), ids=lambda c: c.name)
def test_kernels_match_core_reference(case: Case):
    ids, grad, main_grad = case.arrays()
    expected = reference.accumulate(ids, grad, main_grad, padding_idx=case.padding_idx, path=case.path)
    out = to_torch(main_grad)
    run_kernels(case, to_torch(ids), to_torch(grad), out)
    assert_bits_equal(to_numpy(out), expected)


@cpu_only
@pytest.mark.parametrize("name", ["s-zipf-2d", "f-zipf-2d"])
def test_tensors_at_any_offset_of_a_flat_buffer(name):
    """ids, grad and main_grad as views at odd element offsets of larger buffers (main_grad as
    in Megatron's grad buffer): the core's bits, and nothing written outside main_grad's view.
    The GPU form (test_gpu_tensors_at_any_offset_of_a_flat_buffer) checks the compiled kernels,
    specialised on 16-byte alignment, and the replayed launches."""
    case = next(c for c in cpu_cases() if c.name == name)
    ids, grad, main_grad = case.arrays()
    expected = reference.accumulate(ids, grad, main_grad, path=case.path)
    for offsets in ((1, 1, 1), (3, 5, 2)):
        out, buffer = in_flat_buffer(to_torch(main_grad), offsets[0])
        run_kernels(case, in_flat_buffer(to_torch(ids), offsets[1])[0], in_flat_buffer(to_torch(grad), offsets[2])[0], out)
        assert_bits_equal(to_numpy(out), expected)
        assert_canaries_kept(buffer, out)


@cpu_only
@settings(max_examples=12, deadline=None)
@given(
    ids=st.lists(st.integers(-1, 24), min_size=1, max_size=90),
    hidden=st.integers(1, 20),
    path=st.sampled_from([FEATURE, SORT]),
    dtypes=st.sampled_from([("bfloat16", "float32"), ("float32", "float32"), ("float16", "bfloat16")]),
    seed=st.integers(0, 2**16),
    mask_rate=st.sampled_from([0.0, 0.0, 0.5, 0.9]),
)
def test_kernels_match_core_reference_hypothesis(ids, hidden, path, dtypes, seed, mask_rate):
    """Random ids, and (mask_rate > 0) a random masked with NaN in the masked rows."""
    case = Case("hypothesis", np.array(ids), hidden, 24, *dtypes, path=path, seed=seed)
    ids_np, grad, main_grad = case.arrays()
    out = to_torch(main_grad)
    if mask_rate == 0:
        expected = reference.accumulate(ids_np, grad, main_grad, path=path)
        run_kernels(case, to_torch(ids_np), to_torch(grad), out)
    else:
        masked = np.random.default_rng(seed).random(ids_np.size) < mask_rate
        grad = np.where(masked[:, None], np.asarray(np.nan, grad.dtype), grad)
        expected = reference.accumulate(ids_np, grad, main_grad, path=path, masked=masked)
        ids_t, grad_t = to_torch(ids_np), to_torch(grad)
        problem = ew._check(ids_t, grad_t, out, None)
        ew._launch(ids_t, grad_t, out, problem, path, True, to_torch(masked).view(torch.uint8))
    assert_bits_equal(to_numpy(out), expected)


# Sort routes and tiles run on the interpreter: small merge blocks cross block boundaries
# within ~200 tokens; the GPU's own tiles run too.
STAGE_ROUTES = {
    "merge-small": (SORT, dict(sort="merge", merge_block=8, merge_tile=8, merge_blocks=64, merge_u=16)),
    "merge-gpu": (SORT, "gpu"),
    "torch.sort": (SORT, dict(sort="torch", prefetch=False, partial_programs=3)),
    "rank-small": (FEATURE, dict(block_i=2 * CHUNK, block_j=CHUNK, block_h=8)),
    "rank-wide-steps": (FEATURE, dict(block_i=CHUNK, block_j=4 * CHUNK, block_h=8)),
    "merge-small-h-blocks": (SORT, dict(sort="merge", merge_block=16, merge_tile=4, merge_blocks=32, merge_u=8, block_h=8)),
    # Long runs folded by the long-run kernel, its 32-column items over H blocks of 8; its sums
    # pipelined (LONG_FOLD, the GPU's default), and not; the folders' sums pipelined (_fold_piped).
    "merge-small-h-blocks-fold-kernel": (SORT, dict(sort="merge", merge_block=16, merge_tile=4, merge_blocks=32, merge_u=8, block_h=8,
                                                    long_block_h=32, fold_programs=0)),
    "merge-fold-kernel-piped": (SORT, dict(sort="merge", merge_block=16, merge_tile=4, merge_blocks=32, merge_u=8, fold_programs=0,
                                           long_stages=3, long_batch=3)),
    "merge-fold-kernel-unpiped": (SORT, dict(sort="merge", merge_block=16, merge_tile=4, merge_blocks=32, merge_u=8, fold_programs=0,
                                             long_stages=0, long_batch=32)),
    "merge-fold-piped": (SORT, dict(sort="merge", merge_block=16, merge_tile=4, merge_blocks=32, merge_u=8, fold_stages=3, fold_batch=2)),
    "merge-record-first": (SORT, dict(sort="merge", merge_block=16, merge_tile=4, merge_blocks=32, merge_u=8, record_hint=False)),
    # Lone tokens (ids that occur once) below lone_tokens are added before the plan, the others from records.
    "merge-lone-64": (SORT, dict(sort="merge", merge_block=16, merge_tile=4, merge_blocks=32, merge_u=8, lone_tokens=64, lone_per_program=3)),
    "merge-no-lone": (SORT, dict(sort="merge", merge_block=16, merge_tile=4, merge_blocks=32, merge_u=8, lone_tokens=0)),
    "rank-gpu": (FEATURE, dict(zip(("block_i", "block_j"), ew.RANK_TILES))),
    # Long runs' partials as bf16 bits (the GPU's choice from BF16_SCRATCH_MIN_TOKENS tokens).
    "rank-bf16-scratch": (FEATURE, dict(block_i=2 * CHUNK, block_j=CHUNK, block_h=8, bf16_scratch=True)),
}


@cpu_only
@pytest.mark.parametrize("route", STAGE_ROUTES)
def test_stages_match_core_plan(route):
    path, changes = STAGE_ROUTES[route]
    lengths = (1, 9, 10, 11, 20, 21, 33, 45, 95) + (1,) * 60  # ~300 tokens; 95: a fold of 10 partials
    if route == "merge-gpu":
        lengths += (3,) * 120  # ~570 tokens: three blocks of the GPU's merge_block
    case = Case("stages", runs_ids(lengths, 1000, seed=3), 24, 1000, path=path, padding_idx=None)
    ids, grad, main_grad = case.arrays()
    ids_t, grad_t, out = to_torch(ids), to_torch(grad), to_torch(main_grad)
    problem = ew._check(ids_t, grad_t, out, None)
    cfg = ew._config(problem, path, True)
    if changes == "gpu":
        gpu = ew._config(problem, path, False)
        assert gpu.merge_block < ids.size, "the case must cross merge blocks"
        changes = dict(merge_block=gpu.merge_block, merge_block_i=gpu.merge_block_i, merge_tile=gpu.merge_tile, merge_blocks=gpu.merge_blocks, merge_u=gpu.merge_u)
    cfg = dataclasses.replace(cfg, **changes)
    plan = make_plan(ids, case.num_embeddings, path=path)
    device_plan = ew._plan_stage(ids_t, problem, cfg)
    assert device_plan.sorted_keys.tolist() == plan.sorted_keys.tolist()
    assert device_plan.sorted_pos.tolist() == plan.sorted_pos.tolist()
    assert device_plan.run_start.tolist() == plan.run_start.tolist()
    assert device_plan.run_end.tolist() == plan.run_end.tolist()
    if path == FEATURE:
        assert device_plan.partial_ord.tolist() == plan.partial_ord.tolist()
    else:  # one record per partial that adds to main_grad; the merge group's first, in its order
        lists = [records[:, :5].tolist() for records in device_plan.record_lists()]
        s = plan.partial_slot[plan.sorted_keys[plan.partial_slot] >= 0]
        lone = (plan.run_end[s] - plan.run_start[s] == 1) & (plan.sorted_pos[s] < device_plan.lone_tokens)
        assert device_plan.lone_tokens == (min(ids.size, cfg.lone_tokens) if cfg.sort == "merge" else 0)
        s = s[~lone]  # no record: the partials kernel adds them before its wait on the plan
        in_long_run = plan.run_end[s] - plan.run_start[s] > NROWS  # long runs' records from the front, the others from the back
        for got, slots in ((lists[0], s[in_long_run]), (lists[1], s[~in_long_run])):
            expected = zip(slots, plan.sorted_keys[slots], plan.sorted_pos[slots], plan.run_start[slots], plan.run_end[slots])
            assert sorted(map(tuple, got)) == sorted(tuple(int(v) for v in r) for r in expected)
            if cfg.sort == "merge":  # the group's records (tokens [0, group_cap) in block-sorted order) lead, in that order
                keys = plan.sorted_keys[np.argsort(plan.sorted_pos)]  # each position's key
                u_of = np.empty(ids.size, dtype=np.int64)
                u_of[np.lexsort((np.arange(ids.size), keys, np.arange(ids.size) // cfg.merge_block))] = np.arange(ids.size)
                u = [int(u_of[r[2]]) for r in got]
                grouped = sum(v < device_plan.group_cap for v in u)
                assert device_plan.group_cap > 0 and u[:grouped] == sorted(u[:grouped])
                assert all(v >= device_plan.group_cap for v in u[grouped:])

    def assert_long_runs_listed():
        count = int(device_plan.long_count)
        listed = {tuple(p) for p in device_plan.long_runs[: 2 * count].view(-1, 2).tolist()}
        assert listed == {tuple(p) for p in plan.long_runs.tolist()}

    if path != FEATURE:  # the sort path's plan lists the long runs
        assert_long_runs_listed()
    partials, flags = ew._partials_stage(device_plan, grad_t, out, problem, cfg)
    assert_long_runs_listed()  # feature path: listed by the partials kernel; sort path: left as the plan listed them
    sums = reference.partial_sums(plan, grad.reshape(ids.size, -1))
    long = np.isin(plan.partial_run, np.flatnonzero(plan.run_partials > 1))
    assert long.any()
    assert_partials_equal(to_numpy(partials)[plan.partial_rows[long]], sums[long], path, case.grad_dtype)  # (ew._to_scratch)

    if cfg.fold_programs == 0:  # else the partials kernel folded the long runs
        ew._long_runs_stage(device_plan, partials, flags, out, problem, cfg)
    assert_bits_equal(to_numpy(out), reference.accumulate(ids, grad, main_grad, path=path))


@cpu_only
@pytest.mark.parametrize("changes", [dict(merge_block=24, merge_tile=24), dict(merge_block=32, merge_tile=32, merge_window=12)])
def test_merge_search_spans_must_be_powers_of_two(changes):
    """The merge's searches halve their block or window (_merge_rank_kernel): other sizes are refused."""
    ids_t, grad_t, out = (to_torch(a) for a in Case("stages", runs_ids((3,) * 20, 1000, seed=3), 8, 1000, path=SORT, padding_idx=None).arrays())
    problem = ew._check(ids_t, grad_t, out, None)
    cfg = dataclasses.replace(ew._config(problem, SORT, True), sort="merge", merge_blocks=4, merge_u=16, **changes)
    with pytest.raises(ValueError, match="powers of two"):
        ew._plan_stage(ids_t, problem, cfg)


#: Each way a long run is folded, for the zero skip: the partials kernel's folders, the long-run
#: kernel pipelined (its blocks of nonzero partials) and plain.
ZERO_SKIP_ROUTES = {
    "folders": {},
    "fold-kernel-piped": dict(fold_programs=0, long_stages=3, long_batch=3),
    "fold-kernel-batched": dict(fold_programs=0, long_stages=0, long_batch=2),
}


@cpu_only
@pytest.mark.parametrize(("zero_skip", "skip_wide", "lead"), [(2, 2, 0), (2, 1, 0), (17, 2, 0), (2, 2, 80)])
@pytest.mark.parametrize("route", ZERO_SKIP_ROUTES)
def test_zero_partials_skipped_bitwise(route, zero_skip, skip_wide, lead):
    """Megatron's vocab-parallel input (tests.cases.masked_arrays): the flags say which long-run
    partials are nonzero in each H block, and main_grad gets the reference's bits though the zero
    partials are neither stored nor loaded. With zero_skip 17, row 0's 16 partials (most of them
    all +0) have no flags, so their folds read every partial: each must be stored, zero or not
    (the scratch poisoned with NaN, poisoned_scratch; NOTES v49). The folds check 2 blocks of 4
    flags at once (the interpreter's skip_wide), or 1 (then row 0's third block, all zeros, is skipped alone).
    With lead 80 row 0's first wide block is of nonzero partials: summed as a span, the rest from its
    second wide block on."""
    ids, grad, main_grad = masked_arrays(lead=lead)
    ids_t, grad_t, out = to_torch(ids), to_torch(grad), to_torch(main_grad)
    problem = ew._check(ids_t, grad_t, out, None)
    cfg = dataclasses.replace(ew._config(problem, SORT, True, zero_rows=True), block_h=16, fold_h=8, long_block_h=8, **ZERO_SKIP_ROUTES[route])
    assert (cfg.zero_skip, cfg.skip_block, cfg.skip_wide) == (2, 4, 2)  # the interpreter's
    cfg = dataclasses.replace(cfg, zero_skip=zero_skip, skip_wide=skip_wide)
    plan = ew._plan_stage(ids_t, problem, cfg)
    partials, flags = ew._partials_stage(plan, grad_t, out, problem, cfg)
    if cfg.fold_programs == 0:
        ew._long_runs_stage(plan, partials, flags, out, problem, cfg)
    assert_bits_equal(to_numpy(out), reference.accumulate(ids, grad, main_grad, path=SORT))
    if zero_skip == 2 and not lead:
        assert_masked_flags(to_numpy(flags).T, to_numpy(partials), ids, grad, cfg.zero_skip, cfg.skip_block, cfg.block_h)  # (_flag: [H blocks, rows])


#: Every kernel that reads grad rows, for masked: the feature path; the sort path with its lone
#: tokens (the interpreter's default: half the positions), without, through torch.sort, and with
#: the long-run kernel folding.
MASKED_ROUTES = {
    "feature": (FEATURE, dict(block_h=16)),
    "merge-lone": (SORT, dict(block_h=16)),
    "merge-no-lone": (SORT, dict(block_h=16, lone_tokens=0)),
    "torch.sort": (SORT, dict(block_h=16, sort="torch", prefetch=False, partial_programs=3)),
    "merge-fold-kernel": (SORT, dict(block_h=16, fold_h=8, long_block_h=8, fold_programs=0)),
}


@cpu_only
@pytest.mark.parametrize("defer", [True, False], ids=["deferred", "planned"])
@pytest.mark.parametrize("route", MASKED_ROUTES)
def test_masked_rows_are_not_read(route, defer):
    """accumulate's masked: the masked tokens' rows (NaN here) are never read, and main_grad gets the
    reference's bits with those rows taken as +0; the masked tokens' ids still count (row 0's
    partials, id 7's run, lone ids whose row gets +0)."""
    path, changes = MASKED_ROUTES[route]
    ids, grad, main_grad, masked = masked_tokens()
    ids_t, grad_t, out, masked_t = to_torch(ids), to_torch(grad), to_torch(main_grad), to_torch(masked)
    problem = ew._check(ids_t, grad_t, out, None)
    cfg = dataclasses.replace(ew._config(problem, path, True, zero_rows=True), **changes)
    plan = ew._plan_stage(ids_t, problem, cfg, masked=masked_t.view(torch.uint8) if defer else None)
    partials, flags = ew._partials_stage(plan, grad_t, out, problem, cfg, masked=masked_t.view(torch.uint8))
    if cfg.fold_programs == 0:
        ew._long_runs_stage(plan, partials, flags, out, problem, cfg)
    expected = reference.accumulate(ids, grad, main_grad, path=path, masked=masked)
    assert not np.isnan(expected).any()
    assert_bits_equal(to_numpy(out), expected)
    if plan.compact is not None:  # the masked route (merge sort): the plan is of the tokens not at row 0, no deferral
        kept = np.flatnonzero(ids.reshape(-1) != MASKED_LOOKUP_ID)
        core = make_plan(ids.reshape(-1)[kept], main_grad.shape[0], path=SORT)
        np.testing.assert_array_equal(to_numpy(plan.sorted_pos)[: kept.size], kept[core.sorted_pos])
        front, _ = plan.record_lists()
        assert set(front[:, 0].tolist()) == set(core.partial_slot[core.run_partials[core.partial_run] > 1].tolist())
    elif path == SORT:  # deferred: no record for a partial of a flagged run whose tokens are all masked
        core = make_plan(ids, main_grad.shape[0], path=SORT)
        ends = np.minimum(core.partial_slot + NROWS, core.run_end[core.partial_slot])
        flagged = core.run_partials[core.partial_run] >= cfg.zero_skip
        all_masked = np.array([masked[core.sorted_pos[a:b]].all() for a, b in zip(core.partial_slot, ends)])
        front, _ = plan.record_lists()
        listed = set(front[:, 0].tolist())
        assert listed == set(core.partial_slot[(core.run_partials[core.partial_run] > 1) & ~(defer & flagged & all_masked)].tolist())
        assert (flagged & all_masked).sum() >= 10  # row 0's


@cpu_only
@pytest.mark.parametrize("seed", range(2))
def test_masked_route_groups_row0_by_rank(seed):
    """The masked route on the merge sort: row 0's unmasked tokens summed in the partials of their
    ranks among all of row 0's tokens (_row0_kernel), the other rows from the plan of the others;
    the reference's bits with the masked rows (NaN) taken as +0."""
    ids, grad, main_grad, masked = masked_row0_tokens(seed)
    ids_t, grad_t, out = to_torch(ids), to_torch(grad), to_torch(main_grad)
    problem = ew._check(ids_t, grad_t, out, None)
    cfg = dataclasses.replace(ew._config(problem, SORT, True, zero_rows=True), block_h=16)
    flat = to_torch(masked).view(torch.uint8)
    plan = ew._plan_stage(ids_t, problem, cfg, masked=flat)
    compact, n = to_numpy(plan.compact), ids.size
    kept, kept_keys, real, rank = masked_split(ids, main_grad.shape[0], masked)  # the compaction, as the core defines it
    assert compact[4 * n :].tolist() == [kept.size, real.size, n - kept.size]
    for array, want in enumerate((kept_keys, kept, real, rank)):
        np.testing.assert_array_equal(compact[array * n : array * n + want.size], want)
    ew._partials_stage(plan, grad_t, out, problem, cfg, masked=flat)
    assert_bits_equal(to_numpy(out), reference.accumulate(ids, grad, main_grad, path=SORT, masked=masked))


@cpu_only
@pytest.mark.parametrize("name", MASKED_ROUTE_EDGES)
def test_masked_route_edges(name):
    """The masked route where the plan has no token (m = 0: row 0 still gets its +0, which turns -0
    into +0), where row 0 has none, is padding_idx or shares the call with ids outside [0, V)."""
    ids, grad, main_grad, masked, padding_idx = masked_route_edge(name)
    ids_t, grad_t, out = to_torch(ids), to_torch(grad), to_torch(main_grad)
    problem = ew._check(ids_t, grad_t, out, padding_idx)
    cfg = dataclasses.replace(ew._config(problem, SORT, True, zero_rows=True), block_h=16)
    flat = to_torch(masked).view(torch.uint8)
    plan = ew._plan_stage(ids_t, problem, cfg, masked=flat)
    assert plan.compact is not None
    ew._partials_stage(plan, grad_t, out, problem, cfg, masked=flat)
    assert_bits_equal(to_numpy(out), reference.accumulate(ids, grad, main_grad, path=SORT, masked=masked, padding_idx=padding_idx))


@cpu_only
@pytest.mark.parametrize("lone", [100, 0], ids=["lone", "no lone"])
def test_masked_route_lone_tokens(lone):
    """The masked route's lone tokens: the first `lone` kept tokens (in position order) whose id occurs
    once are added by the partials kernel's lone programs from the compaction (_lone_tokens) and get
    no record (the merge takes the position of kept token `lone` as its bound); every other partial
    keeps its record. 60% of the tokens masked at row 0, the others mostly of ids that occur once, and
    a long run (id 7); masked rows NaN, fp32 rows of mixed magnitudes."""
    rng = np.random.default_rng(5)
    n, vocab = 600, 5000
    masked = rng.random(n) < 0.6
    ids = np.where(masked, 0, rng.integers(1, vocab, n))
    ids[rng.choice(np.flatnonzero(~masked), 40, replace=False)] = 7
    grad = (rng.standard_normal((n, 8)) * 2.0 ** rng.integers(-20, 20, (n, 8))).astype(np.float32)
    grad[masked] = np.nan
    main_grad = rng.standard_normal((vocab, 8)).astype(np.float32)
    ids_t, grad_t, out = to_torch(ids), to_torch(grad), to_torch(main_grad)
    problem = ew._check(ids_t, grad_t, out, None)
    cfg = dataclasses.replace(ew._config(problem, SORT, True, zero_rows=True, masked=True), block_h=16, lone_tokens=lone)
    flat = to_torch(masked).view(torch.uint8)
    plan = ew._plan_stage(ids_t, problem, cfg, masked=flat)
    assert plan.compact is not None and plan.lone_tokens == lone
    kept_ids = ids[ids != 0]  # the kept tokens in position order (masked_split)
    counts = np.bincount(kept_ids, minlength=vocab)
    lone_added = int((counts[kept_ids[:lone]] == 1).sum())
    assert lone_added >= (50 if lone else 0) and kept_ids.size > lone
    front, back = plan.record_lists()
    assert front.shape[0] + back.shape[0] == int(((counts + NROWS - 1) // NROWS).sum()) - lone_added
    partials, flags = ew._partials_stage(plan, grad_t, out, problem, cfg, masked=flat)
    if cfg.fold_programs == 0:
        ew._long_runs_stage(plan, partials, flags, out, problem, cfg)
    assert_bits_equal(to_numpy(out), reference.accumulate(ids, grad, main_grad, path=SORT, masked=masked))


@triton.jit
def _item_ranges(lo_ptr, hi_ptr, stride_ptr, items, head, tail_programs, fold_lo, folders, first):
    """Each program's (lo, hi, stride) from ew._item_range, the folders placed as _partials_kernel places them."""
    pid = tl.program_id(0)
    folder = (pid >= fold_lo) & (pid < fold_lo + folders)
    wid = pid - tl.where(pid >= fold_lo + folders, folders, 0)
    lo, hi, stride = ew._item_range(wid, folder, items, head, tail_programs, first > 0)
    tl.store(lo_ptr + pid, lo)
    tl.store(hi_ptr + pid, hi)
    tl.store(stride_ptr + pid, stride)


@cpu_only
@pytest.mark.parametrize("programs, folders, tail", ITEM_RANGE_GRIDS)
@pytest.mark.parametrize("items", ITEM_RANGE_ITEMS)
@pytest.mark.parametrize("first", [False, True])
def test_item_ranges_cover_every_item_once(programs, folders, tail, items, first):
    """The partials programs' item ranges (_item_range; tests.cases.assert_item_ranges, as the JAX
    twin's test), with and without `first` (the programs that take items first when they are
    few, as where folders run); a range that starts below 0 (a tail program with no item) is
    empty, so the record it loads ahead is masked (_load_record masks from hi on)."""
    fold_lo, folder = item_range_folders(programs, folders, items)
    out = [torch.zeros(programs + folders, dtype=torch.int32) for _ in range(3)]
    _item_ranges[(programs + folders,)](*out, items, programs - tail, tail, fold_lo, folders, int(first))
    lo, hi, stride = (t.numpy() for t in out)
    assert (hi <= lo)[lo < 0].all()  # a range starting below 0 is empty (its record load masked)
    assert_item_ranges(lo, hi, stride, folder, items, first=first)
    if not first and 0 < items <= tail:  # no folders: the working programs are the last ones (NOTES v62, v64)
        taking = (hi > lo)[~folder]
        assert taking[-items:].all() and not taking[:-items].any()


@pytest.mark.parametrize("n, masked, sort", [(32768, False, "merge"), (32769, False, "torch"), (32769, True, "merge"), (65536, True, "merge"),
                                             (65537, True, "torch")])
def test_masked_keeps_the_merge_sort_to_more_tokens(n, masked, sort):
    """accumulate's masked takes the masked route, on the merge sort, up to MASKED_MERGE_SORT_MAX_TOKENS
    (embwgrad_core.merge_sorted); without masked torch.sort from MERGE_SORT_MAX_TOKENS + 1."""
    problem = ew._check(torch.zeros(n, dtype=torch.int32), torch.zeros(n, 8), torch.zeros(10, 8), None)
    assert ew._config(problem, SORT, True, zero_rows=True, masked=masked).sort == sort
    assert ew._compact_route(ew._config(problem, SORT, True, zero_rows=True, masked=masked), torch.zeros(n, dtype=torch.uint8)) == (sort == "merge")


@pytest.mark.parametrize("n, masked, programs, lone", [(8192, True, 48, False), (8193, True, 64, False), (16384, True, 64, False), (16385, True, 96, True), (32768, True, 96, True),
                                                      (65536, True, 96, True), (16384, False, 128, None), (32768, False, 128, None)])
def test_masked_route_launch_settings(n, masked, programs, lone):
    """On an H200's settings (132 SMs, PDL) the masked route runs at most masked_partial_programs_per_sm(n)
    partials programs per SM (48 up to 8192 tokens, 64 up to 16384, 96 above) and its kept lone tokens only where no folders run (_Config.kept_lone);
    a call without masked keeps PARTIAL_PROGRAMS_PER_SM (kept_lone: only the route reads it)."""
    problem = ew._check(torch.zeros(n, dtype=torch.int32), torch.zeros(n, 8), torch.zeros(10, 8), None)
    cfg = ew._config(problem, SORT, False, 132, True, zero_rows=True, masked=masked)
    assert cfg.partial_programs == programs * 132
    assert (cfg.fold_programs == 0) == (n > ew.FOLDERS_MAX_TOKENS)
    assert lone is None or cfg.kept_lone == lone
    assert ew._config(problem, SORT, True, 4, False, zero_rows=True, masked=masked).kept_lone  # the interpreter: lone beside folders


@cpu_only
def test_masked_gives_megatrons_bits():
    """Public accumulate on Megatron's input (masked_arrays: zero rows at row 0, +0 and -0): masked
    marking exactly those rows gives the bits of the call without it, i.e. of the dense path."""
    ids, grad, main_grad = masked_arrays()
    masked = (ids == 0) & ~np.isin(np.arange(ids.size), np.flatnonzero(ids == 0)[[5, 55]])
    out = to_torch(main_grad)
    torch_frontend.accumulate(to_torch(ids), to_torch(grad), out, masked=to_torch(masked.reshape(4, 80)).reshape(-1))
    assert_bits_equal(to_numpy(out), reference.accumulate(ids, grad, main_grad))


@pytest.mark.parametrize(
    "masked, error",
    [
        (lambda i: i > 1, None),
        (lambda i: (i > 1).int(), TypeError),
        (lambda i: (i > 1)[:2], ValueError),
        (lambda i: (i > 1).reshape(3, 1), ValueError),
        (lambda i: [True, False, True], TypeError),
    ],
)
def test_bad_masked_raises_and_leaves_main_grad(masked, error):
    ids, grad, main_grad = _good()
    before = main_grad.clone()
    if error is None:  # the good one, for contrast: it adds the rows of ids 2 (masked: +0) and 1
        torch_frontend.accumulate(ids, grad, main_grad, masked=masked(ids))
        expected = reference.accumulate(to_numpy(ids), to_numpy(grad), to_numpy(before), masked=to_numpy(masked(ids)))
        assert_bits_equal(to_numpy(main_grad), expected)
        return
    with pytest.raises(error, match="masked"):
        torch_frontend.accumulate(ids, grad, main_grad, masked=masked(ids))
    assert_bits_equal(to_numpy(main_grad), to_numpy(before))


@pytest.mark.parametrize("hidden, positions", [(4096, 256), (7168, 256), (16384, 112)])
def test_l2_prefetch_bounded_by_elements(hidden, positions):
    """The partials kernel prefetches 256 positions' rows up to H = 7168, fewer above (ROWS_AHEAD_ELEMENTS)."""
    problem = ew.Problem(8192, hidden, 129280, -1, "bfloat16", "float32")
    assert ew._config(problem, SORT, False).l2_prefetch_tokens == positions


@cpu_only
@pytest.mark.parametrize("zero_rows", [True, False])
def test_zero_rows_changes_no_bit(zero_rows):
    """accumulate's zero_rows only decides whether zero partials are skipped: the reference's bits either way."""
    assert ew._config(ew._check(*_good(), None), SORT, False, zero_rows=zero_rows).zero_skip == (ew.ZERO_SKIP_MIN_PARTIALS if zero_rows else 0)
    ids, grad, main_grad = masked_arrays()
    out = to_torch(main_grad)
    torch_frontend.accumulate(to_torch(ids), to_torch(grad), out, zero_rows=zero_rows)
    assert_bits_equal(to_numpy(out), reference.accumulate(ids, grad, main_grad))


def test_zero_rows_must_be_a_bool():
    ids, grad, main_grad = _good()
    before = main_grad.clone()
    with pytest.raises(TypeError, match="zero_rows"):
        torch_frontend.accumulate(ids, grad, main_grad, zero_rows=1)
    with pytest.raises(TypeError, match="zero_rows must be a bool, got numpy.bool"):
        torch_frontend.accumulate(ids, grad, main_grad, zero_rows=np.True_)
    assert_bits_equal(to_numpy(main_grad), to_numpy(before))


@cpu_only
@pytest.mark.parametrize("count_block", [8, 1024])
@pytest.mark.parametrize("aggregate", [True, False])
def test_lone_counts_are_each_ids_tokens(monkeypatch, count_block, aggregate):
    """The merge kernel's counting programs (_count_ids) leave each id's number of tokens at its
    count, whether they add one per token or one per group of equal keys (lanes [a, b]: b + 1 and
    -a); with blocks of 8 tokens (merge blocks of 16), groups cross the counting blocks and each program takes several."""
    monkeypatch.setattr(ew, "_COUNT_BLOCK", ew.tl.constexpr(count_block))  # the interpreter reads it at run time
    lengths = (1, 2, 3, 9, 10, 11, 17, 33, 45) + (1,) * 40
    case = Case("counts", runs_ids(lengths, 1000, seed=5), 8, 1000, path=SORT, padding_idx=None)
    ids, grad, main_grad = case.arrays()
    ids_t = to_torch(ids)
    problem = ew._check(ids_t, to_torch(grad), to_torch(main_grad), None)
    cfg = dataclasses.replace(ew._config(problem, SORT, True), sort="merge", merge_block=16, merge_tile=4, merge_blocks=32, merge_u=8,
                              lone_tokens=64, count_aggregate=aggregate)
    plan = ew._plan_stage(ids_t, problem, cfg)
    assert plan.count_programs == -(-ids.size // count_block) > (1 if count_block == 8 else 0)
    counts = to_numpy(plan.counts)[np.unique(ids)]
    assert counts.tolist() == np.bincount(ids)[np.unique(ids)].tolist()


@cpu_only
def test_cpu_tensors_without_interpreter_use_core_reference(monkeypatch):
    monkeypatch.setattr(ew, "_interpreting", lambda: False)
    case = cpu_cases()[0]
    ids, grad, main_grad = case.arrays()
    out = to_torch(main_grad, "cpu")
    torch_frontend.accumulate(to_torch(ids, "cpu"), to_torch(grad, "cpu"), out)
    assert_bits_equal(to_numpy(out), reference.accumulate(ids, grad, main_grad))
    assert not torch_frontend.can_accumulate(to_torch(ids, "cpu"), to_torch(grad, "cpu"), out)


def test_dense_route_skips_ids_outside_the_vocabulary():
    """The route for a device without the kernels (PyTorch's dense path, run here on the CPU): ids
    outside [0, V) add nothing and raise nothing, padding_idx's row and absent rows (-0 here) keep
    their bits. Sums of small integers, so that the CPU's order of adds gives the core's bits."""
    ids = np.array([3, -1, 7, 100, 3, 2**31 - 1, 0, -8, 3, 5, 5])
    gen = torch.Generator().manual_seed(4)
    grad = torch.randint(-8, 8, (ids.size, 6), generator=gen).float()
    main_grad = torch.randint(-8, 8, (8, 6), generator=gen).float()
    main_grad[[1, 2, 6]] = -0.0
    for padding_idx in (None, 5):
        out = main_grad.clone()
        problem = ew._check(torch.from_numpy(ids), grad, out, padding_idx)
        ew._accumulate_dense(torch.from_numpy(ids), grad, out, problem)
        assert_bits_equal(to_numpy(out), reference.accumulate(ids, grad.numpy(), main_grad.numpy(), padding_idx=padding_idx))


# ----------------------------------------------------------------------------- both: API


@pytest.mark.parametrize("transpose", [True, False])
def test_strided_grad_is_not_copied(transpose):
    s, b, hidden, vocab = 7, 3, 10, 20
    storage = torch.randn(s, b, hidden + 3, device=DEVICE).bfloat16()
    grad = storage[..., :hidden]  # a row stride that is not H
    if transpose:
        grad = grad.transpose(0, 1)  # [b, s, H] view of [s, b, H] storage
    assert ew._position_strides(grad) is not None
    ids = torch.randint(0, vocab, grad.shape[:-1], device=DEVICE)
    main_grad = torch.randn(vocab, hidden, device=DEVICE)
    expected = main_grad.clone()
    torch_frontend.accumulate(ids, grad.contiguous(), expected)
    torch_frontend.accumulate(ids, grad, main_grad)
    assert_bits_equal(to_numpy(main_grad), to_numpy(expected))


def laid_out(t: torch.Tensor, layout: str, dims: int) -> torch.Tensor:
    """A view holding t's values (t's first `dims` dimensions are positions) in another memory layout:
    "contiguous", "offset" (at an odd element offset of a larger buffer), "transposed" (the first two
    position dimensions swapped in memory), "strided" (every other element of the last position
    dimension of a larger tensor), "expanded" (t's first position row repeated at stride 0: the
    values change to that row's), "columns" (grad's H at stride 2)."""
    if layout == "offset":
        return in_flat_buffer(t, 3)[0]
    if layout == "transposed" and dims >= 2:
        return t.transpose(0, 1).contiguous().transpose(0, 1)
    elif layout == "strided":
        big = torch.zeros(*t.shape[: dims - 1], 2 * t.shape[dims - 1], *t.shape[dims:], dtype=t.dtype, device=t.device)
        view = big.narrow(dims - 1, 0, 2 * t.shape[dims - 1] - 1)[(slice(None),) * (dims - 1) + (slice(None, None, 2),)]
    elif layout == "expanded":
        return t[:1].expand(t.shape)
    elif layout == "columns" and t.dim() > dims:
        view = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)[..., ::2]
    else:
        return t
    view.copy_(t)
    return view


LAYOUTS = ("contiguous", "offset", "transposed", "strided", "expanded")


@cpu_only  # (on the GPU every example would compile its own specialisations; test_gpu_tensors_at_any_offset_of_a_flat_buffer is its GPU form)
@settings(max_examples=10, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 5), st.integers(1, 9)),
    hidden=st.integers(1, 12),
    layouts=st.tuples(st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS + ("columns",)), st.sampled_from(LAYOUTS)),
    with_mask=st.booleans(),
    path=st.sampled_from([FEATURE, SORT]),
    seed=st.integers(0, 2**16),
)
def test_any_layout_gives_the_contiguous_bits(shape, hidden, layouts, with_mask, path, seed):
    """ids, grad and masked in any memory layout, main_grad at an offset: the bits of the call on
    contiguous copies (the path forced, so that small inputs reach the sort path's kernels too)."""
    gen = torch.Generator().manual_seed(seed)
    vocab = 7
    ids = laid_out(torch.randint(-1, vocab, shape, generator=gen).to(DEVICE), layouts[0], 2)
    grad = laid_out(torch.randn(*shape, hidden, generator=gen).bfloat16().to(DEVICE), layouts[1], 2)
    masked = laid_out((torch.rand(shape, generator=gen) < 0.3).to(DEVICE), layouts[2], 2) if with_mask else None
    main_grad = torch.randn(vocab, hidden, generator=gen).to(DEVICE)
    out, _ = in_flat_buffer(main_grad, 1)
    expected = main_grad.clone()
    with unittest.mock.patch.object(ew, "torch_path", lambda n: path):
        torch_frontend.accumulate(ids, grad, out, masked=masked)
        torch_frontend.accumulate(ids.contiguous(), grad.contiguous(), expected, masked=None if masked is None else masked.contiguous())
    assert_bits_equal(to_numpy(out), to_numpy(expected))


@pytest.mark.parametrize("form", ["slice", "columns", "expanded", "transposed"])
def test_strided_ids_and_masked(form):
    """ids and masked given as strided views: every position reads its own id and mask bit (the
    kernels read them as contiguous arrays; a 1-D slice and a reshape that stays a view once
    read the wrong elements)."""
    vocab, hidden = 20, 8
    gen = torch.Generator().manual_seed(3)
    base = torch.randint(0, vocab, (6, 10), generator=gen)
    bits = torch.rand(6, 10, generator=gen) < 0.4
    view = {
        "slice": lambda t: t.reshape(-1)[::2],  # [30], stride 2
        "columns": lambda t: t[:, ::2],  # [6, 5]: reshape(-1) is a view of stride 2
        "expanded": lambda t: t[2, 3].expand(4, 5),  # one id (and one mask bit) at stride 0
        "transposed": lambda t: t.t(),  # [10, 6]
    }[form]
    ids, masked = view(base.to(DEVICE)), view(bits.to(DEVICE))  # (made on the device: a copy there of a slice is contiguous)
    assert not ids.is_contiguous() and not masked.is_contiguous()
    grad = torch.randn(*ids.shape, hidden, generator=gen).bfloat16().to(DEVICE)
    main_grad = torch.randn(vocab, hidden, generator=gen).to(DEVICE)
    for mask in (None, masked):
        out, expected = main_grad.clone(), main_grad.clone()
        torch_frontend.accumulate(ids, grad, out, masked=mask)
        torch_frontend.accumulate(ids.contiguous(), grad, expected, masked=None if mask is None else mask.contiguous())
        assert_bits_equal(to_numpy(out), to_numpy(expected))
        if mask is None:
            assert_bits_equal(to_numpy(out), reference.accumulate(to_numpy(ids).astype(np.int64), to_numpy(grad), to_numpy(main_grad)))


def test_three_strided_dims_fall_back_to_a_copy():
    grad = torch.randn(3, 4, 5, 6, device=DEVICE).permute(2, 1, 0, 3)  # [5, 4, 3, H]: no two-stride form
    assert ew._position_strides(grad) is None
    ids = torch.randint(0, 9, grad.shape[:-1], device=DEVICE)
    main_grad = torch.randn(9, 6, device=DEVICE)
    expected = main_grad.clone()
    torch_frontend.accumulate(ids, grad.contiguous(), expected)
    torch_frontend.accumulate(ids, grad, main_grad)
    assert_bits_equal(to_numpy(main_grad), to_numpy(expected))


def _good():
    return (
        torch.tensor([1, 2, 1], device=DEVICE),
        torch.randn(3, 4, device=DEVICE),
        torch.randn(5, 4, device=DEVICE),
    )


@pytest.mark.parametrize(
    "change, error, name",
    [
        (lambda i, g, m: (i.float(), g, m), TypeError, "ids"),
        (lambda i, g, m: (i, g.to(torch.int32), m), TypeError, "grad"),
        (lambda i, g, m: (i, g.double(), m), TypeError, "grad"),
        (lambda i, g, m: (i, g, m.double()), TypeError, "main_grad"),
        (lambda i, g, m: (i.numpy() if i.device.type == "cpu" else i.cpu().numpy(), g, m), TypeError, "ids"),
        (lambda i, g, m: (i, g[:2], m), ValueError, "grad"),
        (lambda i, g, m: (i, g[:, :3], m), ValueError, "main_grad"),
        (lambda i, g, m: (i, g, m.reshape(-1)), ValueError, "main_grad"),
        (lambda i, g, m: (i, g, m[:, :4].t()), ValueError, "main_grad"),
    ],
)
def test_bad_input_raises_and_leaves_main_grad(change, error, name):
    ids, grad, main_grad = change(*_good())
    before = main_grad.clone() if isinstance(main_grad, torch.Tensor) else None
    with pytest.raises(error, match=name):
        torch_frontend.accumulate(ids, grad, main_grad)
    if before is not None:
        assert_bits_equal(to_numpy(main_grad), to_numpy(before))


def test_non_contiguous_main_grad_rejected():
    ids, grad, _ = _good()
    main_grad = torch.randn(4, 5, device=DEVICE).t()  # [5, 4], not contiguous
    before = main_grad.clone()
    with pytest.raises(ValueError, match="main_grad must be contiguous"):
        torch_frontend.accumulate(ids, grad, main_grad)
    assert_bits_equal(to_numpy(main_grad), to_numpy(before))


def test_main_grad_that_requires_grad():
    """As PyTorch rejects an in-place op on a leaf that requires grad: rejected in grad mode, main_grad
    untouched; under no_grad (an optimizer's update) added, with the bits."""
    ids, grad, main_grad = _good()
    main_grad.requires_grad_()
    before = main_grad.detach().clone()
    assert not torch_frontend.can_accumulate(ids, grad, main_grad)
    with pytest.raises(ValueError, match="main_grad must not require grad"):
        torch_frontend.accumulate(ids, grad, main_grad)
    assert_bits_equal(to_numpy(main_grad.detach()), to_numpy(before))
    with torch.no_grad():
        torch_frontend.accumulate(ids, grad, main_grad)
    expected = reference.accumulate(to_numpy(ids), to_numpy(grad), to_numpy(before))
    assert_bits_equal(to_numpy(main_grad.detach()), expected)


@pytest.mark.parametrize("name", ["ids", "grad", "masked"])
def test_input_sharing_memory_with_main_grad(name):
    """As PyTorch's in-place ops reject an input that overlaps their output: ids, grad or masked in
    main_grad's memory is a ValueError, main_grad untouched; beside it in one buffer, added."""
    buffer = torch.zeros(64, device=DEVICE)
    main_grad = buffer[16:36].view(5, 4)
    main_grad.copy_(torch.randn(5, 4))
    ids, grad, masked = torch.tensor([1, 2, 1], device=DEVICE), torch.randn(3, 4, device=DEVICE), torch.zeros(3, dtype=torch.bool, device=DEVICE)
    # (element ranges of the float buffer; main_grad is [16, 36))
    placed = {"ids": lambda at: buffer[at:at + 3].view(torch.int32).copy_(ids),
              "grad": lambda at: buffer[at:at + 12].view(3, 4).copy_(grad),
              "masked": lambda at: buffer[at:at + 1].view(torch.bool)[:3].copy_(masked)}[name]
    inside = placed({"ids": 34, "grad": 8, "masked": 20}[name])  # ids and masked start in main_grad, grad ends in it
    args = {"ids": ids, "grad": grad, "masked": masked, name: inside}
    before = to_numpy(main_grad.clone())  # (after the placing, which wrote into main_grad)
    assert name == "masked" or not torch_frontend.can_accumulate(args["ids"], args["grad"], main_grad)
    with pytest.raises(ValueError, match=f"{name} and main_grad share memory"):
        torch_frontend.accumulate(args["ids"], args["grad"], main_grad, masked=args["masked"])
    assert_bits_equal(to_numpy(main_grad), before)
    args[name] = placed({"ids": 36, "grad": 4, "masked": 36}[name])  # ends just before main_grad, or starts just after it
    torch_frontend.accumulate(args["ids"], args["grad"], main_grad, masked=args["masked"])
    assert_bits_equal(to_numpy(main_grad), reference.accumulate(to_numpy(ids), to_numpy(grad), before))


def test_inference_tensor_main_grad():
    """As PyTorch rejects an in-place update of an inference tensor outside inference mode: rejected
    there on every route, main_grad untouched; inside torch.inference_mode() added, with the bits."""
    ids, grad, main_grad = _good()
    with torch.inference_mode():
        main_grad = main_grad.clone()
    before = to_numpy(main_grad.clone())
    assert not torch_frontend.can_accumulate(ids, grad, main_grad)
    with pytest.raises(ValueError, match="main_grad is an inference tensor"):
        torch_frontend.accumulate(ids, grad, main_grad)
    assert_bits_equal(to_numpy(main_grad), before)
    with torch.inference_mode():
        torch_frontend.accumulate(ids, grad, main_grad)
    assert_bits_equal(to_numpy(main_grad), reference.accumulate(to_numpy(ids), to_numpy(grad), before))


def test_outside_autograd():
    """main_grad's version counter is bumped, as by an in-place op: a backward that saved it raises.
    A grad that requires grad gives values and no graph."""
    ids, grad, main_grad = _good()
    weight = torch.ones_like(main_grad, requires_grad=True)
    product = (main_grad * weight).sum()  # saves main_grad for its backward
    version = main_grad._version
    torch_frontend.accumulate(ids, grad.requires_grad_(), main_grad)
    assert main_grad._version > version
    assert main_grad.grad_fn is None and not main_grad.requires_grad
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        product.backward()


@pytest.mark.parametrize("padding_idx", [5, -6, 2.0])
def test_bad_padding_idx(padding_idx):
    ids, grad, main_grad = _good()
    with pytest.raises((ValueError, TypeError), match="padding_idx"):
        torch_frontend.accumulate(ids, grad, main_grad, padding_idx=padding_idx)


@requires_cuda
def test_devices_must_match():
    ids, grad, main_grad = _good()
    with pytest.raises(ValueError, match="one device"):
        torch_frontend.accumulate(ids.cpu(), grad, main_grad)


def test_empty_inputs_leave_main_grad():
    main_grad = torch.randn(5, 4, device=DEVICE)
    before = main_grad.clone()
    torch_frontend.accumulate(torch.zeros(0, 3, dtype=torch.int64, device=DEVICE), torch.zeros(0, 3, 4, device=DEVICE), main_grad)
    assert_bits_equal(to_numpy(main_grad), to_numpy(before))
    empty_h = torch.zeros(5, 0, device=DEVICE)
    torch_frontend.accumulate(torch.tensor([1, 2], device=DEVICE), torch.zeros(2, 0, device=DEVICE), empty_h)


def test_can_accumulate():
    ids, grad, main_grad = _good()
    assert torch_frontend.can_accumulate(ids, grad, main_grad)
    assert not torch_frontend.can_accumulate(ids.float(), grad, main_grad)


class _FakeCompiled:
    """Stands in for a CompiledKernel: kernel[grid](*args, stream=...) records the launch."""

    def __init__(self, launches):
        self.launches = launches

    def __getitem__(self, grid):
        return lambda *args, stream=None: self.launches.append((grid, args, stream))


def test_replay_launches_each_call_with_its_own_tensors(monkeypatch):
    # The mechanism on the CPU (the GPU tests run it for real): each tensor argument of a recorded
    # launch is the caller's ids, grad or main_grad, or scratch the call allocated, which a
    # replay allocates afresh with the same shape and dtype; every other argument is kept.
    launches = []
    fake = _FakeCompiled(launches)
    monkeypatch.setattr(ew, "driver", SimpleNamespace(active=SimpleNamespace(get_current_stream=lambda index: 1234)))
    ids, grad, main_grad = torch.zeros(6, dtype=torch.int32), torch.zeros(6, 4), torch.zeros(9, 4)
    launcher = ew._Launcher()
    ws = launcher.empty(20, dtype=torch.int32, device="cpu")
    partials = launcher.empty(2, 4, dtype=torch.float32, device="cpu")
    launcher.recorded += [(fake, (3, 1, 1), (ids, ws, 6, grad, None)), (fake, (5, 2, 1), (ws, partials, main_grad, 7, True))]
    replay = ew._Replay(launcher, ids, grad, main_grad, copy_grad=True)
    assert all(not isinstance(a, torch.Tensor) for _, _, fixed, _ in replay.launches for a in fixed)  # it keeps no tensor

    ids2, main_grad2 = torch.ones(6, dtype=torch.int32), torch.ones(9, 4)
    grad2 = torch.arange(24.0).view(4, 6).t()  # [6, 4], strided: copy_grad makes it contiguous
    replay(ids2, grad2, main_grad2)
    (grid1, args1, stream1), (grid2, args2, stream2) = launches
    assert (grid1, grid2, stream1, stream2) == ((3, 1, 1), (5, 2, 1), 1234, 1234)
    assert args1[0] is ids2 and args2[2] is main_grad2
    assert args1[3].is_contiguous() and torch.equal(args1[3], grad2)
    assert args1[2] == 6 and args1[4] is None and args2[3:] == (7, True)
    new_ws, new_partials = args1[1], args2[1]
    assert args2[0] is new_ws and new_ws is not ws and new_partials is not partials
    assert (new_ws.shape, new_ws.dtype, new_partials.shape, new_partials.dtype) == (ws.shape, ws.dtype, partials.shape, partials.dtype)

    launcher.recorded.append((fake, (1, 1, 1), (torch.zeros(3),)))  # a tensor that is neither the caller's nor scratch
    with pytest.raises(KeyError):
        ew._Replay(launcher, ids, grad, main_grad, copy_grad=False)


def test_replayed_calls_kept_are_bounded(monkeypatch):
    """With a token count that varies per call, every n is a key: the oldest go beyond CALLS_KEPT."""
    monkeypatch.setattr(ew, "_CALLS", {})
    monkeypatch.setattr(ew, "CALLS_KEPT", 3)
    for key in "abcde":
        ew._keep_call(key, key.upper())
    assert ew._CALLS == {"c": "C", "d": "D", "e": "E"}


# ----------------------------------------------------------------------------- GPU


def dense_reference(ids, grad, main_grad, padding_idx):
    """PyTorch's own route: embedding_dense_backward + add_, deterministic algorithms on."""
    prior = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        n, hidden = ids.numel(), grad.shape[-1]
        gw = torch.ops.aten.embedding_dense_backward(grad.reshape(n, hidden), ids.reshape(-1), main_grad.shape[0], padding_idx, False)
        return main_grad.clone().add_(gw)
    finally:
        torch.use_deterministic_algorithms(prior)


def assert_rows_bits_equal(out, expected, what: str = ""):
    """Two [V, H] tensors on the device bit for bit, copying only the first differing rows to the host."""
    as_int = torch.int16 if out.element_size() == 2 else torch.int32
    differ = (out.view(as_int) != expected.view(as_int)).any(dim=1)
    if differ.any():
        bad = differ.nonzero().flatten()[:4]
        assert_bits_equal(to_numpy(out[bad]), to_numpy(expected[bad]), f"rows {bad.tolist()}{what}")


def gpu_inputs(case: Case):
    ids, grad = case.ids_and_grad()
    gen = torch.Generator(device="cuda").manual_seed(case.seed)
    main_grad = torch.randn(case.num_embeddings, case.hidden, device="cuda", generator=gen).to(TORCH_DTYPES[case.main_grad_dtype])
    return ids, grad, to_torch(ids), to_torch(grad), main_grad


@requires_cuda
@pytest.mark.parametrize("case", gpu_cases(), ids=lambda c: c.name)
def test_gpu_bitwise_against_dense_and_core(case: Case):
    ids, grad, ids_t, grad_t, main_grad = gpu_inputs(case)
    expected = dense_reference(ids_t, grad_t, main_grad, case.padding)
    out = main_grad.clone()
    torch_frontend.accumulate(ids_t, grad_t, out, padding_idx=case.padding_idx, zero_rows=case.zero_positions is not None)
    # main_grad holds no -0.0, so the dense path's +0 in absent rows leaves their bits: the
    # whole tensor compares, absent rows included.
    assert_rows_bits_equal(out, expected)
    if core_checked_on_gpu(case):
        rows, new = case.expected_rows(ids, grad, lambda r: to_numpy(main_grad[torch.from_numpy(r).cuda()]))
        assert_bits_equal(to_numpy(out[torch.from_numpy(rows).cuda()]), new, "core reference rows")


@requires_cuda
@pytest.mark.parametrize("case", [c for c in gpu_cases() if c.zero_positions is not None], ids=lambda c: c.name)
def test_gpu_masked_megatron_bitwise(case: Case):
    """Megatron's vocab-parallel input with its input_mask as masked: the masked rows (NaN here) are
    not read, and main_grad gets the dense path's bits on the zeroed grad; twice (the second call
    replays the first's launches with its own mask)."""
    ids, grad, ids_t, grad_t, main_grad = gpu_inputs(case)
    expected = dense_reference(ids_t, grad_t, main_grad, case.padding)
    masked = to_torch(case.masked())
    poisoned = grad_t.masked_fill(masked[:, None], float("nan"))
    for _ in range(2):
        out = main_grad.clone()
        torch_frontend.accumulate(ids_t, poisoned, out, masked=masked.clone())
        assert torch.equal(out.view(torch.int32), expected.view(torch.int32))


@requires_cuda
@pytest.mark.gpu_memory  # main_grad at the real shape (tests/conftest.py)
def test_gpu_replayed_launches_give_the_same_bits():
    # The first call of a key records its compiled kernels; later calls launch them directly.
    case = gpu_cases_by_name()["real-uniform-8192-bfloat16"]
    _, _, ids_t, grad_t, main_grad = gpu_inputs(case)
    problem = ew._check(ids_t, grad_t, main_grad, None)
    key = ew._call_key(ids_t, grad_t, main_grad, problem, torch_path(case.num_tokens))
    ew._CALLS.pop(key, None)
    first, second = main_grad.clone(), main_grad.clone()
    torch_frontend.accumulate(ids_t, grad_t, first)
    assert key in ew._CALLS
    torch_frontend.accumulate(ids_t, grad_t, second)
    assert torch.equal(first.view(torch.int32), second.view(torch.int32))
    assert torch.equal(second.view(torch.int32), dense_reference(ids_t, grad_t, main_grad, -1).view(torch.int32))


@requires_cuda
@pytest.mark.parametrize("name", ["feature-zipf-3072", "real-zipf-8192-bfloat16", "megatron-tp8-32768"])
def test_gpu_tensors_at_any_offset_of_a_flat_buffer(name):
    """main_grad as a view into a flat buffer at an element offset, as Megatron's DDP gives it
    (its data pointer 4-12 bytes past 16-byte alignment), and ids, grad and masked at odd offsets
    too: the dense path's bits and nothing written outside the view (feature path, merge sort with
    the L2 prefetch and lone tokens, the masked route). Triton specialises pointers on 16-byte
    alignment, so alignment is part of the launch key (_call_key): the offsets alternate, so that
    each key's recorded launches are replayed after another key's call. Two misaligned forms:
    main_grad alone (Megatron's case) and every tensor (two more compilations of each kernel)."""
    case = gpu_cases_by_name()[name]
    ids, grad, ids_t, grad_t, main_grad = gpu_inputs(case)
    masked = case.masked()
    masked_t = None if masked is None else to_torch(masked)
    expected = dense_reference(ids_t, grad_t, main_grad, case.padding)
    for offsets in ((0, 0, 0, 0), (1, 0, 0, 0), (0, 0, 0, 0), (3, 1, 3, 5), (2, 0, 0, 0), (1, 3, 1, 1)):
        out, buffer = in_flat_buffer(main_grad, offsets[0])
        torch_frontend.accumulate(in_flat_buffer(ids_t, offsets[1])[0], in_flat_buffer(grad_t, offsets[2])[0], out,
                                  padding_idx=case.padding_idx, masked=None if masked_t is None else in_flat_buffer(masked_t, offsets[3])[0])
        assert torch.equal(out.view(torch.int32), expected.view(torch.int32)), offsets
        assert_canaries_kept(buffer, out)


#: One case per route of the hot path: the sort path's merge sort with folders (case 0, 3073 tokens),
#: the feature path, Zipf 8192, the long-run kernel, the library sort, the masked route (merge sort
#: and library sort) and zero_rows.
GRAPH_CASES = ("real-uniform-3073-bfloat16", "feature-zipf-3072", "real-zipf-8192-bfloat16", "sort-merge-top-32768-zipf",
               "sort-library-32769-uniform", "megatron-tp8-8192", f"megatron-tp8-{MASKED_MERGE_SORT_MAX_TOKENS + 1}",
               "zero-run-below-skip-4096")


@requires_cuda
@pytest.mark.parametrize("name, masked", [(name, name.startswith("megatron")) for name in GRAPH_CASES])
def test_gpu_cuda_graph_and_no_host_sync(name, masked):
    """Every route captures into a CUDA graph with no host synchronisation (set_sync_debug_mode raises
    on one), and the replay gives the eager call's bits."""
    case = gpu_cases_by_name()[name]
    _, _, ids_t, grad_t, main_grad = gpu_inputs(case)
    kwargs = dict(padding_idx=case.padding_idx, zero_rows=case.zero_positions is not None,
                  masked=to_torch(case.masked()) if masked else None)
    expected = main_grad.clone()
    torch_frontend.accumulate(ids_t, grad_t, expected, **kwargs)
    out = main_grad.clone()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host synchronisation raises
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            scratch = main_grad.clone()
            torch_frontend.accumulate(ids_t, grad_t, scratch, **kwargs)  # warm-up: compiles outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            torch_frontend.accumulate(ids_t, grad_t, out, **kwargs)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    out.copy_(main_grad)
    graph.replay()
    torch.cuda.synchronize()
    as_int = torch.int16 if out.element_size() == 2 else torch.int32
    assert torch.equal(out.view(as_int), expected.view(as_int))
    assert not torch.equal(out.view(as_int), main_grad.view(as_int)), "the replay added nothing"


TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (scripts/gpu_two.sh)")


@TWO_GPUS
@pytest.mark.parametrize("name", ["feature-zipf-3072", "real-zipf-8192-bfloat16", "megatron-tp8-32768"])
def test_gpu_tensors_on_a_gpu_that_is_not_the_current_one(name):
    """Every tensor on cuda:1 while cuda:0 is current (a process that drives two GPUs): the call
    runs on cuda:1 (accumulate enters main_grad's device), allocates nothing on cuda:0, leaves cuda:0
    current, and gives the dense path's bits there, on either side of the same call on cuda:0
    (launches are replayed per device: _call_key). The feature path, the merge sort, and the
    masked route without folders."""
    case = gpu_cases_by_name()[name]
    ids, grad = case.ids_and_grad()
    masked = case.masked()
    torch.cuda.set_device(0)
    for device in ("cuda:0", "cuda:1", "cuda:0"):
        ids_t, grad_t = to_torch(ids, device), to_torch(grad, device)
        gen = torch.Generator(device=device).manual_seed(case.seed)
        main_grad = torch.randn(case.num_embeddings, case.hidden, device=device, generator=gen)
        expected = dense_reference(ids_t, grad_t, main_grad, case.padding)
        out = main_grad.clone()
        on_current = torch.cuda.memory_allocated(0)
        torch_frontend.accumulate(ids_t, grad_t, out, padding_idx=case.padding_idx,
                                  masked=None if masked is None else to_torch(masked, device))
        assert torch.cuda.current_device() == 0
        if device == "cuda:1":
            assert torch.cuda.memory_allocated(0) == on_current, "scratch allocated on the current GPU"
        assert out.device == torch.device(device)
        assert torch.equal(out.view(torch.int32), expected.view(torch.int32)), device


@requires_cuda
@pytest.mark.gpu_memory  # main_grad at the real shape (tests/conftest.py)
def test_gpu_extra_memory_is_a_few_n_h():
    case = gpu_cases_by_name()["real-uniform-8192-bfloat16"]
    _, _, ids_t, grad_t, main_grad = gpu_inputs(case)
    torch_frontend.accumulate(ids_t, grad_t, main_grad)  # compile
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch_frontend.accumulate(ids_t, grad_t, main_grad)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    n, hidden = case.num_tokens, case.hidden
    assert extra <= 2 * n * hidden * 4, f"{extra} bytes extra, n*H*4 = {n * hidden * 4}"
