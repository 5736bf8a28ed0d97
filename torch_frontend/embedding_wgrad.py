"""main_grad += embedding_dense_backward(grad, ids) in Triton, with PyTorch CUDA's bits.

Design (SPEC.md; embwgrad_core.plan names the pieces). Three or four launches, no host
synchronisation:

1. Sort the tokens by key, stably. Sort path, up to MERGE_SORT_MAX_TOKENS:
   ``_block_sort_kernel`` sorts blocks of merge_block(n) tokens by counting, then
   ``_merge_rank_kernel`` ranks every token in each other block by binary search and writes
   the sorted keys, positions, run starts and run ends (embwgrad_core.merge_ranks is the model): 13 us
   for 8192 tokens on the H200, against 71 us for torch.sort's route. Above it, torch.sort; with
   accumulate's masked up to MASKED_MERGE_SORT_MAX_TOKENS the merge sort still, of the tokens
   the masked route keeps (embwgrad_core.merge_sorted; _compact_stage).
   Feature path (n <= 3072): ``_rank_kernel`` ranks each token by counting the tokens that
   sort before it, which also gives every token its chunk's ordinal within its run and, from
   the tokens of its key before it and in all, its run's start and end: the whole plan.
2. (torch.sort) ``_runs_kernel`` finds every slot's run start and end by binary search. On
   the sort path the kernel that knows a slot's run (merge or runs) also publishes the
   partials: a record for each slot that starts one (slot, key, position, run start, run end),
   long runs' partials at the front of the list and the others at its back, and an entry in
   the long-run list for each run of more than one partial, with its arrival counter zeroed
   (_append_records). Merge sort: the records of the first FIRST_TOKENS
   positions come first in each list, in order (a group of merge programs places them by a
   single-pass scan, _ordered_bases).
   Merge sort above 4096 tokens (LONE_TOKENS): a token whose id occurs once needs no plan. The
   block sort zeroes an int32 [V] array at its tokens' ids, counting programs after the merge's
   count every id (_count_ids), the merge publishes no record for the lone tokens of the first
   positions, and the partials kernel's first programs add those (_lone_tokens).
3. ``_partials_kernel`` sums each partial's rows in fp32, in order, over one H block per
   item. Sort path: a fixed grid strides the records, long runs' partials first, so no
   program is spent on a slot that starts none, and its last programs take one item each; each
   program asks L1 for its next item's record before the current item's rows (RECORD_HINT);
   with PDL its programs first prefetch the first positions' rows into L2 (a hint, while the
   plan is still being made; main_grad's lines with priority evict_last, PREFETCH_EVICT_LAST),
   then wait; feature path: one program per (slot, H block).
   A run of one partial is finished there (rounded and added into main_grad); a longer run's
   partials go to a scratch buffer (sort path: each counts itself in its run's arrival counter;
   feature path: the run's last partial lists the run). A partial of one row (most of them when
   ids spread over a large vocabulary) is a plain copy-add. Sort path up to
   FOLDERS_MAX_TOKENS: a few of the kernel's programs, those that start right after the
   programs of the long runs' partials, fold the long runs as their partials arrive
   (_fold_runs), and there is no fourth launch.
4. Otherwise ``_long_runs_kernel`` folds each listed run's partials in order, rounds, adds to
   main_grad. Sort path with PDL: its programs start while the partials kernel drains; those
   without a run exit at once, the others wait on their run's arrival counter.
5. With accumulate's zero_rows (sort path): partials of more than one row in runs of at least
   ZERO_SKIP_MIN_PARTIALS partials flag whether they are nonzero per H block and, where not,
   store nothing; the folds skip them (_fold). Exact, since a sum from +0 is never -0.
6. With accumulate's masked (implies zero_rows): masked tokens keep their places in runs,
   partials and chunks, so the sums' order is the dense path's; every load of a grad row is
   predicated on the token's mask byte (_read_h), so a masked row is taken as +0 and never read,
   the L2 prefetch included. Sort path: the plan defers the records of runs with flags, and
   ``_masked_records_kernel`` (after the plan) publishes those of partials with a token not
   masked; a partial of masked tokens only gets no item at all, only 0 flags and its arrivals
   (Megatron's row 0 at TP = 8: thousands of such partials).

No atomics touch floating-point data: every sum's order is PyTorch's. The atomics count
integers (records, the long-run list, arrivals), whose order changes no bit. Rounding to bf16
is done with integer operations, because Triton's interpreter truncates fp32 -> bf16.

On Hopper and later every launch uses programmatic dependent launch (_pdl_enter): the next
kernel's programs start while the previous one drains, and wait on the device for its writes.
Waiting on an arrival counter cannot deadlock: the long-run kernel's programs launch only once
every partials program has started (each lets them launch after its own wait), and the folding
programs inside the partials kernel are a few per SM, waiting on programs that never wait.

The plan lives in one int32 workspace; kernels find its arrays at multiples of n (_KEYS ...).
A later call of the same shapes, dtypes and alignments replays the first one's launches
(_Replay: the same compiled kernels and arguments, its own tensors in their places), without
Triton's generic launch (15-40 us of host time per kernel) or the stages' Python.
"""

import contextlib
from dataclasses import dataclass
from functools import lru_cache

import torch
import triton
import triton.language as tl
from torch.autograd.graph import increment_version
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.runtime import driver
from triton.runtime.interpreter import InterpretedFunction

from embwgrad_core import BF16_SCRATCH_MIN_TOKENS, CHUNK, COMPACT_BLOCK, FEATURE, FOLD_PROGRAMS_PER_SM, FOLD_ROLE_MAX_TOKENS, MASKED_LOOKUP_ID, MERGE_SORT_MAX_TOKENS, NROWS, PARTIAL_PROGRAMS_PER_SM, ROW0_BLOCK_H, ZERO_SKIP_BLOCK, ZERO_SKIP_MIN_PARTIALS, ZERO_SKIP_WIDE, masked_partial_programs_per_sm, merge_block, merge_sorted, merge_tiles, partial_buffer_rows, rows_ahead, torch_path
from embwgrad_core import reference as core_reference
from embwgrad_core.dtypes import ROUNDING_CODE
from embwgrad_core.validate import Problem, check_args, check_masked, type_name

#: Merge sort up to MERGE_WINDOW_MAX_TOKENS: the merge compares each token with the last key of
#: every MERGE_WINDOW-key window of each block first, then searches the one window left. H200,
#: graph replay, plain searches -> windows of 16 (NOTES v11): 4096 uniform 88.5 -> 87.4 us, 8192
#: uniform 159.0 -> 158.2, 8192 Zipf 97.2 -> 96.0; but 16384 uniform 303.2 -> 305.4 and 32768
#: uniform 579.1 -> 591.7 (more blocks, so more samples per token). Windows of 8 were slower
#: everywhere, of 32 between the two. The JAX twin gained nothing from them and has none.
MERGE_WINDOW = 16
MERGE_WINDOW_MAX_TOKENS = 8192

#: Merge sort up to SMALL_MERGE_LANES_MAX_TOKENS: SMALL_MERGE_LANES [tokens, blocks] lanes per merge
#: program (merge_tiles' 1024 above), so four times the programs. The merge is bound by its
#: instructions per warp (Nsight Compute at 4096 uniform ids: 2.5 k per warp, one warp per
#: scheduler on 64 SMs). H200, graph replay (NOTES v12): 4096 uniform 87.3 -> 85.7 us, 4096 Zipf
#: 61.6 -> 61.3; but 8192 uniform 157.2 -> 158.5 and 16384 uniform 304.3 -> 314.8, where the
#: 1024-lane programs already fill the SMs. The JAX twin's bound is 8192 (its own constants).
SMALL_MERGE_LANES = 256
SMALL_MERGE_LANES_MAX_TOKENS = 4096

#: Sort path: partials programs per SM for n up to each bound, PARTIAL_PROGRAMS_PER_SM above.
#: Each program pays a header and a record round trip before its first rows, and with few
#: records (repeated ids, small n) many programs find no item at all. H200, graph replay (NOTES
#: v12), 128 -> 96 -> 64 per SM: 4096 uniform 87.3 / 87.4 / 87.2, 4096 Zipf 61.6 / 58.2 / 56.1;
#: 8192 uniform 157.2 / 157.2 / 160.3, 8192 Zipf 94.5 / 92.6 / 91.3; 16384 uniform 304.3 / 305.6 /
#: 314.4, 16384 Zipf 179.5 / 178.2 / 179.5.
SMALL_PARTIAL_PROGRAMS_PER_SM = ((4096, 64), (8192, 96))

#: Merge sort: the records of the first positions (whole merge blocks) come first, and with PDL
#: their rows are prefetched into L2 while the plan is made. 256 measured 1-2 us faster at 4096
#: and 8192 uniform ids than none; 512 and more, less (NOTES v10). XLA launches the JAX twin's
#: kernels without that overlap, so its merge kernel reads those rows instead (ROWS_AHEAD there).
#: Above H = 7168 fewer positions' rows are prefetched (embwgrad_core.ROWS_AHEAD_ELEMENTS, NOTES v42).
FIRST_TOKENS = 256

#: Those prefetched lines' L2 priority, as a bit mask: 1 grad's, 2 main_grad's, with priority
#: evict_last (createpolicy), so that they stay in L2 until their items read them, whatever
#: streams through it first (do_bench's flush leaves L2 full of dirty lines); an item's own
#: loads and stores of the rows, with the default priority, then make them ordinary lines again.
#: H200, graph replay, two calls (NOTES v41), us, none -> main_grad's -> both: 4096 uniform
#: 85.7 -> 83.8 -> 83.4-84.0, 8192 uniform 155.3 -> 152.6 -> 152.7-152.8, 8192 Zipf 89.9-90.1 ->
#: 90.1 -> 90.5-90.7, 4096 Zipf 53.9-54.0 -> 53.4 -> 53.6-53.8, 16384 Zipf 173.6-173.8 -> 173.7
#: -> 173.9-174.0; grad's alone 85.4 / 154.6 / 90.3. So main_grad's: the uniform gain without the
#: Zipf loss. 128 or 384 prefetched positions instead of 256 measured less good (NOTES v41).
PREFETCH_EVICT_LAST = 2

#: The long runs' partials are stored with L2 priority evict_last, so that more of them are
#: still in L2 when they are folded (both paths; measured on the sort path, where it matters:
#: the feature path's scratch is small). H200, graph replay (NOTES v11): 8192 Zipf 95.4 ->
#: 93.7 us, 16384 Zipf 182.9 -> 179.8, 32768 Zipf 342.3 -> 339.6; uniform ids unchanged (no long
#: runs); 94.3 / 180.7 / 340.4 against 95.9 / 183.9 / 343.1 in a second call. Dropping them from
#: L2 once folded (discard.global.L2) measured slower. The JAX twin measured mixed (+0.3, +2.3,
#: -4.4 us at the same points), so it stores them plainly.
SCRATCH_EVICT_LAST = True

#: Merge sort: the merge stores the plan's sorted positions and records, and the partials kernel
#: loads a partial's other positions, with L2 priority evict_last (0.3 MB at 8192 tokens), so that
#: the rows streaming through L2 do not push them out before the items that read them. H200,
#: graph replay, two calls with the variant twice in each (NOTES v40), us, off -> on: 4096
#: uniform 85.8-86.1 -> 85.2-85.4, 4096 Zipf 54.1 -> 53.3-53.4, 8192 uniform 155.6-155.9 ->
#: 155.1-155.4, 8192 Zipf 89.7-90.4 -> 89.1-90.0, 32768 uniform 569.9-571.1 -> 568.9-569.6;
#: 16384 and 32768 Zipf even. The records' loads keep the default policy: with it too the call
#: measured no faster on the H200 (Triton 3.6), and offline Triton 3.9 then spills at the
#: register target (17 spill instructions); the block-sorted keys kept in L2 the same way
#: measured even or slower.
PLAN_EVICT_LAST = True

#: Sort path: the partials kernel loads the next item's record after the current item's rows,
#: rather than before them (NOTES v12).
RECORD_HINT = True

#: ... having asked it into L1 (prefetch.global.L1) before the rows. With ptxas' own 139
#: registers that hint kept each item from waiting for the record's round trip (NOTES v12); with
#: the register target of 168 (PARTIAL_MAXNREG) it costs time instead. H200, graph replay, three
#: calls (NOTES v20 item 10), hint / none: 4096 Zipf 55.0-55.2 / 54.3-54.4 us, 8192 Zipf
#: 91.1-91.4 / 90.1-90.4, 32768 Zipf 334.0-336.8 / 333.5-334.2, 32768 uniform 576.9-577.0 /
#: 576.4-576.5; 4096 and 8192 uniform within 0.5, 16384 Zipf within 0.2.
RECORD_L1_HINT = False

#: Merge sort: a token whose id occurs once in the call (most tokens, for ids spread over a large
#: vocabulary) needs no plan. The merge kernel's last programs count every id (integer atomics
#: into an int32 [V] array that the block sort zeroed at the tokens' ids: no memset), and the
#: partials kernel's first programs, LONE_PER_PROGRAM positions each, add the lone tokens of
#: positions [0, lone_tokens) while the merge still runs (PDL); the merge publishes no record
#: for them. (n bound, lone_tokens): n up to the bound gets that many, above the last none.
#: H200, graph replay (NOTES v13), none / 2048: 8192 uniform 157.4 / 155.7 us, 16384 uniform
#: 305.2 / 302.5, 32768 uniform 581.2 / 576.4, 8192 Zipf 92.7 / 92.2; but at 4096 tokens any
#: amount was slower (uniform 85.7 against 86.7-89.2, Zipf 55.3 against 56.6-58.7): there the
#: merge is short and the counting delays the partials kernel's launch. Under the interpreter
#: half the positions, so that CPU tests cover both ways a lone token is added.
LONE_TOKENS = ((4096, 0), (MERGE_SORT_MAX_TOKENS, 2048))
LONE_PER_PROGRAM = 2

#: Merge sort with lone tokens: the counting programs add one atomic per group of equal keys
#: (_count_ids: the group's last token adds b + 1, its first -a), not one per token. Atomics on
#: one address are serialised, so an id of many tokens cost the plan 1-2 ns a token; Megatron's
#: vocab-parallel lookup on a rank of TP = 8 sends about 7/8 of the tokens to row 0
#: (benchmarks/probe_tp.py). H200, graph replay, one process (NOTES v27), per token / per group:
#: 8192 TP8 111.8 / 107.9 us, 16384 TP8 179.4 / 170.1, 32768 TP8 355.7 / 334.8, 16384 Zipf 178.8 /
#: 175.7, 32768 Zipf 330.6 / 325.3; 4096 and 8192 uniform, 8192 Zipf and 32768 uniform within
#: 0.2. (A first form, one atomic per group by its last token after a max-scan for its first,
#: cost 8192 uniform 1.2 us: the counting programs delay the partials kernel's launch.)
COUNT_AGGREGATE = True

#: Sort path: _long_runs_kernel's sums pipelined through shared memory (_fold_piped): (stages,
#: partials per stage). A long run's fold is one chain of adds in partial order; _fold waits for
#: each batch of loads before it asks for the next. H200, graph replay, one process (NOTES v27),
#: _fold with 32 a batch / (4, 8): 16384 TP8 202.2 / 170.1 us, 32768 TP8 405.0 / 334.8, 32768 Zipf
#: 328.5 / 325.3; 16384 Zipf and every uniform point within 0.2. (4, 16) lost 9 us at 16384 Zipf.
#: The partials kernel's own folders (n <= FOLD_ROLE_MAX_TOKENS) stay unpipelined: their shared
#: memory would be every program's, and the call lost 2.5-5.6 us at 8192 Zipf (fold_stages).
LONG_FOLD = (4, 8)

#: Sort path: up to this many tokens the partials kernel's own programs fold the long runs
#: (FOLD_PROGRAMS_PER_SM per SM, _fold_runs); above, _long_runs_kernel does. Torch's own bound,
#: twice the core's FOLD_ROLE_MAX_TOKENS, which the JAX frontend keeps (its partials grid and warps
#: change there too). H200, graph replay, one process (NOTES v47 item 6), long-run kernel / folders:
#: 12288 Zipf 137.3 / 127.5 us, 16384 Zipf 174.0 / 162.1, 16384 uniform 296.9 / 295.3, Megatron TP8
#: ids at 12288 / 16384 tokens 90.0 / 88.6 and 108.2 / 101.9, TP2 at 16384 140.0 / 139.0; but 24576
#: Zipf 246.5 / 249.5 and 32768 Zipf 343 / 391 (v8): there the folders fall behind the many long runs.
FOLDERS_MAX_TOKENS = 2 * FOLD_ROLE_MAX_TOKENS

#: A long run's partials past its last full batch are folded FOLD_TAIL at a time (_fold).
FOLD_TAIL = tl.constexpr(4)

#: Slots per _masked_records_kernel program (accumulate's masked): each loads the positions and mask
#: bytes of its partials' slots at once, [MASKED_RECORDS_BLOCK, 16] lanes.
MASKED_RECORDS_BLOCK = 256

#: Sort path: partials programs per SM, the last to start, that take one item each: 0.3-0.9 us
#: off against none at 8192 uniform ids (12 to 36 measured alike; NOTES v10).
TAIL_PROGRAMS_PER_SM = 24

#: Sort path: ptxas' register target for the partials kernel (its maxnreg). Left to itself,
#: ptxas gave it 139-141 registers under Triton 3.6 (14 one-warp programs per SM) while the
#: record's L1 hint was on, and gives it 184 under Triton 3.6 and 186 under Triton 3.9 without it
#: (11 per SM). At 168, the most with which 12 programs fit an SM, neither spills, and ptxas keeps
#: more of a ten-row partial's positions and rows in flight than at 139. H200, Triton 3.6, graph
#: replay, two calls (NOTES v20), 139 registers / 168: 8192 Zipf 92.2-92.5 / 90.8-91.3 us, 16384
#: Zipf 179.8-181.0 / 178.6-179.5, 32768 Zipf 336.9-339.6 / 334.4-334.9, 131072 Zipf 1094 / 1079;
#: uniform ids within 0.4 us (4096: 85.9-86.2 / 86.3). Targets of 184-204 registers (9-11
#: programs per SM) measured 5-10% slower everywhere, and ptxas' own 184 today 4096 uniform 91.8
#: against 85.8, 8192 Zipf 108.5 against 90.0 (NOTES v21 item 3); below 168 ptxas spills.
PARTIAL_MAXNREG = 168

#: (BLOCK_I, BLOCK_J) of _rank_kernel (feature path) on a GPU, multiples of CHUNK: one chunk of
#: tokens per program (32 programs for 1024 tokens), 8 chunks compared per step (4 steps).
RANK_TILES = (CHUNK, 8 * CHUNK)
#: The same under TRITON_INTERPRET=1, where each program step is a NumPy call: large tiles
#: keep it fast. Tests also run the interpreter with RANK_TILES.
INTERPRET_RANK_TILES = (8 * CHUNK, 8 * CHUNK)
#: Warps of each _rank_kernel program. The kernel has few programs (n / CHUNK: 96 at 3072
#: tokens, a seventh of a wave), so each program's issue rate bounds it: 16 warps against 4
#: took 8.6 us off a call at 3072 Zipf, 5.7 at 2048 Zipf, 2.3 at 1024 uniform (8 warps within
#: 0.6 us of 16; NOTES v18 item 1).
RANK_WARPS = 16

