"""main_grad += embedding_dense_backward(grad, ids) in Triton, with PyTorch CUDA's bits.

Design (SPEC.md; embwgrad_core.plan names the pieces). Four launches, no host synchronisation:

1. ``_rank_kernel`` sorts the tokens by key (stable) by counting, for every token, the tokens
   that sort before it: O(n^2) comparisons, spread over n / BLOCK_I programs. Up to
   embwgrad_core.RANK_SORT_MAX_TOKENS this beats a radix sort, whose fixed passes cost more
   than the comparisons (8192 keys: 52 us against 318 us for torch.sort's route); above it we
   call torch.sort, whose cost is small beside the grad bytes by then. On the feature path it also gives every token its
   chunk's ordinal within its run.
2. ``_runs_kernel`` finds every sorted slot's run start by binary search.
3. ``_partials_kernel``: one program per (slot, H block) that starts a partial sums the
   partial's rows in fp32, in order. A run of one partial is finished there (rounded and
   added into main_grad); a longer run's partials go to a scratch buffer, and its last
   partial appends the run to a list.
4. ``_long_runs_kernel`` folds each listed run's partials in order, rounds, adds to main_grad.

No atomics touch floating-point data: every sum's order is PyTorch's. The only atomic is the
integer counter of the long-run list, whose order does not matter. Rounding to bf16 is done
with integer operations, because Triton's interpreter truncates fp32 -> bf16.
"""

import contextlib
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from embwgrad_core import CHUNK, FEATURE, NROWS, RANK_SORT_MAX_TOKENS, SORT, partial_buffer_rows, torch_path
from embwgrad_core import reference as core_reference
from embwgrad_core.dtypes import ROUNDING_CODE
from embwgrad_core.validate import Problem, check_args

#: (BLOCK_I, BLOCK_J) of _rank_kernel on a GPU. BLOCK_I must be a multiple of BLOCK_J, and
#: BLOCK_J == CHUNK on the feature path.
RANK_TILES = {SORT: (128, 64), FEATURE: (64, CHUNK)}
#: The same under TRITON_INTERPRET=1, where each program step is a NumPy call: large tiles
#: keep it fast. Tests also run the interpreter with RANK_TILES and with smaller tiles.
INTERPRET_RANK_TILES = {SORT: (256, 256), FEATURE: (8 * CHUNK, CHUNK)}

