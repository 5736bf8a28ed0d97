"""embwgrad_core: constants, path choice, key packing, the plan, and the NumPy reference.

The reference is checked independently of any kernel: hand-worked cases fix its order of
additions and roundings, and a float64 sum bounds its error.
"""

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embwgrad_core import (
    CHUNK,
    FEATURE,
    FEATURE_PATH_MAX_TOKENS,
    NROWS,
    SORT,
    MASKED_LOOKUP_ID,
    key_packing,
    MERGE_MAX_BLOCKS,
    make_masked_plan,
    make_plan,
    masked_compaction,
    masked_partial_programs_per_sm,
    masked_split,
    merge_block,
    merge_ranks,
    merge_sorted,
    MASKED_MERGE_SORT_MAX_TOKENS,
    MERGE_SORT_MAX_TOKENS,
    pack_keys,
    partial_buffer_rows,
    partial_row,
    reference,
    torch_path,
)
from embwgrad_core.dtypes import bits, round_to
from embwgrad_core.plan import sanitize_ids, unpack_keys
from embwgrad_core.validate import normalize_padding_idx, type_name
from tests.cases import Case, assert_bits_equal, cpu_cases, zipf_ids

BF16 = ml_dtypes.bfloat16


def test_constants_are_pytorchs():
    assert (NROWS, FEATURE_PATH_MAX_TOKENS, CHUNK) == (10, 3072, 32)


def test_core_imports_no_framework():
    code = "import sys, embwgrad_core; bad = {'torch', 'jax', 'triton'} & set(sys.modules); assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_torch_path_threshold():
    assert torch_path(1) == torch_path(FEATURE_PATH_MAX_TOKENS) == FEATURE
    assert torch_path(FEATURE_PATH_MAX_TOKENS + 1) == torch_path(2**20) == SORT


def test_merge_sort_reach():
    """The merge sort up to MERGE_SORT_MAX_TOKENS, and with masked (whose route sorts only the tokens it
    keeps) up to MASKED_MERGE_SORT_MAX_TOKENS; the framework's radix sort above."""
    assert MERGE_SORT_MAX_TOKENS < MASKED_MERGE_SORT_MAX_TOKENS
    assert merge_sorted(MERGE_SORT_MAX_TOKENS) and not merge_sorted(MERGE_SORT_MAX_TOKENS + 1)
    assert merge_sorted(MERGE_SORT_MAX_TOKENS + 1, masked=True) and merge_sorted(MASKED_MERGE_SORT_MAX_TOKENS, masked=True)
    assert not merge_sorted(MASKED_MERGE_SORT_MAX_TOKENS + 1, masked=True)
    assert merge_block(MASKED_MERGE_SORT_MAX_TOKENS) * MERGE_MAX_BLOCKS >= MASKED_MERGE_SORT_MAX_TOKENS


def test_masked_partial_programs_per_sm():
    """The masked route's partials programs per SM: 48 up to 8192 tokens, 64 up to 16384, 96 above,
    to the route's end; no setting past the route (no call asks for one)."""
    ns = (1, 8192, 8193, 16384, 16385, MASKED_MERGE_SORT_MAX_TOKENS)
    assert [masked_partial_programs_per_sm(n) for n in ns] == [48, 48, 64, 64, 96, 96]
    with pytest.raises(ValueError, match="num_tokens"):
        masked_partial_programs_per_sm(MASKED_MERGE_SORT_MAX_TOKENS + 1)


def test_round_to_is_rne_and_keeps_subnormals():
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, 2.0**-130, -(2.0**-133), 65520.0, -0.0], np.float32)
    assert round_to(x, "bfloat16").tolist() == [1.0, 1 + 2**-6, 2.0**-130, -(2.0**-133), 65536.0, -0.0]
    assert round_to(x, "float16")[4] == np.inf  # 65520 rounds up past fp16's max
    assert bits(round_to(x, "float16"))[5] == bits(np.float32(-0.0))


# ----------------------------------------------------------------------------- key packing


