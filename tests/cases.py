"""Cases shared by every test module: core, torch frontend, JAX frontend, cross-framework.

A case is data only (NumPy arrays from a seed), so each framework's tests build their own
tensors from the same bits. Values are random normals at several scales, never all zeros.
"""

import functools
import gc
import sys
from dataclasses import dataclass, field

import numpy as np

from embwgrad_core import CHUNK, FEATURE, FEATURE_PATH_MAX_TOKENS, MASKED_MERGE_SORT_MAX_TOKENS, NROWS, SORT, make_plan, reference
from embwgrad_core.dtypes import bits, numpy_dtype, round_to


@dataclass(frozen=True)
class Case:
    name: str
    ids: np.ndarray  #: int64 [*S]
    hidden: int
    num_embeddings: int
    grad_dtype: str = "bfloat16"
    main_grad_dtype: str = "float32"
    padding_idx: int | None = None
    path: str | None = None  #: forced arithmetic (kernel-level tests only); None: PyTorch's choice
    specials: bool = False  #: sprinkle -0, subnormals, huge values into grad
    seed: int = 0
    marks: tuple = field(default=(), compare=False)
    #: flat positions whose grad rows are zero (+0 and -0), as Megatron's vocab-parallel lookup makes them
    zero_positions: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def num_tokens(self) -> int:
        return int(self.ids.size)

    def arrays(self):
        """(ids int64 [*S], grad [*S, H], main_grad [V, H]) as NumPy arrays of the case's dtypes."""
        ids, grad = self.ids_and_grad()
        rng = np.random.default_rng(self.seed + 1)
        main_grad = rng.standard_normal((self.num_embeddings, self.hidden), dtype=np.float32)
        return ids, grad, main_grad.astype(numpy_dtype(self.main_grad_dtype))

    def ids_and_grad(self):
        """(ids int64 [*S], grad [*S, H]): GPU tests draw main_grad on the device instead."""
        rng = np.random.default_rng(self.seed)
        shape = (*self.ids.shape, self.hidden)
        scale = np.exp2(rng.integers(-8, 8, size=shape[:-1] + (1,))).astype(np.float32)
        grad = (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)
        if self.specials and grad.size:
            flat = grad.reshape(-1)
            spots = rng.choice(flat.size, size=max(1, flat.size // 8), replace=False)
            flat[spots] = rng.choice(np.array([-0.0, 0.0, 2.0**-130, -(2.0**-133), 3.0e38, -1e-45], np.float32), spots.size)
        if self.zero_positions is not None:
            rows = grad.reshape(-1, self.hidden)
            rows[self.zero_positions] = np.where(rng.random((len(self.zero_positions), 1)) < 0.5, -0.0, 0.0)
        return self.ids.astype(np.int64), grad.astype(numpy_dtype(self.grad_dtype))

    def masked(self) -> np.ndarray | None:
        """Megatron's input_mask for the case's zero rows (bool [n], True at zero_positions), or None."""
        if self.zero_positions is None:
            return None
        masked = np.zeros(self.num_tokens, bool)
        masked[self.zero_positions] = True
        return masked

    @property
    def padding(self) -> int:
        """padding_idx normalised: in [0, V), or -1."""
        return -1 if self.padding_idx is None else self.padding_idx % self.num_embeddings

    def expected_rows(self, ids, grad, main_grad_rows_of):
        """(rows, new values) by the core reference, given main_grad's rows as a function of row indices.

        For the GPU, where copying a [V, H] main_grad to the host would dominate the test.
        """
        rows, values = reference.weight_grad_rows(ids, grad, self.num_embeddings, padding_idx=self.padding_idx, path=self.path)
        old = np.asarray(main_grad_rows_of(rows))
        new = round_to(old.astype(np.float32) + values.astype(np.float32), self.main_grad_dtype)
        return rows, new.astype(old.dtype)


def runs_ids(lengths, num_embeddings: int, seed: int = 0, shape=None) -> np.ndarray:
    """Shuffled ids in which id i occurs lengths[i] times (distinct ids drawn from [0, V))."""
    rng = np.random.default_rng(seed)
    keys = rng.choice(num_embeddings, size=len(lengths), replace=False)
    ids = np.repeat(keys, lengths)
    rng.shuffle(ids)
    return ids.reshape(shape) if shape else ids


def _id_repeated(ids: np.ndarray, times: int) -> int:
    """An id that occurs exactly `times` times in ids."""
    values, counts = np.unique(ids, return_counts=True)
    return int(values[counts == times][0])


def uniform_ids(n: int, num_embeddings: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, num_embeddings, size=n)


def zipf_ids(n: int, num_embeddings: int, a: float = 1.1, seed: int = 0) -> np.ndarray:
    """Zipf(a) over the vocabulary: rank r in [1, V] with probability proportional to r^-a, ranks
    mapped to ids by a fixed permutation, so frequent ids are spread over V."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(np.arange(1, num_embeddings + 1, dtype=np.float64) ** -a)
    ranks = np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), num_embeddings - 1)
    return rng.permutation(num_embeddings)[ranks]


# Run lengths that cross the partial boundaries of both paths: NROWS on the sort path, a
# chunk's worth on the feature path.
BOUNDARY_RUNS = (1, NROWS - 1, NROWS, NROWS + 1, 2 * NROWS, 2 * NROWS + 1, CHUNK + 1, 2 * CHUNK + 3)


def cpu_cases() -> list[Case]:
    """Small cases: each runs through the interpreters in a second or two."""
    cases = []
    padded = runs_ids((3, 12, 25, 1), 40, seed=7)
    for path in (SORT, FEATURE):
        tag = path[0]
        cases += [
            Case(f"{tag}-runs-bf16-f32", runs_ids(BOUNDARY_RUNS, 500, seed=1), 37, 500, path=path, seed=1),
            Case(f"{tag}-runs-f32-bf16", runs_ids(BOUNDARY_RUNS, 500, seed=2), 33, 500, "float32", "bfloat16", path=path, seed=2),
            Case(f"{tag}-runs-f16-f16", runs_ids(BOUNDARY_RUNS, 500, seed=3), 24, 500, "float16", "float16", path=path, seed=3),
            Case(f"{tag}-one-token", np.array([7]), 19, 11, path=path, seed=4),
            Case(f"{tag}-all-distinct", np.random.default_rng(5).permutation(300)[:97], 40, 300, path=path, seed=5),
            Case(f"{tag}-one-id-2d", np.full((3, 29), 5), 8, 9, path=path, seed=6),
            # padding_idx, in negative form, names the id that occurs 12 times.
            Case(f"{tag}-padding", padded, 16, 40, padding_idx=_id_repeated(padded, 12) - 40, path=path, seed=7),
            Case(f"{tag}-specials", runs_ids((1, 2, 11, 33), 60, seed=8), 40, 60, specials=True, path=path, seed=8),
            Case(f"{tag}-zipf-2d", zipf_ids(150, 64, seed=9).reshape(5, 30), 24, 64, path=path, seed=9),
        ]
    cases += [
        Case("feature-31", uniform_ids(31, 50, seed=13), 9, 50, seed=13),
        Case("feature-32", zipf_ids(32, 50, seed=14), 9, 50, seed=14),
        Case("feature-33", zipf_ids(33, 50, seed=15), 9, 50, seed=15),
        Case("ids-out-of-range", np.array([3, -1, 7, 100, 3, 2**31 - 1, 0]), 12, 8, seed=10),
        # Zipf ids: lone tokens, short runs and long runs (385 / 220 / 38 ids) at the smallest n on
        # PyTorch's sort path; uniform ids over 2000 had no long run and cost the torch interpreter
        # 1.5x the time (1561 items against 820; session 45).
        Case("torch-path-3073", zipf_ids(FEATURE_PATH_MAX_TOKENS + 1, 2000, seed=11), 8, 2000, seed=11),
    ]
    return cases


def tp_ids(n: int, tp: int, rank: int = 1):
    """(local ids, zero positions, shard rows) of Megatron's vocab-parallel lookup on rank `rank` of
    tp for Zipf(1.1) ids over the real vocabulary: ids outside the rank's shard become 0 and their
    grad rows are zero, so about (tp - 1) / tp of the tokens make one run at row 0 (benchmarks/probe_tp.py)."""
    ids = zipf_ids(n, REAL_V, seed=n)
    shard = REAL_V // tp
    inside = (ids >= rank * shard) & (ids < (rank + 1) * shard)
    return np.where(inside, ids - rank * shard, 0), np.flatnonzero(~inside), shard


def masked_arrays(grad_dtype: str = "bfloat16", lead: int = 0):
    """(ids, grad, main_grad) as Megatron's vocab-parallel lookup hands them on one rank, small: a run of
    151 tokens at row 0 whose grad rows are zero (other ranks' tokens: +0 or -0), but for 2 of its tokens
    (the 5th and 55th), whose rows are nonzero in columns [16, 32) only; a run of 45 tokens of id 7
    with nonzero rows; 124 other tokens. V = 50, H = 40, sort path (320 tokens). lead: row 0's first
    `lead` tokens get nonzero rows in every column (80: its first 8 partials are nonzero everywhere,
    so that a fold meets its zeros only after a wide block or two of nonzero partials).

    With the interpreter's zero skip (runs of 2 partials or more, 4 flags a block) and H blocks of
    16 columns, row 0's 16 partials make, in H block 1, blocks of both kinds and one of zeros (its
    last partial, of one row, counts as nonzero), in blocks 0 and 2 zeros but that one; id 7's
    blocks are of nonzero partials.
    """
    rng = np.random.default_rng(21)
    others = rng.choice(np.setdiff1d(np.arange(1, 50), [7]), size=124)
    ids = rng.permutation(np.concatenate([np.zeros(151, np.int64), np.full(45, 7), others]))
    grad = rng.standard_normal((ids.size, 40), dtype=np.float32)
    row0 = np.flatnonzero(ids == 0)
    grad[row0] = np.where(rng.random((row0.size, 1)) < 0.5, -0.0, 0.0)
    real = row0[[5, 55]]
    grad[real, 16:32] = rng.standard_normal((2, 16), dtype=np.float32)
    grad[row0[:lead]] = rng.standard_normal((lead, 40), dtype=np.float32)
    main_grad = rng.standard_normal((50, 40), dtype=np.float32)
    return ids, grad.astype(numpy_dtype(grad_dtype)), main_grad


def masked_tokens(grad_dtype: str = "bfloat16"):
    """(ids, grad, main_grad, masked) for accumulate's masked: masked_arrays' input, its zero rows at
    row 0 masked as Megatron's `input_mask` marks them (not row 0's two real tokens), and also 3
    tokens of id 7 and 4 other tokens, whose rows are nonzero; every masked row is NaN, so that a
    read of one would show. The expected bits are the reference's with masked."""
    ids, grad, main_grad = masked_arrays("float32")
    masked = ids == 0
    masked[np.flatnonzero(ids == 0)[[5, 55]]] = False
    masked[np.flatnonzero(ids == 7)[[0, 20, 44]]] = True
    masked[np.flatnonzero((ids != 0) & (ids != 7))[[3, 50, 51, 120]]] = True
    grad[masked] = np.nan
    return ids, grad.astype(numpy_dtype(grad_dtype)), main_grad, masked


def masked_row0_tokens(seed: int, n: int = 600, hidden: int = 8):
    """(ids, grad, main_grad, masked) with many unmasked tokens of row 0 among its masked ones (row 0
    of the shard a frequent id): each must fall in the sort path's partial of its rank among all of
    row 0's tokens, and fp32 rows of magnitudes 2^-30 to 2^30 make a wrong grouping show in the
    bits. 60% of the tokens masked at id 0, a quarter of the rest at id 0 too; masked rows NaN."""
    rng = np.random.default_rng(seed)
    masked = rng.random(n) < 0.6
    ids = np.where(masked | (rng.random(n) < 0.25), 0, rng.integers(1, 40, n))
    grad = (rng.standard_normal((n, hidden)) * 2.0 ** rng.integers(-30, 30, (n, hidden))).astype(np.float32)
    grad[masked] = np.nan
    return ids, grad, rng.standard_normal((40, hidden)).astype(np.float32), masked


#: masked_route_edge's cases.
MASKED_ROUTE_EDGES = ["all masked at row 0", "all at row 0, some not masked", "none at row 0", "row 0 is padding_idx", "ids outside [0, V)",
                      "none masked"]


def masked_route_edge(name: str, n: int = 300):
    """(ids, grad, main_grad, masked, padding_idx) at the edges of the masked route (the plan without
    row 0's tokens): no token left in the plan (row 0 still gets its +0, which turns main_grad's -0
    into +0), none at row 0, row 0 padding_idx, ids outside [0, V), none masked. V = 40, H = 8,
    fp32 rows of mixed magnitudes, masked rows NaN."""
    rng = np.random.default_rng(1)
    some = rng.random(n)
    padding_idx = None
    if name == "all masked at row 0":
        ids, masked = np.zeros(n, np.int64), np.ones(n, bool)
    elif name == "all at row 0, some not masked":
        ids, masked = np.zeros(n, np.int64), some < 0.7
    elif name == "none at row 0":
        ids, masked = rng.integers(1, 40, n), some < 0.3
    elif name == "row 0 is padding_idx":
        ids = np.where(some < 0.6, 0, rng.integers(0, 40, n))
        masked, padding_idx = (ids == 0) | (rng.random(n) < 0.1), 0
    elif name == "ids outside [0, V)":
        ids, masked = np.where(some < 0.5, 0, rng.integers(-5, 50, n)), rng.random(n) < 0.5
    else:
        assert name == "none masked", name
        ids, masked = rng.integers(0, 40, n), np.zeros(n, bool)
    rng = np.random.default_rng(2)
    grad = (rng.standard_normal((n, 8)) * 2.0 ** rng.integers(-20, 20, (n, 8))).astype(np.float32)
    grad[masked] = np.nan
    main_grad = rng.standard_normal((40, 8)).astype(np.float32)
    main_grad[0, :3] = -0.0
    return ids, grad, main_grad, masked, padding_idx


def assert_masked_flags(flags, partials, ids, grad, zero_skip: int, skip_block: int, block_h: int = 16) -> None:
    """A frontend's zero-skip flags ([partial rows, H blocks]) and scratch partials for masked_arrays'
    input: each flagged partial's flag per H block of block_h columns says whether the reference's
    sum is nonzero there, and the sum is stored where it is; the case makes every kind of block."""
    plan = make_plan(ids, 50, path=SORT)
    sums = reference.partial_sums(plan, grad.reshape(ids.size, -1))
    blocks = -(-sums.shape[1] // block_h)
    padded = np.zeros((sums.shape[0], blocks * block_h), np.float32)
    padded[:, : sums.shape[1]] = sums
    # A partial of one row counts as nonzero (the frontends skip the test on the copy-add's path).
    one_row = np.minimum(plan.run_end[plan.partial_slot] - plan.partial_slot, NROWS) == 1
    expected = ((bits(padded).reshape(-1, blocks, block_h) != 0).any(axis=2) | one_row[:, None]).astype(np.int32)
    flagged = plan.run_partials[plan.partial_run] >= zero_skip
    rows = plan.partial_rows[flagged]
    assert np.asarray(flags)[rows].tolist() == expected[flagged].tolist()
    stored = np.repeat(expected[flagged], block_h, axis=1)[:, : sums.shape[1]].astype(bool)
    assert_partials_equal(np.asarray(partials)[rows][stored], sums[flagged][stored], SORT, "float32")
    # Row 0's partials but its last are zero in H blocks 0 and 2; in block 1 they make blocks of
    # both kinds and one of zeros. Id 7's are nonzero.
    keys = plan.sorted_keys[plan.partial_slot]
    row0 = expected[flagged & (keys == 0)]
    kinds = [row0[k : k + skip_block, 1] for k in range(0, len(row0), skip_block)]
    assert len(row0) == 16 and not row0[:15, [0, 2]].any() and row0[15].all()
    assert [bool(b.any()) for b in kinds] == [True, True, False, True] and not any(b.all() for b in kinds)
    assert expected[flagged & (keys == 7)].all()


#: The real shape: DeepSeek-V3's vocabulary and hidden size.
REAL_V, REAL_H = 129280, 7168


def gpu_cases() -> list[Case]:
    """Cases at the real shape and around every threshold, for the H200."""
    cases = []
    for n in (3073, 4096, 5000, 8192):
        for dist, ids in (("uniform", uniform_ids(n, REAL_V, seed=n)), ("zipf", zipf_ids(n, REAL_V, seed=n))):
            for gdt in ("bfloat16", "float32"):
                cases.append(Case(f"real-{dist}-{n}-{gdt}", ids, REAL_H, REAL_V, gdt, "float32", seed=n))
    cases += [
        Case("real-odd-H-uniform-8192", uniform_ids(8192, REAL_V, seed=1), 4099, REAL_V, seed=1),
        Case("real-odd-H-zipf-6000", zipf_ids(6000, REAL_V, seed=2), 1031, REAL_V, seed=2),
        Case("real-main-bf16-zipf-8192", zipf_ids(8192, REAL_V, seed=3), REAL_H, REAL_V, "bfloat16", "bfloat16", seed=3),
        Case("specials-8192", zipf_ids(8192, 5000, seed=4), 512, 5000, specials=True, seed=4),
    ]
    for n in (1, 31, 32, 33, 3071, 3072):
        cases.append(Case(f"feature-zipf-{n}", zipf_ids(n, 2000, seed=n), 1024, 2000, seed=n))
        cases.append(Case(f"feature-f32-bf16-{n}", uniform_ids(n, 700, seed=n), 771, 700, "float32", "bfloat16", seed=n))
    # Megatron's vocab-parallel input on a rank of TP = 8: a run of ~7400 zero rows (and a few real
    # ones) at row 0, whose folds skip the zero partials (ZERO_SKIP_MIN_PARTIALS); and above
    # FOLD_ROLE_MAX_TOKENS, where JAX's long-run kernel folds (torch's folders fold up to
    # FOLDERS_MAX_TOKENS, 16384: there the 32768-token Zipf case takes its long-run kernel).
    # Rank 1's own row 0 (id V / 8) does not occur in these ids: one masked token in 997 keeps a
    # nonzero row, so that row 0's folds meet blocks of both kinds too.
    # 32768: torch's masked route with lone tokens and no folders (_Config.kept_lone).
    # Both sides of MASKED_MERGE_SORT_MAX_TOKENS with masked: the masked route's merge sort of the kept
    # tokens, then the library sort of all n with the deferred records (fewer columns, for time).
    for n, hidden in ((8192, 1024), (16384, 1024), (32768, 256), (MASKED_MERGE_SORT_MAX_TOKENS, 256), (MASKED_MERGE_SORT_MAX_TOKENS + 1, 256)):
        local, zeros, shard = tp_ids(n, 8)
        zeros = zeros[np.arange(zeros.size) % 997 != 500]
        cases.append(Case(f"megatron-tp8-{n}", local, hidden, shard, seed=n, zero_positions=zeros))
    # masked given with no token masked at the masked route's largest n: its merge sort of all n tokens
    # (64 full blocks), row 0's tokens all unmasked (the row-0 kernel's partials).
    ids = zipf_ids(MASKED_MERGE_SORT_MAX_TOKENS, 20000, seed=16)
    ids[::97] = 0
    cases.append(Case(f"masked-none-{MASKED_MERGE_SORT_MAX_TOKENS}", ids, 256, 20000, seed=16, zero_positions=np.zeros(0, np.int64)))
    # zero_rows with a run of zero rows too short for flags (600 padding tokens: 60 partials, below
    # ZERO_SKIP_MIN_PARTIALS): each of its zero partials must be stored, since its folds read them
    # all (NOTES v49: they were not, and the folds read stale scratch).
    ids = zipf_ids(4096, 20000, seed=15)
    pads = np.random.default_rng(15).choice(4096, size=600, replace=False)
    ids[pads] = 20000 - 1
    cases.append(Case("zero-run-below-skip-4096", ids, 1024, 20000, seed=15, zero_positions=pads))
    cases += [
        Case("feature-padding-3000", zipf_ids(3000, 500, seed=5), 256, 500, padding_idx=0, seed=5),
        # NaN, inf, -0 and subnormal grads through the feature path's bf16 scratch (from BF16_SCRATCH_MIN_TOKENS).
        Case("feature-specials-2500", zipf_ids(2500, 400, seed=12), 256, 400, specials=True, seed=12),
        Case("sort-padding-9000", zipf_ids(9000, 500, seed=6), 256, 500, padding_idx=3, seed=6),
        Case("sort-fp16-8193", uniform_ids(8193, 20000, seed=7), 640, 20000, "float16", "float16", seed=7),
        Case("sort-library-sort-65536-zipf", zipf_ids(65536, 32000, seed=8), 256, 32000, seed=8),
        Case("sort-20000-uniform", uniform_ids(20000, REAL_V, seed=9), 1024, REAL_V, seed=9),
        # Both sides of MERGE_SORT_MAX_TOKENS: the merge kernels, then the library sort.
        Case("sort-merge-top-32768-zipf", zipf_ids(32768, REAL_V, seed=13), 256, REAL_V, seed=13),
        Case("sort-library-32769-uniform", uniform_ids(32769, REAL_V, seed=14), 256, REAL_V, seed=14),
        # Long context: 2^20 tokens (128k x 8 sequences), and a 2^20-row vocabulary.
        Case("long-context-2^20-zipf", zipf_ids(2**20, REAL_V, seed=10).reshape(8, 2**17), 64, REAL_V, seed=10),
        Case("vocab-2^20-uniform-8192", uniform_ids(8192, 2**20, seed=11), 128, 2**20, seed=11),
        Case("vocab-2^20-ids-at-V-1", np.array([2**20 - 1] * 12 + [0, 5]), 96, 2**20, seed=12),
    ]
    # Every pairing of grad and main_grad dtypes, alternately on each path.
    dtypes = ("bfloat16", "float16", "float32")
    for i, (gdt, mdt) in enumerate((g, m) for g in dtypes for m in dtypes):
        n = 5000 if i % 2 == 0 else 2000
        cases.append(Case(f"dtypes-{gdt}-{mdt}-{n}", zipf_ids(n, 3000, seed=20 + i), 320, 3000, gdt, mdt, seed=20 + i))
    return cases


@functools.cache
def gpu_cases_by_name() -> dict[str, Case]:
    """The GPU cases by name (tests/conftest.py reads a test's parameter that names one)."""
    return {c.name: c for c in gpu_cases()}


def core_checked_on_gpu(case: Case) -> bool:
    """Whether a GPU test also checks the case against the core reference on the host.

    All small cases, and the real shape at 8192 tokens: the host reference of a real-shape
    case takes seconds, and every case is also checked against PyTorch's dense path on the GPU.
    """
    return case.num_tokens * case.hidden <= 8192 * 1024 or case.name in ("real-uniform-8192-bfloat16", "real-zipf-8192-float32")


#: Both frontends' _item_range tests: (programs, folders, tail) and item counts.
ITEM_RANGE_GRIDS = [(8, 0, 3), (8, 2, 3), (40, 4, 17), (5, 0, 4), (12, 3, 0), (64, 0, 3)]
ITEM_RANGE_ITEMS = [0, 1, 2, 3, 7, 50, 333]


def item_range_folders(programs: int, folders: int, items: int):
    """Where both frontends' _item_range tests put the folders: a block of `folders` programs from
    fold_lo on, somewhere among the programs, as after the long runs' partials. Returns fold_lo and
    the folder mask over all programs + folders, in grid order."""
    fold_lo = min(items // 3, programs)
    p = np.arange(programs + folders)
    return fold_lo, (p >= fold_lo) & (p < fold_lo + folders)


def assert_item_ranges(lo, hi, stride, folder, items: int, first: bool = True) -> None:
    """The partials programs' item ranges (each frontend's _item_range), one entry per program in
    grid order: every item once, folders none, and (with `first`: the JAX frontend's and, where
    folders run, the torch frontend's) with no more items than programs the first programs take
    them, one each, in order."""
    assert (stride >= 1).all()
    taken = np.concatenate([np.arange(a, b, s) for a, b, s in zip(lo, hi, stride)] + [np.zeros(0, int)])
    assert sorted(taken.tolist()) == list(range(items))
    assert (lo[folder] >= hi[folder]).all()  # folders take no item
    # No more items than programs that take items: the first `items` of those (in grid order) take
    # one each, in order, so no program without an item starts before one with an item.
    workers = np.flatnonzero(~np.asarray(folder))
    if first and items <= workers.size:
        taken_by = [np.arange(lo[p], hi[p], stride[p]).tolist() for p in workers]
        assert taken_by == [[k] if k < items else [] for k in range(workers.size)]


def assert_partials_equal(stored, sums, path: str, grad_dtype: str) -> None:
    """Long runs' partials as a frontend stored them against the reference's fp32 sums: an int16
    scratch (feature path, bf16 grad) holds each partial rounded to bf16, as its bits."""
    stored = np.asarray(stored)
    if stored.dtype == np.int16:
        assert path == FEATURE and grad_dtype == "bfloat16"
        stored = (stored.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        sums = round_to(sums, "bfloat16")
    assert_bits_equal(stored, sums, "partial sums")


def assert_bits_equal(actual, expected, what: str = "main_grad") -> None:
    """Bitwise equality (any NaN equals any NaN); on failure name the first differing rows/columns."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    both_nan = np.isnan(actual.astype(np.float32)) & np.isnan(expected.astype(np.float32))
    differ = (bits(actual) != bits(expected)) & ~both_nan
    if differ.any():
        where = np.argwhere(differ)
        first = where[:8].tolist()
        a = actual[tuple(where[:8].T)].astype(np.float32).tolist()
        e = expected[tuple(where[:8].T)].astype(np.float32).tolist()
        raise AssertionError(
            f"{what}: {len(where)} of {differ.size} elements differ, rows {np.unique(where[:, 0])[:16].tolist()}; "
            f"first at {first}: got {a}, expected {e}"
        )


def memory_maps() -> int:
    """How many memory maps this process holds (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


@functools.cache
def memory_maps_limit() -> int:
    """The kernel's limit on a process's memory maps (vm.max_map_count; 65530 unless raised)."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65530


def release_compiled_code() -> bool:
    """jax's caches cleared, and True, once this process holds half its memory maps' limit.

    XLA:CPU keeps each compiled executable's code in memory maps of its own (about 210 for each new
    shape of an accumulate call in Pallas interpret mode) for as long as jax caches it, and the
    compile after the limit segfaults: the JAX random test at 100 times its examples did, at 65345
    maps after 263 examples (session 75). The CPU suite peaks at about 27500 in one process today.
    jax.clear_caches() gives the maps back; a later call of a cleared shape compiles again."""
    jax = sys.modules.get("jax")
    if jax is None or memory_maps() < memory_maps_limit() // 2:
        return False
    jax.clear_caches()
    gc.collect()
    return True
