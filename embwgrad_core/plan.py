"""Which path PyTorch takes, key packing, and the sort / run / partial plan as plain arrays.

The plan is what every implementation computes before it touches a gradient row:

* the tokens sorted stably by id (``sorted_keys``, ``sorted_pos``): a token's *key* is its id,
  or -1 for a token that adds nothing (its id is ``padding_idx`` or lies outside [0, V));
* *runs*: the sorted slots of one key (``run_start``, ``run_end`` for every slot);
* *partials*: pieces of a run summed in fp32 before the run's fold. On the sort path a
  partial is NROWS consecutive slots counted from the run's start; on the feature path it is
  the run's tokens inside one CHUNK of positions. ``partial_ord`` is a slot's partial's
  ordinal k within its run;
* *long runs*: runs of more than one partial, whose partials are written to a scratch buffer
  at ``partial_row(run_start, k)`` and folded in order by a second kernel.

Kernel stages in both frontends are tested against these arrays.
"""

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .constants import CHUNK, FEATURE, FEATURE_PATH_MAX_TOKENS, MASKED_LOOKUP_ID, MASKED_MERGE_SORT_MAX_TOKENS, MASKED_PARTIAL_PROGRAMS_PER_SM, MERGE_MAX_BLOCKS, MERGE_MIN_BLOCK, MERGE_SORT_MAX_TOKENS, NROWS, ROWS_AHEAD_ELEMENTS, SORT


def torch_path(num_tokens: int) -> str:
    """The path PyTorch's CUDA embedding backward takes for this many tokens: FEATURE or SORT."""
    return FEATURE if num_tokens <= FEATURE_PATH_MAX_TOKENS else SORT


def merge_sorted(num_tokens: int, masked: bool = False) -> bool:
    """Whether the sort path of num_tokens tokens sorts with the frontends' merge-rank kernels
    (else with the framework's radix sort); masked: accumulate's masked is given, so the masked
    route sorts only the tokens it keeps (MASKED_MERGE_SORT_MAX_TOKENS). Any stable sort gives
    the same bits: this chooses speed only."""
    return num_tokens <= (MASKED_MERGE_SORT_MAX_TOKENS if masked else MERGE_SORT_MAX_TOKENS)


def sanitize_ids(ids, num_embeddings: int, padding_idx: int = -1) -> np.ndarray:
    """int64 keys: the id, or -1 where the token adds nothing (id == padding_idx or outside [0, V))."""
    ids = np.asarray(ids).reshape(-1).astype(np.int64)
    keep = (ids >= 0) & (ids < num_embeddings) & (ids != padding_idx)
    return np.where(keep, ids, -1)


@dataclass(frozen=True)
class KeyPacking:
    """A key and a position in one unsigned integer: ``(key + 1) << pos_bits | pos``.

    Sorting packed integers sorts by key, then by position: the stable sort a plan needs.
    """

    id_bits: int  #: bits for key + 1 in [0, V]
    pos_bits: int  #: bits for a position in [0, n)

    @property
    def total_bits(self) -> int:
        return self.id_bits + self.pos_bits

    @property
    def dtype(self) -> str | None:
        """"uint32" or "uint64", the narrowest that holds a packed key; None if none does."""
        if self.total_bits <= 32:
            return "uint32"
        if self.total_bits <= 64:
            return "uint64"
        return None


def key_packing(num_tokens: int, num_embeddings: int) -> KeyPacking:
    """How many bits a packed key needs for n tokens of a V-row vocabulary."""
    return KeyPacking(id_bits=int(num_embeddings).bit_length(), pos_bits=max(int(num_tokens) - 1, 0).bit_length())


def pack_keys(keys: np.ndarray, packing: KeyPacking) -> np.ndarray:
    """Pack sanitized keys (position = index) into unsigned integers of ``packing.dtype``."""
    keys = np.asarray(keys, dtype=np.int64)
    pos = np.arange(keys.size, dtype=np.uint64)
    return (((keys + 1).astype(np.uint64) << np.uint64(packing.pos_bits)) | pos).astype(packing.dtype)


def unpack_keys(packed: np.ndarray, packing: KeyPacking) -> tuple[np.ndarray, np.ndarray]:
    """(keys, positions) of packed keys, as int64."""
    packed = np.asarray(packed).astype(np.uint64)
    pos = packed & np.uint64((1 << packing.pos_bits) - 1)
    keys = (packed >> np.uint64(packing.pos_bits)).astype(np.int64) - 1
    return keys, pos.astype(np.int64)


def merge_block(num_tokens: int, max_blocks: int = MERGE_MAX_BLOCKS) -> int:
    """Tokens per block of the merge-rank sort: a power of two >= MERGE_MIN_BLOCK, at most max_blocks blocks."""
    block = MERGE_MIN_BLOCK
    while block * max_blocks < num_tokens:
        block *= 2
    return block