_INT32_MAX = tl.constexpr(2**31 - 1)


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
def _add_to_row(row_ptr, cols, mask, gw, ROUNDING: tl.constexpr):
    """row = round(float(row) + gw): main_grad.add_ of one row block, one rounding."""
    old = tl.load(row_ptr + cols, mask=mask).to(tl.float32)
    new = _round(old + gw, ROUNDING)
    tl.store(row_ptr + cols, new.to(row_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_keys(ids_ptr, idx, mask, num_embeddings, padding_idx):
    """int32 keys of ids[idx]: the id, or -1 for a token that adds nothing."""
    ids = tl.load(ids_ptr + idx, mask=mask, other=-1)
    keep = (ids >= 0) & (ids < num_embeddings) & (ids != padding_idx)
    return tl.where(keep, ids, -1).to(tl.int32)


@triton.jit
def _rank_kernel(
    ids_ptr,  # int32/int64 [n]: token ids in position order
    sorted_keys_ptr,  # int32 [n] out: keys in sorted order
    sorted_pos_ptr,  # int32 [n] out: positions in sorted order
    partial_ord_ptr,  # int32 [n] out, feature path only: ordinal of the slot's chunk within its run
    n,  # number of tokens
    num_embeddings,  # V
    padding_idx,  # id that adds nothing, or -1
    FEATURE_PATH: tl.constexpr,  # also compute partial_ord (then BLOCK_J == CHUNK)
    CHUNK_SIZE: tl.constexpr,  # positions per feature-path chunk
    BLOCK_I: tl.constexpr,  # tokens ranked per program (a multiple of BLOCK_J)
    BLOCK_J: tl.constexpr,  # tokens compared per step
):
    i0 = tl.program_id(0) * BLOCK_I
    i = i0 + tl.arange(0, BLOCK_I)
    live_i = i < n
    key_i = _load_keys(ids_ptr, i, live_i, num_embeddings, padding_idx)
    before = tl.zeros([BLOCK_I, BLOCK_J], dtype=tl.int32)  # counts of tokens that sort before i
    chunks = tl.zeros([BLOCK_I], dtype=tl.int32)  # earlier chunks holding i's key
    # Tokens at earlier positions sort before i when their key is <= key_i.
    for j0 in range(0, i0, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        key_j = _load_keys(ids_ptr, j, j < n, num_embeddings, padding_idx)
        before += (key_j[None, :] <= key_i[:, None]).to(tl.int32)
        if FEATURE_PATH:
            chunks += tl.max((key_j[None, :] == key_i[:, None]).to(tl.int32), axis=1)
    # Inside the block, ties go by position.
    for j0 in tl.static_range(0, BLOCK_I, BLOCK_J):
        j = i0 + j0 + tl.arange(0, BLOCK_J)
        live_j = j < n
        key_j = _load_keys(ids_ptr, j, live_j, num_embeddings, padding_idx)
        same = (key_j[None, :] == key_i[:, None]) & live_j[None, :]
        first = (key_j[None, :] < key_i[:, None]) | (same & (j[None, :] < i[:, None]))
        before += (first & live_j[None, :]).to(tl.int32)
        if FEATURE_PATH:
            earlier_chunk = (i0 + j0) // CHUNK_SIZE < i // CHUNK_SIZE
            chunks += tl.where(earlier_chunk, tl.max(same.to(tl.int32), axis=1), 0)
    # Tokens at later positions sort before i when their key is < key_i.
    for j0 in range(i0 + BLOCK_I, n, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        key_j = _load_keys(ids_ptr, j, j < n, num_embeddings, padding_idx)
        key_j = tl.where(j < n, key_j, _INT32_MAX)
        before += (key_j[None, :] < key_i[:, None]).to(tl.int32)
    rank = tl.sum(before, axis=1)
    tl.store(sorted_keys_ptr + rank, key_i, mask=live_i)
    tl.store(sorted_pos_ptr + rank, i, mask=live_i)
    if FEATURE_PATH:
        tl.store(partial_ord_ptr + rank, chunks, mask=live_i)


@triton.jit
def _runs_kernel(
    sorted_keys_ptr,  # int32 [n]: keys in sorted order
    run_start_ptr,  # int32 [n] out: first slot of each slot's run
    long_count_ptr,  # int32 [1] out: the long-run counter, zeroed here
    n,  # number of tokens
    search_steps,  # binary-search steps: n.bit_length()
    BLOCK: tl.constexpr,  # slots per program
):
    s = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = s < n
    key = tl.load(sorted_keys_ptr + s, mask=live, other=0)
    lo = tl.zeros([BLOCK], dtype=tl.int32)
    hi = s  # the run start lies in [lo, hi]
    for _ in range(search_steps):
        mid = (lo + hi) // 2
        below = tl.load(sorted_keys_ptr + mid, mask=live, other=0) < key
        lo = tl.where(below, mid + 1, lo)
        hi = tl.where(below, hi, mid)
    tl.store(run_start_ptr + s, lo, mask=live)
    if tl.program_id(0) == 0:
        tl.store(long_count_ptr, 0)


@triton.jit
def _partials_kernel(
    sorted_keys_ptr,  # int32 [n]: keys in sorted order
    sorted_pos_ptr,  # int32 [n]: positions in sorted order
    run_start_ptr,  # int32 [n]: first slot of each slot's run
    partial_ord_ptr,  # int32 [n], feature path only: ordinal of the slot's chunk within its run
    grad_ptr,  # [*S, H] bf16/fp16/fp32: position p's row at (p // grad_dim1) * grad_stride0 + (p % grad_dim1) * grad_stride1
    main_grad_ptr,  # [V, H] bf16/fp16/fp32, rows main_grad_stride apart
    partials_ptr,  # fp32 [partial_buffer_rows, H] out: partial sums of long runs
    long_runs_ptr,  # int32 [2 * max_long_runs] out: (run start, number of partials) of each long run
    long_count_ptr,  # int32 [1]: number of long runs listed
    n,  # number of tokens
    hidden,  # H
    grad_dim1,
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
):
    s = tl.program_id(0)
    hb = tl.program_id(1)
    key = tl.load(sorted_keys_ptr + s)
    run_start = tl.load(run_start_ptr + s)
    if FEATURE_PATH:
        chunk = tl.load(sorted_pos_ptr + s) // CHUNK_SIZE
        prev_chunk = tl.load(sorted_pos_ptr + s - 1, mask=s > run_start, other=-CHUNK_SIZE) // CHUNK_SIZE
        starts = (s == run_start) | (prev_chunk != chunk)
        k = tl.load(partial_ord_ptr + s)
    else:
        chunk = 0
        starts = (s - run_start) % SPAN == 0
        k = (s - run_start) // SPAN
    if (key >= 0) & starts:
        cols = hb * BLOCK_H + tl.arange(0, BLOCK_H)
        live_h = cols < hidden
        is_first = s == run_start
        main_row = main_grad_ptr + key.to(tl.int64) * main_grad_stride
        if not FEATURE_PATH:
            # The run ends in this partial iff slot s + NROWS holds another key: known before any
            # row is read, so a finished run's main_grad row loads alongside its grad rows.
            after = s + SPAN
            is_last = tl.load(sorted_keys_ptr + after, mask=after < n, other=-2) != key
            finish = cols < tl.where(is_first & is_last, hidden, 0)
            old = tl.load(main_row + cols, mask=finish, other=0.0).to(tl.float32)
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        count = 0
        for t in tl.static_range(SPAN):
            slot = s + t
            key_t = tl.load(sorted_keys_ptr + slot, mask=slot < n, other=-2)
            pos_t = tl.load(sorted_pos_ptr + slot, mask=slot < n, other=0)
            mine = key_t == key
            if FEATURE_PATH:
                mine = mine & (pos_t // CHUNK_SIZE == chunk)
            grad_row = (pos_t // grad_dim1).to(tl.int64) * grad_stride0 + (pos_t % grad_dim1).to(tl.int64) * grad_stride1
            # cols < (mine ? H : 0), not live_h & mine: the interpreter mistypes scalar & vector masks.
            take = cols < tl.where(mine, hidden, 0)
            g = tl.load(grad_ptr + grad_row + cols * grad_stride_h, mask=take, other=0.0)
            acc += g.to(tl.float32)  # acc is never -0, so adding +0 for a row not taken leaves it
            count += mine.to(tl.int32)
        if FEATURE_PATH:
            after = s + count
            is_last = tl.load(sorted_keys_ptr + after, mask=after < n, other=-2) != key
            finish = cols < tl.where(is_first & is_last, hidden, 0)
            old = tl.load(main_row + cols, mask=finish, other=0.0).to(tl.float32)
        if is_first & is_last:
            # +0 + s (sort path) and +0 + round(s) (feature path) both round to round(s).
            new = _round(old + _round(acc, GRAD_ROUNDING), MAIN_ROUNDING)
            tl.store(main_row + cols, new.to(main_grad_ptr.dtype.element_ty), mask=live_h)
        else:
            if FEATURE_PATH:
                row = run_start + k
            else:
                row = 2 * (s // SPAN) + is_first.to(tl.int32)
            tl.store(partials_ptr + row.to(tl.int64) * hidden + cols, acc, mask=live_h)
            if is_last & (hb == 0):
                entry = tl.atomic_add(long_count_ptr, 1)
                tl.store(long_runs_ptr + 2 * entry, run_start)
                tl.store(long_runs_ptr + 2 * entry + 1, k + 1)


@triton.jit
def _long_runs_kernel(
    long_runs_ptr,  # int32 [2 * max_long_runs]: (run start, number of partials) of each long run
    long_count_ptr,  # int32 [1]: number of long runs listed
    sorted_keys_ptr,  # int32 [n]: keys in sorted order
    partials_ptr,  # fp32 [partial_buffer_rows, H]: partial sums of long runs
    main_grad_ptr,  # [V, H] bf16/fp16/fp32
    hidden,  # H
    main_grad_stride,
    FEATURE_PATH: tl.constexpr,
    SPAN: tl.constexpr,
    GRAD_ROUNDING: tl.constexpr,
    MAIN_ROUNDING: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    live_h = cols < hidden
    for e in range(tl.program_id(0), tl.load(long_count_ptr), tl.num_programs(0)):
        run_start = tl.load(long_runs_ptr + 2 * e)
        num_partials = tl.load(long_runs_ptr + 2 * e + 1)
        key = tl.load(sorted_keys_ptr + run_start)
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        for k in range(num_partials):
            if FEATURE_PATH:
                row = run_start + k
            else:
                row = 2 * ((run_start + SPAN * k) // SPAN) + (k == 0)
            part = tl.load(partials_ptr + row.to(tl.int64) * hidden + cols, mask=live_h)
            if FEATURE_PATH:
                acc = _round(acc + _round(part, GRAD_ROUNDING), GRAD_ROUNDING)
            else:
                acc += part
        if not FEATURE_PATH:
            acc = _round(acc, GRAD_ROUNDING)
        _add_to_row(main_grad_ptr + key.to(tl.int64) * main_grad_stride, cols, live_h, acc, MAIN_ROUNDING)


# ----------------------------------------------------------------------------- launch helpers


@dataclass(frozen=True)
class _Config:
    """Launch parameters for one problem: the frontend's one heuristics helper."""

    path: str
    rank_sort: bool  # _rank_kernel (else torch.sort)
    block_i: int
    block_j: int
    rank_warps: int
    runs_block: int
    block_h: int
    partial_warps: int
    long_block_h: int
    long_programs: int
    max_long_runs: int


def _config(problem: Problem, path: str, interpret: bool) -> _Config:
    """The launch parameters: the measured choices are in benchmarks/NOTES.md."""
    n, hidden = problem.num_tokens, problem.hidden
    feature = path == FEATURE
    block_h = min(1024, triton.next_power_of_2(hidden))
    long_block_h = min(256, block_h)
    max_long_runs = max(1, n // 2 if feature else n // (NROWS + 1))
    block_i, block_j = (INTERPRET_RANK_TILES if interpret else RANK_TILES)[path]
    if block_i % block_j or (feature and block_j != CHUNK):
        raise ValueError(f"rank tiles ({block_i=}, {block_j=}) must have block_i % block_j == 0 (block_j == {CHUNK} on the feature path)")
    return _Config(
        path=path,
        rank_sort=feature or n <= RANK_SORT_MAX_TOKENS,
        block_i=block_i,
        block_j=block_j,
        rank_warps=4,
        runs_block=1024,
        block_h=block_h,
        partial_warps=4,
        long_block_h=long_block_h,
        long_programs=max(1, min(max_long_runs, 1024 // triton.cdiv(hidden, long_block_h))),
        max_long_runs=max_long_runs,
    )


def _position_strides(grad: torch.Tensor):
    """(dim1, stride0, stride1) with position p's row at (p // dim1) * stride0 + (p % dim1) * stride1.

    None when grad's leading dimensions do not collapse to two strided dimensions.
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
        merged = [(1, 0)] * (2 - len(merged)) + merged
    (_, stride0), (dim1, stride1) = merged
    return max(dim1, 1), stride0, stride1


@dataclass(frozen=True)
class _Plan:
    """The plan on the device (embwgrad_core.plan names each piece): views of one int32 workspace."""

    sorted_keys: torch.Tensor  # [n]
    sorted_pos: torch.Tensor  # [n]
    partial_ord: torch.Tensor  # [n], feature path only
    run_start: torch.Tensor  # [n]
    long_count: torch.Tensor  # [1]
    long_runs: torch.Tensor  # [2 * max_long_runs]: (run start, number of partials) pairs


def _plan_stage(ids, problem: Problem, cfg: _Config) -> _Plan:
    """Stages 1 and 2: sort the tokens by key and find every slot's run start."""
    n = problem.num_tokens
    workspace = torch.empty(4 * n + 1 + 2 * cfg.max_long_runs, dtype=torch.int32, device=ids.device)
    plan = _Plan(*(workspace[i * n : (i + 1) * n] for i in range(4)), workspace[4 * n : 4 * n + 1], workspace[4 * n + 1 :])
    if cfg.rank_sort:
        _rank_kernel[(triton.cdiv(n, cfg.block_i),)](
            ids,
            plan.sorted_keys,
            plan.sorted_pos,
            plan.partial_ord,
            n,
            problem.num_embeddings,
            problem.padding_idx,
            FEATURE_PATH=cfg.path == FEATURE,
            CHUNK_SIZE=CHUNK,
            BLOCK_I=cfg.block_i,
            BLOCK_J=cfg.block_j,
            num_warps=cfg.rank_warps,
        )
    else:
        keep = (ids >= 0) & (ids < problem.num_embeddings) & (ids != problem.padding_idx)
        keys, order = torch.sort(torch.where(keep, ids, -1).to(torch.int32), stable=True)
        plan.sorted_keys.copy_(keys)
        plan.sorted_pos.copy_(order)
    _runs_kernel[(triton.cdiv(n, cfg.runs_block),)](
        plan.sorted_keys, plan.run_start, plan.long_count, n, n.bit_length(), BLOCK=cfg.runs_block, num_warps=4
    )
    return plan


def _partials_stage(plan: _Plan, grad, main_grad, problem: Problem, cfg: _Config) -> torch.Tensor:
    """Stage 3: sum every partial; finish runs of one partial; return the long runs' partial buffer."""
    n, hidden = problem.num_tokens, problem.hidden
    strides = _position_strides(grad)
    if strides is None:  # more than two strided position dimensions: one copy
        grad = grad.contiguous()
        strides = _position_strides(grad)
    partials = torch.empty(partial_buffer_rows(n, cfg.path), hidden, dtype=torch.float32, device=main_grad.device)
    _partials_kernel[(n, triton.cdiv(hidden, cfg.block_h))](
        plan.sorted_keys,
        plan.sorted_pos,
        plan.run_start,
        plan.partial_ord,
        grad,
        main_grad,
        partials,
        plan.long_runs,
        plan.long_count,
        n,
        hidden,
        *strides,
        grad.stride(-1),
        main_grad.stride(0),
        FEATURE_PATH=cfg.path == FEATURE,
        SPAN=CHUNK if cfg.path == FEATURE else NROWS,
        CHUNK_SIZE=CHUNK,
        GRAD_ROUNDING=ROUNDING_CODE[problem.grad_dtype],
        MAIN_ROUNDING=ROUNDING_CODE[problem.main_grad_dtype],
        BLOCK_H=cfg.block_h,
        num_warps=cfg.partial_warps,
    )
    return partials


def _long_runs_stage(plan: _Plan, partials, main_grad, problem: Problem, cfg: _Config) -> None:
    """Stage 4: fold the partials of every long run in order and add the result to main_grad."""
    _long_runs_kernel[(cfg.long_programs, triton.cdiv(problem.hidden, cfg.long_block_h))](
        plan.long_runs,
        plan.long_count,
        plan.sorted_keys,
        partials,
        main_grad,
        problem.hidden,
        main_grad.stride(0),
        FEATURE_PATH=cfg.path == FEATURE,
        SPAN=CHUNK if cfg.path == FEATURE else NROWS,
        GRAD_ROUNDING=ROUNDING_CODE[problem.grad_dtype],
        MAIN_ROUNDING=ROUNDING_CODE[problem.main_grad_dtype],
        BLOCK_H=cfg.long_block_h,
        num_warps=4,
    )


def _launch(ids, grad, main_grad, problem: Problem, path: str) -> None:
    """All four stages: ids [n] (flattened), grad [*S, H] (strides allowed), main_grad [V, H]."""
    cfg = _config(problem, path, interpret=_interpreting())
    plan = _plan_stage(ids, problem, cfg)
    partials = _partials_stage(plan, grad, main_grad, problem, cfg)
    _long_runs_stage(plan, partials, main_grad, problem, cfg)


def _interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 when triton was imported)."""
    return isinstance(_partials_kernel, InterpretedFunction)


# ----------------------------------------------------------------------------- public functions


def _check(ids, grad, main_grad, padding_idx) -> Problem:
    for name, t in (("ids", ids), ("grad", grad), ("main_grad", main_grad)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    problem = check_args(
        ids_shape=tuple(ids.shape),
        ids_is_integer=ids.dtype in (torch.int32, torch.int64),
        ids_dtype=ids.dtype,
        grad_shape=tuple(grad.shape),
        grad_dtype=grad.dtype,
        main_grad_shape=tuple(main_grad.shape),
        main_grad_dtype=main_grad.dtype,
        padding_idx=padding_idx,
    )
    if not main_grad.is_contiguous():
        raise ValueError(f"main_grad must be contiguous, got strides {main_grad.stride()}")
    if not (ids.device == grad.device == main_grad.device):
        raise ValueError(
            f"ids, grad and main_grad must be on one device, got {ids.device}, {grad.device}, {main_grad.device}"
        )
    return problem


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


def accumulate(ids: torch.Tensor, grad: torch.Tensor, main_grad: torch.Tensor, *, padding_idx=None) -> None:
    """main_grad += embedding_dense_backward(grad, ids), in place, with PyTorch CUDA's bits.

    Args:
        ids: int32 or int64 [*S], token ids.
        grad: [*S, H] float32, bfloat16 or float16: the gradient of the lookup's output. Any
            strides (for example [s, b, H] storage seen as [b, s, H]).
        main_grad: [V, H] float32, bfloat16 or float16, contiguous; updated in place.
        padding_idx: as in torch.nn.functional.embedding: that row gets nothing.

    Only the rows of ids are read and written: rows of ids that do not occur, of
    padding_idx, and of ids outside [0, V) (which are skipped, not checked: a check would
    synchronise with the host) keep their bits. On CUDA the work is four Triton launches on
    the current stream with no host synchronisation, so it can be captured in a CUDA graph.
    On CPU it runs the core's NumPy reference (or the kernels under TRITON_INTERPRET=1).

    Raises TypeError or ValueError, naming the argument, before main_grad is touched.
    """
    problem = _check(ids, grad, main_grad, padding_idx)
    if problem.num_tokens == 0 or problem.hidden == 0:
        return
    path = torch_path(problem.num_tokens)
    if _uses_kernels(main_grad.device):
        with torch.cuda.device(main_grad.device) if main_grad.is_cuda else contextlib.nullcontext():
            _launch(ids.reshape(-1), grad, main_grad, problem, path)
    elif main_grad.device.type == "cpu":
        _accumulate_reference(ids, grad, main_grad, problem)
    else:
        _accumulate_dense(ids, grad, main_grad, problem)


def _accumulate_reference(ids, grad, main_grad, problem: Problem) -> None:
    """CPU tensors: the core's NumPy reference, written back in place."""
    out = core_reference.accumulate(
        ids.numpy(), _to_numpy(grad), _to_numpy(main_grad), padding_idx=problem.padding_idx if problem.padding_idx >= 0 else None
    )
    main_grad.copy_(_from_numpy(out, main_grad.dtype))


def _accumulate_dense(ids, grad, main_grad, problem: Problem) -> None:
    """A device without the kernels: PyTorch's own dense path, deterministic, added only where ids occur."""
    n, hidden, vocab = problem.num_tokens, problem.hidden, problem.num_embeddings
    flat = ids.reshape(-1)
    prior = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        gw = torch.ops.aten.embedding_dense_backward(grad.reshape(n, hidden), flat, vocab, problem.padding_idx, False)
    finally:
        torch.use_deterministic_algorithms(prior)
    present = torch.zeros(vocab, dtype=torch.bool, device=main_grad.device)
    present[flat] = True
    if problem.padding_idx >= 0:
        present[problem.padding_idx] = False
    main_grad.copy_(torch.where(present[:, None], main_grad + gw, main_grad))


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