_INT32_MAX = tl.constexpr(2**31 - 1)
#: _rank_kernel packs two counts of one chunk's compares into an int32: a * _PACK + b, b <= CHUNK.
_PACK = tl.constexpr(64)
#: Feature path: rows of a partial loaded at once after its first (a partial has up to CHUNK).
_FEATURE_BATCH = tl.constexpr(4)

# The workspace: int32 arrays of n at these multiples of n, then the long-run counter and list.
_KEYS = tl.constexpr(0)  # keys in sorted order
_POS = tl.constexpr(1)  # positions in sorted order
_RUN_START = tl.constexpr(2)  # first slot of each slot's run
_AUX = tl.constexpr(3)  # feature path: partial_ord; merge sort: block-sorted keys
_AUX2 = tl.constexpr(4)  # merge sort: block-sorted positions
_RUN_END = tl.constexpr(5)  # one past the last slot of each slot's run
# Sort path: one record of _REC_FIELDS int32 for every slot that starts a partial, in no
# particular order (the plan's programs append theirs with one atomic each): slot, key,
# position, run start, run end. _partials_kernel's programs stride this list.
_REC = tl.constexpr(6)
_REC_FIELDS = tl.constexpr(8)  # five used; eight keep a record in one 32-byte sector
# Sort path: the records of long runs' partials (runs of more than one partial) count up from
# record 0, the others down from record n - 1, so that the partials kernel takes the long runs'
# partials first.
# From _LONG * n, _HEADER words: [0] long runs listed, and on the sort path [1] long runs'
# records, [2] the other records, [3] and [4] the group's (below), from [_STATUS0] the group's
# status words; then [2 * max_long_runs] (run start, partials) pairs (sort path: listed by the
# plan; feature path: by the partials kernel); then, sort path, one arrival counter per slot
# [n], zeroed by the plan where a long run starts; then, merge sort, the group's records.
# Merge sort: the first `group` merge programs (the tokens of the first blocks) place their
# records in program order in lists of their own (_group_records), counted at [3] (front)
# and [4] (back); the partials kernel takes them first in each list (_load_record).
_LONG = tl.constexpr(_REC.value + _REC_FIELDS.value)
_HEADER = tl.constexpr(64)
_STATUS0 = tl.constexpr(8)
_LONE_COUNTED = tl.constexpr(5)  # counting programs done (_count_ids; the partials kernel's lone programs wait for all)
_COUNT_BLOCK = tl.constexpr(1024)  # tokens a counting program counts per step; one counting program per this many tokens
_STATUS_READY = tl.constexpr(1 << 30)
_WORKSPACE_ARRAYS = _LONG.value
_MASKED_ID = tl.constexpr(MASKED_LOOKUP_ID)
_COMPACT_ARRAYS = tl.constexpr(4)  # the masked route's kept keys, kept positions, row-0 positions, their ranks (_compact_kernel)


# ----------------------------------------------------------------------------- kernels


@triton.jit
def _round(x, ROUNDING: tl.constexpr):
    """fp32 -> the dtype of code ROUNDING (0 fp32, 1 bf16, 2 fp16), round to nearest even, as fp32."""
    if ROUNDING == 1:
        bits = x.to(tl.uint32, bitcast=True)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        rounded = tl.where(x != x, ((bits | 0x400000) >> 16) << 16, rounded)  # NaN stays NaN
        return rounded.to(tl.float32, bitcast=True)
    elif ROUNDING == 2:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x


@triton.jit
def _kept_count(compact_ptr, n):
    """The masked route's m: the tokens _compact_kernel kept, the first word of its header after the arrays."""
    return tl.load(compact_ptr + _COMPACT_ARRAYS * n)


@triton.jit
def _to_scratch(acc, gw, partials_ptr):
    """What a long run's partial stores: acc (fp32), or, in an int16 buffer (feature path, bf16 grad), gw's bf16 bits.

    The feature path rounds every partial to grad's dtype before any use (_fold_step), so the
    rounded value (gw) is all the fold needs; a bf16 value's bits are the high half of its fp32
    bits (_round leaves the low half zero), so half the bytes hold it exactly, NaNs included.
    """
    if partials_ptr.dtype.element_ty == tl.int16:
        return (gw.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16).to(tl.int16, bitcast=True)
    else:
        return acc