def test_key_packing_bits():
    p = key_packing(8192, 129280)
    assert (p.id_bits, p.pos_bits, p.dtype) == (17, 13, "uint32")
    assert key_packing(16384, 129280).dtype == "uint32"
    assert key_packing(2**20, 2**31 - 1).dtype == "uint64"
    assert key_packing(1, 1).total_bits == 1


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(-3, 40), min_size=1, max_size=300), st.integers(1, 40))
def test_packed_keys_sort_like_a_stable_sort(ids, vocab):
    keys = sanitize_ids(ids, vocab)
    packing = key_packing(len(ids), vocab)
    packed = pack_keys(keys, packing)
    back_keys, back_pos = unpack_keys(np.sort(packed), packing)
    order = np.argsort(keys, kind="stable")
    assert back_keys.tolist() == keys[order].tolist()
    assert back_pos.tolist() == order.tolist()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(-3, 40), min_size=1, max_size=300), st.integers(1, 40), st.sampled_from([1, 2, 4, 16, 64]))
def test_merge_ranks_is_the_stable_sort(ids, vocab, block):
    keys = sanitize_ids(ids, vocab)
    slot, run_start, run_end = merge_ranks(keys, block)
    order = np.argsort(keys, kind="stable")
    plan = make_plan(ids, vocab, path=SORT)
    assert slot[order].tolist() == list(range(keys.size))
    assert run_start[order].tolist() == plan.run_start.tolist()
    assert run_end[order].tolist() == plan.run_end.tolist()


def test_merge_block_bounds_the_blocks():
    for n in (1, 4096, 8192, 16384, 16385, 32768, 131072, 2**20):
        block = merge_block(n)
        assert block & (block - 1) == 0 and block >= 256
        assert -(-n // block) <= MERGE_MAX_BLOCKS and (block == 256 or -(-n // (block // 2)) > MERGE_MAX_BLOCKS)


# ----------------------------------------------------------------------------- plan


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 12), min_size=1, max_size=400),
    st.sampled_from([FEATURE, SORT]),
    st.one_of(st.none(), st.integers(0, 12)),
)
def test_plan_invariants(ids, path, padding_idx):
    ids = np.array(ids)
    plan = make_plan(ids, 13, padding_idx=-1 if padding_idx is None else padding_idx, path=path)
    n = ids.size
    assert sorted(plan.sorted_pos.tolist()) == list(range(n))
    keys = sanitize_ids(ids, 13, -1 if padding_idx is None else padding_idx)
    assert (keys[plan.sorted_pos] == plan.sorted_keys).all()
    for r, length in zip(plan.run_slot, plan.run_len):
        run = slice(r, r + length)
        assert (plan.sorted_keys[run] == plan.sorted_keys[r]).all()
        assert (np.diff(plan.sorted_pos[run]) > 0).all()  # stable
        assert (plan.run_start[run] == r).all() and (plan.run_end[run] == r + length).all()
    assert (plan.partial_len >= 1).all()
    if path == SORT:
        assert (plan.partial_len <= NROWS).all()
        assert ((plan.partial_slot - plan.run_start[plan.partial_slot]) % NROWS == 0).all()
    else:
        for s, length in zip(plan.partial_slot, plan.partial_len):
            chunks = plan.sorted_pos[s : s + length] // CHUNK
            assert (chunks == chunks[0]).all()
    # Every long run's partials get distinct scratch rows inside the buffer.
    rows = [
        partial_row(r, k, path)
        for r, m in plan.long_runs
        for k in range(m)
    ]
    assert len(set(map(int, rows))) == len(rows)
    assert all(0 <= row < partial_buffer_rows(n, path) for row in rows)


def test_partial_row_sort_path_is_injective_for_adversarial_runs():
    # Long runs packed as tightly as possible: lengths NROWS+1 .. 3*NROWS, at every offset.
    for offset in range(NROWS):
        for length in range(NROWS + 1, 3 * NROWS + 1):
            lengths = [offset + 1] + [length] * 6 + [NROWS + 1]
            plan = make_plan(np.repeat(np.arange(len(lengths)), lengths), len(lengths), path=SORT)
            rows = [int(partial_row(r, k, SORT)) for r, m in plan.long_runs for k in range(m)]
            assert len(set(rows)) == len(rows) and max(rows) < partial_buffer_rows(plan.num_tokens, SORT)


# ----------------------------------------------------------------------------- the masked plan


