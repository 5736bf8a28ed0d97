"""main_grad + embedding_dense_backward(grad, ids) in Pallas (Triton lowering), with PyTorch CUDA's bits.

The JAX twin of torch_frontend/embedding_wgrad.py: the same stages, the same fp32 adds
in the same order (SPEC.md), the pieces named as embwgrad_core.plan names them.

1. Sort the tokens by key, stably. Pallas has no sort inside a kernel. Sort path, up to
   MERGE_SORT_MAX_TOKENS (as the torch twin): ``_block_sort_kernel`` sorts blocks of
   merge_block(n) tokens by counting, then ``_merge_rank_kernel`` ranks every token in each
   other block by binary search and writes the sorted keys, positions, run starts and run
   ends (embwgrad_core.merge_ranks is the model; about 10 us for 8192 tokens, against about
   50 us for XLA's sort). On a GPU the merge kernel's grid also has programs that read the
   first ROWS_AHEAD positions' grad rows and main_grad rows into L2 while it merges
   (``_merge_rows_ahead_kernel``; DRAM idles during the plan). Above it ``lax.sort`` (see
   ``_sort``), where XLA uses CUB's radix sort and the grad bytes dwarf it; with accumulate's
   masked up to MASKED_MERGE_SORT_MAX_TOKENS the merge sort still, of the tokens the masked
   route keeps (embwgrad_core.merge_sorted; ``_compact``).
   Feature path: ``_rank_kernel`` ranks each token by counting the tokens that sort before
   it, which also gives every token its chunk's ordinal within its run and, from the tokens
   of its key before it and in all, its run's start and end: the whole plan.
2. (lax.sort) ``_runs_kernel`` finds every slot's run start and end by binary search. On the
   sort path the kernel that finds a slot's run (merge rank or runs) also publishes the
   partials (``_append_records``): a record for each slot that starts one (slot, key,
   position, run start, run end), long runs' partials at the front of the list and the others
   at its back, and an entry in the long-run list for each run of more than one partial, with
   its arrival counter zeroed.
3. ``_partials_kernel`` sums each partial's rows in fp32, in order, over one H block per item.
   Sort path: a fixed grid strides the records (the next item's record in flight while this
   item's rows are), so no program waits on a slot that starts none, and up to
   FOLD_ROLE_MAX_TOKENS its last programs take one item each (TAIL_PROGRAMS_PER_SM); feature path: one
   program per (slot, H block). A run of one partial is finished there (rounded and added
   into main_grad); a longer run's partials go to a scratch buffer at
   ``embwgrad_core.partial_row`` (feature path: its last partial appends the run to a list).
   Partials of one row load it with the main_grad row and are done. Sort path up to
   FOLD_ROLE_MAX_TOKENS: each parked partial counts itself in its run's arrival counter, and
   a few of the kernel's programs, those right after the programs of the long runs' partials,
   fold each run once its partials are in (``_fold_item``); no fourth kernel follows.
4. Otherwise ``_long_runs_kernel`` folds each listed run's partials in order, rounds, adds to
   main_grad.
5. With accumulate's zero_rows (sort path, as the torch twin): partials of more than one row in
   runs of at least ZERO_SKIP_MIN_PARTIALS partials flag whether they are nonzero per H block
   and, where not, store nothing; the folds skip them (_fold). Exact, since a sum from +0 is never -0.
6. With accumulate's masked (implies zero_rows, as the torch twin): masked tokens keep their
   places in runs and partials; every load of a grad row (add_row, and the merge kernel's rows
   ahead) is predicated on the token's mask byte, so a masked row is taken as +0 and never read.
   Sort path: the plan defers the records of runs with flags, and ``_masked_records_kernel``
   publishes those of partials with a token not masked; a partial of masked tokens only gets
   no item, only 0 flags and its arrivals.

No atomics touch floating-point data; the atomics count records, long runs and arrivals, whose
order changes no bit. Every atomic here is scalar: on the H200 with jax 0.11.2 a vector
plgpu.atomic_add added nothing (benchmarks/probe_atomic_jax.py, NOTES v51). bf16 rounding is
integer bit operations (as in the torch kernels), so both frontends round by the same formula
whatever a lowering does with fp32 -> bf16.

JAX specifics:

* In place: ``accumulate`` is jitted with main_grad donated, and every pallas_call that writes
  main_grad aliases it (``input_output_aliases``), so ``main_grad = accumulate(ids, grad,
  main_grad)`` updates the buffer with no copy and no [V, H] temporary, also inside a user's
  jit or a ``lax.scan`` that carries main_grad. Kernels read and write main_grad through the
  output ref: in interpret mode the aliased input ref is a separate, stale copy.
* One CUDA graph: ``accumulate`` called on its own (no tracer among its arguments) is jitted
  with ``xla_gpu_graph_min_graph_size=1``, so XLA launches its three or four kernels as one command
  buffer (by default a jit of fewer than five kernels launches them one by one). Inside a
  caller's jit, where jax allows no compiler options, the plain jit: the caller's compile
  decides, and a training step's command buffer holds our kernels with the rest.
* The lowering is pinned to Triton: every pallas_call gets ``plgpu.CompilerParams``; without
  them jax >= 0.9 lowers GPU pallas_calls with Mosaic GPU, which these kernels (gathers,
  scatters, scalar loads and atomics) are not written for.
* On CPU (``jax.default_backend() == "cpu"``, decided at trace time) the same kernels run in
  Pallas interpret mode, one program at a time, with larger sort tiles to stay quick.

Limits: n and V below 2**31 (keys and positions are int32). jax 0.11 deprecates the Pallas
Triton backend (SPEC.md): a Mosaic GPU port is the way forward. Interpret mode is for tests: it
runs every program in turn. There XLA:CPU flushes fp32 subnormals to zero (FTZ/DAZ), so
subnormal inputs count as signed zeros; the GPU keeps them, as PyTorch does. GPU settings were
measured on the H200 (benchmarks/NOTES.md): the merge and partials settings come from the torch
twin's variants, the merge threshold and partials warps from benchmarks/probe_jax.py.
"""

import dataclasses
import functools
import inspect
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.custom_partitioning import custom_partitioning
from jax.experimental.pallas import triton as plgpu
from jax.sharding import NamedSharding, PartitionSpec

from embwgrad_core import (
    BF16_SCRATCH_MIN_TOKENS,
    CHUNK,
    COMPACT_BLOCK,
    FEATURE,
    FOLD_PROGRAMS_PER_SM,
    FOLD_ROLE_MAX_TOKENS,
    MASKED_LOOKUP_ID,
    NROWS,
    PARTIAL_PROGRAMS_PER_SM,
    ROW0_BLOCK_H,
    SORT,
    ZERO_SKIP_BLOCK,
    ZERO_SKIP_MIN_PARTIALS,
    ZERO_SKIP_WIDE,
    key_packing,
    masked_partial_programs_per_sm,
    merge_block,
    merge_sorted,
    merge_tiles,
    partial_buffer_rows,
    partial_row,
    rows_ahead,
    torch_path,
)
from embwgrad_core.validate import Problem, check_args, check_masked, type_name

#: Lanes (tokens x blocks) per _merge_rank_kernel program on a GPU up to
#: SMALL_MERGE_LANES_MAX_TOKENS; above, the tiles shared with the torch twin (1024). H200,
#: probe_jax, 1024 -> 256 lanes: 4096 uniform 91.1 -> 87.1 us, then 89.9 -> 87.5 in a later
#: call; 8192 uniform 164.8 -> 162.7, then 164.0 -> 164.1; 8192 Zipf 97.9 -> 95.9, then 97.4 ->
#: 97.9; at 32768 tokens 256 lanes were 2-4% slower; 16384 not measured (NOTES v10, v11). The
#: torch twin measured 256 lanes faster only up to 4096 tokens (its own bound, NOTES v12). The
#: torch twin's window samples (MERGE_WINDOW) measured no faster here (NOTES v11), so the JAX
#: merge keeps its plain binary searches.
SMALL_MERGE_LANES = 256
SMALL_MERGE_LANES_MAX_TOKENS = 8192

#: Up to FEW_MERGE_LANES_MAX_TOKENS, half SMALL_MERGE_LANES. H200, probe_jax, chains of 300
#: calls in one process, 256 lanes / 128, us (NOTES v44 item 3): 4096 uniform 87.5, 86.9,
#: 87.0, 86.5, 86.0, 86.8, 86.9 / 86.0, 85.0, 85.0, 85.8; 3584 uniform 77.0, 76.9, 76.9, 77.4,
#: 77.0, 76.8, 76.9 / 76.3, 76.6, 76.1, 76.1; 4096 Zipf 60.2, 60.0, 59.9, 59.9 / 58.8, 58.8, 58.7
#: (and in the first of the two calls, where 4096 Zipf chains were host-bound and noisy, 59.7,
#: 60.1, 63.1 / 61.5).
#: At 8192 tokens 128 lanes were slower (165.5 against 162.1 us at uniform ids, NOTES v21 item 7).
FEW_MERGE_LANES = 128
FEW_MERGE_LANES_MAX_TOKENS = 4096

#: (block_i, block_j) of _rank_kernel in interpret mode, where every program step is an XLA:CPU
#: loop iteration: large tiles keep it fast. Tests shrink them to cross tile boundaries.
INTERPRET_RANK_TILES = {SORT: (256, 256), FEATURE: (8 * CHUNK, 8 * CHUNK)}

#: Sort path up to FOLD_ROLE_MAX_TOKENS: partials programs per SM, the last to start, that take
#: one item each (the torch twin's TAIL_PROGRAMS_PER_SM). H200, chains of 300 calls, in one
#: process (NOTES v22 item 3), none / 12 / 24 / 48 per SM: 8192 uniform 162.6 / 162.1 / 162.1 /
#: 162.1 us, 8192 Zipf 95.9 / 95.5 / 95.6 / 95.5, 4096 uniform 87.5 / 87.8 / 87.6 / 87.7; above
#: 8192 tokens (one-warp partials, no folders) slower: 32768 uniform 577.3 against 579.7 with 24,
#: 32768 Zipf 335.2 against 337.4, so none there.
TAIL_PROGRAMS_PER_SM = 24

#: Slots per _masked_records_kernel program (accumulate's masked), as the torch twin's: each loads
#: the positions and mask bytes of its partials' slots at once, [16, MASKED_RECORDS_BLOCK] lanes.
MASKED_RECORDS_BLOCK = 256

#: Sort path up to FOLD_ROLE_MAX_TOKENS: one partials program per SM for every this many (token,
#: H block) pairs (H blocks of the partials kernel's block_h), no fewer than PARTIAL_PROGRAMS_PER_SM
#: (128) and no more than WIDE_PARTIAL_PROGRAMS_PER_SM (256). The programs stride the items
#: (partial, H block), so at a fixed 128 per SM each program takes more items one after another as
#: H grows, the long runs' partials (which come first) among them. So 128 per SM up to 8 blocks
#: (H <= 8192) at 8192 tokens, 192 at H = 12288, 256 from H = 16384; at 4096 tokens 128 up to H =
#: 16384. H200, chains of 300 calls in one process, twice each (means; 384 once), us, uniform /
#: Zipf ids (NOTES v43 items 1-2):
#:
#: | tokens, H (blocks) | 128 per SM | 192 | 256 | 384 |
#: |---|---|---|---|---|
#: | 8192, 7168 (7) | 160.1 / 96.2 | 160.4 / 97.3 | 160.9 / 101.7 | 161.4 / 112.6 |
#: | 8192, 12288 (12) | 254.4 / 150.2 | 253.9 / 145.9 | 254.3 / 145.2 | 255.1 / 153.9 |
#: | 8192, 16384 (16) | 349.7 / 202.9 | 348.5 / 194.1 | 348.4 / 192.4 | 348.2 / 194.5 |
#: | 4096, 12288 (12) | 136.2 / 84.9 | 137.0 / 87.5 | 137.3 / 92.8 | - |
#: | 4096, 16384 (16) | 181.3 / 110.5 | - | 181.9 / 112.9 | - |
#:
#: The torch twin's one-warp programs measured no such gain at 8192 tokens (96 per SM stays best
#: there).
PARTIAL_PROGRAM_ITEMS = 512
WIDE_PARTIAL_PROGRAMS_PER_SM = 256

#: Sort path above FOLD_ROLE_MAX_TOKENS (one-warp partials programs, no folders): partials
#: programs per SM, whatever H. H200, chains of 300 calls in one process, 128 per SM / 256, each
#: twice (means), us, 16384 uniform / 16384 Zipf / 32768 uniform / 32768 Zipf / 131072 Zipf (NOTES
#: v43 item 6): H = 7168 301.7 / 174.7 / 572.9 / 325.4 / 1060.3 against 300.0 / 174.4 / 569.1 /
#: 325.0 / 1053.7; H = 16384 662.1 / 352.9 / 1250.7 / 655.9 / 2178.7 against 659.5 / 350.6 /
#: 1245.1 / 651.4 / 2163.7. Faster at every point, in both repeats.
LONG_PARTIAL_PROGRAMS_PER_SM = 256

#: Merge sort: the merge stores the sorted positions and the records, and the partials kernel
#: loads a partial's other positions, with L2 priority evict_last, as the torch twin
#: (PLAN_EVICT_LAST there), so that the streamed rows do not push them out of L2 before the
#: items that read them. H200, chains of 300 calls, twice each in one process (NOTES v40), us,
#: off -> on: 4096 uniform 88.1 -> 87.2-87.8, 8192 uniform 163.1 -> 162.5, 8192 Zipf 97.5-97.6
#: -> 96.5-97.2, 32768 uniform 576.8-578.2 -> 576.1-576.6 (NOTES v40 took that point for a
#: control, but this frontend's merge sort makes the plan up to MERGE_SORT_MAX_TOKENS, 32768 too:
#: NOTES v41). Slower nowhere. The records' loads with evict_last too measured even (NOTES v40 item 6).
PLAN_EVICT_LAST = True

#: Merge sort on a GPU: the merge kernel gets programs past its own that read the grad rows of
#: positions [0, ROWS_AHEAD) and the main_grad rows of their ids, ROWS_AHEAD_PIECES (position, H
#: block) pieces each, with L2 priority evict_last, while the merge runs and DRAM idles (the
#: torch twin's partials kernel prefetches them then, with PDL, which XLA does not give). The
#: partials kernel's items then find them in L2; their own loads make them ordinary lines again.
#: H200, chains of 300 calls (NOTES v41), us, none -> 256: 4096 uniform 87.7-87.9 -> 87.0 and
#: 88.8-91.5 -> 87.9, 8192 uniform 162.1-162.5 -> 160.9 and 163.7-164.2 -> 161.9-162.6, 8192 Zipf
#: 96.9-97.1 -> 95.5 and 97.9-98.3 -> 97.4-97.7, 32768 uniform 576.4-577.7 -> 574.2 and 575.1-575.2
#: -> 573.5-574.0; 128 / 192 / 384 positions, 2 or 8 pieces a program within the chains' spread,
#: 512 and 1024 slower. Fewer positions above H = 7168 (embwgrad_core.ROWS_AHEAD_ELEMENTS: at H =
#: 16384, 112; NOTES v42). Off in interpret mode (a hint only; tests force it to check that it
#: changes no bit).
ROWS_AHEAD = 256
ROWS_AHEAD_PIECES = 4

#: The ways to sort (_Config.sort).
MERGE, RANK, PACKED, PAIRS = "merge", "rank", "packed", "pairs"

_INT32_MAX = 2**31 - 1
#: _rank_kernel packs two counts of one chunk's compares into an int32: a * _PACK + b, b <= CHUNK.
_PACK = 64
assert CHUNK < _PACK


# ----------------------------------------------------------------------------- kernels


