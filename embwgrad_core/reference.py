"""Exact NumPy emulation of PyTorch CUDA's embedding backward and of the add into main_grad.

The CPU oracle for every other implementation (SPEC.md). Vectorised over the hidden
dimension and over partials/runs, with every fp32 addition done in the order PyTorch does it:

* partial sums: ``s = +0``, then ``s += grad[p]`` for the partial's positions in order;
* sort path: ``t = +0``, ``t += s_k`` over the run's partials in order, ``gw = round(t)``;
* feature path: ``gw = +0``, ``gw = round(gw + round(s_k))`` over the run's chunks in order
  (the kernel starts each chunk's sum from its first row, not from +0: the two differ only
  in the sign of a zero sum, which ``+0 + round(s)`` erases);
* ``main_grad[id] = round_main(main_grad[id] + gw)``, one fp32 add and one rounding.

Rows of ids that do not occur, of padding_idx, and of ids outside [0, V) are left as they were.

This is the order PyTorch's kernels are written to follow. Its feature kernel (n <= 3072) can
race from 1025 tokens: a warp may reload the shared ids of the next batch of 1024 while another
still reads them (pytorch/pytorch pull request 187687). The race never fired natively in the
project's runs, but it does under compute-sanitizer; there this reference keeps the race-free
bits and PyTorch does not (README, "What it guarantees").
"""

import numpy as np

from .constants import ACC_DTYPE, FEATURE
from .dtypes import dtype_name, numpy_dtype, round_to
from .plan import Plan, make_plan
from .validate import check_args, check_masked


def partial_sums(plan: Plan, grad2d: np.ndarray) -> np.ndarray:
    """fp32 sum of every partial's rows, in slot order: [num_partials, H]."""
    grad2d = np.asarray(grad2d)
    sums = np.zeros((plan.partial_slot.size, grad2d.shape[1]), dtype=ACC_DTYPE)
    for t in range(int(plan.partial_len.max(initial=0))):
        live = np.flatnonzero(plan.partial_len > t)
        rows = plan.sorted_pos[plan.partial_slot[live] + t]
        sums[live] += grad2d[rows].astype(ACC_DTYPE)
    return sums


def fold_runs(plan: Plan, partials: np.ndarray, grad_dtype: str) -> np.ndarray:
    """Every run's gradient row, rounded to grad_dtype and returned as fp32: [num_runs, H]."""
    acc = np.zeros((plan.run_slot.size, partials.shape[1]), dtype=ACC_DTYPE)
    for k in range(int(plan.run_partials.max(initial=0))):
        live = np.flatnonzero(plan.run_partials > k)
        s = partials[plan.run_first_partial[live] + k]
        if plan.path == FEATURE:
            acc[live] = round_to(acc[live] + round_to(s, grad_dtype), grad_dtype)
        else:
            acc[live] += s
    return acc if plan.path == FEATURE else round_to(acc, grad_dtype)


def weight_grad_rows(ids, grad, num_embeddings: int, *, padding_idx=None, path: str | None = None):
    """(rows, values): the non-zero-able rows of embedding_dense_backward and their values (grad dtype).

    rows are the distinct ids that add to main_grad, ascending; values[i] is gw[rows[i]].
    """
    ids, grad = np.asarray(ids), np.asarray(grad)
    problem = _check(ids, grad, (num_embeddings, grad.shape[-1] if grad.ndim else 0), grad.dtype, padding_idx)
    plan = make_plan(ids, num_embeddings, padding_idx=problem.padding_idx, path=path)
    gw = fold_runs(plan, partial_sums(plan, grad.reshape(plan.num_tokens, problem.hidden)), problem.grad_dtype)
    keep = plan.run_key >= 0
    return plan.run_key[keep], gw[keep].astype(grad.dtype)


def embedding_dense_backward(grad, ids, num_embeddings: int, *, padding_idx=None, path: str | None = None):
    """The dense [V, H] weight gradient of torch.ops.aten.embedding_dense_backward on CUDA."""
    grad = np.asarray(grad)
    rows, values = weight_grad_rows(ids, grad, num_embeddings, padding_idx=padding_idx, path=path)
    out = np.zeros((num_embeddings, grad.shape[-1]), dtype=grad.dtype)
    out[rows] = values
    return out


def accumulate(ids, grad, main_grad, *, padding_idx=None, path: str | None = None, masked=None) -> np.ndarray:
    """A copy of main_grad [V, H] plus embedding_dense_backward(grad, ids) in the rows of ids.

    ids: integer [*S]; grad: [*S, H] float32, bfloat16 (ml_dtypes) or float16; main_grad: [V, H]
    of those dtypes. path forces "feature" or "sort" arithmetic (default: PyTorch's choice).
    masked: bool [*S] or None: the grad rows of those tokens are taken as +0 (validate.check_masked).
    """
    ids, grad, main_grad = np.asarray(ids), np.asarray(grad), np.asarray(main_grad)
    problem = _check(ids, grad, main_grad.shape, main_grad.dtype, padding_idx)
    if masked is not None:
        masked = np.asarray(masked)
        check_masked(masked_shape=masked.shape, masked_is_bool=masked.dtype == np.bool_, masked_dtype=masked.dtype, ids_shape=ids.shape)
        grad = np.where(masked[..., None], np.zeros((), grad.dtype), grad)
    out = main_grad.copy()
    if problem.num_tokens == 0 or problem.hidden == 0:
        return out
    rows, values = weight_grad_rows(ids, grad, problem.num_embeddings, padding_idx=padding_idx, path=path)
    total = out[rows].astype(ACC_DTYPE) + values.astype(ACC_DTYPE)
    out[rows] = round_to(total, problem.main_grad_dtype).astype(out.dtype)
    return out


def _check(ids, grad, main_grad_shape, main_grad_dtype, padding_idx):
    problem = check_args(
        ids_shape=ids.shape,
        ids_is_integer=np.issubdtype(ids.dtype, np.integer),
        ids_dtype=ids.dtype,
        grad_shape=grad.shape,
        grad_dtype=grad.dtype,
        main_grad_shape=main_grad_shape,
        main_grad_dtype=main_grad_dtype,
        padding_idx=padding_idx,
    )
    if grad.dtype != numpy_dtype(dtype_name(grad.dtype)):
        raise TypeError(f"grad dtype {grad.dtype} is not a supported NumPy dtype")
    return problem