def _masked_plan_matches_reference(ids, masked, grad, num_embeddings, padding_idx):
    """make_masked_plan's sums equal the sort path's on grad with the masked rows zeroed, reading no left-out row."""
    zeroed = np.where(masked[:, None], np.zeros((), grad.dtype), grad)
    rows, values = reference.weight_grad_rows(ids, zeroed, num_embeddings, padding_idx=padding_idx, path=SORT)
    pad = -1 if padding_idx is None else padding_idx  # (the plan's convention: -1 for none)
    plan = make_masked_plan(ids, num_embeddings, masked, padding_idx=pad)
    keys = sanitize_ids(ids, num_embeddings, pad)
    kept, _, before = masked_compaction(ids, num_embeddings, masked, padding_idx=pad)
    np.testing.assert_array_equal(kept - before, np.arange(kept.size))  # a kept token's slot, from its prefix count alone
    left_out = np.ones(ids.size, bool)
    left_out[plan.sorted_pos] = False
    assert (masked[left_out] & (keys[left_out] == MASKED_LOOKUP_ID)).all()
    assert left_out.sum() == max(int((masked & (keys == MASKED_LOOKUP_ID)).sum()) - 1, 0)
    assert (plan.partial_len >= 1).all() and (plan.partial_len <= NROWS).all()
    unread = zeroed.copy()
    unread[left_out] = np.nan  # never read
    gw = reference.fold_runs(plan, reference.partial_sums(plan, unread), unread.dtype.name)
    keep = plan.run_key >= 0
    np.testing.assert_array_equal(plan.run_key[keep], rows)
    assert_bits_equal(gw[keep].astype(grad.dtype), values, "masked plan")


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1, max_size=400),
    st.floats(0, 1),
    st.sampled_from([None, 0, 2]),
    st.integers(0, 2**32 - 1),
)
def test_masked_plan_gives_the_sort_paths_bits(tokens, share, padding_idx, seed):
    """Any ids and mask (masked tokens of other ids too); rows of mixed magnitudes and signed zeros, so that
    a partial's boundary or a left-out +0 would show in the bits."""
    rng = np.random.default_rng(seed)
    ids = np.array([t[0] for t in tokens])
    masked = np.array([t[1] for t in tokens]) | (rng.random(ids.size) < share)
    ids = np.where(masked & (rng.random(ids.size) < 0.8), MASKED_LOOKUP_ID, ids)  # most masked tokens at Megatron's id
    grad = (rng.standard_normal((ids.size, 3)) * 2.0 ** rng.integers(-30, 30, (ids.size, 3))).astype(np.float32)
    grad[rng.random(grad.shape) < 0.1] = -0.0
    for dtype in (np.float32, BF16):
        _masked_plan_matches_reference(ids, masked, grad.astype(dtype), 6, padding_idx)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n, share", [(300, 0.5), (2000, 0.875)])
def test_masked_plan_with_many_real_tokens_at_the_masked_id(n, share, seed):
    """Many unmasked tokens at MASKED_LOOKUP_ID among the masked ones (row 0 of the shard a frequent
    id), so that each of them must fall in the partial of its rank among all the id's tokens."""
    rng = np.random.default_rng(seed)
    masked = rng.random(n) < share
    ids = np.where(masked | (rng.random(n) < 0.3), MASKED_LOOKUP_ID, rng.integers(0, 40, n))
    grad = (rng.standard_normal((n, 4)) * 2.0 ** rng.integers(-30, 30, (n, 4))).astype(np.float32)
    _masked_plan_matches_reference(ids, masked, grad, 40, None)
    _masked_plan_matches_reference(ids, masked, grad.astype(BF16), 40, None)


@pytest.mark.parametrize("seed", range(4))
def test_masked_split_ranks_row_tokens_as_the_sort_path(seed):
    """masked_split (the frontends' masked route): every token not of MASKED_LOOKUP_ID kept in order, and each
    unmasked token of it ranked as make_plan's sort path ranks it in that id's run (slot - run start)."""
    rng = np.random.default_rng(seed)
    masked = rng.random(500) < 0.7
    ids = np.where(masked | (rng.random(500) < 0.3), MASKED_LOOKUP_ID, rng.integers(-2, 40, 500))
    kept, kept_keys, real, rank = masked_split(ids, 40, masked)
    keys = sanitize_ids(ids, 40, -1)
    np.testing.assert_array_equal(kept, np.flatnonzero(keys != MASKED_LOOKUP_ID))
    np.testing.assert_array_equal(kept_keys, keys[kept])
    np.testing.assert_array_equal(real, np.flatnonzero((keys == MASKED_LOOKUP_ID) & ~masked))
    plan = make_plan(ids, 40, path=SORT)
    slot_of = np.empty(ids.size, np.int64)
    slot_of[plan.sorted_pos] = np.arange(ids.size)
    np.testing.assert_array_equal(rank, slot_of[real] - plan.run_start[slot_of[real]])