@triton.jit
def _from_scratch(part):
    """A scratch value as fp32 (_to_scratch's inverse)."""
    if part.dtype == tl.int16:
        return (part.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return part


@triton.jit
def _add_to_row(row_ptr, cols, mask, gw, ROUNDING: tl.constexpr):
    """row = round(float(row) + gw): main_grad.add_ of one row block, one rounding."""
    old = tl.load(row_ptr + cols, mask=mask).to(tl.float32)
    new = _round(old + gw, ROUNDING)
    tl.store(row_ptr + cols, new.to(row_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _grad_row(pos, grad_dim1, grad_stride0, grad_stride1):
    """Offset of position pos's grad row: (pos // grad_dim1) * grad_stride0 + (pos % grad_dim1) * grad_stride1."""
    return (pos // grad_dim1).to(tl.int64) * grad_stride0 + (pos % grad_dim1).to(tl.int64) * grad_stride1


@triton.jit
def _read_h(masked_ptr, pos, take, hidden, MASKED: tl.constexpr):
    """Columns of position pos's grad row to read: hidden where taken (and, MASKED, not masked), else 0.

    A masked row is taken as +0 and never loaded: a sum that starts at +0 is never -0, so adding
    +0 (or -0) leaves its bits, and a feature-path chunk sum of +0 rows rounds to +0 as one of -0 rows.
    """
    if MASKED:
        return tl.where(take & (tl.load(masked_ptr + pos, mask=take, other=1) == 0), hidden, 0)
    return tl.where(take, hidden, 0)


@triton.jit
def _partial_row(run_start, k, FEATURE_PATH: tl.constexpr, SPAN: tl.constexpr):
    """Scratch-buffer row of partial k of the run that starts at slot run_start: embwgrad_core.partial_row."""
    if FEATURE_PATH:
        return run_start + k
    else:
        return 2 * ((run_start + SPAN * k) // SPAN) + (k == 0).to(tl.int32)


@triton.jit
def _flag(flags_ptr, n, hb, row, SPAN: tl.constexpr):
    """Sort path: the zero-skip flag of scratch row `row` in H block hb. The flags are [H blocks,
    partial_buffer_rows]: a fold reads one H block's flags of a run's partials, whose rows are two
    apart (_partial_row), so 8 bytes apart here (not 8 * H blocks: NOTES v54). The rows of an H
    block: 2 * cdiv(n, SPAN), embwgrad_core.partial_buffer_rows on the sort path (_flags allocates them)."""
    return flags_ptr + (2 * tl.cdiv(n, SPAN)).to(tl.int64) * hb + row


@triton.jit
def _pdl_enter(PDL: tl.constexpr):
    """Programmatic dependent launch (Hopper): let the next kernel's programs launch and wait
    on the device, then wait for the previous kernel to finish and its writes to show.

    A kernel launched with launch_pdl may start while the one before it drains; every kernel
    here calls this before it touches memory, so the overlap is the launch and the ramp, never data
    (but the partials kernel's lone programs: _lone_tokens says why they need not wait).
    """
    if PDL:
        gdc_launch_dependents()
        gdc_wait()


@triton.jit
def _load_keys(ids_ptr, idx, mask, num_embeddings, padding_idx):
    """int32 keys of ids[idx]: the id, or -1 for a token that adds nothing; INT32_MAX where not mask."""
    ids = tl.load(ids_ptr + idx, mask=mask, other=-1)
    keep = (ids >= 0) & (ids < num_embeddings) & (ids != padding_idx)
    return tl.where(mask, tl.where(keep, ids, -1).to(tl.int32), _INT32_MAX)


@triton.jit
def _listed(ws_ptr, n, e):
    """Entry e of the long-run list: (run start, partials) at the pointer and the next int32 (_LONG)."""
    return ws_ptr + _LONG * n + _HEADER + 2 * e


@triton.jit
def _arrivals(ws_ptr, n, max_long_runs):
    """Sort path: the arrival counters, one per slot, just past the long-run list's last entry."""
    return _listed(ws_ptr, n, max_long_runs)


@triton.jit
def _group_records(ws_ptr, n, max_long_runs):
    """Merge sort: the first programs' records, front list then back list (group_cap each), past the arrival counters."""
    return _arrivals(ws_ptr, n, max_long_runs) + n


#: cp.async.bulk.prefetch.L2 where $3 is nonzero; the second gives the lines L2 priority evict_last (createpolicy).
_PREFETCH_L2 = tl.constexpr("{ .reg .pred p; setp.ne.b32 p, $3, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }")
_PREFETCH_L2_EVICT_LAST = tl.constexpr(
    "{ .reg .pred p; .reg .b64 pol; setp.ne.b32 p, $3, 0; createpolicy.fractional.L2::evict_last.b64 pol, 1.0; "
    "@p cp.async.bulk.prefetch.L2.global.L2::cache_hint [$1], $2, pol; mov.u32 $0, 0; }")


@triton.jit
def _prefetch_l2(addr, nbytes, mask, EVICT_LAST: tl.constexpr):
    """cp.async.bulk.prefetch.L2 of nbytes (a multiple of 16) from addr (16-byte aligned) where mask: a hint, no data.

    EVICT_LAST: the lines get L2 priority evict_last, as Triton's own evict_last loads give theirs."""
    tl.inline_asm_elementwise(
        _PREFETCH_L2_EVICT_LAST if EVICT_LAST else _PREFETCH_L2,
        "=r,l,r,r",
        [addr, nbytes, mask.to(tl.int32)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _prefetch_l1(addr):
    """prefetch.global.L1 of the line at addr: a hint, no data, so nothing waits for it."""
    tl.inline_asm_elementwise("prefetch.global.L1 [$1]; mov.u32 $0, 0;", "=r,l", [addr], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _wait_for(counter_ptr, target):
    """Spin until the counter reaches target; reading it with acquire semantics makes the writes published before it visible."""
    while tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu") < target:
        pass


@triton.jit
def _append_records(ws_ptr, n, max_long_runs, slot, key, pos, run_start, run_end, live, group, group_cap, lone_tokens,
                    SPAN: tl.constexpr, GROUP_P2: tl.constexpr, POLICY: tl.constexpr, DEFER: tl.constexpr):
    """Sort path: publish a record (_REC) for each of these slots that starts a partial, and list the long runs.

    Partials of long runs (more than SPAN slots) go to the front of the record list, the others
    to its back. A long run's first slot lists the run (run start, partials) for the long-run
    kernel and zeroes its arrival counter. One atomic per list. Merge sort: programs below
    `group` place theirs in program order in the group's lists instead (_ordered_bases), which
    the partials kernel takes first. No record for a token of a run of one at a position below
    lone_tokens: the partials kernel adds those before its wait on the plan (_lone_tokens).
    DEFER > 0 (accumulate's masked): no record for a partial of a run of DEFER partials or more;
    _masked_records_kernel publishes those whose tokens are not all masked.
    """
    starts = live & (key >= 0) & ((slot - run_start) % SPAN == 0) & ((run_end - run_start != 1) | (pos >= lone_tokens))
    if DEFER > 0:
        starts = starts & (run_end - run_start <= (DEFER - 1) * SPAN)
    long = run_end - run_start > SPAN
    front = (starts & long).to(tl.int32)
    back = (starts & ~long).to(tl.int32)
    num_front = tl.sum(front, axis=0)
    num_back = tl.sum(back, axis=0)
    in_group = tl.program_id(0) < group
    if in_group:
        base_front, base_back = _ordered_bases(ws_ptr + _LONG * n + _STATUS0, num_front, num_back, GROUP_P2)
        if tl.program_id(0) == tl.minimum(group, tl.num_programs(0)) - 1:  # the group's last program knows its totals
            tl.store(ws_ptr + _LONG * n + 3, base_front + num_front)
            tl.store(ws_ptr + _LONG * n + 4, base_back + num_back)
    else:
        # An atomic only where it adds something: the counters are three hot addresses.
        base_front = tl.atomic_add(ws_ptr + _LONG * n + 1, num_front, mask=num_front > 0)
        base_back = tl.atomic_add(ws_ptr + _LONG * n + 2, num_back, mask=num_back > 0)
    index_front = base_front + tl.cumsum(front, axis=0) - front
    index_back = base_back + tl.cumsum(back, axis=0) - back
    grouped = _group_records(ws_ptr, n, max_long_runs) + tl.where(long, index_front, group_cap + index_back) * _REC_FIELDS
    listed_rec = ws_ptr + _REC * n + tl.where(long, index_front, n - 1 - index_back) * _REC_FIELDS
    rec = tl.where(in_group, grouped, listed_rec)
    tl.store(rec, slot, mask=starts, eviction_policy=POLICY)
    tl.store(rec + 1, key, mask=starts, eviction_policy=POLICY)
    tl.store(rec + 2, pos, mask=starts, eviction_policy=POLICY)
    tl.store(rec + 3, run_start, mask=starts, eviction_policy=POLICY)
    tl.store(rec + 4, run_end, mask=starts, eviction_policy=POLICY)
    first = (live & (key >= 0) & long & (slot == run_start)).to(tl.int32)
    num_first = tl.sum(first, axis=0)
    entry = tl.atomic_add(ws_ptr + _LONG * n, num_first, mask=num_first > 0) + tl.cumsum(first, axis=0) - first
    listed = _listed(ws_ptr, n, entry)
    tl.store(listed, run_start, mask=first != 0)
    tl.store(listed + 1, (run_end - run_start + SPAN - 1) // SPAN, mask=first != 0)
    tl.store(_arrivals(ws_ptr, n, max_long_runs) + slot, 0, mask=first != 0)  # its arrival counter


@triton.jit
def _ordered_bases(status_ptr, num_front, num_back, GROUP_P2: tl.constexpr):
    """(front, back) records of the group's programs before this one: publish this program's
    counts, then read every earlier program's until all are published (a single-pass scan over
    a few programs). It cannot deadlock: earlier programs never wait on later ones; only the
    group waits, at most 56 programs; and the partials kernel, whose programs could fill the
    GPU while they wait, launches only once every merge program has started.

    A status word is (front << 15) | back | _STATUS_READY (counts below 2**15), zeroed by the block sort.
    """
    q = tl.program_id(0)
    tl.atomic_add(status_ptr + q, (num_front << 15) | num_back | _STATUS_READY, sem="relaxed")  # it was zero
    prev = tl.arange(0, GROUP_P2)
    st = tl.load(status_ptr + prev, mask=prev < q, other=_STATUS_READY, volatile=True)
    while tl.min(st, axis=0) < _STATUS_READY:
        st = tl.load(status_ptr + prev, mask=prev < q, other=_STATUS_READY, volatile=True)
    return tl.sum((st >> 15) & 0x7FFF, axis=0), tl.sum(st & 0x7FFF, axis=0)


@triton.jit
def _block_sort_kernel(
    ids_ptr,  # int32/int64 [n]: token ids in position order
    ws_ptr,  # int32 workspace out: block-sorted keys at _AUX * n, their positions at _AUX2 * n
    n,  # number of tokens
    num_embeddings,  # V
    padding_idx,  # id that adds nothing, or -1
    counts_ptr,  # COUNT: int32 [V]: zeroed at each token's id
    compact_ptr,  # COMPACT: int32, _compact_kernel's: its first m keys are the tokens, its second array their positions
    BLOCK: tl.constexpr,  # tokens per block: merge_block(n)
    BLOCK_I: tl.constexpr,  # tokens of the block ranked per program (program (b, c) ranks chunk c of block b)
    TILE: tl.constexpr,  # tokens compared per step
    COUNT: tl.constexpr,  # zero the counts of the tokens' ids (the merge counts them)
    COMPACT: tl.constexpr,  # the masked route: sort compact_ptr's m tokens (ids_ptr is compact_ptr), n only the capacity
    PDL: tl.constexpr,  # launched with programmatic dependent launch
):
    """Sort path, step 1 of the merge-rank sort: sort each block of BLOCK tokens stably by counting."""
    _pdl_enter(PDL)
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        tl.store(ws_ptr + _LONG * n + tl.arange(0, _HEADER), tl.zeros([_HEADER], dtype=tl.int32))  # the counters
    m = _kept_count(compact_ptr, n) if COMPACT else n
    b0 = tl.program_id(0) * BLOCK
    if b0 < m:  # (COMPACT: blocks past the m tokens have nothing to sort)
        i = b0 + tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
        live = i < m
        key_i = _load_keys(ids_ptr, i, live, num_embeddings, padding_idx)
        before = tl.zeros([BLOCK_I, TILE], dtype=tl.int32)
        for j0 in range(0, BLOCK, TILE):
            j = b0 + j0 + tl.arange(0, TILE)
            key_j = _load_keys(ids_ptr, j, j < m, num_embeddings, padding_idx)
            earlier = (key_j[None, :] < key_i[:, None]) | ((key_j[None, :] == key_i[:, None]) & (j[None, :] < i[:, None]))
            before += earlier.to(tl.int32)
        rank = b0 + tl.sum(before, axis=1)
        if COUNT:  # only these entries are read: no [V] memset
            tl.store(counts_ptr + key_i, tl.zeros([BLOCK_I], dtype=tl.int32), mask=live & (key_i >= 0))
        tl.store(ws_ptr + _AUX * n + rank, key_i, mask=live)
        tl.store(ws_ptr + _AUX2 * n + rank, tl.load(compact_ptr + n + i, mask=live) if COMPACT else i, mask=live)


@triton.jit
def _count_ids(ws_ptr, n, counts_ptr, c, counters, compact_ptr, PDL: tl.constexpr, AGGREGATE: tl.constexpr, COMPACT: tl.constexpr):
    """Counter c of `counters` (programs after the merge's): count each id's tokens of its part (COMPACT: of the m
    kept tokens, the block sort's slots past them unwritten), then
    count itself in the header's _LONE_COUNTED (release), which the partials kernel's lone programs
    wait for. Only then may that kernel launch (PDL), so they wait little, and the merge's own
    programs, which let it launch at once, are not held up. The block sort zeroed these counts
    (at the tokens' ids: no [V] memset) and the header."""
    if PDL:
        gdc_wait()
    m = _kept_count(compact_ptr, n) if COMPACT else n
    lane = tl.arange(0, _COUNT_BLOCK)
    for t0 in range(c * _COUNT_BLOCK, m, counters * _COUNT_BLOCK):
        t = t0 + lane
        key = tl.load(ws_ptr + _AUX * n + t, mask=t < m, other=-1)  # block-sorted keys: -1 adds nothing
        if AGGREGATE:
            # Equal keys lie next to each other (within a merge block), and atomics on one address are
            # serialised (a token per atomic cost an id of many tokens 1-2 ns per token): a group of
            # equal keys at lanes [a, b] adds b + 1 by its last token and -a by its first (the sum is
            # its size once both are in; only then is it read), a group of one adds 1.
            before = tl.load(ws_ptr + _AUX * n + t - 1, mask=(lane > 0) & (t < m), other=-2)
            after = tl.load(ws_ptr + _AUX * n + t + 1, mask=(lane < _COUNT_BLOCK - 1) & (t + 1 < m), other=-2)
            first, last = before != key, after != key
            add = tl.where(first & last, 1, tl.where(last, lane + 1, -lane))
            tl.atomic_add(counts_ptr + key, add, mask=(key >= 0) & (first | last), sem="relaxed")
        else:
            tl.atomic_add(counts_ptr + key, 1, mask=key >= 0, sem="relaxed")
    tl.debug_barrier()
    tl.atomic_add(ws_ptr + _LONG * n + _LONE_COUNTED, 1, sem="release", scope="gpu")
    if PDL:
        gdc_launch_dependents()


@triton.jit
def _merge_rank_kernel(
    ws_ptr,  # int32 workspace: block-sorted keys and positions in; sorted keys, positions, run starts and ends out
    n,  # number of tokens
    max_long_runs,  # entries of the long-run list
    group,  # the first programs, whose records go first (_append_records)
    lone_tokens,  # lone tokens at positions below this get no record (_append_records)
    counts_ptr,  # COUNT: int32 [V]: each id's tokens out, zeroed at those ids by the block sort
    merge_programs,  # COUNT: the programs that merge; the programs after them count
    compact_ptr,  # COMPACT: _compact_kernel's output, whose header holds m
    BLOCK: tl.constexpr,  # tokens per block of _block_sort_kernel
    NUM_BLOCKS: tl.constexpr,  # a power of two >= cdiv(n, BLOCK)
    STEPS: tl.constexpr,  # binary-search steps: log2(BLOCK) + 1, or log2(WINDOW) + 1
    BLOCK_U: tl.constexpr,  # block-sorted tokens per program
    SPAN: tl.constexpr,  # NROWS
    GROUP_P2: tl.constexpr,  # a power of two >= group
    WINDOW: tl.constexpr,  # 0, or keys per window: the searches start in the window that the samples give
    COUNT: tl.constexpr,  # programs past merge_programs count each id's tokens (_count_ids)
    PDL: tl.constexpr,  # launched with programmatic dependent launch
    COUNT_AGGREGATE: tl.constexpr,  # COUNT: one atomic per group of equal keys (_count_ids)
    PLAN_POLICY: tl.constexpr,  # L2 eviction policy of the sorted positions' and records' stores: "evict_last" or "" (none)
    DEFER: tl.constexpr,  # > 0: runs of this many partials or more get their records later (_masked_records_kernel)
    COMPACT: tl.constexpr,  # the masked route: the block sort sorted m tokens, n only the capacity
):
    """Sort path, step 2: every token's slot, run start and run end from binary searches in every block.

    Blocks before the token's own add their keys <= its key, blocks after their keys < it,
    its own block its local rank; the run starts after all keys < it and ends after all keys
    <= it (plan.merge_ranks).
    """
    if COUNT:
        if tl.program_id(0) >= merge_programs:
            _count_ids(ws_ptr, n, counts_ptr, tl.program_id(0) - merge_programs, tl.num_programs(0) - merge_programs, compact_ptr,
                       PDL, COUNT_AGGREGATE, COMPACT)
            return
    _pdl_enter(PDL)
    m = _kept_count(compact_ptr, n) if COMPACT else n
    if (tl.program_id(0) * BLOCK_U >= m) & (tl.program_id(0) >= group):  # (COMPACT: past the tokens; the group's all publish)
        return
    if COMPACT:  # the lone tokens are the first lone_tokens kept ones: their positions ascend, so those below the next one's
        lone_tokens = tl.where(lone_tokens < m, tl.load(compact_ptr + n + tl.minimum(lone_tokens, n - 1)), n)
    u = tl.program_id(0) * BLOCK_U + tl.arange(0, BLOCK_U)
    live = u < m
    key = tl.load(ws_ptr + _AUX * n + u, mask=live, other=0)
    pos = tl.load(ws_ptr + _AUX2 * n + u, mask=live, other=0)
    own = u // BLOCK
    c = tl.arange(0, NUM_BLOCKS)
    c_len = tl.minimum(tl.maximum(m - c * BLOCK, 0), BLOCK)[None, :]
    c_keys = ws_ptr + _AUX * n + (c * BLOCK)[None, :]
    # Each search keeps only its lower end lo (the keys before it are < key, or <= key) and knows
    # the count lies in [lo, lo + w], w the window (or BLOCK): a probe at lo + s - 1 adds s to lo
    # or not, for s = w / 2, ..., 1, and a last probe at lo adds 1. As many probes as a binary
    # search of [lo, hi] (log2(w) + 1), with fewer instructions (no midpoint, no upper end): the
    # merge is bound by its chains of dependent instructions (benchmarks/NOTES.md v12 item 2, v30).
    lo_lt = tl.zeros([BLOCK_U, NUM_BLOCKS], dtype=tl.int32)  # -> keys < key in block c
    lo_le = lo_lt  # -> keys <= key in block c
    if WINDOW > 0:
        # Each block's windows of WINDOW keys, by their last keys (one round trip for all): the
        # windows whose last key is < key (<= key) hold only keys < key (<= key), so the search
        # starts in the next window, log2(WINDOW) + 1 steps instead of log2(BLOCK) + 1 (NOTES v11).
        for k in tl.static_range(BLOCK // WINDOW):
            last = (k + 1) * WINDOW - 1
            sample = tl.load(c_keys + last, mask=last < c_len, other=_INT32_MAX)
            lo_lt += (sample < key[:, None]).to(tl.int32) * WINDOW
            lo_le += (sample <= key[:, None]).to(tl.int32) * WINDOW
    for t in tl.static_range(STEPS - 1):
        s = (WINDOW if WINDOW > 0 else BLOCK) >> (t + 1)
        at_lt = lo_lt + (s - 1)
        at_le = lo_le + (s - 1)
        lo_lt += tl.where(tl.load(c_keys + at_lt, mask=at_lt < c_len, other=_INT32_MAX) < key[:, None], s, 0)
        lo_le += tl.where(tl.load(c_keys + at_le, mask=at_le < c_len, other=_INT32_MAX) <= key[:, None], s, 0)
    lo_lt += (tl.load(c_keys + lo_lt, mask=lo_lt < c_len, other=_INT32_MAX) < key[:, None]).to(tl.int32)
    lo_le += (tl.load(c_keys + lo_le, mask=lo_le < c_len, other=_INT32_MAX) <= key[:, None]).to(tl.int32)
    earlier_block = c[None, :] < own[:, None]
    later_block = c[None, :] > own[:, None]
    slot = u - own * BLOCK + tl.sum(tl.where(earlier_block, lo_le, tl.where(later_block, lo_lt, 0)), axis=1)
    run_start = tl.sum(lo_lt, axis=1)
    run_end = tl.sum(lo_le, axis=1)
    tl.store(ws_ptr + _KEYS * n + slot, key, mask=live)
    tl.store(ws_ptr + _POS * n + slot, pos, mask=live, eviction_policy=PLAN_POLICY)
    tl.store(ws_ptr + _RUN_START * n + slot, run_start, mask=live)
    tl.store(ws_ptr + _RUN_END * n + slot, run_end, mask=live)
    _append_records(ws_ptr, n, max_long_runs, slot, key, pos, run_start, run_end, live, group, group * BLOCK_U, lone_tokens, SPAN,
                    GROUP_P2, PLAN_POLICY, DEFER)


@triton.jit
def _counted(cmp, same):
    """[BLOCK_I, chunks] per-chunk counts of two [BLOCK_I, chunks, CHUNK_SIZE] compares, packed in one sum: (cmp, same)."""
    per_chunk = tl.sum(cmp.to(tl.int32) * _PACK + same.to(tl.int32), axis=2)
    return per_chunk // _PACK, per_chunk % _PACK


@triton.jit
def _rank_kernel(
    ids_ptr,  # int32/int64 [n]: token ids in position order
    ws_ptr,  # int32 workspace out: sorted keys, positions, run starts and ends, partial_ord at _AUX * n; the long-run counter zeroed
    n,  # number of tokens
    num_embeddings,  # V
    padding_idx,  # id that adds nothing, or -1
    CHUNK_SIZE: tl.constexpr,  # positions per feature-path chunk
    BLOCK_I: tl.constexpr,  # tokens ranked per program (a multiple of CHUNK_SIZE)
    BLOCK_J: tl.constexpr,  # tokens compared per step (a multiple of CHUNK_SIZE)
    PDL: tl.constexpr,  # launched with programmatic dependent launch
):
    """Feature path, the whole plan: each token's slot by counting the tokens that sort before it,
    its run's start and end, and partial_ord.

    Steps of BLOCK_J tokens, seen as [BLOCK_J // CHUNK_SIZE, CHUNK_SIZE] so that each step also
    counts the earlier chunks that hold a token's key; program starts (multiples of
    CHUNK_SIZE) never split a chunk, so a chunk is wholly before a program's tokens or not.
    The same pass counts the tokens of each token's key, before it and in all: its run starts
    at its slot less those before it and ends that many slots on, so no search follows the
    sort. Each compare of a step yields (sorts before) * _PACK + (same key), summed once over a
    chunk (at most CHUNK_SIZE < _PACK of each) and taken apart after.
    """
    tl.static_assert(CHUNK_SIZE < _PACK)
    _pdl_enter(PDL)
    if tl.program_id(0) == 0:
        tl.store(ws_ptr + _LONG * n, 0)  # the long-run counter: the partials kernel lists the long runs
    CHUNKS: tl.constexpr = BLOCK_J // CHUNK_SIZE
    i0 = tl.program_id(0) * BLOCK_I
    i = i0 + tl.arange(0, BLOCK_I)
    live_i = i < n
    key_i = _load_keys(ids_ptr, i, live_i, num_embeddings, padding_idx)
    k3 = key_i[:, None, None]
    offsets = tl.reshape(tl.arange(0, BLOCK_J), [CHUNKS, CHUNK_SIZE])
    before = tl.zeros([BLOCK_I], dtype=tl.int32)  # tokens that sort before i
    chunks = tl.zeros([BLOCK_I], dtype=tl.int32)  # earlier chunks holding i's key
    same_before = tl.zeros([BLOCK_I], dtype=tl.int32)  # tokens of i's key at earlier positions
    same_after = tl.zeros([BLOCK_I], dtype=tl.int32)  # and at later positions
    # Tokens at earlier positions sort before i when their key is <= key_i. Past i0: INT32_MAX.
    for j0 in range(0, i0, BLOCK_J):
        j3 = j0 + offsets
        key_j3 = _load_keys(ids_ptr, j3, j3 < i0, num_embeddings, padding_idx)[None, :, :]
        le, same = _counted(key_j3 <= k3, key_j3 == k3)
        before += tl.sum(le, axis=1)
        chunks += tl.sum((same > 0).to(tl.int32), axis=1)
        same_before += tl.sum(same, axis=1)
    # Inside the block, ties go by position: chunk by chunk.
    for c0 in tl.static_range(0, BLOCK_I, CHUNK_SIZE):
        j = i0 + c0 + tl.arange(0, CHUNK_SIZE)
        live_j = j < n
        key_j = _load_keys(ids_ptr, j, live_j, num_embeddings, padding_idx)
        same = (key_j[None, :] == key_i[:, None]) & live_j[None, :]
        earlier = j[None, :] < i[:, None]
        first = (key_j[None, :] < key_i[:, None]) | (same & earlier)
        before += tl.sum((first & live_j[None, :]).to(tl.int32), axis=1)
        earlier_chunk = (i0 + c0) // CHUNK_SIZE < i // CHUNK_SIZE
        chunks += tl.where(earlier_chunk, tl.max(same.to(tl.int32), axis=1), 0)
        same_before += tl.sum((same & earlier).to(tl.int32), axis=1)
        same_after += tl.sum((same & (j[None, :] > i[:, None])).to(tl.int32), axis=1)
    # Tokens at later positions sort before i when their key is < key_i (past n: INT32_MAX).
    for j0 in range(i0 + BLOCK_I, n, BLOCK_J):
        j3 = j0 + offsets
        key_j3 = _load_keys(ids_ptr, j3, j3 < n, num_embeddings, padding_idx)[None, :, :]
        lt, later_same = _counted(key_j3 < k3, key_j3 == k3)
        before += tl.sum(lt, axis=1)
        same_after += tl.sum(later_same, axis=1)
    run_start = before - same_before
    tl.store(ws_ptr + _KEYS * n + before, key_i, mask=live_i)
    tl.store(ws_ptr + _POS * n + before, i, mask=live_i)
    tl.store(ws_ptr + _AUX * n + before, chunks, mask=live_i)
    tl.store(ws_ptr + _RUN_START * n + before, run_start, mask=live_i)
    tl.store(ws_ptr + _RUN_END * n + before, before + 1 + same_after, mask=live_i)


@triton.jit
def _runs_kernel(
    ws_ptr,  # int32 workspace: sorted keys and positions in (the counters zeroed); run starts and ends, records out
    n,  # number of tokens
    search_steps,  # binary-search steps: n.bit_length()
    max_long_runs,  # entries of the long-run list
    BLOCK: tl.constexpr,  # slots per program
    SPAN: tl.constexpr,  # NROWS
    PDL: tl.constexpr,  # launched with programmatic dependent launch
    DEFER: tl.constexpr,  # > 0: runs of this many partials or more get their records later (_masked_records_kernel)
):
    """Sort path after torch.sort: every slot's run start and end by binary search in the sorted keys, and the records."""
    _pdl_enter(PDL)
    s = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = s < n
    key = tl.load(ws_ptr + _KEYS * n + s, mask=live, other=0)
    lo = tl.zeros([BLOCK], dtype=tl.int32)
    hi = s  # the run start lies in [lo, hi]
    lo_end = s + 1  # the run end lies in [lo_end, hi_end]
    hi_end = tl.zeros([BLOCK], dtype=tl.int32) + n
    for _ in range(search_steps):
        mid = (lo + hi) // 2
        below = tl.load(ws_ptr + _KEYS * n + mid, mask=live, other=0) < key
        lo = tl.where(below, mid + 1, lo)
        hi = tl.where(below, hi, mid)
        mid_end = (lo_end + hi_end) // 2
        within = tl.load(ws_ptr + _KEYS * n + mid_end, mask=live & (mid_end < n), other=_INT32_MAX) <= key
        lo_end = tl.where(within, mid_end + 1, lo_end)
        hi_end = tl.where(within, hi_end, mid_end)
    tl.store(ws_ptr + _RUN_START * n + s, lo, mask=live)
    tl.store(ws_ptr + _RUN_END * n + s, lo_end, mask=live)
    pos = tl.load(ws_ptr + _POS * n + s, mask=live, other=0)
    _append_records(ws_ptr, n, max_long_runs, s, key, pos, lo, lo_end, live, 0, 0, 0, SPAN, 1, "", DEFER)


@triton.jit
def _masked_records_kernel(
    ws_ptr,  # int32 workspace: the plan (sorted positions, run starts and ends); records, arrivals out
    masked_ptr,  # uint8 [n] in position order, nonzero where the token's grad row is taken as +0
    flags_ptr,  # int32 [num_hb, partial_buffer_rows] out (_flag): 0 for each partial of masked tokens only (_partial writes the others')
    n,  # number of tokens
    max_long_runs,  # entries of the long-run list
    num_hb,  # H blocks of _partials_kernel
    BLOCK: tl.constexpr,  # slots per program
    SPAN: tl.constexpr,  # NROWS
    SPAN_P2: tl.constexpr,  # a power of two >= SPAN
    DEFER: tl.constexpr,  # the plan deferred the records of runs of this many partials or more (the zero skip's SKIP_MIN)
    POLICY: tl.constexpr,  # L2 eviction policy of the records' stores
    PDL: tl.constexpr,  # launched with programmatic dependent launch
):
    """Sort path with accumulate's masked: the records the plan deferred (_append_records' DEFER).

    On Megatron's vocab-parallel input most tokens are masked and all look up row 0, whose run
    then has thousands of partials of masked tokens only (2870 at 32768 tokens on a rank of
    TP = 8). Their sums are +0, so they need no item of the partials kernel: such a partial gets
    no record, its flags are 0 in every H block (the fold skips it, as any zero partial of a
    flagged run: exact, since a sum from +0 is never -0), and its arrivals are counted here (the
    fold waits for all of its run's). A partial with a token not masked gets its front record.
    Deferred runs have flags: DEFER is the zero skip's SKIP_MIN, at least 2. Each program adds
    its dropped partials of a run to the run's counter by two atomics, + the running count at
    the run's last slot in the program, - the count before its first (as _count_ids counts).
    """
    _pdl_enter(PDL)
    s = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = s < n
    key = tl.load(ws_ptr + _KEYS * n + s, mask=live, other=-1)
    run_start = tl.load(ws_ptr + _RUN_START * n + s, mask=live, other=0)
    run_end = tl.load(ws_ptr + _RUN_END * n + s, mask=live, other=0)
    flagged = live & (key >= 0) & (run_end - run_start > (DEFER - 1) * SPAN)
    deferred = flagged & ((s - run_start) % SPAN == 0)
    # The partial's SPAN slots' positions, then their mask bytes: two round trips, all at once.
    t = tl.arange(0, SPAN_P2)[None, :]
    take = deferred[:, None] & (t < SPAN) & (s[:, None] + t < run_end[:, None])
    pos_t = tl.load(ws_ptr + _POS * n + s[:, None] + t, mask=take, other=0)
    real = tl.max((take & (tl.load(masked_ptr + pos_t, mask=take, other=1) == 0)).to(tl.int32), axis=1) != 0
    pos = tl.sum(tl.where(t == 0, pos_t, 0), axis=1)
    # Records of the partials with a token not masked, at the front list's end (one atomic).
    front = real.to(tl.int32)
    num_front = tl.sum(front, axis=0)
    base = tl.atomic_add(ws_ptr + _LONG * n + 1, num_front, mask=num_front > 0)
    rec = ws_ptr + _REC * n + (base + tl.cumsum(front, axis=0) - front) * _REC_FIELDS
    tl.store(rec, s, mask=real, eviction_policy=POLICY)
    tl.store(rec + 1, key, mask=real, eviction_policy=POLICY)
    tl.store(rec + 2, pos, mask=real, eviction_policy=POLICY)
    tl.store(rec + 3, run_start, mask=real, eviction_policy=POLICY)
    tl.store(rec + 4, run_end, mask=real, eviction_policy=POLICY)
    # The others: flags 0, arrivals counted.
    dropped = deferred & ~real
    row = _partial_row(run_start, (s - run_start) // SPAN, False, SPAN)
    for hb in range(num_hb):
        tl.store(_flag(flags_ptr, n, hb, row, SPAN), 0, mask=dropped)
    d = dropped.to(tl.int32)
    count = tl.cumsum(d, axis=0)  # dropped partials of this program up to this slot
    lo = tl.program_id(0) * BLOCK
    first = flagged & ((s == run_start) | (s == lo))
    last = flagged & ((s + 1 == run_end) | (s == lo + BLOCK - 1))
    arrivals = _arrivals(ws_ptr, n, max_long_runs) + run_start
    tl.atomic_add(arrivals, count * num_hb, mask=last & (count != 0))
    tl.atomic_add(arrivals, (d - count) * num_hb, mask=first & (count != d))


@triton.jit
def _compact_counts_kernel(
    ids_ptr,  # int32/int64 [n]: token ids in position order
    masked_ptr,  # uint8 [n]: nonzero where masked
    counts_ptr,  # int32 [2, blocks] out: each block's tokens of key MASKED_LOOKUP_ID, and those of them not masked
    n,
    num_embeddings,
    padding_idx,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """The masked route's first kernel (_compact_stage): per block, the tokens that leave the plan for row 0's kernel."""
    _pdl_enter(PDL)
    t = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = t < n
    at_row = live & (_load_keys(ids_ptr, t, live, num_embeddings, padding_idx) == _MASKED_ID)
    real = at_row & (tl.load(masked_ptr + t, mask=live, other=1) == 0)
    tl.store(counts_ptr + tl.program_id(0), tl.sum(at_row.to(tl.int32), axis=0))
    tl.store(counts_ptr + tl.num_programs(0) + tl.program_id(0), tl.sum(real.to(tl.int32), axis=0))


@triton.jit
def _compact_kernel(
    ids_ptr,  # int32/int64 [n]: token ids in position order
    masked_ptr,  # uint8 [n]: nonzero where masked
    counts_ptr,  # int32 [2, blocks]: _compact_counts_kernel's
    compact_ptr,  # int32 [_COMPACT_ARRAYS * n + 3] out (_compact_stage)
    n,
    num_embeddings,
    padding_idx,
    BLOCK: tl.constexpr,
    BLOCKS_P2: tl.constexpr,  # a power of two >= the number of blocks
    PDL: tl.constexpr,
):
    """The masked route's compaction (embwgrad_core.masked_split: a prefix count, every token of
    MASKED_LOOKUP_ID leaving the plan): the other tokens' keys and positions at slot t - (row-0 tokens
    before t), the first m of compact_ptr's first two arrays; row 0's unmasked tokens' positions and
    their ranks among all row-0 tokens at their index among them; the header (m, those, all row-0 tokens).
    Each program sums the counts of the blocks before its own (no program waits on another)."""
    b = tl.program_id(0)
    t = b * BLOCK + tl.arange(0, BLOCK)
    live = t < n
    key = _load_keys(ids_ptr, t, live, num_embeddings, padding_idx)
    at_row = (live & (key == _MASKED_ID)).to(tl.int32)
    real = at_row * (tl.load(masked_ptr + t, mask=live, other=1) == 0).to(tl.int32)
    _pdl_enter(PDL)  # (the counts: the kernel before)
    blocks = tl.arange(0, BLOCKS_P2)
    row_before = tl.sum(tl.load(counts_ptr + blocks, mask=blocks < b, other=0), axis=0) + tl.cumsum(at_row, axis=0) - at_row
    real_before = tl.sum(tl.load(counts_ptr + tl.num_programs(0) + blocks, mask=blocks < b, other=0), axis=0) + tl.cumsum(real, axis=0) - real
    kept = live & (at_row == 0)
    tl.store(compact_ptr + t - row_before, key, mask=kept)
    tl.store(compact_ptr + n + t - row_before, t, mask=kept)
    tl.store(compact_ptr + 2 * n + real_before, t, mask=real != 0)
    tl.store(compact_ptr + 3 * n + real_before, row_before, mask=real != 0)
    if b == tl.num_programs(0) - 1:
        rows = tl.max(tl.where(live, row_before + at_row, 0), axis=0)
        reals = tl.max(tl.where(live, real_before + real, 0), axis=0)
        tl.store(compact_ptr + _COMPACT_ARRAYS * n, n - rows)
        tl.store(compact_ptr + _COMPACT_ARRAYS * n + 1, reals)
        tl.store(compact_ptr + _COMPACT_ARRAYS * n + 2, rows)


@triton.jit
def _row0_kernel(
    compact_ptr,  # int32: _compact_kernel's row-0 list and header
    grad_ptr,  # [*S, H] bf16/fp16/fp32
    main_grad_ptr,  # [V, H]
    n,
    hidden,
    grad_dim1,  # position p's grad row: (p // grad_dim1) * grad_stride0 + (p % grad_dim1) * grad_stride1
    grad_stride0,
    grad_stride1,
    grad_stride_h,
    main_grad_stride,
    SPAN: tl.constexpr,  # NROWS
    GRAD_ROUNDING: tl.constexpr,
    MAIN_ROUNDING: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
):
    """The masked route's row MASKED_LOOKUP_ID, these columns: its run's sort-path sum from its unmasked tokens alone.

    A token's partial is its rank among all of the row's tokens, masked or not, // SPAN
    (embwgrad_core.make_masked_plan). The unmasked ones, in position order, have rising ranks,
    so each partial's tokens are next to each other in the list: a partial is summed from +0 in
    order, the partials are added from +0 in order (partials of masked tokens only would add +0
    to a sum that is never -0: left out), rounded to grad's dtype and added to main_grad. Where
    the row has tokens but none unmasked the add is of +0, as the dense path's.
    """
    _pdl_enter(PDL)
    header = compact_ptr + _COMPACT_ARRAYS * n
    if tl.load(header + 2) > 0:
        cols = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
        live_h = cols < hidden
        total = tl.zeros([BLOCK_H], dtype=tl.float32)
        part = tl.zeros([BLOCK_H], dtype=tl.float32)
        k = tl.zeros([], dtype=tl.int32) - 1
        for i in range(tl.load(header + 1)):
            pos = tl.load(compact_ptr + 2 * n + i)
            k_i = tl.load(compact_ptr + 3 * n + i) // SPAN
            total = tl.where(k_i != k, total + part, total)  # a new partial: the last one's sum in
            part = tl.where(k_i != k, 0.0, part)
            k = k_i
            part += tl.load(grad_ptr + _grad_row(pos, grad_dim1, grad_stride0, grad_stride1) + cols * grad_stride_h, mask=live_h,
                            other=0).to(tl.float32)
        total += part
        _add_to_row(main_grad_ptr + _MASKED_ID * main_grad_stride, cols, live_h, _round(total, GRAD_ROUNDING), MAIN_ROUNDING)


@triton.jit
def _partials_kernel(
    ws_ptr,  # int32 workspace: the plan; the long-run counter and list out
    grad_ptr,  # [*S, H] bf16/fp16/fp32: position p's row at (p // grad_dim1) * grad_stride0 + (p % grad_dim1) * grad_stride1
    main_grad_ptr,  # [V, H] bf16/fp16/fp32, rows main_grad_stride apart
    partials_ptr,  # [partial_buffer_rows, H] out: partial sums of long runs, fp32 or bf16 bits (_to_scratch)
    flags_ptr,  # SKIP_MIN > 0: int32 [cdiv(H, BLOCK_H), partial_buffer_rows] out (_flag), whether each long-run partial is nonzero (_partial)
    n,  # number of tokens
    hidden,  # H
    max_long_runs,  # entries of the long-run list
    fold_lo,  # sort path: 0 (the folders follow the long runs' partials) or the last programs (interpreter)
    fold_programs,  # sort path: programs that fold long runs (0: _long_runs_kernel folds them)
    group_cap,  # merge sort: records of each of the group's lists (_append_records)
    tail_programs,  # sort path: the last programs but the folders, which take one item each
    ids_ptr,  # PREFETCH_L2, LONE: token ids in position order
    num_embeddings,  # PREFETCH_L2, LONE: V
    prefetch_tokens,  # PREFETCH_L2: positions [0, prefetch_tokens) have their rows prefetched
    counts_ptr,  # LONE: int32 [V], each id's tokens (_block_sort_kernel)
    padding_idx,  # LONE: id that adds nothing, or -1
    lone_tokens,  # LONE: positions [0, lone_tokens) whose id occurs once are added by the lone programs (_lone_tokens)
    lone_programs,  # LONE: the first lone_programs programs, which take no record
    count_programs,  # LONE: the merge kernel's counting programs (_LONE_COUNTED)
    masked_ptr,  # MASKED: uint8 [n] in position order, nonzero where the token's grad row is taken as +0 and not read
    grad_dim1,  # 1 for a contiguous grad: Triton then folds the division away
    grad_stride0,
    grad_stride1,
    grad_stride_h,
    main_grad_stride,
    FEATURE_PATH: tl.constexpr,  # partials are chunks (else NROWS slots)
    SPAN: tl.constexpr,  # most slots in a partial: CHUNK or NROWS
    CHUNK_SIZE: tl.constexpr,
    GRAD_ROUNDING: tl.constexpr,
    MAIN_ROUNDING: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PREFETCH: tl.constexpr,  # sort path: load the next item's record before this item's rows
    RECORD_HINT: tl.constexpr,  # with PREFETCH: instead, load it after them, with L1_HINT asked into L1 before them
    L1_HINT: tl.constexpr,  # prefetch.global.L1 (inline PTX: not under the interpreter)
    FOLD_H: tl.constexpr,  # sort path: columns of one fold item
    FOLD_BATCH: tl.constexpr,  # sort path: partials a fold loads at once
    PREFETCH_L2: tl.constexpr,  # sort path with PDL: prefetch the first positions' rows before the wait
    LONE: tl.constexpr,  # merge sort: add the lone tokens of positions [0, lone_tokens) first (_lone_tokens)
    SCRATCH_POLICY: tl.constexpr,  # L2 eviction policy of the long runs' partials' stores: "evict_last" or "" (none)
    PDL: tl.constexpr,  # launched with programmatic dependent launch
    FOLD_STAGES: tl.constexpr,  # sort path: > 0, the folders' sums pipelined over this many stages, FOLD_BATCH partials each (_fold_piped)
    SKIP_MIN: tl.constexpr,  # sort path: runs of this many partials or more flag and skip their zero partials (_fold; 0: none)
    SKIP_BLOCK: tl.constexpr,  # flags a fold reads at once
    PLAN_POLICY: tl.constexpr,  # sort path: L2 eviction policy of the partials' positions' loads: "evict_last" or "" (none)
    PREFETCH_EVICT_LAST: tl.constexpr,  # PREFETCH_L2's lines with L2 priority evict_last: 1 grad's, 2 main_grad's, 3 both
    KEPT: tl.constexpr,  # the masked route, PREFETCH_L2 or LONE: ids_ptr is _compact_kernel's output, "positions" its kept tokens
    MASKED: tl.constexpr,  # accumulate's masked: masked positions' rows are neither loaded nor prefetched
    SKIP_WIDE: tl.constexpr,  # blocks of flags a fold checks at once (ZERO_SKIP_WIDE)
):
    """Sum every partial over every H block: items (partial, H block), H block fastest.

    Sort path: the programs stride the plan's records (_REC), one per partial, so no program
    waits on a slot that starts none (for ids with heavy repeats, most slots). A record is one
    round trip: slot, key, position, run start and run end, which say how many rows the
    partial has and whether it finishes its run. A partial of one row (most of them for ids
    spread over a large vocabulary) then loads its grad row with the main_grad row and is
    done: the instructions of a plain copy. Longer partials load the other positions, then
    their rows, unrolled so that all are in flight at once.
    Feature path: program p takes slot p // cdiv(H, BLOCK_H), and stops unless it starts a partial.
    (One program per slot looping over the H blocks measured 1.5x slower: its row loads wait
    for the previous block's stores.)
    """
    if PREFETCH_L2:  # before the wait: the plan is still being made, DRAM is idle (NOTES v10)
        _prefetch_first_rows(ids_ptr, grad_ptr, main_grad_ptr, num_embeddings, hidden, prefetch_tokens, grad_dim1,
                             grad_stride0, grad_stride1, main_grad_stride, masked_ptr, n, BLOCK_H, PREFETCH_EVICT_LAST, MASKED,
                             KEPT)
    if LONE:
        if tl.program_id(0) < lone_programs:  # with PDL while the merge still runs; no wait on the plan
            _lone_tokens(ws_ptr, n, ids_ptr, counts_ptr, grad_ptr, main_grad_ptr, num_embeddings, padding_idx, hidden, lone_tokens,
                         lone_programs, count_programs, grad_dim1, grad_stride0, grad_stride1, grad_stride_h, main_grad_stride,
                         masked_ptr, MAIN_ROUNDING, BLOCK_H, MASKED, KEPT)
            return
    if PDL:  # wait first, then let the long-run kernel launch: it reads the plan without waiting
        gdc_wait()
        gdc_launch_dependents()
    num_hb = tl.cdiv(hidden, BLOCK_H)
    if FEATURE_PATH:
        s = tl.program_id(0) // num_hb
        key = tl.load(ws_ptr + _KEYS * n + s)
        pos0 = tl.load(ws_ptr + _POS * n + s)
        run_start = tl.load(ws_ptr + _RUN_START * n + s)
        _partial(ws_ptr, grad_ptr, main_grad_ptr, partials_ptr, n, hidden, grad_dim1, grad_stride0, grad_stride1, grad_stride_h,
                 main_grad_stride, s, tl.program_id(0) % num_hb, key, pos0, run_start, 0, ws_ptr, flags_ptr, masked_ptr,
                 FEATURE_PATH, SPAN, CHUNK_SIZE, GRAD_ROUNDING, MAIN_ROUNDING, BLOCK_H, SCRATCH_POLICY, 0, "", MASKED)
    else:
        group_front = tl.load(ws_ptr + _LONG * n + 3)
        group_back = tl.load(ws_ptr + _LONG * n + 4)
        front = tl.load(ws_ptr + _LONG * n + 1) + group_front
        items = (front + tl.load(ws_ptr + _LONG * n + 2) + group_back) * num_hb
        arrivals = _arrivals(ws_ptr, n, max_long_runs)
        pid = tl.program_id(0) - lone_programs  # (LONE: the lone programs came first)
        step = tl.num_programs(0) - lone_programs - fold_programs
        # Programs [fold_lo, fold_lo + fold_programs) fold the long runs. With PDL they come right
        # after the programs that take the long runs' partials (programs start in order), so
        # they hold no slot while those are still to start (NOTES v9); without, last.
        fold_lo = tl.minimum(front * num_hb + fold_lo, step)
        folder = (pid >= fold_lo) & (pid < fold_lo + fold_programs)
        if folder:
            _fold_runs(ws_ptr, partials_ptr, main_grad_ptr, flags_ptr, n, hidden, main_grad_stride, max_long_runs, num_hb, pid - fold_lo,
                       fold_programs, SPAN, GRAD_ROUNDING, MAIN_ROUNDING, FOLD_H, FOLD_BATCH, FOLD_STAGES, BLOCK_H, SKIP_MIN, SKIP_BLOCK,
                       SKIP_WIDE)
        wid = pid - tl.where(pid >= fold_lo + fold_programs, fold_programs, 0)  # this program among the others
        # The last tail_programs programs (they start last) take the last items, one each, so that
        # the kernel ends one item after the steady state rather than a few (NOTES v10); the
        # others stride the items before those (where folders run and items are few, the first
        # programs take them instead: _item_range).
        lo, hi, stride = _item_range(wid, folder, items, step - tail_programs, tail_programs, fold_programs > 0)
        # PREFETCH: the record of the program's first item now, each next one inside the loop
        # (RECORD_HINT: asked into L1 before this item's rows, loaded after them; else loaded
        # before them); otherwise each item's own record when its turn comes.
        if PREFETCH:
            s, key, pos0, run_start, run_end = _load_record(ws_ptr, n, max_long_runs, lo, hi, num_hb, front, group_front, group_back,
                                                            group_cap)
        else:
            s, key, pos0, run_start, run_end = lo * 0, lo * 0, lo * 0, lo * 0, lo * 0  # (set in the loop)
        for w in range(lo, hi, stride):
            if not PREFETCH:
                s, key, pos0, run_start, run_end = _load_record(ws_ptr, n, max_long_runs, w, hi, num_hb, front, group_front, group_back,
                                                                group_cap)
            elif not RECORD_HINT:  # the next item's record in flight while this item's rows are
                s_next, key_next, pos_next, start_next, end_next = _load_record(ws_ptr, n, max_long_runs, w + stride, hi, num_hb, front,
                                                                                group_front, group_back, group_cap)
            if PREFETCH and RECORD_HINT and L1_HINT:
                # Loaded before this item's rows as scalars, ptxas moves the next record's fields into
                # uniform registers at once, so each item waited for that L2 round trip before
                # asking for its own rows (NOTES v12): so only a hint here, no register waits for it
                # (the last item's record again past the last item: any other address there is no record's).
                nxt = tl.minimum(w + stride, hi - 1)
                _prefetch_l1(_record_address(ws_ptr, n, max_long_runs, nxt, num_hb, front, group_front, group_back, group_cap))
            _partial(ws_ptr, grad_ptr, main_grad_ptr, partials_ptr, n, hidden, grad_dim1, grad_stride0, grad_stride1, grad_stride_h,
                     main_grad_stride, s, w % num_hb, key, pos0, run_start, run_end, arrivals, flags_ptr, masked_ptr,
                     FEATURE_PATH, SPAN, CHUNK_SIZE, GRAD_ROUNDING, MAIN_ROUNDING, BLOCK_H, SCRATCH_POLICY, SKIP_MIN, PLAN_POLICY, MASKED)
            if PREFETCH:
                if RECORD_HINT:
                    s, key, pos0, run_start, run_end = _load_record(ws_ptr, n, max_long_runs, w + stride, hi, num_hb, front, group_front,
                                                                    group_back, group_cap)
                else:
                    s, key, pos0, run_start, run_end = s_next, key_next, pos_next, start_next, end_next


@triton.jit
def _item_range(wid, folder, items, head, tail_programs, first):
    """(lo, hi, stride) of a partials program: it takes items lo, lo + stride, ... below hi (the
    JAX twin's _item_range).

    wid is the program among those that take items. The last tail_programs of them (from head on;
    they start last) take the last items, one each, and the head programs stride the items before
    those. But with `first` (folders run) and no more items than programs, the first `items`
    programs take one each, in order, and the rest none: programs start in grid order, and the
    folders come right after the programs of the long runs' partials, which must then be running
    already, not behind every program left without an item (Megatron's TP 8 masked input at 4096-16384
    tokens: 2-4 us faster, NOTES v62). Without folders the programs without an item stay first:
    there the items first measured 8 us slower at 32768 tokens, TP 8 (NOTES v62), and half of
    them first 4-5 us slower at 24576-32768 (v64), a loss that vanished with the masked route's
    kept lone tokens off: in this order the lone programs at the grid's front run alone while the
    programs without an item pass, and items started beside them cost more than they gain. A
    folder takes none (lo = hi = items)."""
    few = first & (items <= head + tail_programs)
    is_tail = (wid >= head) & ~few
    tail_item = items - tail_programs + (wid - head)
    lo = tl.where(folder, items, tl.where(is_tail, tail_item, wid))
    hi = tl.where(folder | (is_tail & (tail_item < 0)) | (few & (wid >= items)), lo,
                  tl.where(few, wid + 1, tl.where(is_tail, tail_item + 1, tl.maximum(items - tail_programs, 0))))
    stride = tl.where(is_tail | few, 1, head)
    return lo, hi, stride


@triton.jit
def _record_address(ws_ptr, n, max_long_runs, w, num_hb, front, group_front, group_back, group_cap):
    """Where item w's record is.

    Records [0, front) are long runs' partials: the group's (_append_records), then the list's
    from its front; the others are the group's, then the list's from its back."""
    r = w // num_hb
    is_front = r < front
    b = r - front
    in_group = tl.where(is_front, r < group_front, b < group_back)
    grouped = _group_records(ws_ptr, n, max_long_runs) + tl.where(is_front, r, group_cap + b) * _REC_FIELDS
    listed = ws_ptr + _REC * n + tl.where(is_front, r - group_front, n - 1 - (b - group_back)) * _REC_FIELDS
    return tl.where(in_group, grouped, listed)


@triton.jit
def _load_record(ws_ptr, n, max_long_runs, w, end, num_hb, front, group_front, group_back, group_cap):
    """(slot, key, position, run start, run end) of item w's record; zeros from item `end` on."""
    rec = _record_address(ws_ptr, n, max_long_runs, w, num_hb, front, group_front, group_back, group_cap)
    live = w < end
    return (
        tl.load(rec, mask=live, other=0),
        tl.load(rec + 1, mask=live, other=0),
        tl.load(rec + 2, mask=live, other=0),
        tl.load(rec + 3, mask=live, other=0),
        tl.load(rec + 4, mask=live, other=0),
    )


@triton.jit
def _prefetch_first_rows(ids_ptr, grad_ptr, main_grad_ptr, num_embeddings, hidden, prefetch_tokens, grad_dim1, grad_stride0,
                         grad_stride1, main_grad_stride, masked_ptr, n, BLOCK_H: tl.constexpr, EVICT_LAST: tl.constexpr,
                         MASKED: tl.constexpr, KEPT: tl.constexpr):
    """Prefetch into L2 the (position, H block) pieces of grad and of main_grad at the position's id, for positions
    [0, prefetch_tokens), 32 pieces per program from program 0 on: a hint, no data comes back.

    The merge's group (_append_records) puts those positions' records first, so the first
    programs after the wait take them, from L2. KEPT (the masked route): ids_ptr is _compact_kernel's
    output and the pieces are those of its first kept tokens (key i at i, position at n + i, i below
    its m), which the group holds there. These loads come before the wait, and with PDL the
    compaction may not have ended (each kernel lets the next launch before its own wait), so every
    index read here is clamped into range: a stale one costs a useless hint, never a wrong address.
    """
    num_hb = tl.cdiv(hidden, BLOCK_H)
    v = tl.program_id(0) * 32 + tl.arange(0, 32)
    take = v < prefetch_tokens * num_hb
    if tl.program_id(0) * 32 < prefetch_tokens * num_hb:
        p = v // num_hb
        col = (v % num_hb) * BLOCK_H
        width = tl.minimum(hidden - col, BLOCK_H)
        if KEPT:
            take = take & (p < _kept_count(ids_ptr, n))
        key = _load_keys(ids_ptr, p, take, num_embeddings, -1)  # every id in range; padding rows are prefetched too
        if KEPT:
            p = tl.minimum(tl.maximum(tl.load(ids_ptr + n + p, mask=take, other=0).to(tl.int32), 0), n - 1)
        keep = take & (key >= 0)
        gsize: tl.constexpr = grad_ptr.dtype.element_ty.primitive_bitwidth // 8
        msize: tl.constexpr = main_grad_ptr.dtype.element_ty.primitive_bitwidth // 8
        g_addr = (grad_ptr + _grad_row(p, grad_dim1, grad_stride0, grad_stride1) + col).to(tl.int64)
        m_addr = (main_grad_ptr + key.to(tl.int64) * main_grad_stride + col).to(tl.int64)
        read = take
        if MASKED:  # a masked row is never read
            read = take & (tl.load(masked_ptr + p, mask=take, other=1) == 0)
        _prefetch_l2(g_addr, (width * gsize).to(tl.int32), read, (EVICT_LAST & 1) != 0)
        _prefetch_l2(m_addr, (width * msize).to(tl.int32), keep, (EVICT_LAST & 2) != 0)


@triton.jit(noinline=True)
def _lone_tokens(ws_ptr, n, ids_ptr, counts_ptr, grad_ptr, main_grad_ptr, num_embeddings, padding_idx, hidden, lone_tokens,
                 lone_programs, count_programs, grad_dim1, grad_stride0, grad_stride1, grad_stride_h, main_grad_stride,
                 masked_ptr, MAIN_ROUNDING: tl.constexpr, BLOCK_H: tl.constexpr, MASKED: tl.constexpr, KEPT: tl.constexpr):
    """Lone program pid adds the rows of positions pid, pid + lone_programs, ... below lone_tokens whose id occurs once
    (KEPT, the masked route: of the kept tokens pid, pid + lone_programs, ... below lone_tokens and m, ids_ptr being
    _compact_kernel's output: key i at i, position at n + i; the compaction ended before the counts, see below).

    A lone token's run is one partial of one row: main_grad[id] = round(main_grad[id] + (0 + row)),
    the bits of _partial's copy-add. It needs no plan, only the counts: this waits until every
    counting program has counted (_count_ids, _LONE_COUNTED, acquire). The merge publishes no
    record for these tokens. These programs write main_grad without waiting on the plan, which
    is safe: with PDL the partials kernel launches only after the counting programs' own wait,
    so the block sort, and before it every earlier kernel, has finished; no other program
    writes these rows. (noinline: inlined, the partials kernel took 190 registers, not 135.)
    """
    _wait_for(ws_ptr + _LONG * n + _LONE_COUNTED, count_programs)
    if KEPT:
        lone_tokens = tl.minimum(lone_tokens, _kept_count(ids_ptr, n))
    for i in range(tl.program_id(0), lone_tokens, lone_programs):
        key = _load_keys(ids_ptr, i, True, num_embeddings, padding_idx)
        p = tl.load(ids_ptr + n + i).to(tl.int32) if KEPT else i
        count = tl.load(counts_ptr + key, mask=key >= 0, other=0)
        grad_row = grad_ptr + _grad_row(p, grad_dim1, grad_stride0, grad_stride1)
        main_row = main_grad_ptr + key.to(tl.int64) * main_grad_stride
        read_h = _read_h(masked_ptr, p, True, hidden, MASKED)
        for col in range(0, tl.where(count == 1, hidden, 0), BLOCK_H):
            cols = col + tl.arange(0, BLOCK_H)
            g = tl.load(grad_row + cols * grad_stride_h, mask=cols < read_h, other=0.0)
            acc = tl.zeros([BLOCK_H], dtype=tl.float32) + g.to(tl.float32)  # 0 + row: -0 becomes +0, as in PyTorch
            _add_to_row(main_row, cols, cols < hidden, acc, MAIN_ROUNDING)


@triton.jit
def _partial(
    ws_ptr, grad_ptr, main_grad_ptr, partials_ptr, n, hidden, grad_dim1, grad_stride0, grad_stride1, grad_stride_h,
    main_grad_stride,
    s,  # the slot
    my_hb,  # the H block
    key,  # its key
    pos0,  # its position
    run_start,  # its run's first slot
    run_end,  # sort path: one past its run's last slot
    arrivals,  # sort path: the arrival counters, one per slot
    flags_ptr,  # SKIP_MIN > 0: per long-run partial and H block, whether it is nonzero
    masked_ptr,  # MASKED: uint8 [n] in position order, nonzero where the token's grad row is taken as +0 and not read
    FEATURE_PATH: tl.constexpr,
    SPAN: tl.constexpr,
    CHUNK_SIZE: tl.constexpr,
    GRAD_ROUNDING: tl.constexpr,
    MAIN_ROUNDING: tl.constexpr,
    BLOCK_H: tl.constexpr,
    SCRATCH_POLICY: tl.constexpr,  # L2 eviction policy of the scratch stores: "evict_last" or "" (none)
    SKIP_MIN: tl.constexpr,  # sort path: a run of this many partials or more flags each (0: none)
    PLAN_POLICY: tl.constexpr,  # sort path: L2 eviction policy of the other positions' loads: "evict_last" or "" (none)
    MASKED: tl.constexpr,  # accumulate's masked: rows of masked positions are not loaded (their +0 changes no sum)
):
    """The partial that starts at slot s, over H block my_hb (if s starts one): finished, or to the scratch buffer.

    Sort path: a long run's partial, once stored, counts itself in the run's
    arrival counter; the CTA barrier and the counter's release atomic publish the stores to the
    long-run kernel, which reads the counter with acquire semantics (as CUTLASS's semaphore).
    In a run of SKIP_MIN partials or more it also stores its flag: 0 where its sum (of more
    than one row) is all +0 over the H block, and then it stores no sum (_fold skips it).
    """
    keys_ptr = ws_ptr + _KEYS * n
    pos_ptr = ws_ptr + _POS * n
    is_first = s == run_start
    if FEATURE_PATH:
        chunk = pos0 // CHUNK_SIZE
        prev_chunk = tl.load(pos_ptr + s - 1, mask=s > run_start, other=-CHUNK_SIZE) // CHUNK_SIZE
        active = (key >= 0) & (is_first | (prev_chunk != chunk))
        k = tl.load(ws_ptr + _AUX * n + s)
        # The partial's slots are s .. s + nrows - 1: sorted by (key, position), a chunk's
        # tokens of one key are consecutive. One vector load of the next SPAN keys and
        # positions (a lane each) counts them and finds the key after them.
        t = tl.arange(0, SPAN)
        key_t = tl.load(keys_ptr + s + t, mask=s + t < n, other=-2)
        pos_t = tl.load(pos_ptr + s + t, mask=s + t < n, other=0)
        nrows = tl.sum(((key_t == key) & (pos_t // CHUNK_SIZE == chunk)).to(tl.int32), axis=0)
        after = tl.sum(tl.where(t == nrows, key_t, 0), axis=0)  # the key of slot s + nrows, if nrows < SPAN
        beyond = tl.load(keys_ptr + s + SPAN, mask=s + SPAN < n, other=-2)  # if nrows == SPAN
        is_last = tl.where(nrows < SPAN, after, beyond) != key
    else:
        chunk = 0
        active = (key >= 0) & ((s - run_start) % SPAN == 0)
        k = (s - run_start) // SPAN
        nrows = tl.minimum(run_end - s, SPAN)
        is_last = run_end <= s + SPAN
    row = _partial_row(run_start, k, FEATURE_PATH, SPAN)
    finish = active & is_first & is_last  # a run of one partial: add it to main_grad here
    in_long_run = active & ~(is_first & is_last)  # else: to the scratch buffer (embwgrad_core.partial_row)
    main_row = main_grad_ptr + key.to(tl.int64) * main_grad_stride
    for hb in range(my_hb, my_hb + active.to(tl.int32)):  # once, or not at all
        cols = hb * BLOCK_H + tl.arange(0, BLOCK_H)
        # cols < (flag ? H : 0), not live_h & flag: the interpreter mistypes scalar & vector masks.
        old = tl.load(main_row + cols, mask=cols < tl.where(finish, hidden, 0), other=0.0).to(tl.float32)
        if FEATURE_PATH:
            grad_row = _grad_row(pos0, grad_dim1, grad_stride0, grad_stride1)
            g = tl.load(grad_ptr + grad_row + cols * grad_stride_h, mask=cols < _read_h(masked_ptr, pos0, True, hidden, MASKED), other=0.0)
            acc = tl.zeros([BLOCK_H], dtype=tl.float32) + g.to(tl.float32)  # 0 + row: -0 becomes +0, as in PyTorch
            # The other rows _FEATURE_BATCH at a time, in order; their positions come out of
            # pos_t (a reduction across the warp's lanes, cheaper than a load).
            for t0 in range(1, nrows, _FEATURE_BATCH):
                for u in tl.static_range(_FEATURE_BATCH):
                    take = t0 + u < nrows
                    pos_u = tl.sum(tl.where(t == t0 + u, pos_t, 0), axis=0)
                    grad_row = _grad_row(pos_u, grad_dim1, grad_stride0, grad_stride1)
                    g = tl.load(grad_ptr + grad_row + cols * grad_stride_h, mask=cols < _read_h(masked_ptr, pos_u, take, hidden, MASKED),
                                other=0.0)
                    acc += g.to(tl.float32)  # acc is never -0, so adding +0 for a row not taken leaves it
            gw = _round(acc, GRAD_ROUNDING)
        else:
            grad_row = _grad_row(pos0, grad_dim1, grad_stride0, grad_stride1)
            g = tl.load(grad_ptr + grad_row + cols * grad_stride_h, mask=cols < _read_h(masked_ptr, pos0, True, hidden, MASKED), other=0.0)
            acc = tl.zeros([BLOCK_H], dtype=tl.float32) + g.to(tl.float32)  # 0 + row: -0 becomes +0, as in PyTorch
            gw = acc  # one row: already a value of grad's dtype, so rounding would change nothing
            nonzero = tl.full((), 1, tl.int32)  # a partial of one row counts as nonzero: no reduction on the copy-add's path
            if nrows > 1:
                for t in tl.static_range(1, SPAN):
                    take = t < nrows
                    pos_t = tl.load(pos_ptr + s + t, mask=take, other=0, eviction_policy=PLAN_POLICY)
                    grad_row = _grad_row(pos_t, grad_dim1, grad_stride0, grad_stride1)
                    g = tl.load(grad_ptr + grad_row + cols * grad_stride_h, mask=cols < _read_h(masked_ptr, pos_t, take, hidden, MASKED),
                                other=0.0)
                    acc += g.to(tl.float32)  # acc is never -0, so adding +0 for a row not taken leaves it
                gw = _round(acc, GRAD_ROUNDING)
                if SKIP_MIN > 0:
                    nonzero = tl.max((acc.to(tl.uint32, bitcast=True) != 0).to(tl.int32), axis=0)  # (columns past H summed +0)
        # A run of one partial: +0 + s (sort path) and +0 + round(s) (feature path) both round to round(s).
        new = _round(old + gw, MAIN_ROUNDING)
        tl.store(main_row + cols, new.to(main_grad_ptr.dtype.element_ty), mask=cols < tl.where(finish, hidden, 0))
        stored = in_long_run
        if SKIP_MIN > 0:  # (predicated, no branch: a branch here cost 8192 uniform ids 1.2 us, NOTES v29)
            flagged = in_long_run & (run_end - run_start > (SKIP_MIN - 1) * SPAN)  # a run of SKIP_MIN partials or more
            tl.store(_flag(flags_ptr, n, hb, row, SPAN), nonzero, mask=flagged)
            # A zero partial is not stored only where its flag says so: a run of fewer partials
            # has no flags and its fold reads them all (NOTES v49: unstored, it read stale scratch).
            stored = in_long_run & ((nonzero != 0) | ~flagged)
        tl.store(partials_ptr + row.to(tl.int64) * hidden + cols, _to_scratch(acc, gw, partials_ptr), mask=cols < tl.where(stored, hidden, 0),
                 eviction_policy=SCRATCH_POLICY)
        if not FEATURE_PATH:
            if in_long_run:
                tl.debug_barrier()  # every thread's part of the partial is stored before the release
                tl.atomic_add(arrivals + run_start, 1, sem="release", scope="gpu")
    if FEATURE_PATH:  # (the sort path's plan lists its long runs)
        if in_long_run & is_last & (my_hb == 0):
            entry = tl.atomic_add(ws_ptr + _LONG * n, 1)
            tl.store(_listed(ws_ptr, n, entry), run_start)
            tl.store(_listed(ws_ptr, n, entry) + 1, k + 1)


@triton.jit
def _fold_step(acc, part, FEATURE_PATH: tl.constexpr, GRAD_ROUNDING: tl.constexpr):
    """One partial folded in: feature path, rounded and rounded again (PyTorch's per-chunk sums); sort path, added."""
    if FEATURE_PATH:
        return _round(acc + _round(part, GRAD_ROUNDING), GRAD_ROUNDING)
    else:
        return acc + part


@triton.jit
def _fold(partials_ptr, run_start, num_partials, hidden, cols, live_h, FEATURE_PATH: tl.constexpr, SPAN: tl.constexpr,
          GRAD_ROUNDING: tl.constexpr, BATCH: tl.constexpr, CACHE: tl.constexpr, STAGES: tl.constexpr, flags_ptr,
          SKIP_MIN: tl.constexpr, SKIP_BLOCK: tl.constexpr, SKIP_WIDE: tl.constexpr):
    """A long run's partials over these columns, folded in order and rounded to grad's dtype (as fp32).

    _fold_span sums them. SKIP_MIN > 0 (sort path): a run of at least SKIP_MIN partials has a
    flag per partial at flags_ptr + partial_row (_flag; _partial: 0 where the partial is
    all +0 over these columns' H block, and then not stored). If none is 0 the run is summed as
    without flags; else zero partials add nothing (the sum is never -0, so adding +0 leaves it)
    and are not loaded (ZERO_SKIP_MIN_PARTIALS). The flags are checked SKIP_WIDE * SKIP_BLOCK at
    a time (one vector load; ZERO_SKIP_WIDE), first only until a block with a 0 turns up, then
    to skip the blocks of zeros; in the others each SKIP_BLOCK's nonzero partials are found in
    its flags (_fold_nonzero).
    """
    acc = tl.zeros(cols.shape, dtype=tl.float32)
    if SKIP_MIN > 0:
        tl.static_assert(not FEATURE_PATH, "flags mark the sort path's partials")
        WIDE: tl.constexpr = SKIP_BLOCK * SKIP_WIDE
        # First whether a block of flags holds a 0: with none (a long run of nonzero partials, as
        # in Zipf ids) the run is summed in one span, its pipeline (STAGES) never restarted.
        zero_blocks = 0
        if num_partials >= SKIP_MIN:
            k0 = 0
            while (k0 < num_partials) & (zero_blocks == 0):  # (a masked run: only its first block)
                flags = _flags_block(flags_ptr, run_start, k0, num_partials, SPAN, WIDE, 1)
                zero_blocks = (tl.min(flags, axis=0) == 0).to(tl.int32)
                k0 += WIDE
        if zero_blocks == 0:
            acc = _fold_span(acc, partials_ptr, run_start, 0, num_partials, hidden, cols, live_h, SPAN, GRAD_ROUNDING, BATCH, CACHE,
                             STAGES, False)
        else:
            for w0 in range(0, num_partials, WIDE):
                if tl.max(_flags_block(flags_ptr, run_start, w0, num_partials, SPAN, WIDE, 0), axis=0) != 0:
                    for k0 in range(w0, tl.minimum(w0 + WIDE, num_partials), SKIP_BLOCK):
                        acc = _fold_nonzero(acc, partials_ptr, run_start, k0, num_partials, hidden, cols, live_h, SPAN, GRAD_ROUNDING, BATCH,
                                            CACHE, flags_ptr, SKIP_BLOCK)
    else:
        acc = _fold_span(acc, partials_ptr, run_start, 0, num_partials, hidden, cols, live_h, SPAN, GRAD_ROUNDING, BATCH, CACHE,
                         STAGES, FEATURE_PATH)
    if not FEATURE_PATH:
        acc = _round(acc, GRAD_ROUNDING)
    return acc


@triton.jit
def _fold_nonzero(acc, partials_ptr, run_start, k0, num_partials, hidden, cols, live_h, SPAN: tl.constexpr, GRAD_ROUNDING: tl.constexpr,
                  BATCH: tl.constexpr, CACHE: tl.constexpr, flags_ptr, SKIP_BLOCK: tl.constexpr):
    """Sort path: acc with the nonzero partials among [k0, k0 + SKIP_BLOCK) of a flagged run folded in, in order.

    The block's flags in one vector load; the u-th nonzero partial is the one whose rank among
    them (a cumulative sum) is u, so BATCH of them are found in registers and loaded at once,
    then added in order. Past the last one the load is masked: +0, which leaves the sum (never -0).
    """
    ks = k0 + tl.arange(0, SKIP_BLOCK)
    nonzero = _flags_block(flags_ptr, run_start, k0, num_partials, SPAN, SKIP_BLOCK, 0) != 0
    rank = tl.cumsum(nonzero.to(tl.int32), axis=0) - 1
    count = tl.sum(nonzero.to(tl.int32), axis=0)
    for g in range(0, count, BATCH):
        for u in tl.static_range(BATCH):
            k = tl.min(tl.where(nonzero & (rank == g + u), ks, num_partials), axis=0)  # num_partials: none left
            live = (cols < tl.where(k < num_partials, hidden, 0)) & live_h
            part = _load_partial(partials_ptr, run_start, tl.minimum(k, num_partials - 1), hidden, cols, live, SPAN, CACHE, False)
            acc = _fold_step(acc, part, False, GRAD_ROUNDING)
    return acc


@triton.jit
def _flags_block(flags_ptr, run_start, k0, num_partials, SPAN: tl.constexpr, SKIP_BLOCK: tl.constexpr, PAST: tl.constexpr):
    """The flags of partials [k0, k0 + SKIP_BLOCK) of the run, one vector load; past its last partial, PAST."""
    ks = k0 + tl.arange(0, SKIP_BLOCK)
    return tl.load(flags_ptr + _partial_row(run_start, ks, False, SPAN), mask=ks < num_partials, other=PAST)


@triton.jit
def _fold_span(acc, partials_ptr, run_start, k_lo, k_end, hidden, cols, live_h, SPAN: tl.constexpr, GRAD_ROUNDING: tl.constexpr,
               BATCH: tl.constexpr, CACHE: tl.constexpr, STAGES: tl.constexpr, FEATURE_PATH: tl.constexpr):
    """acc with partials [k_lo, k_end) of a run folded in, in order (feature path: each rounded, as PyTorch's per-chunk sums).

    BATCH partials' loads are in flight at once, then FOLD_TAIL at a time for the rest; the adds
    stay one at a time, in order. Past k_end the last one is loaded again (always an address,
    no predicate, so all of a step's loads issue before its first add) and dropped. STAGES > 0
    (sort path only): the same sum as _fold_piped's loop, BATCH partials a stage.
    """
    if STAGES > 0:
        tl.static_assert(not FEATURE_PATH, "_fold_piped sums the sort path's partials")
        return _fold_piped(acc, partials_ptr, run_start, k_lo, k_end, hidden, cols, live_h, SPAN, BATCH, STAGES, CACHE)
    full = k_lo + (k_end - k_lo) // BATCH * BATCH
    for k0 in range(k_lo, full, BATCH):
        for u in tl.static_range(BATCH):
            k = tl.minimum(k0 + u, k_end - 1)  # (always k0 + u: a tensor under the interpreter too)
            part = _load_partial(partials_ptr, run_start, k, hidden, cols, live_h, SPAN, CACHE, FEATURE_PATH)
            acc = _fold_step(acc, part, FEATURE_PATH, GRAD_ROUNDING)
    # The rest FOLD_TAIL at a time, so a run pays at most FOLD_TAIL - 1 dropped steps, not
    # BATCH - 1 (most long runs have a few partials: NOTES v17 item 8).
    TAIL: tl.constexpr = BATCH if BATCH < FOLD_TAIL else FOLD_TAIL
    for k0 in range(full, k_end, TAIL):
        for u in tl.static_range(TAIL):
            k = tl.minimum(k0 + u, k_end - 1)
            part = _load_partial(partials_ptr, run_start, k, hidden, cols, live_h, SPAN, CACHE, FEATURE_PATH)
            acc = tl.where(k0 + u < k_end, _fold_step(acc, part, FEATURE_PATH, GRAD_ROUNDING), acc)
    return acc


@triton.jit
def _load_partial(partials_ptr, run_start, k, hidden, cols, live_h, SPAN: tl.constexpr, CACHE: tl.constexpr, FEATURE_PATH: tl.constexpr):
    """Partial k of the run over these columns, as fp32."""
    row = _partial_row(run_start, k, FEATURE_PATH, SPAN)
    return _from_scratch(tl.load(partials_ptr + row.to(tl.int64) * hidden + cols, mask=live_h, other=0, cache_modifier=CACHE))


@triton.jit
def _fold_piped(acc, partials_ptr, run_start, k_lo, k_end, hidden, cols, live_h, SPAN: tl.constexpr, ROWS: tl.constexpr,
                STAGES: tl.constexpr, CACHE: tl.constexpr):
    """Sort path: _fold_span's sum as one loop that Triton's pipeliner takes (num_stages): ROWS partials an
    iteration, each copied to shared memory by cp.async STAGES - 1 iterations ahead, so that a long
    run's fold keeps (STAGES - 1) * ROWS partials in flight without registers for them (a fold is
    one chain of adds; _fold_span waits for each batch's loads before it asks for the next batch's).
    Partials from k_end on load as +0: the sum starts at +0 and is never -0, so adding +0
    leaves it.
    """
    for k0 in tl.range(k_lo, k_end, ROWS, num_stages=STAGES):
        for u in tl.static_range(ROWS):
            k = tl.minimum(k0 + u, k_end)  # (a tensor under the interpreter too; from k_end on, masked)
            row = _partial_row(run_start, k, False, SPAN)
            live = cols < tl.where(k < k_end, hidden, 0)
            acc += _from_scratch(tl.load(partials_ptr + row.to(tl.int64) * hidden + cols, mask=live & live_h, other=0,
                                         cache_modifier=CACHE))
    return acc


@triton.jit(noinline=True)
def _fold_runs(ws_ptr, partials_ptr, main_grad_ptr, flags_ptr, n, hidden, main_grad_stride, max_long_runs, num_hb, fid, folders,
               SPAN: tl.constexpr, GRAD_ROUNDING: tl.constexpr, MAIN_ROUNDING: tl.constexpr, FOLD_H: tl.constexpr,
               FOLD_BATCH: tl.constexpr, FOLD_STAGES: tl.constexpr, BLOCK_H: tl.constexpr, SKIP_MIN: tl.constexpr,
               SKIP_BLOCK: tl.constexpr, SKIP_WIDE: tl.constexpr):
    """Sort path, inside _partials_kernel: fold the listed long runs, (run, FOLD_H columns) items strided by `folders` programs.

    Each item waits until all the run's partials have arrived (num_partials * num_hb items of
    the partials kernel, counted with release atomics), reads the counter with acquire
    semantics, then folds in order, rounds and adds to main_grad. The long runs' partials come
    first among the records, and with PDL the folding programs right after the programs that
    take them (programs start in order): they wait little and fold while the other partials are
    summed. (First in the grid, they held 4 of an SM's 12 slots while waiting: 8192 Zipf ids
    101.5 against 96.2 us; NOTES v9.) Waiting cannot deadlock: the folders are a few programs
    per SM, and the partials they wait for are taken by programs that never wait.
    A function of its own (noinline), so that _partials_kernel keeps its registers (NOTES v3.1).
    """
    arrivals = _arrivals(ws_ptr, n, max_long_runs)
    chunks = tl.cdiv(hidden, FOLD_H)
    for f in range(fid, tl.load(ws_ptr + _LONG * n) * chunks, folders):
        e = f // chunks
        cols = (f % chunks) * FOLD_H + tl.arange(0, FOLD_H)
        live_h = cols < hidden
        run_start = tl.load(_listed(ws_ptr, n, e))
        num_partials = tl.load(_listed(ws_ptr, n, e) + 1)
        key = tl.load(ws_ptr + _KEYS * n + run_start)
        _wait_for(arrivals + run_start, num_partials * num_hb)
        acc = _fold(partials_ptr, run_start, num_partials, hidden, cols, live_h, False, SPAN, GRAD_ROUNDING, FOLD_BATCH, ".cg",
                    FOLD_STAGES, _flag(flags_ptr, n, (f % chunks) * FOLD_H // BLOCK_H, 0, SPAN), SKIP_MIN, SKIP_BLOCK, SKIP_WIDE)
        _add_to_row(main_grad_ptr + key.to(tl.int64) * main_grad_stride, cols, live_h, acc, MAIN_ROUNDING)


@triton.jit
def _long_runs_kernel(
    ws_ptr,  # int32 workspace: sorted keys, the long-run counter and list
    partials_ptr,  # [partial_buffer_rows, H]: partial sums of long runs, fp32 or bf16 bits (_to_scratch)
    main_grad_ptr,  # [V, H] bf16/fp16/fp32
    n,  # number of tokens
    hidden,  # H
    main_grad_stride,
    max_long_runs,  # entries of the long-run list
    partial_hb,  # sort path: H blocks of _partials_kernel (arrivals per partial)
    flags_ptr,  # SKIP_MIN > 0: int32, per long-run partial and H block of _partials_kernel, nonzero or not (_partial)
    FEATURE_PATH: tl.constexpr,
    SPAN: tl.constexpr,
    GRAD_ROUNDING: tl.constexpr,
    MAIN_ROUNDING: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BATCH: tl.constexpr,  # partials loaded per step
    PDL: tl.constexpr,  # launched with programmatic dependent launch
    STAGES: tl.constexpr,  # sort path: > 0, the sums pipelined over this many stages, BATCH partials each (_fold_piped); feature path: 0
    PARTIAL_BLOCK_H: tl.constexpr,  # _partials_kernel's BLOCK_H (a multiple of BLOCK_H)
    SKIP_MIN: tl.constexpr,  # sort path: runs of this many partials or more skip their zero partials (_fold; 0: none)
    SKIP_BLOCK: tl.constexpr,
    SKIP_WIDE: tl.constexpr,  # blocks of flags a fold checks at once (ZERO_SKIP_WIDE)
):
    """Fold each listed run's partials in order, round, add to main_grad; programs stride the list.

    Sort path with PDL: the plan listed the long runs, so the list is final when this kernel's
    programs start (the partials kernel lets them launch after its own wait on the plan). A
    program with no run exits at once; one with a run waits on that run's arrival counter, not on
    the whole partials kernel, then folds it. Program (0, 0) always waits on the partials kernel,
    so this grid ends after that one's, as every kernel after it assumes.
    """
    early = PDL and not FEATURE_PATH
    if early:
        gdc_launch_dependents()
    else:
        _pdl_enter(PDL)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    live_h = cols < hidden
    arrivals = _arrivals(ws_ptr, n, max_long_runs)
    for e in range(tl.program_id(0), tl.load(ws_ptr + _LONG * n), tl.num_programs(0)):
        run_start = tl.load(_listed(ws_ptr, n, e))
        num_partials = tl.load(_listed(ws_ptr, n, e) + 1)
        key = tl.load(ws_ptr + _KEYS * n + run_start)
        if early:  # this run's partials are in once its arrival counter is full
            _wait_for(arrivals + run_start, num_partials * partial_hb)
        acc = _fold(partials_ptr, run_start, num_partials, hidden, cols, live_h, FEATURE_PATH, SPAN, GRAD_ROUNDING, BATCH, "", STAGES,
                    _flag(flags_ptr, n, tl.program_id(1) * BLOCK_H // PARTIAL_BLOCK_H, 0, SPAN), SKIP_MIN, SKIP_BLOCK, SKIP_WIDE)
        _add_to_row(main_grad_ptr + key.to(tl.int64) * main_grad_stride, cols, live_h, acc, MAIN_ROUNDING)
    if early:
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            gdc_wait()


# ----------------------------------------------------------------------------- launch helpers


@dataclass(frozen=True)
class _Config:
    """Launch parameters for one problem: the frontend's one heuristics helper (_config) fills it."""

    path: str
    sort: str  # "merge" (sort path, _block_sort_kernel + _merge_rank_kernel), "rank" (feature path), "torch" (torch.sort)
    merge_block: int  # tokens per block of the merge sort
    merge_block_i: int  # tokens of a block ranked per _block_sort_kernel program
    merge_tile: int  # _block_sort_kernel's comparison tile
    merge_blocks: int  # power of two >= cdiv(n, merge_block)
    merge_u: int  # tokens per _merge_rank_kernel program
    merge_warps: int
    merge_window: int  # keys per window whose last key the merge compares first (0: plain binary searches)
    first_tokens: int  # merge sort: the records of positions [0, this) come first (a multiple of merge_block; 0: none)
    l2_prefetch_tokens: int  # merge sort with PDL: their rows are prefetched into L2 while the plan is made (0: none)
    prefetch_evict_last: int  # those prefetched lines with L2 priority evict_last: 1 grad's, 2 main_grad's, 3 both (PREFETCH_EVICT_LAST)
    lone_tokens: int  # merge sort: lone tokens of positions [0, this) are added before the plan (LONE_TOKENS; 0: none)
    lone_per_program: int  # positions per lone program (LONE_PER_PROGRAM)
    block_i: int  # _rank_kernel tiles
    block_j: int
    rank_warps: int  # _rank_kernel's num_warps
    bf16_scratch: bool  # feature path, bf16 grad: long runs' partials stored as bf16 bits (_to_scratch; BF16_SCRATCH_MIN_TOKENS)
    runs_block: int
    block_h: int  # _partials_kernel columns per program
    partial_warps: int
    partial_maxnreg: int | None  # ptxas register cap of _partials_kernel (None: the compiler's choice)
    partial_programs: int  # sort path: _partials_kernel's programs, which stride the partials
    prefetch: bool  # sort path: _partials_kernel loads the next item's record before this item's rows
    record_hint: bool  # sort path: ... after them (RECORD_HINT)
    l1_hint: bool  # with record_hint, ask the record into L1 before the rows (RECORD_L1_HINT; probes turn it on)
    tail_programs: int  # sort path: its last programs (but the folders), which take the last items, one each
    fold_programs: int  # sort path: _partials_kernel programs that fold the long runs (0, and on the feature path: _long_runs_kernel does)
    fold_h: int  # columns of one of their items
    fold_batch: int  # partials they load at once
    pdl: bool  # launch with programmatic dependent launch (Hopper and later, not the interpreter)
    long_block_h: int
    long_programs: int
    long_batch: int  # partials loaded at once by _long_runs_kernel
    scratch_evict_last: bool  # long runs' partials stored with L2 priority evict_last (SCRATCH_EVICT_LAST)
    plan_evict_last: bool  # merge sort: the sorted positions and records kept in L2 the same way (PLAN_EVICT_LAST)
    long_warps: int
    max_long_runs: int
    count_aggregate: bool  # merge sort with lone tokens: one atomic per group of equal keys in the count (COUNT_AGGREGATE)
    fold_stages: int  # sort path: > 0, the folders' sums pipelined over this many stages, fold_batch partials each (_fold_piped)
    long_stages: int  # sort path: the same for _long_runs_kernel, long_batch partials each (LONG_FOLD)
    zero_skip: int  # sort path: runs of this many partials or more skip their zero partials (ZERO_SKIP_MIN_PARTIALS; 0: none)
    skip_block: int  # their flags read at once (ZERO_SKIP_BLOCK)
    skip_wide: int  # blocks of their flags checked at once (ZERO_SKIP_WIDE)
    masked_reads: bool = True  # with masked, the partials kernel reads its mask bytes (probes: False reads masked rows too)
    compact: bool = True  # with masked on the merge sort, the masked route (_compact_stage; probes: False, the deferred records)
    kept_prefetch: bool = True  # the masked route: the first kept tokens' rows prefetched (_prefetch_first_rows; probes: False, none)
    # The masked route: the first kept tokens of ids that occur once added before the plan (_lone_tokens). Not
    # beside the partials kernel's folders: H200, graph replay, Megatron's TP8 input masked, 96 partials programs
    # per SM (NOTES v58), with / without them: 16384 (folders) 56.3 / 52.9 us; 32768 (no folders) 58.7 / 61.9,
    # but with folders 66.4. The interpreter keeps both, so that its tests cover lone tokens beside folders.
    kept_lone: bool = True


@lru_cache(maxsize=None)
def _device_traits(device_index: int) -> tuple[int, bool]:
    """(SMs, whether it has programmatic dependent launch: compute capability 9.0 or later)."""
    props = torch.cuda.get_device_properties(device_index)
    return props.multi_processor_count, props.major >= 9


@lru_cache(maxsize=256)
def _config(problem: Problem, path: str, interpret: bool, sms: int = 4, pdl: bool = False, zero_rows: bool = False,
            masked: bool = False) -> _Config:
    """The launch parameters for a GPU of sms SMs (zero_rows: accumulate's; masked: whether accumulate's masked is given,
    whose route keeps the merge sort to more tokens, embwgrad_core.merge_sorted); the measured choices are in benchmarks/NOTES.md."""
    n, hidden = problem.num_tokens, problem.hidden
    feature = path == FEATURE
    block_h = min(1024, triton.next_power_of_2(hidden))
    long_block_h = min(128, block_h)
    long_hb = triton.cdiv(hidden, long_block_h)
    max_long_runs = max(1, n // 2 if feature else n // (NROWS + 1))
    block_i, block_j = INTERPRET_RANK_TILES if interpret else RANK_TILES
    mblock = merge_block(n)
    mblocks = triton.next_power_of_2(triton.cdiv(n, mblock))
    tiles = merge_tiles(mblock)
    first_tokens = min(n, FIRST_TOKENS) // mblock * mblock  # whole merge blocks
    sort = "rank" if feature else "merge" if merge_sorted(n, masked) else "torch"
    per_sm = next((programs for bound, programs in SMALL_PARTIAL_PROGRAMS_PER_SM if n <= bound), PARTIAL_PROGRAMS_PER_SM)
    if masked and sort == "merge":  # the masked route (_compact_route: cfg.compact is True here)
        per_sm = min(per_sm, masked_partial_programs_per_sm(n))
    fold_programs = FOLD_PROGRAMS_PER_SM * sms if not feature and n <= FOLDERS_MAX_TOKENS else 0
    return _Config(
        path=path,
        sort=sort,
        merge_block=mblock,
        merge_block_i=mblock if interpret else tiles.block_i,
        merge_tile=mblock if interpret else tiles.tile,
        merge_blocks=mblocks,
        merge_u=max(1, (8192 if interpret else SMALL_MERGE_LANES if n <= SMALL_MERGE_LANES_MAX_TOKENS else tiles.lanes) // mblocks),
        merge_warps=4,
        merge_window=MERGE_WINDOW if n <= MERGE_WINDOW_MAX_TOKENS else 0,
        first_tokens=first_tokens,
        l2_prefetch_tokens=rows_ahead(first_tokens, hidden),  # (fewer above H = 7168: ROWS_AHEAD_ELEMENTS)
        prefetch_evict_last=PREFETCH_EVICT_LAST,
        lone_tokens=0 if feature or n > MERGE_SORT_MAX_TOKENS else n // 2 if interpret else min(n, next((t for bound, t in LONE_TOKENS if n <= bound), 0)),
        lone_per_program=LONE_PER_PROGRAM,
        block_i=block_i,
        block_j=block_j,
        rank_warps=RANK_WARPS,
        bf16_scratch=feature and problem.grad_dtype == "bfloat16" and n >= BF16_SCRATCH_MIN_TOKENS,
        runs_block=1024,
        block_h=block_h,
        partial_warps=1,
        partial_maxnreg=None if feature else PARTIAL_MAXNREG,
        partial_programs=per_sm * sms,
        prefetch=True,
        record_hint=RECORD_HINT,
        l1_hint=RECORD_L1_HINT,
        tail_programs=0 if feature else TAIL_PROGRAMS_PER_SM * sms,
        fold_programs=fold_programs,
        fold_h=256,
        fold_batch=16,
        pdl=pdl and not interpret,
        long_block_h=long_block_h,
        # Programs along the run list: an empty list costs ~1 us less at 64 than at 146, and a
        # long list (large n) wants more programs, each folding fewer runs one after another.
        long_programs=max(1, min(max_long_runs, max(64, min(4096 // long_hb, n // 128)))),
        long_batch=32 if feature else LONG_FOLD[1],
        scratch_evict_last=SCRATCH_EVICT_LAST,
        plan_evict_last=PLAN_EVICT_LAST,  # (used where the merge sort makes the plan: measured there)
        long_warps=1,
        max_long_runs=max_long_runs,
        count_aggregate=COUNT_AGGREGATE,
        fold_stages=0,
        long_stages=0 if feature else LONG_FOLD[0],
        # The interpreter's tests are small: there runs of 2 partials or more, 4 flags a block.
        zero_skip=0 if feature or not zero_rows else 2 if interpret else ZERO_SKIP_MIN_PARTIALS,
        skip_block=4 if interpret else ZERO_SKIP_BLOCK,
        skip_wide=2 if interpret else ZERO_SKIP_WIDE,
        kept_lone=interpret or fold_programs == 0,
    )


class _Launcher:
    """Launches a call's kernels through Triton's generic launch (kernel[grid](...)), in order,
    and keeps what _Replay needs: each CompiledKernel with its grid and arguments (constexprs
    included, in signature order), and the scratch tensors the stages allocated (empty).
    """

    def __init__(self):
        self.recorded = []  # (CompiledKernel or None, grid, every argument in signature order)
        self.scratch = []

    def empty(self, *shape, dtype, device) -> torch.Tensor:
        """torch.empty, kept: a replay allocates its twin afresh (its contents are never read before written)."""
        t = torch.empty(*shape, dtype=dtype, device=device)
        self.scratch.append(t)
        return t

    def __call__(self, kernel, grid, args, num_warps, maxnreg=None, pdl=False, **constexprs):
        grid = tuple(grid) + (1,) * (3 - len(grid))
        constexprs["PDL"] = pdl
        # No FMA contraction: every sum's rounding is PyTorch's only if no multiply-add is
        # ever fused into one rounding. The kernels have no float multiply today (the SASS
        # of every variant is the same either way, Triton 3.6), so this pins the arithmetic
        # against a later edit or Triton's default (which Triton 3.9 warns will change).
        options = {"num_warps": num_warps, "enable_fp_fusion": False}
        if pdl:
            options["launch_pdl"] = True
        if maxnreg is not None:
            options["maxnreg"] = maxnreg
        compiled = kernel[grid](*args, **options, **constexprs)
        self.recorded.append((compiled, grid, (*args, *(constexprs[name] for name in kernel.arg_names[len(args) :]))))


class _Replay:
    """One call's launches, replayed by every later call of its _call_key.

    Triton's generic launch binds and specialises every argument in Python, 15-40 us of host
    time per kernel on the H200 machine, and the stages' own Python (the config, the grids, the
    integer arguments) adds more: together more than the GPU time of a call for n <= 8192. All
    of it is fixed by _call_key but the tensors: the caller's ids, grad, main_grad and masked, and the
    scratch the stages allocate. So the first call of a key records its launches (_Launcher),
    and a later call allocates the same scratch and launches the same CompiledKernels with the
    same arguments, its own tensors in their places, as Triton's fused-softmax tutorial
    launches a compiled kernel. Only calls whose device work is all Triton launches are
    replayed (not the torch.sort route above MERGE_SORT_MAX_TOKENS, whose sort is torch's).
    """

    def __init__(self, launcher: _Launcher, ids, grad, main_grad, copy_grad: bool, masked=None):
        slot = {id(t): i for i, t in enumerate((ids, grad, main_grad, masked, *launcher.scratch)) if t is not None}
        self.scratch = [(tuple(t.shape), t.dtype) for t in launcher.scratch]
        self.copy_grad = copy_grad  # grad's strides need the contiguous copy the stages made
        self.launches = []  # (CompiledKernel, grid, arguments with None for tensors, ((index, slot), ...))
        for compiled, grid, args in launcher.recorded:
            if compiled is None:
                raise ValueError("a launch returned no CompiledKernel")
            tensors = tuple((i, slot[id(a)]) for i, a in enumerate(args) if isinstance(a, torch.Tensor))  # KeyError: another tensor
            self.launches.append((compiled, grid, [None if isinstance(a, torch.Tensor) else a for a in args], tensors))

    @property
    def kernels(self) -> list:
        """The CompiledKernels, in launch order (the probes print their registers)."""
        return [compiled for compiled, *_ in self.launches]

    def __call__(self, ids, grad, main_grad, masked=None) -> None:
        if self.copy_grad:
            grad = grad.contiguous()
        device = main_grad.device
        tensors = [ids, grad, main_grad, masked, *(torch.empty(shape, dtype=dtype, device=device) for shape, dtype in self.scratch)]
        # The raw current stream, as Triton's own launch takes it (torch.cuda.current_stream()
        # builds a Stream object: 8 us of host time on the H200 machine).
        stream = driver.active.get_current_stream(device.index)
        for compiled, grid, fixed, places in self.launches:
            args = fixed.copy()
            for i, t in places:
                args[i] = tensors[t]
            compiled[grid](*args, stream=stream)


_CALLS = {}  # _call_key -> _Replay, at most CALLS_KEPT (the first recorded dropped first)

#: Replayed calls kept. A step of fixed shapes needs a few keys; with a token count that varies
#: from call to call (packed sequences) every new n adds one, so the oldest go beyond this many
#: (their next call takes Triton's launch again), and the host memory they hold stays bounded.
CALLS_KEPT = 4096


def _keep_call(key, replay: "_Replay") -> None:
    if len(_CALLS) >= CALLS_KEPT:
        del _CALLS[next(iter(_CALLS))]
    _CALLS[key] = replay


def _call_key(ids, grad, main_grad, problem: Problem, path: str, zero_rows: bool = False, masked=None):
    """Everything that decides which kernels a call launches and how Triton specialises them.

    Triton specialises integer arguments (all derived from problem and grad's shape and
    strides) and pointer alignment (ids, grad, main_grad and masked here; the workspace and scratch
    buffers come from PyTorch's allocator, 512-byte aligned).
    """
    return (
        problem,
        path,
        zero_rows,
        None if masked is None else masked.data_ptr() % 16,
        main_grad.device.index,
        ids.dtype,
        ids.data_ptr() % 16,
        grad.shape,
        grad.stride(),
        grad.data_ptr() % 16,
        main_grad.data_ptr() % 16,
    )


def _position_strides(grad: torch.Tensor):
    """(dim1, stride0, stride1) with position p's row at (p // dim1) * stride0 + (p % dim1) * stride1.

    None when grad's leading dimensions do not collapse to two strided dimensions. One
    dimension (a contiguous grad, say) gives dim1 = 1, which Triton specialises: the kernel's
    division and remainder by dim1 then compile away.
    """
    dims = [(size, stride) for size, stride in zip(grad.shape[:-1], grad.stride()[:-1]) if size != 1]
    merged = []
    for size, stride in dims:
        if merged and merged[-1][1] == stride * size:
            merged[-1] = (merged[-1][0] * size, stride)
        else:
            merged.append((size, stride))
    if len(merged) > 2:
        return None
    if len(merged) < 2:
        return 1, (merged[0][1] if merged else 0), 0
    (_, stride0), (dim1, stride1) = merged
    return dim1, stride0, stride1


@dataclass(frozen=True)
class _Plan:
    """The plan on the device: one int32 workspace (embwgrad_core.plan names each piece)."""

    workspace: torch.Tensor  # [_WORKSPACE_ARRAYS * n + _HEADER + 2 * max_long_runs + n + 2 * group_cap * _REC_FIELDS]
    n: int
    max_long_runs: int
    group_cap: int = 0  # merge sort: records of each of the group's lists (_append_records)
    ids: torch.Tensor | None = None  # merge sort with lone tokens: the token ids, and
    counts: torch.Tensor | None = None  # each id's tokens (int32 [V])
    lone_tokens: int = 0  # lone tokens of positions [0, this) have no record (_lone_tokens adds them)
    deferred: int = 0  # masked: runs of this many partials or more have no records yet (_masked_records_kernel publishes them)
    compact: torch.Tensor | None = None  # the masked route: _compact_kernel's output (the plan is of its m tokens; row 0 aside)

    @property
    def count_programs(self) -> int:
        """Merge sort with lone tokens: _merge_rank_kernel's counting programs (_count_ids), after its merging ones."""
        return triton.cdiv(self.n, _COUNT_BLOCK.value) if self.lone_tokens else 0

    def _array(self, index: int) -> torch.Tensor:
        return self.workspace[index * self.n : (index + 1) * self.n]

    # Views for tests and benchmarks; the kernels take the workspace.
    sorted_keys = property(lambda self: self._array(_KEYS.value))
    sorted_pos = property(lambda self: self._array(_POS.value))
    run_start = property(lambda self: self._array(_RUN_START.value))
    partial_ord = property(lambda self: self._array(_AUX.value))
    run_end = property(lambda self: self._array(_RUN_END.value))
    long_count = property(lambda self: self.workspace[_LONG.value * self.n])
    long_runs = property(lambda self: self.workspace[_LONG.value * self.n + _HEADER.value :])

    def record_lists(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Sort path: (long runs' records, the others), each [count, _REC_FIELDS] in the order the partials kernel takes them."""
        n, header = self.n, self.workspace[_LONG.value * self.n : _LONG.value * self.n + 5].tolist()
        records = self.workspace[_REC.value * n : _LONG.value * n].view(n, _REC_FIELDS.value)
        start = _group_records_start(n, self.max_long_runs)
        grouped = self.workspace[start : start + 2 * self.group_cap * _REC_FIELDS.value].view(-1, _REC_FIELDS.value)
        front = torch.cat([grouped[: header[3]], records[: header[1]]])
        back = torch.cat([grouped[self.group_cap : self.group_cap + header[4]], records.flip(0)[: header[2]]])
        return front, back


def _group_records_start(n: int, max_long_runs: int) -> int:
    """The host twin of _group_records: where the merge group's records start in the workspace (its end before them)."""
    return _WORKSPACE_ARRAYS * n + _HEADER.value + 2 * max_long_runs + n


def _compact_route(cfg: _Config, masked) -> bool:
    """Whether a call takes the masked route: masked given, on the merge sort (_compact_stage)."""
    return masked is not None and cfg.sort == "merge" and cfg.compact


def _compact_stage(ids, masked, problem: Problem, cfg: _Config, launch) -> torch.Tensor:
    """The masked route's stage 0: every token of MASKED_LOOKUP_ID (Megatron's other-shard tokens
    and the shard's own row 0) leaves the plan, the others are compacted in position order, and
    row 0's unmasked tokens are listed with their ranks among all of its tokens
    (embwgrad_core.make_masked_plan, with the whole row aside): int32 [_COMPACT_ARRAYS * n + 3]."""
    n = problem.num_tokens
    blocks = triton.cdiv(n, COMPACT_BLOCK)
    counts = launch.empty(2 * blocks, dtype=torch.int32, device=ids.device)
    compact = launch.empty(_COMPACT_ARRAYS.value * n + 3, dtype=torch.int32, device=ids.device)
    args = (ids, masked, counts)
    launch(_compact_counts_kernel, (blocks,), (*args, n, problem.num_embeddings, problem.padding_idx), 4, pdl=cfg.pdl, BLOCK=COMPACT_BLOCK)
    launch(_compact_kernel, (blocks,), (*args, compact, n, problem.num_embeddings, problem.padding_idx), 4, pdl=cfg.pdl, BLOCK=COMPACT_BLOCK,
           BLOCKS_P2=triton.next_power_of_2(blocks))
    return compact


def _row0_stage(plan: _Plan, grad, main_grad, problem: Problem, cfg: _Config, launch, strides) -> None:
    """The masked route's last stage: row MASKED_LOOKUP_ID from its unmasked tokens (_row0_kernel); strides: grad's (_position_strides)."""
    launch(_row0_kernel, (triton.cdiv(problem.hidden, ROW0_BLOCK_H),),
           (plan.compact, grad, main_grad, problem.num_tokens, problem.hidden, *strides, grad.stride(-1), main_grad.stride(0)), 4,
           pdl=cfg.pdl, SPAN=NROWS, GRAD_ROUNDING=ROUNDING_CODE[problem.grad_dtype], MAIN_ROUNDING=ROUNDING_CODE[problem.main_grad_dtype],
           BLOCK_H=ROW0_BLOCK_H)


def _plan_stage(ids, problem: Problem, cfg: _Config, launch=None, masked=None) -> _Plan:
    """Stages 1 and 2: sort the tokens by key and find every slot's run start and end.

    masked (accumulate's, sort path with the zero skip): on the merge sort, the masked route
    (_compact_stage first; the plan is of the tokens not of MASKED_LOOKUP_ID, in their first m
    slots, and _row0_stage adds that row); else the records of runs with flags are deferred to
    _partials_stage, which needs the same masked then (_masked_records_kernel)."""
    launch = launch or _Launcher()
    n = problem.num_tokens
    compact = _compact_stage(ids, masked, problem, cfg, launch) if _compact_route(cfg, masked) else None
    defer = cfg.zero_skip if masked is not None and cfg.sort != "rank" and compact is None else 0
    group = min(cfg.first_tokens // cfg.merge_u, _HEADER.value - _STATUS0.value) if cfg.sort == "merge" else 0
    group_cap = group * cfg.merge_u
    ws = launch.empty(_group_records_start(n, cfg.max_long_runs) + 2 * group_cap * _REC_FIELDS.value, dtype=torch.int32, device=ids.device)
    keys_args = (ids if compact is None else compact, ws, n, problem.num_embeddings, problem.padding_idx)
    if cfg.sort == "merge":
        lone = min(n, cfg.lone_tokens) if compact is None or cfg.kept_lone else 0
        counts = launch.empty(problem.num_embeddings, dtype=torch.int32, device=ids.device) if lone else None  # zeroed where read
        plan = _Plan(ws, n, cfg.max_long_runs, group_cap, ids if lone else None, counts, lone, defer, compact)
        merge_programs = triton.cdiv(n, cfg.merge_u)
        block_i = min(cfg.merge_block, cfg.merge_block_i)
        window = cfg.merge_window if 0 < cfg.merge_window < cfg.merge_block else 0
        if any(w & (w - 1) for w in (cfg.merge_block, window)):  # the searches halve a power of two (_merge_rank_kernel)
            raise ValueError(f"merge_block ({cfg.merge_block}) and merge_window ({window}) must be powers of two")
        launch(
            _block_sort_kernel,
            (triton.cdiv(n, cfg.merge_block), cfg.merge_block // block_i),
            (*keys_args, ws if counts is None else counts, ws if compact is None else compact),
            cfg.merge_warps,
            pdl=cfg.pdl,
            BLOCK=cfg.merge_block,
            BLOCK_I=block_i,
            TILE=cfg.merge_tile,
            COUNT=counts is not None,
            COMPACT=compact is not None,
        )
        launch(
            _merge_rank_kernel,
            (merge_programs + plan.count_programs,),
            (ws, n, cfg.max_long_runs, group, lone, ws if counts is None else counts, merge_programs, ws if compact is None else compact),
            cfg.merge_warps,
            pdl=cfg.pdl,
            BLOCK=cfg.merge_block,
            NUM_BLOCKS=cfg.merge_blocks,
            STEPS=(window if window else cfg.merge_block).bit_length(),
            BLOCK_U=cfg.merge_u,
            SPAN=NROWS,
            WINDOW=window,
            GROUP_P2=triton.next_power_of_2(max(group, 1)),
            COUNT=counts is not None,
            COUNT_AGGREGATE=cfg.count_aggregate,
            PLAN_POLICY="evict_last" if cfg.plan_evict_last else "",
            DEFER=defer,
            COMPACT=compact is not None,
        )
        return plan
    plan = _Plan(ws, n, cfg.max_long_runs, group_cap, deferred=defer)
    if cfg.sort == "rank":
        if cfg.block_i % CHUNK or cfg.block_j % CHUNK:
            raise ValueError(f"rank tiles ({cfg.block_i=}, {cfg.block_j=}) must be multiples of {CHUNK}")
        launch(_rank_kernel, (triton.cdiv(n, cfg.block_i),), keys_args, cfg.rank_warps, pdl=cfg.pdl, CHUNK_SIZE=CHUNK, BLOCK_I=cfg.block_i,
               BLOCK_J=cfg.block_j)
        return plan  # the rank kernel also found the runs
    else:
        keep = (ids >= 0) & (ids < problem.num_embeddings) & (ids != problem.padding_idx)
        keys, order = torch.sort(torch.where(keep, ids, -1).to(torch.int32), stable=True)
        plan.sorted_keys.copy_(keys)
        plan.sorted_pos.copy_(order)
        ws[_LONG.value * n : _LONG.value * n + _HEADER.value].zero_()  # the counters, before the runs kernel appends records
    launch(_runs_kernel, (triton.cdiv(n, cfg.runs_block),), (ws, n, n.bit_length(), cfg.max_long_runs), 4, pdl=cfg.pdl, BLOCK=cfg.runs_block, SPAN=NROWS,
           DEFER=defer)
    return plan


def _prefetchable(grad: torch.Tensor, main_grad: torch.Tensor, strides) -> bool:
    """Whether the pieces of grad's and main_grad's rows lie on 16-byte boundaries (cp.async.bulk.prefetch.L2)."""
    g, m = grad.element_size(), main_grad.element_size()
    return (
        grad.stride(-1) == 1
        and main_grad.stride(1) == 1
        and grad.data_ptr() % 16 == 0
        and main_grad.data_ptr() % 16 == 0
        and all(stride * g % 16 == 0 for stride in strides[1:])
        and main_grad.stride(0) * m % 16 == 0
        and grad.shape[-1] * g % 16 == 0  # so the last H block's piece ends on 16 bytes too
        and grad.shape[-1] * m % 16 == 0
    )


def _partials_stage(plan: _Plan, grad, main_grad, problem: Problem, cfg: _Config, launch=None, ids=None, masked=None) -> torch.Tensor:
    """Stage 3: sum every partial; finish runs of one partial; return the long runs' partial buffer.

    ids, when given, lets the kernel prefetch the first positions' rows (cfg.l2_prefetch_tokens).
    masked (uint8 [n], accumulate's): rows of the positions where it is nonzero are taken as +0, not read.
    """
    launch = launch or _Launcher()
    n, hidden = problem.num_tokens, problem.hidden
    strides = _position_strides(grad)
    if strides is None:  # more than two strided position dimensions: one copy
        grad = grad.contiguous()
        strides = _position_strides(grad)
    # (The masked route: the first rows and the lone tokens are its first kept tokens, read from the compaction.)
    kept = plan.compact is not None
    ids = plan.compact if kept else plan.ids if ids is None else ids
    lone = plan.lone_tokens > 0
    prefetch = (cfg.pdl and cfg.sort == "merge" and cfg.l2_prefetch_tokens > 0 and ids is not None and (cfg.kept_prefetch or not kept)
                and _prefetchable(grad, main_grad, strides))
    first_rows = (ids, problem.num_embeddings, cfg.l2_prefetch_tokens if prefetch else 0) if prefetch or lone else (plan.workspace, 0, 0)
    if cfg.bf16_scratch and (cfg.path != FEATURE or problem.grad_dtype != "bfloat16"):
        raise ValueError(f"bf16_scratch needs the feature path and a bf16 grad, got {cfg.path} and {problem.grad_dtype}")
    partials = launch.empty(partial_buffer_rows(n, cfg.path), hidden, dtype=torch.int16 if cfg.bf16_scratch else torch.float32,
                            device=main_grad.device)
    flags = _flags(partials, cfg, launch)
    if plan.deferred:
        if masked is None or cfg.zero_skip != plan.deferred or cfg.path == FEATURE:
            raise ValueError(f"a plan made with masked needs the same masked and zero_skip ({plan.deferred}), got "
                             f"masked={masked is not None} and zero_skip={cfg.zero_skip} on the {cfg.path} path")
        _masked_records_stage(plan, masked, flags, hidden, cfg, launch)
    items = n * triton.cdiv(hidden, cfg.block_h)  # feature path: one program each; sort path: at most this many
    folders = cfg.fold_programs
    programs = items if cfg.path == FEATURE else min(items, cfg.partial_programs) + folders
    # With PDL the folding programs start right after the long runs' partials (the kernel knows
    # where); without it, last (Triton's interpreter runs programs in order, one at a time).
    fold_lo = 0 if cfg.pdl else programs - folders
    lone_programs = triton.cdiv(plan.lone_tokens, cfg.lone_per_program)  # first in the grid
    lone_args = (plan.counts, problem.padding_idx, plan.lone_tokens, lone_programs, plan.count_programs) if lone else (plan.workspace, -1, 0, 0, 0)
    launch(
        _partials_kernel,
        (lone_programs + programs,),
        (plan.workspace, grad, main_grad, partials, flags, n, hidden, cfg.max_long_runs, fold_lo, folders, plan.group_cap,
         min(cfg.tail_programs, programs - folders - 1), *first_rows, *lone_args, plan.workspace if masked is None else masked, *strides,
         grad.stride(-1), main_grad.stride(0)),
        cfg.partial_warps,
        pdl=cfg.pdl,
        maxnreg=cfg.partial_maxnreg,
        FEATURE_PATH=cfg.path == FEATURE,
        SPAN=CHUNK if cfg.path == FEATURE else NROWS,
        CHUNK_SIZE=CHUNK,
        GRAD_ROUNDING=ROUNDING_CODE[problem.grad_dtype],
        MAIN_ROUNDING=ROUNDING_CODE[problem.main_grad_dtype],
        BLOCK_H=cfg.block_h,
        PREFETCH=cfg.prefetch,
        RECORD_HINT=cfg.record_hint,
        L1_HINT=cfg.record_hint and cfg.l1_hint and not _interpreting(),
        FOLD_H=min(cfg.fold_h, cfg.block_h),
        FOLD_BATCH=cfg.fold_batch,
        PREFETCH_L2=prefetch,
        LONE=lone,
        SCRATCH_POLICY="evict_last" if cfg.scratch_evict_last else "",
        FOLD_STAGES=cfg.fold_stages,
        SKIP_MIN=cfg.zero_skip,
        SKIP_BLOCK=cfg.skip_block,
        SKIP_WIDE=cfg.skip_wide,
        PLAN_POLICY="evict_last" if cfg.plan_evict_last and cfg.sort == "merge" else "",
        PREFETCH_EVICT_LAST=cfg.prefetch_evict_last if prefetch else 0,
        KEPT=kept and (prefetch or lone),
        MASKED=masked is not None and cfg.masked_reads,
    )
    if plan.compact is not None:  # (the masked route: row 0 after the partials kernel, which never touches it)
        _row0_stage(plan, grad, main_grad, problem, cfg, launch, strides)
    return partials, flags


def _masked_records_stage(plan: _Plan, masked, flags, hidden: int, cfg: _Config, launch) -> None:
    """Sort path with masked, before the partials kernel: the records the plan deferred (_masked_records_kernel)."""
    n = plan.n
    launch(_masked_records_kernel, (triton.cdiv(n, MASKED_RECORDS_BLOCK),),
           (plan.workspace, masked, flags, n, cfg.max_long_runs, triton.cdiv(hidden, cfg.block_h)), 4, pdl=cfg.pdl,
           BLOCK=MASKED_RECORDS_BLOCK, SPAN=NROWS, SPAN_P2=triton.next_power_of_2(NROWS), DEFER=plan.deferred,
           POLICY="evict_last" if cfg.plan_evict_last and cfg.sort == "merge" else "")


def _flags(partials, cfg: _Config, launch) -> torch.Tensor:
    """Sort path with zero_skip: int32 [H blocks, partial rows], whether each long-run partial is nonzero (never
    read before written; _flag); else a placeholder the kernels never touch."""
    if not cfg.zero_skip:
        return partials
    assert cfg.path != FEATURE, "flags mark the sort path's partials (_flag's rows are its partial_buffer_rows)"
    return launch.empty(triton.cdiv(partials.shape[1], cfg.block_h), partials.shape[0], dtype=torch.int32, device=partials.device)


def _long_runs_stage(plan: _Plan, partials, flags, main_grad, problem: Problem, cfg: _Config, launch=None) -> None:
    """Stage 4: fold the partials of every long run in order and add the result to main_grad."""
    launch = launch or _Launcher()
    launch(
        _long_runs_kernel,
        (cfg.long_programs, triton.cdiv(problem.hidden, cfg.long_block_h)),
        (plan.workspace, partials, main_grad, problem.num_tokens, problem.hidden, main_grad.stride(0), cfg.max_long_runs,
         triton.cdiv(problem.hidden, cfg.block_h), flags),
        cfg.long_warps,
        pdl=cfg.pdl,
        FEATURE_PATH=cfg.path == FEATURE,
        SPAN=CHUNK if cfg.path == FEATURE else NROWS,
        GRAD_ROUNDING=ROUNDING_CODE[problem.grad_dtype],
        MAIN_ROUNDING=ROUNDING_CODE[problem.main_grad_dtype],
        BLOCK_H=cfg.long_block_h,
        BATCH=cfg.long_batch,
        STAGES=cfg.long_stages,
        PARTIAL_BLOCK_H=cfg.block_h,
        SKIP_MIN=cfg.zero_skip,
        SKIP_BLOCK=cfg.skip_block,
        SKIP_WIDE=cfg.skip_wide,
    )


def _launch(ids, grad, main_grad, problem: Problem, path: str, zero_rows: bool = False, masked=None) -> None:
    """All four stages: ids [n] (flattened), grad [*S, H] (strides allowed), main_grad [V, H], masked uint8 [n] or None."""
    interpret = _interpreting()
    key = None if interpret else _call_key(ids, grad, main_grad, problem, path, zero_rows, masked)
    replay = _CALLS.get(key)
    if replay is not None:
        replay(ids, grad, main_grad, masked)
        return
    cfg = _config(problem, path, interpret, *((4, False) if interpret else _device_traits(main_grad.device.index)), zero_rows=zero_rows,
                  masked=masked is not None)
    copy_grad = _position_strides(grad) is None
    if copy_grad:  # more than two strided position dimensions: one copy (here, so that a replay knows)
        grad = grad.contiguous()
    launch = _Launcher()
    plan = _plan_stage(ids, problem, cfg, launch, masked)
    partials, flags = _partials_stage(plan, grad, main_grad, problem, cfg, launch, ids, masked)
    if cfg.fold_programs == 0:  # else the partials kernel folded the long runs
        _long_runs_stage(plan, partials, flags, main_grad, problem, cfg, launch)
    if key is not None and cfg.sort != "torch":
        try:
            _keep_call(key, _Replay(launch, ids, grad, main_grad, copy_grad, masked))
        except (KeyError, ValueError):  # a launch it cannot repeat: later calls take this path again (main_grad is already updated)
            pass


def _interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 when triton was imported)."""
    return isinstance(_partials_kernel, InterpretedFunction)


# ----------------------------------------------------------------------------- public functions


def _check(ids, grad, main_grad, padding_idx) -> Problem:
    for name, t in (("ids", ids), ("grad", grad), ("main_grad", main_grad)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type_name(t)}")
    shapes = (tuple(ids.shape), ids.dtype, tuple(grad.shape), grad.dtype, tuple(main_grad.shape), main_grad.dtype)
    if padding_idx is None or type(padding_idx) is int:
        problem = _checked(*shapes, padding_idx)  # the same arguments again: a dictionary lookup
    else:
        problem = _check_args(*shapes, padding_idx)
    if not main_grad.is_contiguous():
        raise ValueError(f"main_grad must be contiguous, got strides {main_grad.stride()}")
    if not (ids.device == grad.device == main_grad.device):
        raise ValueError(
            f"ids, grad and main_grad must be on one device, got {ids.device}, {grad.device}, {main_grad.device}"
        )
    if main_grad.requires_grad and torch.is_grad_enabled():
        raise ValueError("main_grad must not require grad while grad mode is on: accumulate updates it in place, outside autograd")
    if main_grad.is_inference() and not torch.is_inference_mode_enabled():
        raise ValueError("main_grad is an inference tensor: PyTorch allows its in-place update only inside torch.inference_mode()")
    _check_no_overlap(ids, "ids", main_grad)
    _check_no_overlap(grad, "grad", main_grad)
    return problem


def _check_no_overlap(t: torch.Tensor, name: str, main_grad: torch.Tensor) -> None:
    """As PyTorch's in-place ops reject an input that shares memory with their output: main_grad is
    written while t is read, so memory of both would give other bits (a race on the GPU). Exact for
    views at any offset of one buffer (t's strides are never negative in torch; an empty tensor
    spans nothing); about 1 us of host time at most."""
    if not (t.numel() and main_grad.numel()):
        return
    start = main_grad.data_ptr()
    first = t.data_ptr()
    if first >= start + main_grad.numel() * main_grad.element_size():
        return
    if first >= start or first + (sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) + 1) * t.element_size() > start:
        raise ValueError(f"{name} and main_grad share memory: main_grad is written while {name} is read")


def _check_args(ids_shape, ids_dtype, grad_shape, grad_dtype, main_grad_shape, main_grad_dtype, padding_idx) -> Problem:
    return check_args(
        ids_shape=ids_shape,
        ids_is_integer=ids_dtype in (torch.int32, torch.int64),
        ids_dtype=ids_dtype,
        grad_shape=grad_shape,
        grad_dtype=grad_dtype,
        main_grad_shape=main_grad_shape,
        main_grad_dtype=main_grad_dtype,
        padding_idx=padding_idx,
    )


#: check_args of arguments already seen (a bad call raises, and is never cached).
_checked = lru_cache(maxsize=1024)(_check_args)


def _uses_kernels(device: torch.device) -> bool:
    if _interpreting():
        return device.type == "cpu"  # TRITON_INTERPRET=1: the kernels run on CPU tensors
    return device.type == "cuda"


def can_accumulate(ids: torch.Tensor, grad: torch.Tensor, main_grad: torch.Tensor, *, padding_idx=None) -> bool:
    """Whether accumulate runs these tensors through the Triton kernels.

    True for every valid input on a CUDA device (and on CPU under TRITON_INTERPRET=1).
    Where it is False, accumulate still gives the same bits by a slower route.
    """
    try:
        _check(ids, grad, main_grad, padding_idx)
    except (TypeError, ValueError):
        return False
    return _uses_kernels(main_grad.device)


@torch.compiler.disable  # under torch.compile a graph break: run as is, not traced (0.8 us of host time eagerly)
def accumulate(ids: torch.Tensor, grad: torch.Tensor, main_grad: torch.Tensor, *, padding_idx=None, zero_rows: bool = False,
               masked: torch.Tensor | None = None) -> None:
    """main_grad += embedding_dense_backward(grad, ids), in place, with PyTorch CUDA's bits.

    Args:
        ids: int32 or int64 [*S], token ids. Any strides (a strided view is copied to contiguous first).
        grad: [*S, H] float32, bfloat16 or float16: the gradient of the lookup's output. Any
            strides (for example [s, b, H] storage seen as [b, s, H]), read in place.
        main_grad: [V, H] float32, bfloat16 or float16, contiguous (at any storage offset, as a
            view into Megatron's grad buffer); updated in place.
        padding_idx: as in torch.nn.functional.embedding: that row gets nothing.
        zero_rows: True where many of grad's rows are zero, as Megatron's vocab-parallel lookup
            makes them on a rank of TP > 1 (the other ranks' tokens, all looked up as id 0): the
            partial sums of ten zero rows are then neither stored nor folded (about 35% off such
            a call on the H200, at some cost to calls without zero rows; benchmarks/NOTES.md v29).
            Only the speed changes: the bits are the same either way.
        masked: bool [*S] or None: tokens whose grad rows are taken as +0 and never read, as
            Megatron's vocab-parallel lookup zeroes the rows of its `input_mask` (pass that mask
            with its `masked_input` as ids). The bits are the dense path's on grad with those rows
            zeroed, so, where they are +0 or -0 already, the dense path's on grad itself. Implies
            zero_rows=True. At 8192 tokens on a rank of TP = 8 (7/8 of the tokens masked) 24%
            faster than zero_rows alone on the H200, 0.066 -> 0.050 ms (benchmarks/NOTES.md v49).
            On the merge sort (4097 to MASKED_MERGE_SORT_MAX_TOKENS tokens with masked) every token of id
            MASKED_LOOKUP_ID (0, Megatron's masked_input for other shards' tokens) leaves the sort,
            and row 0 is summed apart from its unmasked tokens (_compact_stage, _row0_kernel;
            embwgrad_core.make_masked_plan): 4-35% faster again at 4096-65536 tokens, TP = 8 (NOTES v55-v58).
            With no token masked the route still sorts all n: 6-8% slower than no mask at 65536
            tokens (NOTES v57), so pass no mask at TP = 1.

    Only the rows of ids are read and written: rows of ids that do not occur, of
    padding_idx, and of ids outside [0, V) (which are skipped, not checked: a check would
    synchronise with the host) keep their bits. On CUDA the work is three to seven Triton launches on
    the current stream with no host synchronisation, so it can be captured in a CUDA graph.
    On CPU it runs the core's NumPy reference (or the kernels under TRITON_INTERPRET=1).
    Inside torch.compile it is a graph break: Dynamo runs it as it is instead of tracing the
    launch code (so fullgraph=True cannot include it).

    Outside autograd, as an optimizer's in-place update: main_grad gets values and no graph
    (grad may require grad; no gradient flows through the call), and its version counter is
    bumped as an in-place op bumps it, so a tensor saved for a backward that sees it changed
    raises there. main_grad requiring grad while grad mode is on is rejected, as PyTorch rejects
    an in-place op on a leaf that requires grad, and so is an inference tensor outside
    torch.inference_mode(), as PyTorch rejects its in-place update there. ids, grad or masked
    sharing memory with main_grad is rejected, as PyTorch's in-place ops reject an input that
    overlaps their output.

    Raises TypeError or ValueError, naming the argument, before main_grad is touched.
    """
    problem = _check(ids, grad, main_grad, padding_idx)
    if not isinstance(zero_rows, bool):
        raise TypeError(f"zero_rows must be a bool, got {type_name(zero_rows)}")
    if masked is not None:
        _check_masked(masked, ids)
        _check_no_overlap(masked, "masked", main_grad)
    if problem.num_tokens == 0 or problem.hidden == 0:
        return
    path = torch_path(problem.num_tokens)
    if _uses_kernels(main_grad.device):
        other_device = main_grad.is_cuda and main_grad.device.index != torch.cuda.current_device()
        # The kernels read ids and masked at position p as element p: a strided view (ids[::2],
        # an expanded id, a reshape that stays a view) is made contiguous first; grad's strides are the kernels' own.
        flat = None if masked is None else masked.reshape(-1).contiguous().view(torch.uint8)
        with torch.cuda.device(main_grad.device) if other_device else contextlib.nullcontext():
            _launch((ids if ids.dim() == 1 else ids.reshape(-1)).contiguous(), grad, main_grad, problem, path, zero_rows or masked is not None, flat)
        increment_version(main_grad)  # (the kernels write it behind autograd's back; copy_ on the other routes bumps it)
    else:
        with torch.no_grad():  # (no graph from a grad that requires grad, as on the kernels' route)
            if masked is not None:  # (these routes read every row: the masked ones zeroed first)
                grad = grad.masked_fill(masked[..., None], 0)
            if main_grad.device.type == "cpu":
                _accumulate_reference(ids, grad, main_grad, problem)
            else:
                _accumulate_dense(ids, grad, main_grad, problem)


def _check_masked(masked, ids) -> None:
    if not isinstance(masked, torch.Tensor):
        raise TypeError(f"masked must be a torch.Tensor or None, got {type_name(masked)}")
    check_masked(masked_shape=tuple(masked.shape), masked_is_bool=masked.dtype == torch.bool, masked_dtype=masked.dtype,
                 ids_shape=tuple(ids.shape))
    if masked.device != ids.device:
        raise ValueError(f"masked must be on ids' device {ids.device}, got {masked.device}")


def _accumulate_reference(ids, grad, main_grad, problem: Problem) -> None:
    """CPU tensors: the core's NumPy reference, written back in place."""
    out = core_reference.accumulate(
        ids.numpy(), _to_numpy(grad), _to_numpy(main_grad), padding_idx=problem.padding_idx if problem.padding_idx >= 0 else None
    )
    main_grad.copy_(_from_numpy(out, main_grad.dtype))


def _accumulate_dense(ids, grad, main_grad, problem: Problem) -> None:
    """A device without the kernels: PyTorch's own dense path, deterministic, added only where ids occur.

    Ids outside [0, V) go to an extra row V, computed and dropped (PyTorch would assert on them):
    a token's id decides only its own row's runs, and chunks are of positions, so the other rows
    get the bits they get without it, and the token still counts in n."""
    n, hidden, vocab = problem.num_tokens, problem.hidden, problem.num_embeddings
    flat = ids.reshape(-1)
    flat = torch.where((flat >= 0) & (flat < vocab), flat, vocab)
    prior = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        gw = torch.ops.aten.embedding_dense_backward(grad.reshape(n, hidden), flat, vocab + 1, problem.padding_idx, False)[:vocab]
    finally:
        torch.use_deterministic_algorithms(prior)
    present = torch.zeros(vocab + 1, dtype=torch.bool, device=main_grad.device)
    present[flat] = True
    if problem.padding_idx >= 0:
        present[problem.padding_idx] = False
    main_grad.copy_(torch.where(present[:vocab, None], main_grad + gw, main_grad))


def _to_numpy(t: torch.Tensor):
    import ml_dtypes

    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _from_numpy(a, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bfloat16:
        return torch.from_numpy(a.view("int16")).view(torch.bfloat16)
    return torch.from_numpy(a)