def rows_ahead(positions: int, hidden: int) -> int:
    """How many of the first positions have their rows read into L2 ahead: `positions`, or fewer so
    that positions x hidden stays within ROWS_AHEAD_ELEMENTS (so unchanged up to H = 7168)."""
    return min(positions, ROWS_AHEAD_ELEMENTS // max(hidden, 1))


def masked_partial_programs_per_sm(num_tokens: int) -> int:
    """The masked route's most partials programs per SM for n tokens (MASKED_PARTIAL_PROGRAMS_PER_SM):
    both frontends run at most this many, fewer where n's own setting is lower."""
    for bound, programs in MASKED_PARTIAL_PROGRAMS_PER_SM:
        if num_tokens <= bound:
            return programs
    raise ValueError(f"num_tokens={num_tokens} is above the masked route's {MASKED_MERGE_SORT_MAX_TOKENS} tokens")


class MergeTiles(NamedTuple):
    """GPU tiles of the merge-rank kernels, shared by both frontends (measured: benchmarks/NOTES.md)."""

    block_i: int  # tokens of a block that one block-sort program ranks
    tile: int  # tokens of the block it compares them with per step
    lanes: int  # [tokens, blocks] lanes of one merge-rank program


def merge_tiles(block: int) -> MergeTiles:
    """The merge kernels' GPU tiles for blocks of ``block`` tokens.

    Blocks of 256 (n <= 16384): 16 tokens against the whole block in one step, 40 registers
    (H200, 8192 tokens: 13.2 us against 14.1 for 64 x 32). Larger blocks: 64 x 32 steps, since
    a [64, 512] step would spill and 16 x 256 measured slower at 32768 tokens (41 us against 39).
    """
    if block <= 256:
        return MergeTiles(block_i=min(16, block), tile=block, lanes=1024)
    return MergeTiles(block_i=64, tile=32, lanes=1024)


def merge_ranks(keys, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(slot, run_start, run_end) of every token: the stable sort by key as the frontends' kernels compute it.

    1. Cut the tokens into blocks of ``block`` consecutive positions and sort each block
       stably by counting: a token's local rank is the number of tokens of its block with a
       smaller key, or an equal key at an earlier position.
    2. In every other block, binary-search the token's key in the sorted block: blocks
       before its own add the keys <= it (equal keys there come earlier), blocks after add
       the keys < it. With its local rank that is its slot in the stable sort.
    3. Its run starts at the number of keys < it over all blocks, and ends (exclusive) at the
       number of keys <= it: both are sums of the searches of step 2.

    About n * block comparisons and 2 * n * (n / block) * log2(block) probes, instead of the
    n^2 comparisons of ranking against every token.
    """
    keys = np.asarray(keys, dtype=np.int64).reshape(-1)
    n = keys.size
    slot = np.empty(n, np.int64)
    run_start = np.zeros(n, np.int64)
    run_end = np.zeros(n, np.int64)
    starts = range(0, n, block)
    sorted_blocks = [np.sort(keys[b : b + block], kind="stable") for b in starts]
    for own, b in enumerate(starts):
        mine = keys[b : b + block]
        local = np.argsort(np.argsort(mine, kind="stable"), kind="stable")
        slot[b : b + block] = local
        for other, sorted_block in enumerate(sorted_blocks):
            lower = np.searchsorted(sorted_block, mine, side="left")
            upper = np.searchsorted(sorted_block, mine, side="right")
            run_start[b : b + block] += lower
            run_end[b : b + block] += upper
            if other < own:
                slot[b : b + block] += upper
            elif other > own:
                slot[b : b + block] += lower
    return slot, run_start, run_end


def partial_row(run_start, k, path: str):
    """Row of the partial-sum scratch buffer that holds partial k of the run starting at slot run_start.

    Only runs of more than one partial use the buffer. Feature path: ``run_start + k`` (a run
    has no more partials than slots). Sort path: with s = run_start + NROWS * k, row
    ``2 * (s // NROWS) + (k == 0)``: a long run has at least NROWS + 1 slots, so at most one
    run's first partial and one other run's later partial start in any NROWS slots, and the
    buffer needs only ``partial_buffer_rows`` = 2 * ceil(n / NROWS) rows.

    Plain integer arithmetic, so it takes Python ints, NumPy arrays and traced JAX scalars
    alike (the JAX kernels call it; Triton kernels cannot call Python and spell it out).
    """
    if path == FEATURE:
        return run_start + k
    return 2 * ((run_start + NROWS * k) // NROWS) + (k == 0)


def partial_buffer_rows(num_tokens: int, path: str) -> int:
    """Rows of the partial-sum scratch buffer (each H fp32 values)."""
    return num_tokens if path == FEATURE else 2 * (-(-num_tokens // NROWS))


@dataclass(frozen=True)
class Plan:
    """The sort / run / partial plan of one call (module docstring). Arrays are int64."""

    path: str
    num_tokens: int
    # One entry per sorted slot.
    sorted_keys: np.ndarray
    sorted_pos: np.ndarray
    run_start: np.ndarray
    run_end: np.ndarray
    partial_start: np.ndarray  #: bool: the slot begins a partial
    partial_ord: np.ndarray  #: ordinal of the slot's partial within its run
    # One entry per partial, in slot order.
    partial_slot: np.ndarray
    partial_len: np.ndarray
    partial_run: np.ndarray  #: index of the partial's run
    # One entry per run, in slot order.
    run_slot: np.ndarray
    run_len: np.ndarray
    run_key: np.ndarray
    run_partials: np.ndarray  #: number of partials
    run_first_partial: np.ndarray  #: index of the run's first partial

    @property
    def long_runs(self) -> np.ndarray:
        """[(run_start, num_partials)] of the runs of more than one partial that add to main_grad."""
        keep = (self.run_partials > 1) & (self.run_key >= 0)
        return np.stack([self.run_slot[keep], self.run_partials[keep]], axis=1)

    @property
    def partial_rows(self) -> np.ndarray:
        """Scratch-buffer row of every partial (meaningful for partials of long runs)."""
        k = self.partial_ord[self.partial_slot]
        return partial_row(self.run_start[self.partial_slot], k, self.path)


def make_plan(ids, num_embeddings: int, *, padding_idx: int = -1, path: str | None = None) -> Plan:
    """The plan for ids (any shape, flattened in row-major order) into a V-row vocabulary.

    path defaults to PyTorch's choice for this many tokens; tests pass the other to exercise
    both arithmetics at any size.
    """
    keys = sanitize_ids(ids, num_embeddings, padding_idx)
    n = keys.size
    path = torch_path(n) if path is None else path
    if path not in (FEATURE, SORT):
        raise ValueError(f"path={path!r} must be {FEATURE!r} or {SORT!r}")
    order = np.argsort(keys, kind="stable")
    sorted_keys, sorted_pos = keys[order], order.astype(np.int64)
    new_run, run_start = _runs(sorted_keys)
    if path == SORT:
        partial_start = (np.arange(n) - run_start) % NROWS == 0
    else:
        chunk = sorted_pos // CHUNK
        partial_start = new_run.copy()
        partial_start[1:] |= chunk[1:] != chunk[:-1]
    return _plan_arrays(path, sorted_keys, sorted_pos, new_run, run_start, partial_start)


def _runs(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(new_run, run_start) of every slot: whether it starts a run, and the slot its run starts at."""
    n = sorted_keys.size
    new_run = np.ones(n, dtype=bool)
    new_run[1:] = sorted_keys[1:] != sorted_keys[:-1]
    return new_run, np.flatnonzero(new_run)[np.cumsum(new_run) - 1].astype(np.int64)


def _plan_arrays(path, sorted_keys, sorted_pos, new_run, run_start, partial_start) -> Plan:
    """The Plan of sorted slots, given where runs and partials start."""
    n = sorted_keys.size
    slots = np.arange(n, dtype=np.int64)
    run_slot = slots[new_run]
    run_index = np.cumsum(new_run) - 1
    run_len = np.diff(np.append(run_slot, n))
    run_end = run_start + run_len[run_index]
    partial_index = np.cumsum(partial_start) - 1
    partial_slot = slots[partial_start]
    run_first_partial = partial_index[run_slot] if n else np.zeros(0, np.int64)
    partial_ord = partial_index - run_first_partial[run_index]
    run_partials = np.diff(np.append(run_first_partial, partial_slot.size))

    return Plan(
        path=path,
        num_tokens=n,
        sorted_keys=sorted_keys,
        sorted_pos=sorted_pos,
        run_start=run_start,
        run_end=run_end,
        partial_start=partial_start,
        partial_ord=partial_ord,
        partial_slot=partial_slot,
        partial_len=np.diff(np.append(partial_slot, n)),
        partial_run=run_index[partial_slot],
        run_slot=run_slot,
        run_len=run_len,
        run_key=sorted_keys[run_slot],
        run_partials=run_partials,
        run_first_partial=run_first_partial,
    )


def make_masked_plan(ids, num_embeddings: int, masked, *, padding_idx: int = -1) -> Plan:
    """The sort path's plan with Megatron's input_mask, over the tokens that can matter only.

    On a rank of TP = 8 about 7/8 of the tokens are masked, all looked up as MASKED_LOOKUP_ID,
    and add +0. They still count in that id's run: a real token's partial is its rank among
    *all* the run's tokens, masked or not, divided by NROWS. But those tokens all carry one id,
    so a real token's rank there is its rank among the run's unmasked tokens plus the number of
    masked tokens of that id before it: a prefix count over positions, no sort. So the masked
    tokens of MASKED_LOOKUP_ID are left out (all but the first, which keeps the run, and with
    it the dense path's add of +0 to that row, where every token of the id is masked), and the
    plan is made over the m tokens left, stably sorted by id as make_plan does. Masked tokens of
    other ids stay, as zero rows; so do all tokens when padding_idx is MASKED_LOOKUP_ID (their key
    is then -1: they add nothing, and the plan is make_plan's on the sort path).

    The slots are those m tokens (``num_tokens`` = m; ``sorted_pos`` are positions in ids). In
    the run of MASKED_LOOKUP_ID a partial starts where rank // NROWS changes, so a partial may
    hold fewer than NROWS slots anywhere in the run, and partials of masked tokens only are
    not there at all: they are +0, and a run's fold starts at +0 and is never -0, so leaving
    them out changes no bit. ``partial_ord`` counts the partials that are there; the other runs
    are as in make_plan. partial_row's scratch layout does not hold for that run (its partials
    may start fewer than NROWS slots apart): kernels on this plan need a layout of their own.
    With grad's masked rows taken as +0, reference.partial_sums and
    reference.fold_runs on this plan give reference.weight_grad_rows' bits on the sort path
    (tests/test_core.py), reading no row of a left-out token. A measured bound for kernels on
    this plan (benchmarks/NOTES.md v55): the call on the shard's own tokens alone takes 43-55% less
    time than masked at 4096-65536 tokens, TP = 8 (H200).
    """
    kept, kept_keys, before = masked_compaction(ids, num_embeddings, masked, padding_idx=padding_idx)
    order = np.argsort(kept_keys, kind="stable")
    sorted_keys, sorted_pos, lead = kept_keys[order], kept[order], before[order]
    new_run, run_start = _runs(sorted_keys)
    rank = np.arange(sorted_keys.size) - run_start + np.where(sorted_keys == MASKED_LOOKUP_ID, lead, 0)
    partial_start = new_run.copy()
    partial_start[1:] |= rank[1:] // NROWS != rank[:-1] // NROWS
    return _plan_arrays(SORT, sorted_keys, sorted_pos, new_run, run_start, partial_start)


def masked_compaction(ids, num_embeddings: int, masked, *, padding_idx: int = -1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """make_masked_plan's first step: (kept positions ascending, their keys, left-out tokens before each), int64.

    One prefix count over positions gives all three. With L the masked tokens of key
    MASKED_LOOKUP_ID and E[t] the number of them before position t, the first of them is kept
    (E == 0) and the others are left out, so a kept token t has max(E[t] - 1, 0) left-out tokens
    before it and lands at index t - max(E[t] - 1, 0) of the kept list (a kernel's output slot).
    """
    keys = sanitize_ids(ids, num_embeddings, padding_idx)
    masked = np.asarray(masked, dtype=bool).reshape(-1)
    marked = masked & (keys == MASKED_LOOKUP_ID)
    before_all = np.cumsum(marked) - marked  # E: such tokens before each position
    left_out = marked & (before_all > 0)
    kept = np.flatnonzero(~left_out).astype(np.int64)
    return kept, keys[kept], np.maximum(before_all[kept] - 1, 0)


def masked_split(ids, num_embeddings: int, masked, *, padding_idx: int = -1) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What the frontends' masked route computes before its plan (torch _compact_stage, JAX _compact), int64:
    (positions of the tokens not of key MASKED_LOOKUP_ID, ascending; their keys; positions of that key's
    unmasked tokens, ascending; each one's rank among all of that key's tokens, masked or not).

    make_masked_plan's arithmetic with the whole row apart: the plan sorts only the first two, and row
    MASKED_LOOKUP_ID is summed from the last two (partial = rank // NROWS), so a kernel needs no
    plan for it. Two prefix counts over positions give all four: a kept token t lands at slot
    t - (row tokens before t).
    """
    keys = sanitize_ids(ids, num_embeddings, padding_idx)
    masked = np.asarray(masked, dtype=bool).reshape(-1)
    at_row = keys == MASKED_LOOKUP_ID
    kept = np.flatnonzero(~at_row).astype(np.int64)
    real = np.flatnonzero(at_row & ~masked).astype(np.int64)
    return kept, keys[kept], real, (np.cumsum(at_row) - at_row)[real]