def test_masked_plan_on_megatron_ids():
    """Megatron's vocab-parallel ids on a rank of TP = 8 (7/8 of the tokens masked at id 0): the plan
    keeps the shard's tokens and one masked token, and gives the sort path's bits."""
    ids = zipf_ids(8192, 4096, seed=5)
    masked = (ids < 512) | (ids >= 1024)
    local = np.where(masked, 0, ids - 512)
    grad = np.random.default_rng(5).standard_normal((8192, 8)).astype(BF16)
    plan = make_masked_plan(local, 512, masked)
    assert plan.num_tokens == (~masked).sum() + 1
    _masked_plan_matches_reference(local, masked, grad, 512, None)


# ----------------------------------------------------------------------------- reference: hand-worked order


def test_sort_path_adds_partials_not_rows():
    # One id, 21 fp32 rows: partials [0..9], [10..19], [20]. Row 0 is 1, rows 10 and 11 are
    # 2^-24 each. In position order, 1 + 2^-24 ties to 1 twice; PyTorch's partial
    # [10..19] = 2^-23 first, and 1 + 2^-23 is exact.
    grad = np.zeros((21, 1), np.float32)
    grad[0], grad[10], grad[11] = 1.0, 2.0**-24, 2.0**-24
    rows, gw = reference.weight_grad_rows(np.zeros(21, int), grad, 1, path=SORT)
    assert gw[0, 0] == np.float32(1 + 2**-23)
    assert np.float32(np.float32(np.float32(1) + np.float32(2**-24)) + np.float32(2**-24)) == 1.0


def test_feature_path_rounds_every_chunk():
    # bf16 grad, one id at positions 0, 1, 2 (chunk 0) and 32 (chunk 1). Chunk 0 sums to
    # 1 + 2^-8, a tie that rounds to 1; then 1 + 2^-8 ties to 1 again. The sort path rounds
    # once: 1 + 2^-7.
    ids = np.full(33, 1)
    ids[[0, 1, 2, 32]] = 0
    grad = np.zeros((33, 1), np.float32)
    grad[[0, 1, 2, 32], 0] = [1.0, 2.0**-9, 2.0**-9, 2.0**-8]
    grad = grad.astype(BF16)
    assert reference.weight_grad_rows(ids, grad, 2, path=FEATURE)[1][0, 0] == 1.0
    assert reference.weight_grad_rows(ids, grad, 2, path=SORT)[1][0, 0] == BF16(1 + 2**-7)


def test_main_grad_add_rounds_once():
    main_grad = np.array([[1.0]], BF16)
    grad = np.array([[2.0**-9]], np.float32)  # fp32 grad into bf16 main_grad
    out = reference.accumulate(np.array([0]), grad, main_grad)
    assert out[0, 0] == 1.0  # 1 + 2^-9 rounds to 1 in bf16, in one step


def test_signed_zero_and_subnormals():
    grad = np.array([[-0.0, 2.0**-130], [-0.0, 2.0**-130]], np.float32)
    main_grad = np.array([[-0.0, 0.0], [-0.0, -0.0]], np.float32)
    out = reference.accumulate(np.array([0, 0]), grad, main_grad)
    assert bits(out[0]).tolist() == bits(np.array([0.0, 2.0**-129], np.float32)).tolist()
    assert bits(out[1]).tolist() == bits(main_grad[1]).tolist()  # absent row untouched, -0 kept


def test_padding_and_out_of_range_rows_untouched():
    ids = np.array([0, 1, 2, -1, 5, 1])
    grad = np.ones((6, 3), np.float32)
    main_grad = np.full((4, 3), -0.0, np.float32)
    out = reference.accumulate(ids, grad, main_grad, padding_idx=2)
    assert out[1].tolist() == [2, 2, 2] and out[0].tolist() == [1, 1, 1]
    assert bits(out[2:]).tolist() == bits(main_grad[2:]).tolist()


# ----------------------------------------------------------------------------- reference: bounded by float64


