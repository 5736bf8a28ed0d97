"""``embedding(ids, weight)``: the lookup, with a backward that adds into ``weight.main_grad``.

A drop-in for ``torch.nn.functional.embedding(ids, weight, padding_idx)`` in a training loop
that keeps an fp32 ``main_grad`` beside each parameter (Megatron-LM's DDP and optimizers). The
forward is ``F.embedding`` itself. The backward follows the convention of Megatron's layers that
fuse their weight-gradient accumulation (``LinearWithGradAccumulationAndAsyncCommunication``):

- ``weight.main_grad`` present: ``accumulate(ids, grad_output, weight.main_grad)`` adds the
  gradient in place, with PyTorch CUDA's bits, touching only the rows of the ids. Then, if the
  weight has a ``grad_added_to_main_grad`` attribute (Megatron's DDP gives every parameter one),
  it is set True and autograd gets a dummy ``[V, H]`` gradient in the weight's dtype,
  uninitialised (``torch.empty``, no kernel). Megatron's gradient hook needs a gradient to fire
  (with ``overlap_grad_reduce`` it asserts one), and skips adding it because of the flag. Without
  that attribute autograd gets None: ``weight.grad`` stays as it was, and nothing else is added
  anywhere.
- No ``main_grad``: autograd gets the dense gradient, ``embedding_dense_backward`` as
  ``F.embedding``'s own backward computes it, so the function behaves exactly like ``F.embedding``.
- ``weight.overwrite_main_grad`` True (Megatron-FSDP sets it on its parameters: a fused layer must
  then overwrite the gradient bucket it fetches, not add into ``main_grad``, which may be a stale
  view): the same, the dense gradient for Megatron-FSDP's hook to copy; nothing is added anywhere.
- ``weight.zero_out_wgrad`` or ``weight.embwgrad_dense`` True: the same, the dense gradient.
  Both mark a weight with more than one use in a step on this device. Megatron sets the first
  (tied input and output embeddings, or multi-token prediction's lookups, at pipeline size 1);
  ``torch_frontend.megatron.use_embwgrad`` sets the second where a stage looks a weight up more
  than once without that mark (multi-token prediction's layers on the last of several pipeline
  stages); a caller may set it on any such weight. Autograd sums the uses' gradients in the
  weight's dtype (bf16 for bf16 parameters) and Megatron's hook adds that sum into
  ``main_grad`` (with ``zero_out_wgrad``, whatever ``grad_added_to_main_grad`` says). A lookup
  that added its own share into ``main_grad`` would change the bits (the sum's rounding), and
  with ``zero_out_wgrad`` the hook's dense add would stay anyway. With the dense gradient
  ``main_grad`` gets exactly the stock bits, at the stock cost: correct there, not faster.

The dummy is a transient ``[V, H]`` allocation from the caching allocator, as in Megatron's own
layers (its hook drops it at once); nothing writes it. Double backward is not supported.
"""

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from embwgrad_core.validate import normalize_padding_idx, type_name

from .embedding_wgrad import _check_masked, accumulate

__all__ = ["embedding"]

#: A weight with one of these attributes True has more than one use in a step on this device
#: (Megatron's mark, and embwgrad's own that torch_frontend.megatron.use_embwgrad sets).
SHARED_FLAGS = ("zero_out_wgrad", "embwgrad_dense")

#: A weight with one of these attributes True gets F.embedding's dense gradient (module docstring).
_DENSE_FLAGS = ("overwrite_main_grad", *SHARED_FLAGS)


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, weight, pad, zero_rows, masked):
        ctx.save_for_backward(ids, weight, masked)
        ctx.pad = pad  # padding_idx in [0, V), or -1 for none (normalize_padding_idx)
        ctx.zero_rows = zero_rows
        out = F.embedding(ids, weight)  # padding_idx changes only the backward
        return out if masked is None else out.masked_fill(masked[..., None], 0)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        ids, weight, masked = ctx.saved_tensors
        if not ctx.needs_input_grad[1]:
            return None, None, None, None, None
        main_grad = getattr(weight, "main_grad", None)
        if main_grad is None or any(getattr(weight, flag, False) for flag in _DENSE_FLAGS):
            if masked is not None:  # the masked outputs are constants: no gradient flows from them
                grad_output = grad_output.masked_fill(masked[..., None], 0)
            dense = torch.ops.aten.embedding_dense_backward(grad_output, ids, weight.shape[0], ctx.pad, False)
            return None, dense, None, None, None
        accumulate(ids, grad_output, main_grad, padding_idx=ctx.pad if ctx.pad >= 0 else None, zero_rows=ctx.zero_rows, masked=masked)
        if not hasattr(weight, "grad_added_to_main_grad"):
            return None, None, None, None, None
        weight.grad_added_to_main_grad = True
        return None, torch.empty(weight.shape, dtype=weight.dtype, device=weight.device), None, None, None


def embedding(ids: torch.Tensor, weight: torch.Tensor, *, padding_idx=None, zero_rows: bool = False,
              masked: torch.Tensor | None = None) -> torch.Tensor:
    """``F.embedding(ids, weight, padding_idx)`` whose backward adds into ``weight.main_grad``.

    Args:
        ids: int32 or int64 [*S], token ids (as the lookup should use them: for Megatron's
            ``VocabParallelEmbedding``, its ``masked_input``).
        weight: [V, H] parameter. If it has a ``main_grad`` ([V, H], contiguous), the backward
            adds into it (see the module docstring for what autograd then gets).
        padding_idx: as in torch.nn.functional.embedding: that row gets no gradient.
        zero_rows: passed to ``accumulate``: True for ``VocabParallelEmbedding`` with TP > 1,
            whose other ranks' tokens have zero gradient rows (same bits, faster).
        masked: bool [*S] or None: tokens whose output rows are zero, as ``VocabParallelEmbedding``
            zeroes those of its ``input_mask`` (the other ranks' tokens). The forward zeroes them,
            and the backward passes the mask to ``accumulate``, which then never reads their
            gradient rows (same bits as Megatron's lookup and zeroing, faster than zero_rows alone).

    Returns:
        [*S, H], the rows of weight: ``F.embedding``'s own output (zero at masked tokens).

    Raises TypeError or ValueError naming the argument (padding_idx by the core's check, as
    ``accumulate``). ``main_grad`` is checked when the backward runs, by ``accumulate``, before
    it is touched.
    """
    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"ids must be an int32 or int64 torch.Tensor, got {getattr(ids, 'dtype', type(ids).__name__)}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"weight must be a 2-D torch.Tensor [V, H], got {getattr(weight, 'shape', type(weight).__name__)}")
    if not isinstance(zero_rows, bool):
        raise TypeError(f"zero_rows must be a bool, got {type_name(zero_rows)}")
    if masked is not None:
        _check_masked(masked, ids)
    return _Embedding.apply(ids, weight, normalize_padding_idx(padding_idx, weight.shape[0]), zero_rows, masked)