def _round(x, dtype: str):
    """fp32 -> dtype ("float32", "bfloat16", "float16"), round to nearest even, returned as fp32."""
    if dtype == "bfloat16":
        bits = lax.bitcast_convert_type(x, jnp.uint32)
        rounded = ((bits + jnp.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16) << 16
        rounded = jnp.where(x != x, ((bits | jnp.uint32(0x400000)) >> 16) << 16, rounded)  # NaN stays NaN
        return lax.bitcast_convert_type(rounded, jnp.float32)
    if dtype == "float16":
        return x.astype(jnp.float16).astype(jnp.float32)
    return x


def _to_scratch(acc, gw, dtype):
    """What a long run's partial stores (as the torch twin): acc (fp32), or in int16 (feature path,
    bf16 grad: _Config.bf16_scratch) gw's bf16 bits, the high half of its fp32 bits. The feature
    path rounds every partial to grad's dtype before any use, so the rounded value is all the
    fold needs, and half the bytes hold it exactly (NaNs included)."""
    if dtype == jnp.int16:
        return lax.bitcast_convert_type((lax.bitcast_convert_type(gw, jnp.uint32) >> 16).astype(jnp.uint16), jnp.int16)
    return acc


def _from_scratch(part):
    """A scratch value as fp32 (_to_scratch's inverse)."""
    if part.dtype == jnp.int16:
        return lax.bitcast_convert_type(lax.bitcast_convert_type(part, jnp.uint16).astype(jnp.uint32) << 16, jnp.float32)
    return part


def _add_to_row(main_grad_ref, row, h0, live_h, gw, dtype: str):
    """main_grad[row, h0 : h0 + len(gw)] = round(float(main_grad) + gw): main_grad.add_ of one row block."""
    block = main_grad_ref.at[row, pl.ds(h0, gw.shape[0])]
    old = plgpu.load(block, mask=live_h, other=0).astype(jnp.float32)
    plgpu.store(block, _round(old + gw, dtype).astype(main_grad_ref.dtype), mask=live_h)


def _keys(ids, num_embeddings: int, padding_idx: int):
    """int32 keys (embwgrad_core.plan.sanitize_ids): the id, or -1 for a token that adds nothing."""
    keep = (ids >= 0) & (ids < num_embeddings) & (ids != padding_idx)
    return jnp.where(keep, ids, -1).astype(jnp.int32)


def _load_keys(ids_ref, start, size: int, *, n: int, num_embeddings: int, padding_idx: int):
    """(positions, keys) of ids[start : start + size]; positions past n get key -1."""
    pos = start + lax.iota(jnp.int32, size)
    ids = plgpu.load(ids_ref.at[pl.ds(start, size)], mask=pos < n, other=-1)
    return pos, _keys(ids, num_embeddings, padding_idx)


#: Feature path: rows of a partial loaded at once after its first (as the torch twin).
FEATURE_BATCH = 4
#: A long run's partials past its last whole batch are folded FOLD_TAIL at a time (_fold).
FOLD_TAIL = 4

#: Fields of a record (flat int32 array of REC_FIELDS per partial): slot, key, position, run
#: start, run end, three unused (a record fills one 32-byte sector).
REC_FIELDS = 8

#: The plan's counters (int32 [COUNTS]): long runs listed, then (sort path) the records of long
#: runs' partials, counting up from record 0, and the other records, counting down from n - 1.
COUNTS = 4
_LISTED, _FRONT, _BACK = 0, 1, 2
_M = 3  # the masked route: the tokens the plan sorts (written by the block sort, read by the merge)
#: The masked route's arrays (_compact_kernel): kept keys, kept positions, row-0 positions, their ranks; then a header.
_COMPACT_ARRAYS = 4


def _kept_count(compact_ref, stride: int):
    """The masked route's m: the tokens _compact_kernel kept, the first word of its header after
    the arrays (as the torch twin's _kept_count)."""
    return compact_ref[_COMPACT_ARRAYS * stride]


def _flag(flags_ref, num_hb: int, hb, row):
    """Sort path: index of the zero-skip flag of scratch row `row` in H block hb. The flags are
    [H blocks, partial_buffer_rows], flattened: a fold reads one H block's flags of a run's
    partials, whose rows are two apart (partial_row), so 8 bytes apart here (as the torch twin's
    _flag; not 8 * H blocks: NOTES v54)."""
    return hb * (flags_ref.shape[0] // num_hb) + row


def _appended(counts_ref, flags, counter: int):
    """(base + rank among these lanes) of each flagged lane, base from one atomic add of their number to counts_ref[counter]."""
    flags = flags.astype(jnp.int32)
    total = jnp.sum(flags, dtype=jnp.int32)
    # (A masked atomic has no interpret-mode rule; a literal 0 as a branch result no Triton lowering.)
    base = lax.cond(total > 0, lambda t: plgpu.atomic_add(counts_ref, jnp.int32(counter), t), lambda t: t * 0, total)
    return base + jnp.cumsum(flags) - flags


def _append_records(records_ref, counts_ref, long_runs_ref, arrivals_ref, slot, key, pos, run_start, run_end, live, *, n: int,
                    policy: str | None, defer: int = 0):
    """Sort path: publish a record for each of these slots that starts a partial, and list the long runs (as the torch twin).

    Partials of long runs (more than NROWS slots) go to the front of the record list, the
    others to its back, so that the partials kernel takes the long runs' partials first. A long
    run's first slot lists the run (run start, partials) and zeroes its arrival counter. An
    atomic only where it adds something: the counters are hot addresses. defer > 0 (accumulate's
    masked): no record for a partial of a run of defer partials or more; _masked_records_kernel
    publishes those whose tokens are not all masked.
    """
    starts = live & (key >= 0) & ((slot - run_start) % NROWS == 0)
    if defer:
        starts = starts & (run_end - run_start <= (defer - 1) * NROWS)
    long = run_end - run_start > NROWS
    lane = lax.iota(jnp.int32, slot.shape[0])
    append = functools.partial(_appended, counts_ref)
    front, back = starts & long, starts & ~long
    index = jnp.where(front, append(front, _FRONT), n - 1 - append(back, _BACK))
    index = jnp.where(starts, index, n + lane)  # lanes that append nothing scatter past the end (see _rank_kernel)
    for field, value in enumerate((slot, key, pos, run_start, run_end)):
        plgpu.store(records_ref.at[index * REC_FIELDS + field], value, mask=starts, eviction_policy=policy)
    first = live & (key >= 0) & long & (slot == run_start)
    entry = jnp.where(first, append(first, _LISTED), long_runs_ref.shape[0] + lane)  # the others past the end, as above
    plgpu.store(long_runs_ref.at[entry, 0], run_start, mask=first)
    plgpu.store(long_runs_ref.at[entry, 1], (run_end - run_start + NROWS - 1) // NROWS, mask=first)
    plgpu.store(arrivals_ref.at[jnp.where(first, slot, n + lane)], jnp.zeros_like(slot), mask=first)


def _block_sort_kernel(
    # Inputs
    ids_ref,  # int32/int64 [n]: token ids in position order
    # Outputs
    block_keys_ref,  # int32 [n]: every block's keys in sorted order, at the block's offset
    block_pos_ref,  # int32 [n]: their positions
    counts_ref,  # int32 [COUNTS]: the plan's counters, zeroed here
    *,
    n: int,
    num_embeddings: int,  # V
    padding_idx: int,  # id that adds nothing, or -1
    block: int,  # tokens per block: merge_block(n)
    block_i: int,  # tokens of the block ranked per program: program (b, c) ranks chunk c of block b
    tile: int,  # tokens compared per step (divides block)
    compact: int = 0,  # the masked route: ids_ref is _compact_kernel's output, its first m keys the tokens; its stride
):
    """Sort path, step 1 of the merge-rank sort: sort each block of tokens stably by counting.

    compact: the m tokens that _compact_kernel kept (n only the capacity), m also written to
    counts[_M] for the merge; their positions from its second array."""
    b0 = pl.program_id(0) * block
    c0 = pl.program_id(1) * block_i
    first = (pl.program_id(0) == 0) & (pl.program_id(1) == 0)  # read here: interpret mode has no program ids inside pl.when
    m = _kept_count(ids_ref, compact) if compact else n
    load = functools.partial(_load_keys, ids_ref, n=n, num_embeddings=num_embeddings, padding_idx=padding_idx)

    @pl.when(first)
    def _():
        plgpu.store(counts_ref.at[lax.iota(jnp.int32, COUNTS)], jnp.where(lax.iota(jnp.int32, COUNTS) == _M, m, 0).astype(jnp.int32))

    @pl.when(b0 < m)  # (compact: blocks past the m tokens have nothing to sort)
    def _():
        i, key_i = load(b0 + c0, block_i)
        live = i < m

        def compare(step, before):  # a token sorts before i: a smaller key, or an equal key at an earlier position
            j, key_j = load(b0 + step * tile, tile)
            key_j = jnp.where(j < m, key_j, _INT32_MAX)
            same = key_j[None, :] == key_i[:, None]
            earlier = (key_j[None, :] < key_i[:, None]) | (same & (j[None, :] < i[:, None]))
            return before + earlier.astype(jnp.int32)

        before = lax.fori_loop(0, block // tile, compare, jnp.zeros((block_i, tile), jnp.int32))
        # Lanes past m scatter past the end (see _rank_kernel).
        slot = jnp.where(live, b0 + jnp.sum(before, axis=1, dtype=jnp.int32), i)
        pos = plgpu.load(ids_ref.at[compact + jnp.minimum(i, n - 1)], mask=live, other=0) if compact else i
        plgpu.store(block_keys_ref.at[slot], key_i, mask=live)
        plgpu.store(block_pos_ref.at[slot], pos, mask=live)


def _merge_rank_kernel(
    # Inputs
    block_keys_ref,  # int32 [n]: every block's keys in sorted order (_block_sort_kernel)
    block_pos_ref,  # int32 [n]: their positions
    counts_in_ref,  # int32 [COUNTS]: aliased to counts_ref, never read
    # Outputs
    sorted_keys_ref,  # int32 [n]: keys in sorted order
    sorted_pos_ref,  # int32 [n]: positions in sorted order
    run_start_ref,  # int32 [n]: first slot of each slot's run
    run_end_ref,  # int32 [n]: one past the last slot of each slot's run
    counts_ref,  # int32 [COUNTS]: the plan's counters (zeroed by _block_sort_kernel)
    records_ref,  # int32 [n * REC_FIELDS]: a record per partial (_append_records)
    long_runs_ref,  # int32 [max_long_runs, 2]: (run start, number of partials) of each long run
    arrivals_ref,  # int32 [n]: arrival counters, zeroed where a long run starts
    *,
    n: int,
    block: int,  # tokens per block of _block_sort_kernel
    num_blocks: int,  # a power of two >= cdiv(n, block)
    steps: int,  # binary-search steps: block.bit_length()
    block_u: int,  # block-sorted tokens per program
    unroll: bool,  # the steps unrolled (as the torch twin), else a loop
    plan_policy: str | None,  # L2 eviction policy of the sorted positions' and records' stores (PLAN_EVICT_LAST), or None
    defer: int = 0,  # > 0: runs of this many partials or more get their records later (_masked_records_kernel)
    pid=None,  # the program id, when read by a caller (interpret mode has no program ids inside pl.when)
    compact: bool = False,  # the masked route: the block sort sorted counts[_M] tokens, n only the capacity
):
    """Sort path, step 2: every token's slot, run start and run end from binary searches in every block.

    Blocks before the token's own add their keys <= its key, blocks after their keys < it,
    its own block its local rank; the run starts after all keys < it and ends after all keys
    <= it (plan.merge_ranks).
    """
    m = counts_in_ref[_M] if compact else n  # (the same buffer as counts_ref: the block sort wrote it)
    u0 = (pl.program_id(0) if pid is None else pid) * block_u

    def ranks():
        u = u0 + lax.iota(jnp.int32, block_u)
        live = u < m
        key = plgpu.load(block_keys_ref.at[pl.ds(u0, block_u)], mask=live, other=0)
        pos = plgpu.load(block_pos_ref.at[pl.ds(u0, block_u)], mask=live, other=0)
        own = u // block
        c = lax.iota(jnp.int32, num_blocks)
        # [num_blocks, block_u] lanes, tokens along the last axis: XLA's Triton then gives a
        # warp's lanes consecutive tokens probing one block (the same or nearby keys, few L1
        # wavefronts per gather). As [block_u, num_blocks] a warp's lanes probed 32 blocks at
        # once and every key broadcast went through shared memory: 19.3 us against 9.9 (H200,
        # 8192 tokens, Nsight Compute; benchmarks/NOTES.md v6).
        c0 = (c * block)[:, None]  # [num_blocks, 1]: block c's offset and length
        c_len = jnp.minimum(jnp.maximum(m - c * block, 0), block)[:, None]
        k = key[None, :]

        # Searches of [lo, hi]. The torch twin keeps only lo (a probe at lo + s - 1 adds s or not): in
        # JAX that form measured 1.3 us faster at 16384 tokens, 1.5-2.5 us slower at 32768 and within
        # noise at 4096-8192 (H200, benchmarks/NOTES.md v30), so this one stays.
        def halve(_, bounds):  # lo_lt -> keys < key in block c, lo_le -> keys <= key in block c
            lo_lt, hi_lt, lo_le, hi_le = bounds
            mid_lt = (lo_lt + hi_lt) // 2
            mid_le = (lo_le + hi_le) // 2
            below_lt = plgpu.load(block_keys_ref.at[c0 + mid_lt], mask=mid_lt < c_len, other=_INT32_MAX) < k
            below_le = plgpu.load(block_keys_ref.at[c0 + mid_le], mask=mid_le < c_len, other=_INT32_MAX) <= k
            lo_lt, hi_lt = jnp.where(below_lt, mid_lt + 1, lo_lt), jnp.where(below_lt, hi_lt, mid_lt)
            lo_le, hi_le = jnp.where(below_le, mid_le + 1, lo_le), jnp.where(below_le, hi_le, mid_le)
            return lo_lt, hi_lt, lo_le, hi_le

        lo = jnp.zeros((num_blocks, block_u), jnp.int32)
        bounds = (lo, lo + c_len, lo, lo + c_len)
        if unroll:
            for step in range(steps):
                bounds = halve(step, bounds)
        else:
            bounds = lax.fori_loop(0, steps, halve, bounds)
        lo_lt, _, lo_le, _ = bounds
        earlier_block = c[:, None] < own[None, :]
        later_block = c[:, None] > own[None, :]
        others = jnp.where(earlier_block, lo_le, jnp.where(later_block, lo_lt, 0))
        slot = u - own * block + jnp.sum(others, axis=0, dtype=jnp.int32)
        run_start = jnp.sum(lo_lt, axis=0, dtype=jnp.int32)
        run_end = jnp.sum(lo_le, axis=0, dtype=jnp.int32)
        slot = jnp.where(live, slot, u)  # lanes past n scatter past the end (see _rank_kernel)
        plgpu.store(sorted_keys_ref.at[slot], key, mask=live)
        plgpu.store(sorted_pos_ref.at[slot], pos, mask=live, eviction_policy=plan_policy)
        plgpu.store(run_start_ref.at[slot], run_start, mask=live)
        plgpu.store(run_end_ref.at[slot], run_end, mask=live)
        _append_records(records_ref, counts_ref, long_runs_ref, arrivals_ref, slot, key, pos, run_start, run_end, live, n=n,
                        policy=plan_policy, defer=defer)

    if compact:
        # The masked route's grid is sized for n, its tokens are m: programs past them exit, as the torch twin's. Without
        # this they searched the live blocks for dead lanes: 38.7 us of the JAX masked call's 99 at 32768 tokens, TP 8,
        # against 14 us in the torch twin (H200, timeline_target.py --tp; benchmarks/NOTES.md v57).
        pl.when(u0 < m)(ranks)
    else:
        ranks()


def _rank_kernel(
    # Inputs
    ids_ref,  # int32/int64 [n]: token ids in position order
    # Outputs
    sorted_keys_ref,  # int32 [n]: keys in sorted order
    sorted_pos_ref,  # int32 [n]: positions in sorted order
    partial_ord_ref=None,  # int32 [n], feature path only: ordinal of the slot's chunk within its run
    run_start_ref=None,  # int32 [n], feature path only: first slot of each slot's run
    run_end_ref=None,  # int32 [n], feature path only: one past the last slot of each slot's run
    counts_ref=None,  # int32 [COUNTS], feature path only: the long-run counter zeroed here
    records_ref=None,  # feature path only: unused outputs, the _runs_kernel's twins
    long_runs_ref=None,
    arrivals_ref=None,
    *,
    n: int,
    num_embeddings: int,  # V
    padding_idx: int,  # id that adds nothing, or -1
    block_i: int,  # tokens ranked per program (feature path: a multiple of CHUNK; sort path: of block_j)
    block_j: int,  # tokens compared per step (feature path: a multiple of CHUNK)
):
    """Each token's slot by counting the tokens that sort before it; on the feature path the
    whole plan: also partial_ord and the run starts and ends (as the torch twin).

    Feature path: a step of block_j tokens is seen as [block_j // CHUNK, CHUNK] to count the
    earlier chunks holding a token's key; program starts (multiples of CHUNK) never split a
    chunk, so a chunk lies wholly before a program's tokens or not. The same pass counts the
    tokens of each token's key before it and in all: its run starts at its slot less those
    before it. Each compare yields (sorts before) * _PACK + (same key), summed once over a chunk.
    """
    del records_ref, long_runs_ref, arrivals_ref
    feature = partial_ord_ref is not None
    load = functools.partial(_load_keys, ids_ref, n=n, num_embeddings=num_embeddings, padding_idx=padding_idx)
    i0 = pl.program_id(0) * block_i
    i, key_i = load(i0, block_i)
    live_i = i < n
    zero = jnp.zeros((block_i,), jnp.int32)
    if feature:
        first_program = pl.program_id(0) == 0  # read here: interpret mode has no program ids inside pl.when

        @pl.when(first_program)
        def _():
            counts_ref[_LISTED] = jnp.int32(0)

    def counted(cmp, same):  # [block_i, chunks] per-chunk counts of (cmp, same), packed in one sum
        packed = cmp.astype(jnp.int32) * _PACK + same.astype(jnp.int32)
        per_chunk = jnp.sum(packed.reshape(block_i, block_j // CHUNK, CHUNK), axis=2, dtype=jnp.int32)
        return per_chunk // _PACK, per_chunk % _PACK

    def earlier(step, carry):  # tokens at earlier positions sort before i when their key is <= key_i
        before, chunks, same_before = carry
        j, key_j = load(step * block_j, block_j)
        key_j = jnp.where(j < i0, key_j, _INT32_MAX)
        le = key_j[None, :] <= key_i[:, None]
        if not feature:
            return before + jnp.sum(le.astype(jnp.int32), axis=1, dtype=jnp.int32), chunks, same_before
        # every whole chunk of this step lies before i0 or not at all
        le_c, same_c = counted(le, key_j[None, :] == key_i[:, None])
        return (
            before + jnp.sum(le_c, axis=1, dtype=jnp.int32),
            chunks + jnp.sum((same_c > 0).astype(jnp.int32), axis=1, dtype=jnp.int32),
            same_before + jnp.sum(same_c, axis=1, dtype=jnp.int32),
        )

    before, chunks, same_before = lax.fori_loop(0, (i0 + block_j - 1) // block_j, earlier, (zero, zero, zero))
    same_after = zero
    diag = CHUNK if feature else block_j
    for j0 in range(0, block_i, diag):  # inside the block, ties go by position
        j, key_j = load(i0 + j0, diag)
        live_j = (j < n)[None, :]
        same = (key_j[None, :] == key_i[:, None]) & live_j
        sooner = j[None, :] < i[:, None]
        first = (key_j[None, :] < key_i[:, None]) | (same & sooner)
        before += jnp.sum((first & live_j).astype(jnp.int32), axis=1, dtype=jnp.int32)
        if feature:
            earlier_chunk = (i0 + j0) // CHUNK < i // CHUNK
            chunks += jnp.where(earlier_chunk, jnp.max(same.astype(jnp.int32), axis=1), 0)
            same_before += jnp.sum((same & sooner).astype(jnp.int32), axis=1, dtype=jnp.int32)
            same_after += jnp.sum((same & (j[None, :] > i[:, None])).astype(jnp.int32), axis=1, dtype=jnp.int32)

    def later(step, carry):  # tokens at later positions sort before i when their key is < key_i
        before, same_after = carry
        j, key_j = load(i0 + block_i + step * block_j, block_j)
        key_j = jnp.where(j < n, key_j, _INT32_MAX)
        lt = key_j[None, :] < key_i[:, None]
        if not feature:
            return before + jnp.sum(lt.astype(jnp.int32), axis=1, dtype=jnp.int32), same_after
        lt_c, same_c = counted(lt, key_j[None, :] == key_i[:, None])
        return before + jnp.sum(lt_c, axis=1, dtype=jnp.int32), same_after + jnp.sum(same_c, axis=1, dtype=jnp.int32)

    before, same_after = lax.fori_loop(0, (jnp.maximum(n - i0 - block_i, 0) + block_j - 1) // block_j, later, (before, same_after))
    # Lanes past n scatter past the end: interpret mode writes masked lanes back with their old
    # value, which would race with a live lane's write to the same slot.
    slot = jnp.where(live_i, before, i)
    plgpu.store(sorted_keys_ref.at[slot], key_i, mask=live_i)
    plgpu.store(sorted_pos_ref.at[slot], i, mask=live_i)
    if feature:
        plgpu.store(partial_ord_ref.at[slot], chunks, mask=live_i)
        plgpu.store(run_start_ref.at[slot], before - same_before, mask=live_i)
        plgpu.store(run_end_ref.at[slot], before + 1 + same_after, mask=live_i)


def _runs_kernel(
    # Inputs
    sorted_keys_ref,  # int32 [n]: keys in sorted order
    sorted_pos_ref,  # int32 [n]: positions in sorted order
    counts_in_ref,  # int32 [COUNTS]: zeros, aliased to counts_ref; never read
    # Outputs
    run_start_ref,  # int32 [n]: first slot of each slot's run
    run_end_ref,  # int32 [n]: one past the last slot of each slot's run
    counts_ref,  # int32 [COUNTS]: the plan's counters
    records_ref,  # int32 [n * REC_FIELDS]: a record per partial (_append_records)
    long_runs_ref,  # int32 [max_long_runs, 2]: the long runs listed
    arrivals_ref,  # int32 [n]: arrival counters zeroed where a long run starts
    *,
    n: int,
    block: int,  # slots per program
    defer: int = 0,  # > 0: runs of this many partials or more get their records later (_masked_records_kernel)
):
    """Sort path after lax.sort: every slot's run start and end by binary search in the sorted keys, and the records."""
    del counts_in_ref
    s0 = pl.program_id(0) * block
    s = s0 + lax.iota(jnp.int32, block)
    live = s < n
    key = plgpu.load(sorted_keys_ref.at[pl.ds(s0, block)], mask=live, other=0)

    def halve(_, bounds):  # the run start lies in [lo, hi], the run end in [lo_end, hi_end]
        lo, hi, lo_end, hi_end = bounds
        mid = (lo + hi) // 2
        below = plgpu.load(sorted_keys_ref.at[mid], mask=live, other=0) < key
        mid_end = (lo_end + hi_end) // 2
        # Lanes whose search reached n read slot s instead (masked loads still need an address in interpret mode).
        within = plgpu.load(sorted_keys_ref.at[jnp.where(mid_end < n, mid_end, s)], mask=live & (mid_end < n), other=_INT32_MAX) <= key
        return (
            jnp.where(below, mid + 1, lo),
            jnp.where(below, hi, mid),
            jnp.where(within, mid_end + 1, lo_end),
            jnp.where(within, hi_end, mid_end),
        )

    zero = jnp.zeros((block,), jnp.int32)
    lo, _, lo_end, _ = lax.fori_loop(0, n.bit_length(), halve, (zero, s, s + 1, zero + n))
    plgpu.store(run_start_ref.at[pl.ds(s0, block)], lo, mask=live)
    plgpu.store(run_end_ref.at[pl.ds(s0, block)], lo_end, mask=live)
    pos = plgpu.load(sorted_pos_ref.at[pl.ds(s0, block)], mask=live, other=0)
    _append_records(records_ref, counts_ref, long_runs_ref, arrivals_ref, s, key, pos, lo, lo_end, live, n=n, policy=None, defer=defer)


def _masked_records_kernel(
    # Inputs
    sorted_keys_ref,  # int32 [n]: keys in sorted order
    sorted_pos_ref,  # int32 [n]: positions in sorted order
    run_start_ref,  # int32 [n]: first slot of each slot's run
    run_end_ref,  # int32 [n]: one past the last slot of each slot's run
    masked_ref,  # int8 [n]: nonzero where position p's row is taken as +0
    counts_in_ref,  # int32 [COUNTS]: aliased to counts_ref, never read
    records_in_ref,  # int32 [n * REC_FIELDS]: aliased to records_ref, never read
    arrivals_in_ref,  # int32 [n]: aliased to arrivals_ref, never read
    # Outputs
    counts_ref,  # int32 [COUNTS]: the plan's counters
    records_ref,  # int32 [n * REC_FIELDS]: the plan's records, and here the deferred partials' with a token not masked
    arrivals_ref,  # int32 [n]: arrival counters; here each run's partials of masked tokens only are counted in
    flags_ref,  # int32 [num_hb * partial_buffer_rows] (_flag): 0 for each partial of masked tokens only (the partials kernel writes the others')
    *,
    n: int,
    block: int,  # slots per program
    num_hb: int,  # H blocks of the partials kernel
    defer: int,  # the plan deferred the records of runs of this many partials or more (the zero skip's skip_min, >= 2)
    policy: str | None,  # L2 eviction policy of the records' stores
):
    """Sort path with accumulate's masked: the records the plan deferred (as the torch twin).

    A partial of a deferred run (a run with flags) whose tokens are all masked sums to +0: it
    gets no record, its flags are 0 in every H block (the folds skip it) and its arrivals are
    counted here, since the folders wait for all of its run's. The others get their front
    records. Each program adds its dropped partials of a run to the run's counter by one scalar
    atomic a run (the torch twin uses two vector atomics, which add nothing here: see below).
    """
    del counts_in_ref, records_in_ref, arrivals_in_ref
    s0 = pl.program_id(0) * block
    s = s0 + lax.iota(jnp.int32, block)
    lane = lax.iota(jnp.int32, block)
    live = s < n
    key = plgpu.load(sorted_keys_ref.at[pl.ds(s0, block)], mask=live, other=-1)
    run_start = plgpu.load(run_start_ref.at[pl.ds(s0, block)], mask=live, other=0)
    run_end = plgpu.load(run_end_ref.at[pl.ds(s0, block)], mask=live, other=0)
    flagged = live & (key >= 0) & (run_end - run_start > (defer - 1) * NROWS)
    deferred = flagged & ((s - run_start) % NROWS == 0)
    # The partial's slots' positions, then their mask bytes: two round trips, all at once
    # ([block, span] lanes, the slots along the last axis, as the torch twin).
    t = lax.iota(jnp.int32, 1 << (NROWS - 1).bit_length())[None, :]
    take = deferred[:, None] & (t < NROWS) & (s[:, None] + t < run_end[:, None])
    pos_t = plgpu.load(sorted_pos_ref.at[jnp.where(take, s[:, None] + t, 0)], mask=take, other=0)  # (masked lanes need an address)
    real_t = take & (plgpu.load(masked_ref.at[pos_t], mask=take, other=1) == 0)
    real = jnp.max(real_t.astype(jnp.int32), axis=1) != 0
    pos = jnp.sum(jnp.where(t == 0, pos_t, 0), axis=1, dtype=jnp.int32)
    index = jnp.where(real, _appended(counts_ref, real, _FRONT), n + lane)  # the others past the end (see _rank_kernel)
    for field, value in enumerate((s, key, pos, run_start, run_end)):
        plgpu.store(records_ref.at[index * REC_FIELDS + field], value, mask=real, eviction_policy=policy)
    dropped = deferred & ~real
    row = partial_row(run_start, (s - run_start) // NROWS, SORT).astype(jnp.int32)
    past = flags_ref.shape[0] + lane

    def zero_flag(hb, carry):
        plgpu.store(flags_ref.at[jnp.where(dropped, _flag(flags_ref, num_hb, hb, row), past)], jnp.zeros((block,), jnp.int32), mask=dropped)
        return carry

    lax.fori_loop(0, num_hb, zero_flag, None)
    # Each run with flags that meets this program adds its dropped partials here to its arrivals, by
    # one scalar atomic a run: on the H200 (jax 0.11.2, Triton 3.6) a vector plgpu.atomic_add added
    # nothing, masked or not (NOTES v51). A run with flags spans more than a program's slots on a
    # GPU (defer = ZERO_SKIP_MIN_PARTIALS), so the loop takes one or two turns there.
    starts = flagged & ((s == run_start) | (s == s0))
    segment = jnp.cumsum(starts.astype(jnp.int32)) - 1

    def arrive(k, carry):
        mine = flagged & (segment == k)
        value = jnp.sum(jnp.where(mine, dropped.astype(jnp.int32), 0), dtype=jnp.int32) * num_hb
        plgpu.atomic_add(arrivals_ref, jnp.max(jnp.where(mine, run_start, 0)), value)
        return carry

    lax.fori_loop(0, jnp.sum(starts.astype(jnp.int32), dtype=jnp.int32), arrive, None)


def _compact_counts_kernel(
    # Inputs
    ids_ref,  # int32/int64 [n]: token ids in position order
    masked_ref,  # int8 [n]: nonzero where masked
    # Outputs
    counts_ref,  # int32 [2 * blocks]: each block's tokens of key MASKED_LOOKUP_ID, then those of them not masked
    *,
    n: int,
    num_embeddings: int,
    padding_idx: int,
    block: int,
    blocks: int,
):
    """The masked route's first kernel (_compact): per block, the tokens that leave the plan for row 0's kernel (as the torch twin)."""
    b = pl.program_id(0)
    t, key = _load_keys(ids_ref, b * block, block, n=n, num_embeddings=num_embeddings, padding_idx=padding_idx)
    live = t < n
    at_row = live & (key == MASKED_LOOKUP_ID)
    real = at_row & (plgpu.load(masked_ref.at[pl.ds(b * block, block)], mask=live, other=1) == 0)
    plgpu.store(counts_ref.at[b], jnp.sum(at_row.astype(jnp.int32)))
    plgpu.store(counts_ref.at[blocks + b], jnp.sum(real.astype(jnp.int32)))


def _compact_kernel(
    # Inputs
    ids_ref,  # int32/int64 [n]: token ids in position order
    masked_ref,  # int8 [n]: nonzero where masked
    counts_ref,  # int32 [2 * blocks]: _compact_counts_kernel's
    # Outputs
    compact_ref,  # int32 [_COMPACT_ARRAYS * stride + 4]
    *,
    n: int,
    num_embeddings: int,
    padding_idx: int,
    block: int,
    blocks: int,
    blocks_p2: int,  # a power of two >= blocks
    stride: int,  # each array's room: n + blocks * block (_compact_stride)
):
    """The masked route's compaction (the torch twin's _compact_kernel): the tokens not of MASKED_LOOKUP_ID,
    keys and positions, at slot t - (row-0 tokens before t); row 0's unmasked tokens' positions and their
    ranks among all of row 0's tokens; the header (m, those, all row-0 tokens). Each program sums the
    counts of the blocks before its own (no program waits on another). Each array has room past n
    for the lanes whose store is masked: interpret mode's masked scatter may still write a lane's
    index (with the old value), so no two lanes of one store share an index."""
    b = pl.program_id(0)
    last = b == blocks - 1  # read here: interpret mode has no program ids inside pl.when
    t, key = _load_keys(ids_ref, b * block, block, n=n, num_embeddings=num_embeddings, padding_idx=padding_idx)
    live = t < n
    at_row = (live & (key == MASKED_LOOKUP_ID)).astype(jnp.int32)
    real = at_row * (plgpu.load(masked_ref.at[pl.ds(b * block, block)], mask=live, other=1) == 0).astype(jnp.int32)
    c = lax.iota(jnp.int32, blocks_p2)
    earlier = c < b
    row_before = jnp.sum(plgpu.load(counts_ref.at[jnp.minimum(c, blocks - 1)], mask=earlier, other=0)) + jnp.cumsum(at_row) - at_row
    real_before = (jnp.sum(plgpu.load(counts_ref.at[blocks + jnp.minimum(c, blocks - 1)], mask=earlier, other=0)) + jnp.cumsum(real)
                   - real)
    kept = live & (at_row == 0)
    slot = jnp.where(kept, t - row_before, n + t)  # (masked lanes past n, each its own)
    plgpu.store(compact_ref.at[slot], key, mask=kept)
    plgpu.store(compact_ref.at[stride + slot], t, mask=kept)
    index = jnp.where(real != 0, real_before, n + t)
    plgpu.store(compact_ref.at[2 * stride + index], t, mask=real != 0)
    plgpu.store(compact_ref.at[3 * stride + index], row_before, mask=real != 0)
    rows = jnp.max(jnp.where(live, row_before + at_row, 0))
    reals = jnp.max(jnp.where(live, real_before + real, 0))

    @pl.when(last)
    def _():
        lane = lax.iota(jnp.int32, 4)
        plgpu.store(compact_ref.at[_COMPACT_ARRAYS * stride + lane], jnp.where(lane == 0, n - rows, jnp.where(lane == 1, reals, rows)))


def _row0_kernel(
    # Inputs
    compact_ref,  # int32: _compact_kernel's row-0 list and header
    grad_ref,  # [n, H]
    main_grad_in_ref,  # aliased to main_grad_ref
    # Outputs
    main_grad_ref,  # [V, H]
    *,
    stride: int,  # _compact_kernel's
    hidden: int,
    block_h: int,
    grad_dtype: str,
    main_grad_dtype: str,
):
    """The masked route's row MASKED_LOOKUP_ID, these columns (the torch twin's _row0_kernel): a token's
    partial is its rank among all of the row's tokens // NROWS; the unmasked ones in position order, each
    partial summed from +0 in order, the partials added from +0 in order, rounded, added to main_grad
    (+0 where the row has only masked tokens)."""
    del main_grad_in_ref
    h0 = pl.program_id(0) * block_h  # read here: interpret mode has no program ids inside pl.when
    live_h = h0 + lax.iota(jnp.int32, block_h) < hidden
    header = _COMPACT_ARRAYS * stride

    @pl.when(compact_ref[header + 2] > 0)
    def _():
        def add(i, carry):
            total, part, k = carry
            pos = compact_ref[2 * stride + i]
            k_i = compact_ref[3 * stride + i] // NROWS
            total = jnp.where(k_i != k, total + part, total)  # a new partial: the last one's sum in
            part = jnp.where(k_i != k, 0.0, part)
            row = plgpu.load(grad_ref.at[pos, pl.ds(h0, block_h)], mask=live_h, other=0).astype(jnp.float32)
            return total, part + row, k_i

        zeros = jnp.zeros((block_h,), jnp.float32)
        total, part, _ = lax.fori_loop(0, compact_ref[header + 1], add, (zeros, zeros, jnp.int32(-1)))
        _add_to_row(main_grad_ref, jnp.int32(MASKED_LOOKUP_ID), h0, live_h, _round(total + part, grad_dtype), main_grad_dtype)


def _partials_kernel(
    # Inputs
    partial_ord_ref,  # int32 [n], feature path only (None on the sort path): ordinal of the slot's chunk within its run
    sorted_keys_ref,  # int32 [n]: keys in sorted order
    sorted_pos_ref,  # int32 [n]: positions in sorted order
    run_start_ref,  # int32 [n]: first slot of each slot's run
    records_ref,  # int32 [n * REC_FIELDS]: sort path, a record per partial (_append_records); feature path, unused
    grad_ref,  # [n, H] bf16/fp16/fp32: position p's row is row p
    masked_ref,  # int8 [n]: masked, nonzero where position p's row is taken as +0 and not read (else any array, unread)
    main_grad_in_ref,  # [V, H]: aliased to main_grad_ref, never read (stale in interpret mode)
    counts_in_ref,  # int32 [COUNTS]: aliased to counts_ref, never read
    long_runs_in_ref,  # int32 [max_long_runs, 2]: aliased to long_runs_ref, never read
    arrivals_in_ref,  # int32 [n]: aliased to arrivals_ref, never read
    # Outputs
    main_grad_ref,  # [V, H] bf16/fp16/fp32: rows of runs of one partial (and with folders, of long runs) get their gradient
    partials_ref,  # [partial_buffer_rows, H]: partial sums of long runs, at partial_row, fp32 or bf16 bits (_to_scratch)
    long_runs_ref,  # int32 [max_long_runs, 2]: (run start, number of partials) of each long run (sort path: the plan's)
    counts_ref,  # int32 [COUNTS]: the plan's counters; feature path, [_LISTED] counts the long runs listed here
    arrivals_ref,  # int32 [n]: sort path with folders, each run's partials that have arrived (at its first slot)
    flags_ref,  # int32 [cdiv(H, block_h) * partial_buffer_rows] (_flag): skip_min > 0, whether each long-run partial is nonzero per H block
    *,
    n: int,
    hidden: int,  # H
    path: str,  # FEATURE (partials are chunks) or SORT (partials are NROWS slots)
    grad_dtype: str,
    main_grad_dtype: str,
    block_h: int,
    unroll: bool,  # the rows unrolled, their indices loaded first (as the torch twin), else a loop
    prefetch: bool,  # sort path: the next item's record loaded before this item's rows
    folders: int,  # sort path: programs that fold the long runs here (0: _long_runs_kernel does)
    fold_lo: int,  # the first of them (0 on a GPU, the last programs in interpret mode)
    fold_h: int,  # columns of one of their items
    fold_batch: int,  # partials they load at once
    fold_ahead: bool,  # they load the next batch while they add this one (_fold)
    tail: int,  # sort path: the last programs but the folders, which take the last items, one each (as the torch twin)
    interpret: bool,  # Pallas interpret mode: programs run in order, one at a time (no barrier, no waiting)
    skip_min: int,  # sort path: runs of this many partials or more flag and skip their zero partials (_fold; 0: none)
    skip_block: int,  # flags a fold reads at once
    skip_wide: int,  # blocks of flags a fold checks at once (ZERO_SKIP_WIDE)
    plan_policy: str | None,  # sort path: L2 eviction policy of the other positions' loads (PLAN_EVICT_LAST), or None
    masked: bool,  # accumulate's masked: rows of masked positions are not loaded (their +0 changes no sum)
):
    """Every partial's rows summed in order, over one H block per item (partial, H block).

    Sort path (as the torch twin): the programs stride the records, one round trip each (slot,
    key, position, run start, run end), so no program is spent on a slot that starts no
    partial. A partial of one row loads it with the main_grad row and is done; longer partials
    load their other positions, then the rows.
    Feature path: one program per (slot, H block); the next CHUNK slots' keys and positions
    come in the first round trip, and slots that start no partial stop there.

    Sort path with folders (as the torch twin): a long run's partial, once stored, counts itself
    in the run's arrival counter (a CTA barrier, then an acquire-release atomic), and programs
    [fold_lo, fold_lo + folders) fold each listed run as soon as its counter is full (_fold_item).
    The long runs' records come first, and on a GPU the folders are the programs right after
    those that take them (programs start in order), so they wait little and fold while the
    other partials are summed.
    Waiting cannot deadlock: the folders are a few programs per SM, and the partials they wait
    for are taken by programs that never wait (in interpret mode, which runs programs in order,
    the folders come last).
    Sort path with skip_min (as the torch twin): a partial of a run of skip_min partials or more
    stores its flag, 0 where its sum is all +0 over the H block, and then no sum (_fold skips it).
    """
    del main_grad_in_ref, counts_in_ref, long_runs_in_ref, arrivals_in_ref
    feature = path == FEATURE
    span = CHUNK if feature else NROWS  # most slots in a partial
    num_hb = pl.cdiv(hidden, block_h)
    p = pl.program_id(0)  # read here: interpret mode has no program ids inside pl.when
    programs = pl.num_programs(0)

    def item(s, hb, key, pos0, run_start, run_end):
        """The partial that starts at slot s (if it starts one), over H block hb."""
        cols = hb * block_h + lax.iota(jnp.int32, block_h)
        live_h = cols < hidden
        row_block = pl.ds(hb * block_h, block_h)
        is_first = s == run_start

        if feature:
            chunk = pos0 // CHUNK
            prev_chunk = plgpu.load(sorted_pos_ref.at[s - 1], mask=s > run_start, other=-CHUNK) // CHUNK
            k = partial_ord_ref[s]
            active = (key >= 0) & (is_first | (prev_chunk != chunk))
            # The partial's slots are s .. s + nrows - 1 (a chunk's tokens of one key are
            # consecutive in sorted order): one vector load of the next span keys and positions
            # counts them and finds the key after them (as the torch twin).
            t = lax.iota(jnp.int32, span)
            inside = s + t < n
            spanned = jnp.where(inside, s + t, s)  # masked lanes still need an address in interpret mode
            key_v = plgpu.load(sorted_keys_ref.at[spanned], mask=inside, other=-2)
            pos_v = plgpu.load(sorted_pos_ref.at[spanned], mask=inside, other=0)
            nrows = jnp.sum(((key_v == key) & (pos_v // CHUNK == chunk)).astype(jnp.int32), dtype=jnp.int32)
            after = jnp.sum(jnp.where(t == nrows, key_v, 0), dtype=jnp.int32)  # the key of slot s + nrows, if nrows < span
            beyond = plgpu.load(sorted_keys_ref.at[jnp.where(s + span < n, s + span, s)], mask=s + span < n, other=-2)
            is_last = jnp.where(nrows < span, after, beyond) != key
        else:
            k = (s - run_start) // NROWS
            active = (key >= 0) & ((s - run_start) % NROWS == 0)  # always, for a record
            nrows = jnp.minimum(run_end - s, NROWS)
            is_last = run_end <= s + NROWS

        def load_old(finish):  # the main_grad row of a run of one partial, before its grad rows, to overlap them
            return plgpu.load(main_grad_ref.at[key, row_block], mask=live_h & finish, other=0).astype(jnp.float32)

        def write(acc, gw, old, finish, last, nonzero=None):
            """A run of one partial: round(old + gw) into main_grad; else acc to the scratch buffer and, if last, the run to the list.

            nonzero (sort path with skip_min, a partial of more than one row): whether acc has a
            nonzero bit; a partial of one row counts as nonzero (no reduction on the copy-add's path).
            """
            new = _round(old + gw, main_grad_dtype)
            plgpu.store(main_grad_ref.at[key, row_block], new.astype(main_grad_ref.dtype), mask=live_h & finish)
            row = partial_row(run_start, k, path).astype(jnp.int32)  # embwgrad_core.partial_row
            stored = ~finish
            if skip_min and not feature:  # (predicated, no branch, as the torch twin)
                flagged = ~finish & (run_end - run_start > (skip_min - 1) * NROWS)  # a run of skip_min partials or more
                nonzero = jnp.int32(1) if nonzero is None else nonzero
                plgpu.store(flags_ref.at[_flag(flags_ref, num_hb, hb, row)], nonzero, mask=flagged)
                stored = stored & ((nonzero != 0) | ~flagged)  # a run without flags: its fold reads every partial
            plgpu.store(partials_ref.at[row, row_block], _to_scratch(acc, gw, partials_ref.dtype), mask=live_h & stored)

            if feature:  # the sort path's plan lists its long runs

                @pl.when(~finish & last & (hb == 0))
                def _():
                    entry = plgpu.atomic_add(counts_ref, jnp.int32(_LISTED), jnp.int32(1))
                    long_runs_ref[entry, 0] = run_start
                    long_runs_ref[entry, 1] = k + 1

            elif folders:

                @pl.when(~finish)
                def _():
                    if not interpret:
                        plgpu.debug_barrier()  # every thread's part of the partial is stored before the release
                    plgpu.atomic_add(arrivals_ref, run_start, jnp.int32(1))

        def add_row(pos_t, take, acc):  # acc after the row at position pos_t, if take (and, masked, not masked)
            if masked:  # (pos_t is a position in [0, n) even where not taken)
                take = take & (masked_ref[pos_t] == 0)
            g = plgpu.load(grad_ref.at[pos_t, row_block], mask=live_h & take, other=0)
            return acc + g.astype(jnp.float32)  # acc is never -0, so adding +0 for a row not taken leaves it

        if feature:

            @pl.when(active)
            def _():
                finish = is_first & is_last
                old = load_old(finish)
                acc = add_row(pos0, True, jnp.zeros((block_h,), jnp.float32))  # 0 + row: -0 becomes +0

                def add_batch(b, acc):  # the other rows FEATURE_BATCH at a time, in order; positions out of pos_v
                    for u in range(FEATURE_BATCH):
                        r = 1 + b * FEATURE_BATCH + u
                        acc = add_row(jnp.sum(jnp.where(t == r, pos_v, 0), dtype=jnp.int32), r < nrows, acc)
                    return acc

                acc = lax.fori_loop(0, (nrows - 1 + FEATURE_BATCH - 1) // FEATURE_BATCH, add_batch, acc)
                # A run of one partial: +0 + round(s) rounds to round(s).
                write(acc, _round(acc, grad_dtype), old, finish, is_last)

            return

        # Sort path. One row: already a value of grad's dtype, so rounding would change nothing;
        # 0 + row turns -0 into +0, as PyTorch's sum does.
        finish = is_first & is_last

        @pl.when(active & (nrows == 1))
        def _():
            old = load_old(finish)
            acc = add_row(pos0, True, jnp.zeros((block_h,), jnp.float32))
            write(acc, acc, old, finish, is_last)

        @pl.when(active & (nrows > 1))
        def _():
            old = load_old(finish)
            acc = add_row(pos0, True, jnp.zeros((block_h,), jnp.float32))
            if unroll:  # every position, then every row, in flight at once
                taken = [t < nrows for t in range(1, span)]
                positions = [plgpu.load(sorted_pos_ref.at[s + t], mask=take, other=0, eviction_policy=plan_policy)
                             for t, take in zip(range(1, span), taken)]
                for pos_t, take in zip(positions, taken):
                    acc = add_row(pos_t, take, acc)
            else:
                acc = lax.fori_loop(1, nrows, lambda t, acc: add_row(sorted_pos_ref[s + t], True, acc), acc)
            nonzero = jnp.max((lax.bitcast_convert_type(acc, jnp.uint32) != 0).astype(jnp.int32)) if skip_min else None  # (columns past H: +0)
            write(acc, _round(acc, grad_dtype), old, finish, is_last, nonzero)

    if feature:
        s = p // num_hb
        item(s, p % num_hb, sorted_keys_ref[s], sorted_pos_ref[s], run_start_ref[s], None)
        return

    front = counts_ref[_FRONT]
    items = (front + counts_ref[_BACK]) * num_hb
    q = p  # this program's first item
    folder = False
    if folders:
        fold_lo = jnp.minimum(front * num_hb + fold_lo, programs - folders)  # after the long runs' partials (interpret: last)
        folder = (p >= fold_lo) & (p < fold_lo + folders)

        @pl.when(folder)
        def _():
            chunks = pl.cdiv(hidden, fold_h)
            fold = functools.partial(_fold_item, long_runs_ref, sorted_keys_ref, partials_ref, main_grad_ref, arrivals_ref, flags_ref,
                                     hidden=hidden, chunks=chunks, partial_hb=num_hb, block_h=block_h, grad_dtype=grad_dtype,
                                     main_grad_dtype=main_grad_dtype, fold_h=fold_h, batch=fold_batch, ahead=fold_ahead, fid=p - fold_lo,
                                     folders=folders, wait=not interpret, skip_min=skip_min, skip_block=skip_block,
                                     skip_wide=skip_wide)
            lax.fori_loop(0, (counts_ref[_LISTED] * chunks - (p - fold_lo) + folders - 1) // folders, fold, None)

        programs -= folders
        q = jnp.where(folder, items, p - (p >= fold_lo + folders).astype(jnp.int32) * folders)

    lo, hi, stride = _item_range(q, folder, items, programs, tail)

    def load_record(w):  # (slot, key, position, run start, run end) of item w; zeros past the last item
        r = w // num_hb
        rec = jnp.where(r < front, r, n - 1 - (r - front)) * REC_FIELDS  # long runs' records from the front, the others from the back
        return tuple(plgpu.load(records_ref.at[jnp.where(w < items, rec + f, 0)], mask=w < items, other=0) for f in range(5))

    def record(t, fields):  # items lo, lo + stride, ... below hi: H block fastest
        w = lo + t * stride
        following = load_record(w + stride) if prefetch else None  # in flight while this item's rows are
        if not prefetch:
            fields = load_record(w)
        item(fields[0], w % num_hb, *fields[1:])
        return following if prefetch else fields

    first = load_record(lo) if prefetch else (jnp.int32(0),) * 5
    lax.fori_loop(0, jnp.maximum(hi - lo + stride - 1, 0) // stride, record, first)


def _item_range(q, folder, items, programs, tail: int):
    """(lo, hi, stride) of a partials program: it takes items lo, lo + stride, ... below hi.

    q is the program among the `programs` that take items (a folder's q is `items`). Without a
    tail: q, q + programs, ... below items. With one (as the torch twin where folders run; here a
    tail comes only with folders): with more items than programs, the last `tail` programs (they
    start last) take the last items, one each, and the others stride the items before those; with
    no more items than programs, the first `items` programs take one each, in order, so that the
    programs of the long runs' partials start before the folders that wait on them, not behind
    every program left without an item (NOTES v62). A program left without an item (a folder, or
    one past the items) gets lo = hi = items, so that the record it loads ahead is masked
    (load_record masks w >= items only: a negative item would read before the records, an
    illegal address on the H200, NOTES v22). Works elementwise on arrays of q (tests).
    """
    if not tail:
        return q, items, programs
    head = programs - tail
    few = items <= programs
    is_tail = (q >= head) & ~few
    tail_item = items - tail + (q - head)
    idle = folder | (few & (q >= items))
    lo = jnp.where(idle, items, jnp.where(is_tail, tail_item, q))
    hi = jnp.where(idle, items, jnp.where(few, q + 1, jnp.where(is_tail, tail_item + 1, items - tail)))
    # (jnp.int32 on both: with a bare 1 the Triton lowering gave the select an i1 operand, jax 0.10.2.)
    stride = jnp.where(is_tail | few, jnp.int32(1), jnp.int32(head))
    return lo, hi, stride


def _fold(partials_ref, run_start, num_partials, h0, width: int, live_h, *, path: str, grad_dtype: str, batch: int,
          ahead: bool = False, flags_ref=None, flag_hb=0, partial_hb: int = 1, skip_min: int = 0, skip_block: int = 1,
          skip_wide: int = 1):
    """A long run's partials over columns [h0, h0 + width), folded in order and rounded to grad's dtype (as fp32).

    batch partials' loads are in flight at once, then FOLD_TAIL at a time for the rest; the adds
    stay one at a time, in order. Past the last partial the last one is loaded again (an
    address, no predicate, so every load of a step issues before its first add) and dropped.
    Feature path: each partial and each step is rounded, as PyTorch's per-chunk sums are; sort
    path: the sum is rounded once. ahead: the next batch's loads are issued before this batch's
    adds (carried through the loop in registers, twice a batch's), so a long fold keeps loads in
    flight while it adds instead of a round trip per batch; the last batch may drop up to
    batch - 1 steps. The same sum either way.
    skip_min > 0 (sort path, as the torch twin): a run of at least skip_min partials has a flag per
    partial and H block of the partials kernel at flags_ref[_flag(flags_ref, partial_hb, flag_hb, partial_row)]
    (0: all +0 there, and not stored). If none is 0 the run is summed as without flags; else zero
    partials add nothing (the sum is never -0, so adding +0 leaves it) and are not loaded
    (ZERO_SKIP_MIN_PARTIALS). The flags are checked skip_wide * skip_block at a time (one vector
    load; ZERO_SKIP_WIDE), first only until a block with a 0 turns up, then to skip the blocks of
    zeros; in the others each skip_block's nonzero partials are found in its flags' vector (the
    u-th is the one whose rank among them is u) and loaded batch at a time (nonzero), so a block
    of one nonzero partial costs one round trip, not skip_block / batch.
    """
    feature = path == FEATURE

    def load(k0, size, k_end):  # partials [k0, k0 + size), those from k_end on as the last before it
        parts = []
        for u in range(size):
            k = jnp.minimum(k0 + u, k_end - 1)
            row = partial_row(run_start, k, path).astype(jnp.int32)
            parts.append(_from_scratch(plgpu.load(partials_ref.at[row, pl.ds(h0, width)], mask=live_h, other=0)))
        return tuple(parts)

    def add(k0, parts, acc, k_end):  # those from k_end on dropped
        for u, part in enumerate(parts):
            take = k0 + u < k_end
            if feature:
                acc = jnp.where(take, _round(acc + _round(part, grad_dtype), grad_dtype), acc)
            else:
                acc = jnp.where(take, acc + part, acc)
        return acc

    def span(acc, k_lo, k_end, ahead):  # acc with partials [k_lo, k_end) folded in
        if ahead:
            def step(b, carry):
                acc, parts = carry
                following = load(k_lo + (b + 1) * batch, batch, k_end)  # in flight while this batch is added
                return add(k_lo + b * batch, parts, acc, k_end), following

            acc, _ = lax.fori_loop(0, (k_end - k_lo + batch - 1) // batch, step, (acc, load(k_lo, batch, k_end)))
            return acc
        # Whole batches, then the rest FOLD_TAIL at a time, so a run drops at most FOLD_TAIL - 1
        # steps, not batch - 1 (as the torch twin; NOTES v17 item 8).
        tail = min(FOLD_TAIL, batch)
        full = (k_end - k_lo) // batch
        acc = lax.fori_loop(0, full, lambda b, acc: add(k_lo + b * batch, load(k_lo + b * batch, batch, k_end), acc, k_end), acc)
        if batch > 1:  # (batch 1, as in interpret mode, leaves no rest: no second loop to compile)
            rest = k_lo + full * batch
            acc = lax.fori_loop(0, (k_end - rest + tail - 1) // tail,
                                lambda b, acc: add(rest + b * tail, load(rest + b * tail, tail, k_end), acc, k_end), acc)
        return acc

    zero = jnp.zeros((width,), jnp.float32)
    if skip_min and not feature:
        def flags_block(k0, past, size=skip_block):  # the flags of partials [k0, k0 + size), past the last `past`; one vector load
            ks = k0 + lax.iota(jnp.int32, size)
            inside = ks < num_partials
            rows = partial_row(run_start, jnp.where(inside, ks, k0), path).astype(jnp.int32)  # masked lanes still need an address
            return plgpu.load(flags_ref.at[_flag(flags_ref, partial_hb, flag_hb, rows)], mask=inside, other=past)

        wide = skip_block * skip_wide

        def nonzero(b, acc):  # acc with the nonzero partials of [k0, k0 + skip_block) folded in, in order
            k0 = b * skip_block
            ks = k0 + lax.iota(jnp.int32, skip_block)
            some = flags_block(k0, 0) != 0
            rank = jnp.cumsum(some.astype(jnp.int32)) - 1
            count = jnp.sum(some.astype(jnp.int32))

            def group(g, acc):  # the nonzero partials of ranks [g * batch, (g + 1) * batch): loads at once, adds in order
                parts = []
                for u in range(batch):
                    k = jnp.min(jnp.where(some & (rank == g * batch + u), ks, num_partials))  # num_partials: none left
                    row = partial_row(run_start, jnp.minimum(k, num_partials - 1), path).astype(jnp.int32)
                    parts.append(_from_scratch(plgpu.load(partials_ref.at[row, pl.ds(h0, width)], mask=live_h & (k < num_partials), other=0)))
                for part in parts:
                    acc = acc + part  # +0 past the last: the sum is never -0
                return acc

            return lax.fori_loop(0, (count + batch - 1) // batch, group, acc)

        def wide_block(w, acc):  # skipped if all zeros, else its blocks' nonzero partials folded
            some = jnp.max(flags_block(w * wide, 0, wide)) != 0
            first = w * skip_wide
            last = jnp.minimum(first + skip_wide, (num_partials + skip_block - 1) // skip_block)
            return lax.cond(some, lambda acc: lax.fori_loop(first, last, nonzero, acc), lambda acc: acc, acc)

        # First whether a block of flags holds a 0, only until one does (a masked run: its first):
        # with none (a long run of nonzero partials, as in Zipf ids) the run is summed in one span,
        # its loads ahead never restarted (as the torch twin).
        def unchecked(carry):
            w, z = carry
            return (num_partials >= skip_min) & (w * wide < num_partials) & (z == 0)

        def check(carry):
            w, _ = carry
            return w + 1, (jnp.min(flags_block(w * wide, 1, wide)) == 0).astype(jnp.int32)

        _, zero_blocks = lax.while_loop(unchecked, check, (jnp.int32(0), jnp.int32(0)))
        folded = lambda: lax.fori_loop(0, (num_partials + wide - 1) // wide, wide_block, zero)  # noqa: E731
        acc = lax.cond(zero_blocks == 0, lambda: span(zero, 0, num_partials, ahead), folded)
    else:
        acc = span(zero, 0, num_partials, ahead)
    return acc if feature else _round(acc, grad_dtype)


def _fold_item(long_runs_ref, sorted_keys_ref, partials_ref, main_grad_ref, arrivals_ref, flags_ref, t, carry, *, hidden: int,
               chunks: int, partial_hb: int, block_h: int, grad_dtype: str, main_grad_dtype: str, fold_h: int, batch: int, ahead: bool,
               fid, folders: int, wait: bool, skip_min: int, skip_block: int, skip_wide: int):
    """Sort path, a folding program of _partials_kernel: its t-th (long run, fold_h columns) item.

    It waits until the run's arrival counter holds all its partials (num_partials *
    partial_hb items of the partials kernel), reading it with an atomic add of 0 (acquire-release),
    then folds them in order, rounds and adds to main_grad. Interpret mode (wait False) runs the
    folders after every other program, and cannot discharge a loop on a ref's atomic.
    """
    f = fid + t * folders
    e = f // chunks
    h0 = (f % chunks) * fold_h
    live_h = h0 + lax.iota(jnp.int32, fold_h) < hidden
    run_start = long_runs_ref[e, 0]
    num_partials = long_runs_ref[e, 1]

    def arrived(_):
        return plgpu.atomic_add(arrivals_ref, run_start, jnp.int32(0))

    if wait:
        lax.while_loop(lambda count: count < num_partials * partial_hb, arrived, arrived(None))
    acc = _fold(partials_ref, run_start, num_partials, h0, fold_h, live_h, path=SORT, grad_dtype=grad_dtype, batch=batch, ahead=ahead,
                flags_ref=flags_ref, flag_hb=h0 // block_h, partial_hb=partial_hb, skip_min=skip_min, skip_block=skip_block,
                skip_wide=skip_wide)
    _add_to_row(main_grad_ref, sorted_keys_ref[run_start], h0, live_h, acc, main_grad_dtype)
    return carry


def _long_runs_kernel(
    # Inputs
    long_runs_ref,  # int32 [max_long_runs, 2]: (run start, number of partials) of each long run
    counts_ref,  # int32 [COUNTS]: [_LISTED] long runs listed
    sorted_keys_ref,  # int32 [n]: keys in sorted order
    partials_ref,  # [partial_buffer_rows, H]: partial sums of long runs, fp32 or bf16 bits (_to_scratch)
    flags_ref,  # int32 [partial_hb * partial_buffer_rows] (_flag): skip_min > 0, whether each long-run partial is nonzero (_partials_kernel)
    main_grad_in_ref,  # [V, H]: aliased to main_grad_ref, never read
    # Outputs
    main_grad_ref,  # [V, H] bf16/fp16/fp32: rows of long runs get their gradient
    *,
    hidden: int,
    path: str,
    grad_dtype: str,
    main_grad_dtype: str,
    block_h: int,
    batch: int,  # partials loaded per step
    ahead: bool,  # the next batch loaded while this one is added (_fold)
    partial_block_h: int,  # the partials kernel's block_h (a multiple of block_h)
    skip_min: int,  # sort path: runs of this many partials or more skip their zero partials (_fold; 0: none)
    skip_block: int,
    skip_wide: int,
):
    """Fold each listed run's partials in order, round, add to main_grad; programs stride the list."""
    del main_grad_in_ref
    program, programs = pl.program_id(0), pl.num_programs(0)
    h0 = pl.program_id(1) * block_h
    live_h = h0 + lax.iota(jnp.int32, block_h) < hidden

    def fold_run(t, carry):  # long runs program, program + programs, ...
        entry = program + t * programs
        run_start = long_runs_ref[entry, 0]
        acc = _fold(partials_ref, run_start, long_runs_ref[entry, 1], h0, block_h, live_h, path=path, grad_dtype=grad_dtype, batch=batch,
                    ahead=ahead, flags_ref=flags_ref, flag_hb=h0 // partial_block_h, partial_hb=pl.cdiv(hidden, partial_block_h),
                    skip_min=skip_min, skip_block=skip_block, skip_wide=skip_wide)
        _add_to_row(main_grad_ref, sorted_keys_ref[run_start], h0, live_h, acc, main_grad_dtype)
        return carry

    lax.fori_loop(0, (counts_ref[_LISTED] - program + programs - 1) // programs, fold_run, None)


# ----------------------------------------------------------------------------- launch helpers


@dataclasses.dataclass(frozen=True)
class _Config:
    """Launch parameters for one problem: the frontend's one heuristics helper (_config) fills it."""

    path: str  # FEATURE or SORT arithmetic
    # MERGE (_block_sort_kernel + _merge_rank_kernel), RANK (_rank_kernel), PACKED (lax.sort of
    # packed uint32 keys), PAIRS (stable lax.sort of (key, position))
    sort: str
    interpret: bool  # Pallas interpret mode (CPU)
    merge_block: int  # tokens per block of the merge-rank sort (a power of two)
    merge_block_i: int  # tokens of a block ranked per _block_sort_kernel program (a power of two)
    merge_tile: int  # _block_sort_kernel's comparison tile (divides merge_block)
    merge_blocks: int  # power of two >= cdiv(n, merge_block)
    merge_u: int  # block-sorted tokens per _merge_rank_kernel program (a power of two)
    block_i: int  # _rank_kernel tiles
    block_j: int
    runs_block: int  # _runs_kernel slots per program
    block_h: int  # _partials_kernel columns per program
    partial_warps: int  # _partials_kernel's num_warps
    partial_programs: int  # sort path: _partials_kernel's programs, which stride the records
    prefetch: bool  # sort path: _partials_kernel loads the next item's record before this item's rows
    fold_programs: int  # sort path: _partials_kernel programs that fold the long runs (0, and on the feature path: _long_runs_kernel does)
    fold_h: int  # columns of one of their items
    fold_batch: int  # partials they load at once
    fold_ahead: bool  # they load the next batch while they add this one (_fold)
    # The short static loops of _merge_rank_kernel and _partials_kernel unrolled, as the torch
    # twin's (GPU), else loops: XLA:CPU compiles them several times faster in interpret mode.
    unroll: bool
    long_block_h: int  # _long_runs_kernel columns per program
    long_programs: int  # _long_runs_kernel programs along the run list
    long_batch: int  # partials _long_runs_kernel loads at once
    long_ahead: bool  # it loads the next batch while it adds this one (_fold)
    zero_skip: int  # sort path: runs of this many partials or more skip their zero partials (ZERO_SKIP_MIN_PARTIALS; 0: none)
    skip_block: int  # their flags read at once (ZERO_SKIP_BLOCK)
    skip_wide: int  # blocks of their flags checked at once (ZERO_SKIP_WIDE)
    long_warps: int  # _long_runs_kernel's num_warps
    max_long_runs: int  # rows of the long-run list
    num_warps: int  # every kernel's but _partials_kernel's and _rank_kernel's
    num_stages: int
    bf16_scratch: bool = False  # feature path, bf16 grad: long runs' partials as bf16 bits (_to_scratch; BF16_SCRATCH_MIN_TOKENS)
    rank_warps: int = 4  # _rank_kernel's num_warps: 8 or 16 measured 5-6 us slower at 2048-3072 Zipf (NOTES v18 item 1)
    tail_programs: int = 0  # sort path: _partials_kernel's last programs (but the folders), which take the last items, one each
    plan_evict_last: bool = False  # merge sort: the sorted positions and records kept in L2 (PLAN_EVICT_LAST)
    rows_ahead: int = 0  # merge sort: extra merge-kernel programs read the rows of positions [0, this) into L2 (ROWS_AHEAD)
    rows_ahead_per: int = ROWS_AHEAD_PIECES  # (position, H block) pieces per such program
    masked_defer: bool = True  # sort path with masked: the records of runs with flags wait for _masked_records (False: v49's plan)
    compact: bool = True  # merge sort with masked: the masked route (_compact; probes: False, the deferral)
    # Inside jax.shard_map: the ShapeDtypeStruct keyword that makes every kernel's outputs vary
    # over main_grad's manual mesh axes, as (name, value) (_mesh_axes); () outside.
    vary: tuple = ()


@functools.lru_cache(maxsize=None)
def _gpu_sms() -> int:
    """SMs of the first local device (jax's core_count); 132 (H100, H200) if the runtime does not say."""
    return getattr(jax.local_devices()[0], "core_count", None) or 132


def _merge_lanes(n: int, tile_lanes: int, interpret: bool) -> int:
    """Lanes (tokens x blocks) per _merge_rank_kernel program: FEW_MERGE_LANES and
    SMALL_MERGE_LANES for few tokens on a GPU, else the tiles' own (and always in interpret mode)."""
    if interpret or n > SMALL_MERGE_LANES_MAX_TOKENS:
        return tile_lanes
    return FEW_MERGE_LANES if n <= FEW_MERGE_LANES_MAX_TOKENS else SMALL_MERGE_LANES


def _config(problem: Problem, path: str, overrides: tuple = (), zero_rows: bool = False, masked: bool = False) -> _Config:
    """The launch parameters (zero_rows: accumulate's; masked: whether accumulate's masked is given, whose route keeps
    the merge sort to more tokens, embwgrad_core.merge_sorted); overrides ((field, value), ...) lets tests force a sort
    or small tiles.

    interpret and merge_block are read from overrides first: the tiles and merge_blocks and
    merge_u follow from them, unless overridden too.
    """
    n, hidden = problem.num_tokens, problem.hidden
    if path not in (FEATURE, SORT):
        raise ValueError(f"path={path!r} must be {FEATURE!r} or {SORT!r}")
    feature = path == FEATURE
    forced = dict(overrides)
    interpret = forced.get("interpret", jax.default_backend() == "cpu")
    if feature:
        sort = RANK  # the feature path needs the chunk ordinals that only _rank_kernel gives
    elif merge_sorted(n, masked):  # MERGE_SORT_MAX_TOKENS: 8192 until session 6 (benchmarks/NOTES.md v6 item 4)
        sort = MERGE
    elif key_packing(n, problem.num_embeddings).dtype == "uint32":
        sort = PACKED
    else:
        sort = PAIRS
    max_long_runs = max(1, n // 2 if feature else n // (NROWS + 1))  # a long run has > 1 partial
    mblock = forced.get("merge_block", merge_block(n))
    mblocks = pl.next_power_of_2(pl.cdiv(n, mblock))
    tiles = merge_tiles(mblock)  # shared with the torch twin
    if interpret:  # one H block per program and few long-run programs: fewer interpreter steps
        block_i, block_j = INTERPRET_RANK_TILES[path]
        block_h = long_block_h = pl.next_power_of_2(hidden)
        long_programs = min(4, max_long_runs)
        partial_programs = 8  # several records each
    else:
        block_i, block_j = (CHUNK, 8 * CHUNK) if feature else (128, 64)  # as the torch twin on the feature path
        block_h = min(1024, pl.next_power_of_2(hidden))
        per_sm = LONG_PARTIAL_PROGRAMS_PER_SM
        if n <= FOLD_ROLE_MAX_TOKENS:  # more (token, H block) pairs, more programs (PARTIAL_PROGRAM_ITEMS)
            per_sm = min(WIDE_PARTIAL_PROGRAMS_PER_SM, max(PARTIAL_PROGRAMS_PER_SM, n * pl.cdiv(hidden, block_h) // PARTIAL_PROGRAM_ITEMS))
        if masked and sort == MERGE:  # the masked route (_compact, where cfg.compact)
            per_sm = min(per_sm, masked_partial_programs_per_sm(n))
        partial_programs = per_sm * _gpu_sms()
        long_block_h = min(128, block_h)
        # As the torch twin: 64 programs along the run list for small n, up to 4096 in all.
        long_programs = max(1, min(max_long_runs, max(64, min(4096 // pl.cdiv(hidden, long_block_h), n // 128))))
    cfg = _Config(
        path=path,
        sort=sort,
        interpret=interpret,
        merge_block=mblock,
        merge_block_i=mblock if interpret else tiles.block_i,
        merge_tile=mblock if interpret else tiles.tile,
        merge_blocks=mblocks,
        merge_u=max(1, _merge_lanes(n, tiles.lanes, interpret) // mblocks),
        block_i=block_i,
        block_j=block_j,
        runs_block=1024,
        block_h=block_h,
        # Two warps where the partials kernel also folds (and on the feature path); one above
        # FOLD_ROLE_MAX_TOKENS, where the long-run kernel folds: H200, 16384-131072 tokens 2-4%
        # faster, 4096-8192 3-5% slower (NOTES v9).
        partial_warps=1 if not feature and n > FOLD_ROLE_MAX_TOKENS else 2,
        partial_programs=partial_programs,
        prefetch=True,
        # Not above FOLD_ROLE_MAX_TOKENS, unlike the torch twin's FOLDERS_MAX_TOKENS: there folders gained
        # 2.5-3 us at 12288-16384 Zipf ids only with two-warp programs, which cost 16384 uniform 3.6 us
        # and 24576 Zipf 8 (one-warp programs with folders: 7-18 us slower; NOTES v48 item 1).
        fold_programs=0 if feature or n > FOLD_ROLE_MAX_TOKENS else (2 if interpret else FOLD_PROGRAMS_PER_SM * _gpu_sms()),
        # Sort path: folders and the long-run kernel load the next batch of partials while they add
        # this one, the folders over 128 columns: Megatron's vocab-parallel ids (probe_tp.py) 12-17%
        # faster, 16384-131072 Zipf 1.5-2.5%, 8192 Zipf about 1.5 us slower (NOTES v28 item 1).
        fold_h=min(128, block_h),
        fold_batch=1 if interpret else 16,
        fold_ahead=True,
        unroll=not interpret,
        long_block_h=long_block_h,
        long_programs=long_programs,
        # The feature path's long-run kernel batch by batch, as before: ahead it measured 3.6-11
        # us slower at 2048-3072 tokens (few chunks a run, each step rounded; NOTES v28 item 4).
        long_batch=1 if interpret else 32 if feature else 16,
        long_ahead=not feature,
        # As the torch twin; interpret mode's tests are small: there runs of 2 partials or more, 4 flags a block.
        zero_skip=0 if feature or not zero_rows else 2 if interpret else ZERO_SKIP_MIN_PARTIALS,
        skip_block=4 if interpret else ZERO_SKIP_BLOCK,
        skip_wide=2 if interpret else ZERO_SKIP_WIDE,
        long_warps=1,
        max_long_runs=max_long_runs,
        num_warps=4,
        num_stages=2,
        bf16_scratch=feature and problem.grad_dtype == "bfloat16" and n >= BF16_SCRATCH_MIN_TOKENS,
        tail_programs=0 if feature else (3 if interpret else TAIL_PROGRAMS_PER_SM * _gpu_sms() if n <= FOLD_ROLE_MAX_TOKENS else 0),
        plan_evict_last=PLAN_EVICT_LAST,  # (used where the merge sort makes the plan)
        # (used where the merge sort makes the plan; fewer positions above H = 7168: ROWS_AHEAD_ELEMENTS)
        rows_ahead=0 if interpret or feature else rows_ahead(ROWS_AHEAD, hidden),
    )
    cfg = dataclasses.replace(cfg, **forced)
    if cfg.bf16_scratch and (not feature or problem.grad_dtype != "bfloat16"):
        raise ValueError(f"bf16_scratch needs the feature path and a bf16 grad, got {path} and {problem.grad_dtype}")
    sorts = (MERGE, RANK, PACKED, PAIRS)
    if cfg.sort not in sorts or (feature and cfg.sort != RANK):
        raise ValueError(f"sort={cfg.sort!r} must be {RANK!r} on the feature path, else one of {sorts}")
    if (cfg.block_i % CHUNK or cfg.block_j % CHUNK) if feature else cfg.block_i % cfg.block_j:
        raise ValueError(f"block_i={cfg.block_i} must be a multiple of block_j={cfg.block_j} (feature path: both multiples of {CHUNK})")
    powers = {f: getattr(cfg, f) for f in ("merge_block", "merge_block_i", "merge_tile", "merge_blocks", "merge_u")}
    if any(v < 1 or v & (v - 1) for v in powers.values()):
        raise ValueError(f"{powers} must all be powers of two")
    if cfg.merge_tile > cfg.merge_block:
        raise ValueError(f"merge_tile={cfg.merge_tile} must be <= merge_block={cfg.merge_block}")
    if cfg.merge_blocks < pl.cdiv(n, cfg.merge_block):
        raise ValueError(f"merge_blocks={cfg.merge_blocks} must be >= cdiv(n={n}, merge_block={cfg.merge_block})")
    return cfg


def _call(kernel, cfg: _Config, *, out_shape, grid, name: str, input_output_aliases=None, num_warps=None, **static):
    """pl.pallas_call pinned to the Triton lowering (interpret mode on CPU); num_warps defaults to cfg's."""
    return pl.pallas_call(
        functools.partial(kernel, **static),
        out_shape=out_shape,
        grid=grid,
        input_output_aliases=input_output_aliases or {},
        compiler_params=plgpu.CompilerParams(num_warps=num_warps or cfg.num_warps, num_stages=cfg.num_stages),
        interpret=cfg.interpret,
        name=name,
    )


class _Stages(NamedTuple):
    """Every stage's output (embwgrad_core.plan names each piece); main_grad is the result."""

    sorted_keys: jax.Array  # int32 [n]
    sorted_pos: jax.Array  # int32 [n]
    partial_ord: jax.Array | None  # int32 [n], feature path only
    run_start: jax.Array  # int32 [n]
    run_end: jax.Array  # int32 [n]
    # int32 [n * REC_FIELDS], sort path only: counts[_FRONT] records from the front (long runs'
    # partials), counts[_BACK] from the back
    records: jax.Array | None
    counts: jax.Array  # int32 [COUNTS]
    partials: jax.Array  # fp32 [partial_buffer_rows, H]: meaningful at the partial rows of long runs
    long_runs: jax.Array  # int32 [max_long_runs, 2]: the first counts[_LISTED] rows are meaningful
    # int32 [cdiv(H, block_h) * partial_buffer_rows], with zero_skip: at (H block, partial row) of
    # the partials of runs of zero_skip partials or more, whether the partial is nonzero there (_flag)
    flags: jax.Array
    main_grad: jax.Array  # [V, H]


def _sds(cfg: _Config, shape, dtype) -> jax.ShapeDtypeStruct:
    """A kernel output's shape and dtype; inside jax.shard_map it varies over main_grad's mesh axes (cfg.vary)."""
    return jax.ShapeDtypeStruct(shape, dtype, **dict(cfg.vary))


def _axes(vary) -> frozenset:
    """The manual mesh axes of an aval's manual_axis_type (jax >= 0.10: its .varying) or vma (jax 0.7-0.9), or of None."""
    return frozenset(getattr(vary, "varying", vary) or ())


def _varying(x) -> frozenset:
    """The manual mesh axes that x varies over inside jax.shard_map (empty outside, or on a jax without them)."""
    aval = jax.typeof(x)
    mat = getattr(aval, "manual_axis_type", None)
    return _axes(mat if mat is not None else getattr(aval, "vma", None))


def _mesh_axes(ids, grad, main_grad, masked=None) -> tuple:
    """cfg.vary for main_grad; raises ValueError if ids or grad vary over a mesh axis that main_grad does not.

    Inside jax.shard_map (with check_vma, its default) a pallas_call must say which manual mesh
    axes its outputs vary over. Every kernel output here is made from ids and grad and (the
    last) is main_grad updated in place, so it varies as main_grad does; an ids or grad that
    differs across an axis where main_grad is one replicated value would make that value differ
    across the axis, which shard_map's types forbid: the caller must say so (jax.lax.pcast).
    """
    extra = (_varying(ids) | _varying(grad) | (frozenset() if masked is None else _varying(masked))) - _varying(main_grad)
    if extra:
        raise ValueError(f"main_grad must vary over every mesh axis that ids and grad vary over inside jax.shard_map: "
                         f"they vary over {sorted(extra)}, main_grad does not (make it varying, e.g. jax.lax.pcast(main_grad, "
                         f"{tuple(sorted(extra))}, to='varying'))")
    aval = jax.typeof(main_grad)
    fields = set(inspect.signature(jax.ShapeDtypeStruct).parameters)
    for name in ("manual_axis_type", "vma"):  # jax >= 0.10, jax 0.7-0.9
        if name in fields and getattr(aval, name, None) is not None:
            return ((name, getattr(aval, name)),)
    return ()


def _plan_shapes(n: int, cfg: _Config):
    """Shapes of the plan's counters, records, long-run list and arrival counters."""
    return [
        _sds(cfg, (COUNTS,), jnp.int32),
        _sds(cfg, (n * REC_FIELDS,), jnp.int32),
        _sds(cfg, (cfg.max_long_runs, 2), jnp.int32),
        _sds(cfg, (n,), jnp.int32),
    ]


def _merge_rows_ahead_kernel(block_keys_ref, block_pos_ref, counts_in_ref, ids_ref, grad_ref, masked_ref, main_grad_in_ref,
                             sorted_keys_ref, sorted_pos_ref, run_start_ref, run_end_ref, counts_ref, records_ref, long_runs_ref,
                             arrivals_ref, main_grad_ref, sink_ref, *, merge_programs: int, tokens: int, per: int, hidden: int,
                             block_h: int, num_embeddings: int, padding_idx: int, masked: bool, kept: int = 0, **merge):
    """Merge sort with ROWS_AHEAD: _merge_rank_kernel's programs, then programs that read the (position, H block) pieces of
    grad and of main_grad at the position's id for positions [0, tokens), per pieces each, with L2 priority evict_last, while
    the merge runs (DRAM idles during the plan; XLA gives no PDL to let the partials kernel's programs prefetch them then, as
    the torch twin's do). main_grad passes through (aliased) and is only read.

    The values are kept alive by a store into sink_ref (never read) under a mask that depends on them (a load whose value
    is unused is dropped). With masked (int8 [n], else any array, unread), masked positions' grad rows are not read.

    kept (the masked route): ids_ref is _compact's output, whose arrays are kept (their stride) apart, and the pieces read are
    those of its first kept tokens (keys at i, positions at kept + i, i below its m): the tokens the plan has, where the
    first positions are mostly masked tokens of row 0, which the partials never read (about 7/8 of them at TP 8).
    """
    del main_grad_in_ref
    q = pl.program_id(0)

    @pl.when(q < merge_programs)
    def _():
        _merge_rank_kernel(block_keys_ref, block_pos_ref, counts_in_ref, sorted_keys_ref, sorted_pos_ref, run_start_ref,
                           run_end_ref, counts_ref, records_ref, long_runs_ref, arrivals_ref, pid=q, **merge)

    @pl.when(q >= merge_programs)
    def _():
        num_hb = pl.cdiv(hidden, block_h)
        cols = lax.iota(jnp.int32, block_h)
        acc = jnp.zeros((block_h,), jnp.float32)
        for j in range(per):
            v = (q - merge_programs) * per + j
            take = v < tokens * num_hb
            i = jnp.minimum(v // num_hb, tokens - 1)
            if kept:
                take = take & (i < _kept_count(ids_ref, kept))
                pos = jnp.where(take, plgpu.load(ids_ref.at[kept + i]), 0)
            else:
                pos = i
            h0 = (v % num_hb) * block_h
            live_h = (h0 + cols < hidden) & take
            key = _keys(plgpu.load(ids_ref.at[i]), num_embeddings, padding_idx)
            keep = live_h & (key >= 0)
            read = live_h & (masked_ref[pos] == 0) if masked else live_h
            g = plgpu.load(grad_ref.at[pos, pl.ds(h0, block_h)], mask=read, other=0, eviction_policy="evict_last")
            m = plgpu.load(main_grad_ref.at[jnp.maximum(key, 0), pl.ds(h0, block_h)], mask=keep, other=0,
                           eviction_policy="evict_last")
            acc = acc + g.astype(jnp.float32) + m.astype(jnp.float32)
        plgpu.store(sink_ref.at[pl.ds(0, block_h)], acc, mask=acc == 1.0e-30)


def _merge_sort(ids, grad, main_grad, masked, problem: Problem, cfg: _Config, defer: int = 0, compact=None):
    """Stages 1 and 2 by the merge-rank sort: (sorted_keys, sorted_pos, run_start, run_end, counts, records, long_runs, arrivals,
    main_grad); main_grad is passed through (aliased), its rows read ahead with cfg.rows_ahead (but masked's, int8 [n] or None).
    compact (the masked route, _compact's output): the plan is of its m tokens."""
    n = problem.num_tokens
    slots = _sds(cfg, (n,), jnp.int32)
    block_keys, block_pos, counts = _call(
        _block_sort_kernel,
        cfg,
        out_shape=[slots, slots, _sds(cfg, (COUNTS,), jnp.int32)],
        grid=(pl.cdiv(n, cfg.merge_block), cfg.merge_block // min(cfg.merge_block_i, cfg.merge_block)),
        name="embwgrad_block_sort",
        n=n,
        num_embeddings=problem.num_embeddings,
        padding_idx=problem.padding_idx,
        block=cfg.merge_block,
        block_i=min(cfg.merge_block_i, cfg.merge_block),
        tile=cfg.merge_tile,
        compact=0 if compact is None else _compact_stride(n),
    )(ids if compact is None else compact)
    merge = dict(n=n, block=cfg.merge_block, num_blocks=cfg.merge_blocks, steps=cfg.merge_block.bit_length(), block_u=cfg.merge_u,
                 unroll=cfg.unroll, plan_policy="evict_last" if cfg.plan_evict_last else None, defer=defer, compact=compact is not None)
    if cfg.rows_ahead:
        tokens = min(n, cfg.rows_ahead)
        merge_programs = pl.cdiv(n, cfg.merge_u)
        extra = pl.cdiv(tokens * pl.cdiv(problem.hidden, cfg.block_h), cfg.rows_ahead_per)
        return _call(
            _merge_rows_ahead_kernel,
            cfg,
            out_shape=[slots, slots, slots, slots, *_plan_shapes(n, cfg), _sds(cfg, main_grad.shape, main_grad.dtype),
                       _sds(cfg, (cfg.block_h,), jnp.float32)],
            grid=(merge_programs + extra,),
            input_output_aliases={2: 4, 6: 8},
            name="embwgrad_merge_rank",
            merge_programs=merge_programs,
            tokens=tokens,
            per=cfg.rows_ahead_per,
            hidden=problem.hidden,
            block_h=cfg.block_h,
            num_embeddings=problem.num_embeddings,
            padding_idx=problem.padding_idx,
            masked=masked is not None,
            kept=0 if compact is None else _compact_stride(n),
            **merge,
        )(block_keys, block_pos, counts, ids if compact is None else compact, grad, ids if masked is None else masked, main_grad)[:-1]
    return (*_call(
        _merge_rank_kernel,
        cfg,
        out_shape=[slots, slots, slots, slots, *_plan_shapes(n, cfg)],
        grid=(pl.cdiv(n, cfg.merge_u),),
        input_output_aliases={2: 4},
        name="embwgrad_merge_rank",
        **merge,
    )(block_keys, block_pos, counts), main_grad)


def _sort(ids, problem: Problem, cfg: _Config):
    """Stage 1 by _rank_kernel or lax.sort: (sorted_keys, sorted_pos); on the feature path the
    whole plan, (sorted_keys, sorted_pos, partial_ord, run_start, run_end, counts, records, long_runs, arrivals)."""
    n, vocab = problem.num_tokens, problem.num_embeddings
    if cfg.sort == RANK:
        feature = cfg.path == FEATURE
        slots = _sds(cfg, (n,), jnp.int32)
        return _call(
            _rank_kernel,
            cfg,
            out_shape=[slots] * 5 + _plan_shapes(n, cfg) if feature else [slots] * 2,
            grid=(pl.cdiv(n, cfg.block_i),),
            name="embwgrad_rank",
            num_warps=cfg.rank_warps,
            n=n,
            num_embeddings=vocab,
            padding_idx=problem.padding_idx,
            block_i=cfg.block_i,
            block_j=cfg.block_j,
        )(ids)
    keys = _keys(ids, vocab, problem.padding_idx)
    pos = lax.iota(jnp.int32, n)
    if cfg.sort == PACKED:
        # (key + 1) << pos_bits | pos in one uint32: every packed key is distinct, so any sort is
        # the stable one, and one 32-bit operand is the cheapest sort XLA has (on Hopper a
        # keys-only CUB radix sort above ~22k elements), half the bytes of a (key, position) pair.
        pos_bits = key_packing(n, vocab).pos_bits
        packed = lax.sort(((keys + 1).astype(jnp.uint32) << pos_bits) | pos.astype(jnp.uint32))
        sorted_keys = (packed >> pos_bits).astype(jnp.int32) - 1
        sorted_pos = (packed & jnp.uint32((1 << pos_bits) - 1)).astype(jnp.int32)
        return sorted_keys, sorted_pos
    # More than 32 bits of key and position: sort the pair, keys only compared, stably.
    return tuple(lax.sort((keys, pos), num_keys=1, is_stable=True))


def _vary_as(x, cfg: _Config):
    """x made to vary over main_grad's mesh axes (cfg.vary; inside jax.shard_map, x itself otherwise)."""
    axes = tuple(sorted(frozenset().union(*(_axes(value) for _, value in cfg.vary)) - _varying(x)))
    if not axes:
        return x
    return lax.pcast(x, axes, to="varying") if hasattr(lax, "pcast") else lax.pvary(x, axes)  # jax >= 0.9; 0.7-0.8


def _runs(sorted_keys, sorted_pos, problem: Problem, cfg: _Config, defer: int = 0):
    """Stage 2 after lax.sort (sort path): (run_start, run_end, counts, records, long_runs, arrivals)."""
    n = problem.num_tokens
    # The counters must be zero before the kernel's atomics: a zero buffer aliased to them.
    return _call(
        _runs_kernel,
        cfg,
        out_shape=[_sds(cfg, (n,), jnp.int32)] * 2 + _plan_shapes(n, cfg),
        grid=(pl.cdiv(n, cfg.runs_block),),
        input_output_aliases={2: 2},
        name="embwgrad_runs",
        n=n,
        block=cfg.runs_block,
        defer=defer,
    )(sorted_keys, sorted_pos, _vary_as(jnp.zeros((COUNTS,), jnp.int32), cfg))


def _masked_records(plan, counts, records, arrivals, masked, problem: Problem, cfg: _Config, defer: int):
    """Sort path with masked: the deferred records (_masked_records_kernel). Returns (counts, records, arrivals, flags),
    all but flags aliased to the inputs; flags holds 0 for the dropped partials and is written further by _partials."""
    sorted_keys, sorted_pos, _, run_start, run_end = plan
    n = problem.num_tokens
    num_hb = pl.cdiv(problem.hidden, cfg.block_h)
    return _call(
        _masked_records_kernel,
        cfg,
        out_shape=[_sds(cfg, (COUNTS,), jnp.int32), _sds(cfg, records.shape, jnp.int32), _sds(cfg, arrivals.shape, jnp.int32),
                   _sds(cfg, (partial_buffer_rows(n, cfg.path) * num_hb,), jnp.int32)],
        grid=(pl.cdiv(n, MASKED_RECORDS_BLOCK),),
        input_output_aliases={5: 0, 6: 1, 7: 2},
        num_warps=4,
        name="embwgrad_masked_records",
        n=n,
        block=MASKED_RECORDS_BLOCK,
        num_hb=num_hb,
        defer=defer,
        policy="evict_last" if cfg.plan_evict_last and cfg.sort == MERGE else None,
    )(sorted_keys, sorted_pos, run_start, run_end, masked, counts, records, arrivals)


def _flags_in(kernel):
    """kernel with one more input before its six outputs, the flags (aliased to its last output) and never read."""

    def with_flags(*refs, **static):
        return kernel(*refs[:-7], *refs[-6:], **static)

    return with_flags


def _partials(plan, records, counts, long_runs, arrivals, grad, main_grad, problem: Problem, cfg: _Config, masked=None, flags=None):
    """Stage 3: sum every partial, finish runs of one partial; feature path: list the long runs;
    sort path with folding programs: fold them too. masked (int8 [n] or None): those positions' rows are taken as +0, not read.

    plan is (sorted_keys, sorted_pos, partial_ord or None, run_start, run_end). Returns
    (main_grad, partials, long_runs, counts, arrivals, flags), all but partials aliased to the inputs, and flags too when
    given (_masked_records wrote some).
    """
    sorted_keys, sorted_pos, partial_ord, run_start, run_end = plan
    n, hidden = problem.num_tokens, problem.hidden
    feature = cfg.path == FEATURE
    kernel = _partials_kernel if feature else functools.partial(_partials_kernel, None)
    inputs = [partial_ord] * feature + [sorted_keys, sorted_pos, run_start, records, grad, sorted_pos if masked is None else masked,
                                        main_grad, counts, long_runs, arrivals]
    items = n * pl.cdiv(hidden, cfg.block_h)  # feature path: one program each; sort path: at most this many
    folders = cfg.fold_programs  # 0 on the feature path (_config)
    programs = items if feature else min(items, cfg.partial_programs) + folders
    last = len(inputs) - 1
    aliases = {last - 3: 0, last - 1: 2, last - 2: 3, last: 4}
    if flags is not None:
        kernel, inputs = _flags_in(kernel), inputs + [flags]
        aliases[last + 1] = 5
    return _call(
        kernel,
        cfg,
        out_shape=[
            _sds(cfg, main_grad.shape, main_grad.dtype),
            _sds(cfg, (partial_buffer_rows(n, cfg.path), hidden), jnp.int16 if cfg.bf16_scratch else jnp.float32),
            _sds(cfg, long_runs.shape, jnp.int32),
            _sds(cfg, (COUNTS,), jnp.int32),
            _sds(cfg, arrivals.shape, jnp.int32),
            # (never read before written; a placeholder without the zero skip)
            _sds(cfg, (partial_buffer_rows(n, cfg.path) * pl.cdiv(hidden, cfg.block_h) if cfg.zero_skip else 1,), jnp.int32),
        ],
        grid=(programs,),
        input_output_aliases=aliases,
        num_warps=cfg.partial_warps,
        name="embwgrad_partials",
        n=n,
        hidden=hidden,
        path=cfg.path,
        grad_dtype=problem.grad_dtype,
        main_grad_dtype=problem.main_grad_dtype,
        block_h=cfg.block_h,
        unroll=cfg.unroll,
        prefetch=cfg.prefetch,
        folders=folders,
        # The folders follow the programs of the long runs' partials (the kernel adds their number);
        # interpret mode runs programs in order, one at a time: the folders, who wait, come last.
        fold_lo=programs - folders if cfg.interpret else 0,
        fold_h=min(cfg.fold_h, cfg.block_h),
        fold_batch=cfg.fold_batch,
        fold_ahead=cfg.fold_ahead,
        tail=0 if feature else max(0, min(cfg.tail_programs, programs - folders - 1)),
        interpret=cfg.interpret,
        skip_min=cfg.zero_skip,
        skip_block=cfg.skip_block,
        skip_wide=cfg.skip_wide,
        plan_policy="evict_last" if cfg.plan_evict_last and cfg.sort == MERGE else None,
        masked=masked is not None,
    )(*inputs)


def _long_runs(long_runs, counts, sorted_keys, partials, flags, main_grad, problem: Problem, cfg: _Config):
    """Stage 4: fold every long run's partials in order and add the result to main_grad (aliased)."""
    return _call(
        _long_runs_kernel,
        cfg,
        out_shape=_sds(cfg, main_grad.shape, main_grad.dtype),
        grid=(cfg.long_programs, pl.cdiv(problem.hidden, cfg.long_block_h)),
        input_output_aliases={5: 0},
        num_warps=cfg.long_warps,
        name="embwgrad_long_runs",
        hidden=problem.hidden,
        path=cfg.path,
        grad_dtype=problem.grad_dtype,
        main_grad_dtype=problem.main_grad_dtype,
        block_h=cfg.long_block_h,
        batch=cfg.long_batch,
        ahead=cfg.long_ahead,
        partial_block_h=cfg.block_h,
        skip_min=cfg.zero_skip,
        skip_block=cfg.skip_block,
        skip_wide=cfg.skip_wide,
    )(long_runs, counts, sorted_keys, partials, flags, main_grad)


def _compact(ids, masked, problem: Problem, cfg: _Config):
    """The masked route's stage 0 (as the torch twin's _compact_stage): int32 [_COMPACT_ARRAYS * stride + 4] (_compact_kernel)."""
    n = problem.num_tokens
    blocks = pl.cdiv(n, COMPACT_BLOCK)
    static = dict(n=n, num_embeddings=problem.num_embeddings, padding_idx=problem.padding_idx, block=COMPACT_BLOCK, blocks=blocks)
    counts = _call(_compact_counts_kernel, cfg, out_shape=_sds(cfg, (2 * blocks,), jnp.int32), grid=(blocks,), name="embwgrad_compact_counts",
                   **static)(ids, masked)
    stride = _compact_stride(n)
    return _call(_compact_kernel, cfg, out_shape=_sds(cfg, (_COMPACT_ARRAYS * stride + 4,), jnp.int32), grid=(blocks,),
                 name="embwgrad_compact", blocks_p2=pl.next_power_of_2(blocks), stride=stride, **static)(ids, masked, counts)


def _compact_stride(n: int) -> int:
    """Room of each of _compact_kernel's arrays: n, and past it a slot for each lane of the last block (its masked stores)."""
    return n + pl.cdiv(n, COMPACT_BLOCK) * COMPACT_BLOCK


def _row0(compact, grad, main_grad, problem: Problem, cfg: _Config):
    """The masked route's last stage: row MASKED_LOOKUP_ID from its unmasked tokens (_row0_kernel); main_grad aliased."""
    return _call(_row0_kernel, cfg, out_shape=_sds(cfg, main_grad.shape, main_grad.dtype), grid=(pl.cdiv(problem.hidden, ROW0_BLOCK_H),),
                 input_output_aliases={2: 0}, name="embwgrad_row0", stride=_compact_stride(problem.num_tokens), hidden=problem.hidden,
                 block_h=ROW0_BLOCK_H,
                 grad_dtype=problem.grad_dtype, main_grad_dtype=problem.main_grad_dtype)(compact, grad, main_grad)


def _run_stages(ids, grad, main_grad, problem: Problem, cfg: _Config, masked=None) -> _Stages:
    """All stages on ids [n] (flattened) and grad [n, H] into main_grad [V, H] (aliased); masked: int8 [n] or None."""
    partial_ord = None
    # With masked on the merge sort, the masked route: every token of MASKED_LOOKUP_ID leaves the plan,
    # and _row0 adds that row. Else, sort path with masked and the zero skip: the records of runs with
    # flags wait for _masked_records.
    compact = _compact(ids, masked, problem, cfg) if masked is not None and cfg.sort == MERGE and cfg.compact else None
    defer = cfg.zero_skip if masked is not None and cfg.path != FEATURE and cfg.masked_defer and compact is None else 0
    if cfg.sort == MERGE:
        sorted_keys, sorted_pos, run_start, run_end, counts, records, long_runs, arrivals, main_grad = _merge_sort(ids, grad, main_grad,
                                                                                                                   masked, problem, cfg, defer,
                                                                                                                   compact)
    elif cfg.path == FEATURE:  # _rank_kernel makes the whole plan
        sorted_keys, sorted_pos, partial_ord, run_start, run_end, counts, records, long_runs, arrivals = _sort(ids, problem, cfg)
    else:
        sorted_keys, sorted_pos = _sort(ids, problem, cfg)
        run_start, run_end, counts, records, long_runs, arrivals = _runs(sorted_keys, sorted_pos, problem, cfg, defer)
    plan = (sorted_keys, sorted_pos, partial_ord, run_start, run_end)
    flags = None
    if defer:
        counts, records, arrivals, flags = _masked_records(plan, counts, records, arrivals, masked, problem, cfg, defer)
    main_grad, partials, long_runs, counts, arrivals, flags = _partials(plan, records, counts, long_runs, arrivals, grad, main_grad,
                                                                       problem, cfg, masked, flags)
    if cfg.fold_programs == 0:  # else the partials kernel folded the long runs (never on the feature path)
        main_grad = _long_runs(long_runs, counts, sorted_keys, partials, flags, main_grad, problem, cfg)
    if compact is not None:
        main_grad = _row0(compact, grad, main_grad, problem, cfg)
    if cfg.path == FEATURE:
        records = None
    return _Stages(*plan, records, counts, partials, long_runs, flags, main_grad)


# ----------------------------------------------------------------------------- public functions


def _check(ids, grad, main_grad, padding_idx) -> Problem:
    for name, x in (("ids", ids), ("grad", grad), ("main_grad", main_grad)):
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise TypeError(f"{name} must be a jax.Array, got {type_name(x)}")
    problem = check_args(
        ids_shape=ids.shape,
        ids_is_integer=ids.dtype in (jnp.int32, jnp.int64),
        ids_dtype=ids.dtype,
        grad_shape=grad.shape,
        grad_dtype=grad.dtype,
        main_grad_shape=main_grad.shape,
        main_grad_dtype=main_grad.dtype,
        padding_idx=padding_idx,
    )
    for name, size in (("ids.size", problem.num_tokens), ("main_grad.shape[0]", problem.num_embeddings)):
        if size > _INT32_MAX:
            raise ValueError(f"{name}={size} must be below 2**31 (keys and positions are int32)")
    return problem


def _check_masked(masked, ids) -> None:
    if not (hasattr(masked, "shape") and hasattr(masked, "dtype")):
        raise TypeError(f"masked must be a jax.Array or None, got {type_name(masked)}")
    check_masked(masked_shape=tuple(masked.shape), masked_is_bool=masked.dtype == jnp.bool_, masked_dtype=masked.dtype,
                 ids_shape=tuple(ids.shape))


def _accumulate_impl(ids, grad, main_grad, masked=None, *, padding_idx=None, zero_rows=False, path=None, overrides=()):
    """accumulate with knobs for tests: the arithmetic forced to path ("feature" or "sort"; None:
    PyTorch's choice), _Config fields forced by overrides ((field, value), ...)."""
    problem = _check(ids, grad, main_grad, padding_idx)
    if not isinstance(zero_rows, bool):
        raise TypeError(f"zero_rows must be a bool, got {type_name(zero_rows)}")
    if masked is not None:
        _check_masked(masked, ids)
    n, hidden = problem.num_tokens, problem.hidden
    if n == 0 or hidden == 0:
        return main_grad
    padding = None if problem.padding_idx < 0 else problem.padding_idx
    ids, grad = ids.reshape(n), grad.reshape(n, hidden)
    zero_rows = zero_rows or masked is not None
    operands = (ids, grad, main_grad) if masked is None else (ids, grad, main_grad, masked.reshape(n).astype(jnp.int8))
    if _explicit_axes(main_grad):
        return _in_explicit_mesh(operands, padding, zero_rows, path, overrides)
    partitioned = _partitioned if masked is None else _partitioned_masked
    return partitioned(*operands, padding, zero_rows, path, overrides, _mesh_axes(*operands))


def _stages(ids, grad, main_grad, padding_idx, zero_rows, path, overrides, vary, masked=None):
    """main_grad with the rows of ids [n] added from grad [n, H] (but masked's, int8 [n] or None): every stage, on this
    main_grad (all of it, or a device's shard)."""
    problem = _check(ids, grad, main_grad, padding_idx)
    cfg = _config(problem, torch_path(problem.num_tokens) if path is None else path, overrides, zero_rows=zero_rows, masked=masked is not None)
    return _run_stages(ids, grad, main_grad, problem, dataclasses.replace(cfg, vary=vary), masked).main_grad


def _stages_unmasked(ids, grad, main_grad, padding_idx, zero_rows, path, overrides, vary):
    """_stages without masked, for custom_partitioning (whose operands are every argument not static)."""
    return _stages(ids, grad, main_grad, padding_idx, zero_rows, path, overrides, vary)


def _stages_masked(ids, grad, main_grad, masked, padding_idx, zero_rows, path, overrides, vary):
    """_stages with masked (int8 [n]) as a fourth operand, for custom_partitioning."""
    return _stages(ids, grad, main_grad, padding_idx, zero_rows, path, overrides, vary, masked)


# ----------------------------------------------------------------------------- under jax.jit with sharded arrays
#
# A pallas_call is a custom call, which XLA's partitioner would otherwise replicate: under jit
# with a main_grad sharded over devices, every device would gather all of main_grad, add all
# of it, and keep its own shard. With the rule below each device adds into its own shard only:
#
# - main_grad keeps its sharding, [V, H] split over any mesh axes (rows, columns or both);
# - ids and grad are gathered over their token dimension (a call under jit adds every token,
#   as on one device), and grad is split over the columns as main_grad is;
# - a device whose shard holds rows [r0, r0 + V_local) passes ids - r0, with the ids outside
#   its rows (padding_idx's too) made -1, so they add nothing there (masked, where given, is
#   gathered as ids are). A row's run, its partials
#   and, on the feature path, its chunk positions depend only on the positions of its own
#   tokens and on n, which every device keeps: each shard gets the bits of its rows in the
#   call on one device, and columns are summed independently.
#
# On one device, and inside a jax.shard_map over every mesh axis, jax lowers the body as it is
# (_stages).


def _axis_names(entry) -> tuple:
    """A PartitionSpec entry's mesh axes: () for None, a name, or a tuple of names."""
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _spec(axes: tuple):
    return None if not axes else axes[0] if len(axes) == 1 else axes


def _split(mesh, sharding) -> tuple:
    """(main_grad's row axes, and the PartitionSpecs of ids, grad and main_grad) for a main_grad of this sharding.

    main_grad keeps its split, by rows, columns or both (replicated where its sharding is no
    NamedSharding of this mesh); ids and grad are whole over tokens, and grad is split by columns
    as main_grad is.
    """
    rows, cols = (), ()
    if isinstance(sharding, NamedSharding) and sharding.mesh.shape_tuple == mesh.shape_tuple:
        spec = tuple(sharding.spec) + (None, None)
        rows, cols = _axis_names(spec[0]), _axis_names(spec[1])
    return rows, PartitionSpec(), PartitionSpec(None, _spec(cols)), PartitionSpec(_spec(rows), _spec(cols))


def _shard_stages(ids, grad, main_grad, masked=None, *, rows: tuple, padding_idx, zero_rows, path, overrides, vary):
    """_stages on this device's shard of main_grad, split by rows over the mesh axes `rows` (maybe none)."""
    if rows:  # this device's rows of main_grad start at r0
        local = main_grad.shape[0]
        r0 = lax.axis_index(rows) * local
        keep = (ids >= r0) & (ids < r0 + local)
        if padding_idx is not None:
            keep &= ids != padding_idx
        ids, padding_idx = jnp.where(keep, ids - r0, -1).astype(ids.dtype), None
    return _stages(ids, grad, main_grad, padding_idx, zero_rows, path, overrides, vary, masked)


def _partition(padding_idx, zero_rows, path, overrides, vary, mesh, arg_shapes, result_shape):
    """(ids, grad, main_grad[, masked]): masked, where given, split as ids."""
    rows, *specs = _split(mesh, arg_shapes[2].sharding)
    lower_fn = functools.partial(_shard_stages, rows=rows, padding_idx=padding_idx, zero_rows=zero_rows, path=path, overrides=overrides,
                                 vary=vary)
    ids, grad, main = (NamedSharding(mesh, spec) for spec in specs)
    return mesh, lower_fn, main, (ids, grad, main, ids)[: len(arg_shapes)]


def _infer_sharding(padding_idx, zero_rows, path, overrides, vary, mesh, arg_shapes, result_shape):
    return NamedSharding(mesh, _split(mesh, arg_shapes[2].sharding)[3])


_partitioned = custom_partitioning(_stages_unmasked, static_argnums=(3, 4, 5, 6, 7))
_partitioned.def_partition(partition=_partition, infer_sharding_from_operands=_infer_sharding,
                           sharding_rule="n, n h, v h -> v h", need_replication_factors=("n",))
_partitioned_masked = custom_partitioning(_stages_masked, static_argnums=(4, 5, 6, 7, 8))
_partitioned_masked.def_partition(partition=_partition, infer_sharding_from_operands=_infer_sharding,
                                  sharding_rule="n, n h, v h, n -> v h", need_replication_factors=("n",))


# Under jax.set_mesh with Explicit axes, arrays carry their shardings in their types and a
# pallas_call must run where every mesh axis is Manual: the same split by jax.shard_map, ids
# and grad resharded first as _partition asks for them.


def _explicit_axes(x) -> tuple:
    """The Explicit mesh axes of x's type (under jax.set_mesh with AxisType.Explicit); () otherwise."""
    sharding = getattr(jax.typeof(x), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    explicit = getattr(getattr(jax.sharding, "AxisType", None), "Explicit", None)
    if mesh is None or explicit is None:
        return ()
    return tuple(name for name, kind in zip(mesh.axis_names, getattr(mesh, "axis_types", ())) if kind == explicit)


def _in_explicit_mesh(operands, padding_idx, zero_rows, path, overrides):
    """operands: (ids, grad, main_grad[, masked]); masked, where given, resharded as ids."""
    sharding = jax.typeof(operands[2]).sharding
    rows, ids_spec, grad_spec, main_spec = _split(sharding.mesh, sharding)
    specs = (ids_spec, grad_spec, main_spec, ids_spec)[: len(operands)]
    operands = [x if i == 2 else jax.sharding.reshard(x, spec) for i, (x, spec) in enumerate(zip(operands, specs))]  # main_grad stays
    body = functools.partial(_shard_stages, rows=rows, padding_idx=padding_idx, zero_rows=zero_rows, path=path,
                             overrides=overrides, vary=())
    # check_vma off: the body's outputs vary as main_grad does by construction (in Pallas interpret
    # mode jax 0.10.2 fails its own check, as tests/test_jax_frontend.py's shard_map tests note).
    return jax.shard_map(body, mesh=sharding.mesh, in_specs=specs, out_specs=main_spec, check_vma=False)(*operands)


_JIT = dict(static_argnames=("padding_idx", "zero_rows", "path", "overrides"), donate_argnames=("main_grad",))
#: Inside a caller's jit (or any other transformation), where jax allows no compiler options.
_accumulate = jax.jit(_accumulate_impl, **_JIT)
#: A call on its own is three or four custom kernels, below XLA's CUDA-graph threshold
#: (xla_gpu_graph_min_graph_size, 5), so XLA would launch them one by one. Measured on the H200
#: (benchmarks/NOTES.md v6 item 5, v7 item 7): 1024 tokens about 10 us faster per call, no
#: change from 4096 tokens up, no cost found with a new grad array every call. Inside a
#: caller's jit the caller's command buffer holds our kernels.
_accumulate_alone = jax.jit(_accumulate_impl, **_JIT, compiler_options={"xla_gpu_graph_min_graph_size": 1})


def accumulate(ids: jax.Array, grad: jax.Array, main_grad: jax.Array, *, padding_idx: int | None = None,
               zero_rows: bool = False, masked: jax.Array | None = None) -> jax.Array:
    """main_grad + embedding_dense_backward(grad, ids), with PyTorch CUDA's bits; main_grad is donated.

    Args:
        ids: int32 [*S] token ids (int64 under jax_enable_x64).
        grad: [*S, H] float32, bfloat16 or float16: the gradient of the lookup's output.
        main_grad: [V, H] float32, bfloat16 or float16. Donated: use the returned array, as in
            ``main_grad = accumulate(ids, grad, main_grad)``, which updates the buffer in place
            (also inside jax.jit and lax.scan, where XLA keeps the alias).
        padding_idx: as in torch.nn.functional.embedding: that row gets nothing.
        zero_rows: True where many of grad's rows are zero, as a vocab-parallel lookup makes them
            (each device's tokens of other shards looked up as id 0, their grad rows zeroed): the
            partial sums of ten zero rows are then neither stored nor folded (as the torch
            frontend's; benchmarks/NOTES.md v29). Only the speed changes: the bits are the same.
        masked: bool [*S] or None: tokens whose grad rows are taken as +0 and never read, as a
            vocab-parallel lookup zeroes the rows of the tokens of other shards (pass its mask,
            with the shard-local ids). The bits are the dense path's on grad with those rows
            zeroed, so, where they are +0 or -0 already, the dense path's on grad itself; the
            torch frontend's bits with the same masked. Implies zero_rows=True. On the merge sort
            (4097 to MASKED_MERGE_SORT_MAX_TOKENS tokens with masked) every token of id MASKED_LOOKUP_ID (0) leaves
            the sort and row 0 is summed apart from its unmasked tokens (_compact, _row0_kernel;
            embwgrad_core.make_masked_plan; benchmarks/NOTES.md v55-v57). With no token masked the
            route still sorts all n: 6-8% slower than no mask at 65536 tokens (v57), so pass no
            mask where nothing is sharded.

    Returns:
        The new main_grad [V, H]. Only the rows of ids are read and written: rows of ids that
        do not occur, of padding_idx, and of ids outside [0, V) (skipped, not checked) keep
        their bits. On GPU, four Pallas Triton launches (three and a lax.sort above
        MERGE_SORT_MAX_TOKENS tokens; seven with masked on the merge sort: the compaction's
        two first, row 0's last); on CPU the same kernels in interpret mode.

    Under jax.jit with sharded arrays, every token of the call is added, as on one device, and
    each device adds only into its own shard of main_grad (split by rows, columns or both, over
    any mesh axes; the sharding is kept): ids and grad are gathered over tokens where split, and
    main_grad is never moved (_partition; under jax.set_mesh with Explicit axes, the same split
    by a shard_map, _in_explicit_mesh).

    Inside jax.shard_map (one call per device on its own shards, e.g. data parallel with a
    main_grad per device), every kernel's outputs vary over main_grad's mesh axes, so shard_map's
    check_vma holds; main_grad must then vary over every axis that ids or grad vary over.

    Not under jax.vmap (custom_partitioning has no batching rule): pass a batch as ids' leading
    dimensions, or lax.scan over micro-batches with main_grad as the carry. Not differentiable
    (jax.grad through it raises NotImplementedError for custom_partitioning): it is where the
    gradient ends, so call it outside the differentiated function, on the lookup's cotangent.

    Raises TypeError or ValueError, naming the argument, while tracing: main_grad is then
    neither donated nor changed. n == 0 or H == 0 returns main_grad unchanged.
    """
    ids = _int32_safe(ids)
    traced = any(isinstance(a, jax.core.Tracer) for a in (ids, grad, main_grad, masked))
    return (_accumulate if traced else _accumulate_alone)(ids, grad, main_grad, masked, padding_idx=padding_idx, zero_rows=zero_rows)


def _int32_safe(ids):
    """ids as given, but a NumPy int64 array without jax_enable_x64 with its ids outside int32 made -1.

    jax converts such an array to int32 by wrapping, silently, so an id from 2**31 up (outside
    [0, V), to be skipped) would become an id in [0, V) and add into its row; -1 is skipped as
    it is. A jax.Array is int32 already (its ids wrapped, if at all, where it was made)."""
    if isinstance(ids, np.ndarray) and ids.dtype == np.int64 and not jax.config.jax_enable_x64:
        info = np.iinfo(np.int32)
        return np.where((ids < info.min) | (ids > info.max), -1, ids)
    return ids