@pytest.mark.parametrize("case", [c for c in cpu_cases() if not c.specials], ids=lambda c: c.name)
def test_reference_is_within_float64_bound(case: Case):
    ids, grad, main_grad = case.arrays()
    plan = make_plan(ids, case.num_embeddings, padding_idx=-1 if case.padding_idx is None else case.padding_idx % case.num_embeddings, path=case.path)
    rows, gw = reference.weight_grad_rows(ids, grad, case.num_embeddings, padding_idx=case.padding_idx, path=case.path)
    g64 = grad.reshape(ids.size, -1).astype(np.float64)
    u32 = 2.0**-24
    u_grad = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}[case.grad_dtype]
    for row, value in zip(rows, gw.astype(np.float64)):
        pos = plan.sorted_pos[plan.sorted_keys == row]
        exact = g64[pos].sum(axis=0)
        magnitude = np.abs(g64[pos]).sum(axis=0)
        roundings = 2 * np.unique(pos // CHUNK).size if plan.path == FEATURE else 1  # rounds to the grad dtype
        bound = (pos.size * u32 + roundings * u_grad) * magnitude * 1.01 + 1e-37
        assert (np.abs(value - exact) <= bound).all(), row


@pytest.mark.parametrize("case", [c for c in cpu_cases() if c.path is None], ids=lambda c: c.name)
def test_reference_rows_present_only(case: Case):
    ids, grad, main_grad = case.arrays()
    out = reference.accumulate(ids, grad, main_grad, padding_idx=case.padding_idx)
    touched = np.zeros(case.num_embeddings, bool)
    keys = sanitize_ids(ids, case.num_embeddings, -1 if case.padding_idx is None else case.padding_idx % case.num_embeddings)
    touched[keys[keys >= 0]] = True
    assert_bits_equal(out[~touched], main_grad[~touched], "absent rows")


def test_reference_matches_dense_definition_on_zipf():
    ids = zipf_ids(5000, 300, seed=3)
    grad = np.random.default_rng(3).standard_normal((5000, 16)).astype(BF16)
    main_grad = np.random.default_rng(4).standard_normal((300, 16)).astype(np.float32)
    dense = reference.embedding_dense_backward(grad, ids, 300)
    expected = main_grad.copy()
    present = np.unique(ids)
    expected[present] = main_grad[present] + dense[present].astype(np.float32)
    assert_bits_equal(reference.accumulate(ids, grad, main_grad), expected)


# ----------------------------------------------------------------------------- reference: validation


@pytest.mark.parametrize(
    "ids, grad, main_grad, padding_idx, error, name",
    [
        (np.zeros(3, np.float32), np.zeros((3, 4), np.float32), np.zeros((5, 4), np.float32), None, TypeError, "ids"),
        (np.zeros(3, int), np.zeros((3, 4), np.int32), np.zeros((5, 4), np.float32), None, TypeError, "grad"),
        (np.zeros(3, int), np.zeros((3, 4), np.float32), np.zeros((5, 4), np.float64), None, TypeError, "main_grad"),
        (np.zeros(3, int), np.zeros((4, 4), np.float32), np.zeros((5, 4), np.float32), None, ValueError, "grad"),
        (np.zeros(3, int), np.zeros((3, 4), np.float32), np.zeros((5, 3), np.float32), None, ValueError, "main_grad"),
        (np.zeros(3, int), np.zeros((3, 4), np.float32), np.zeros(20, np.float32), None, ValueError, "main_grad"),
        (np.zeros(3, int), np.zeros((3, 4), np.float32), np.zeros((5, 4), np.float32), 5, ValueError, "padding_idx"),
    ],
)
def test_reference_rejects_bad_input(ids, grad, main_grad, padding_idx, error, name):
    with pytest.raises(error, match=name):
        reference.accumulate(ids, grad, main_grad, padding_idx=padding_idx)


def test_reference_empty_inputs():
    main_grad = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert_bits_equal(reference.accumulate(np.zeros((0,), int), np.zeros((0, 4), np.float32), main_grad), main_grad)
    empty_h = np.zeros((3, 0), np.float32)
    assert reference.accumulate(np.array([1, 2]), np.zeros((2, 0), np.float32), empty_h).shape == (3, 0)


def test_error_messages_name_the_type_with_its_module():
    """numpy's bool and integers are not shown as Python's bool and int ("got bool" for np.True_)."""
    assert [type_name(v) for v in (True, 3, None, "x", np.True_, np.int64(3), np.zeros(1))] == [
        "bool", "int", "NoneType", "str", f"numpy.{type(np.True_).__name__}", "numpy.int64", "numpy.ndarray"]
    with pytest.raises(TypeError, match="padding_idx must be an int or None, got numpy.int64"):
        normalize_padding_idx(np.int64(3), 10)
