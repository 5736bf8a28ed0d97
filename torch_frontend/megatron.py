"""Megatron-LM's ``VocabParallelEmbedding`` with embwgrad's backward (megatron-core >= 0.13).

    from torch_frontend.megatron import use_embwgrad
    use_embwgrad(model)   # every VocabParallelEmbedding in model; returns how many

Each such module's forward becomes Megatron's own (``VocabParallelEmbedding.forward``, the same
text in megatron-core 0.13.0 to 0.16.1) with the lookup replaced by ``torch_frontend.embedding(masked_input, weight,
masked=input_mask)``: the same output, bit for bit, and a backward that adds into
``weight.main_grad`` (Megatron's DDP gives every parameter one) only the rows of the tokens of
this rank's shard, never reading the other ranks' tokens' gradient rows, with the bits that
``F.embedding``'s backward (``embedding_dense_backward``, deterministic, on CUDA) would give
Megatron's DDP there. With TP = 1 there is no mask. The rest of the forward is Megatron's: the
all-reduce, or with ``reduce_scatter_embeddings`` the transpose to [s, b, h] and the
reduce-scatter over the sequence, through Megatron's own mappings and the module's ``tp_group``.
Under Megatron-FSDP (parameters marked ``overwrite_main_grad``) the backward is ``F.embedding``'s
own dense gradient, as without embwgrad (torch_frontend.autograd). So it is for a weight with more
than one use on one pipeline stage: autograd sums the uses' gradients in the weight's dtype and
Megatron's hook adds that sum, so only the dense gradient keeps main_grad's bits. Megatron marks
such a weight ``zero_out_wgrad`` at pipeline size 1 (tied input and output embeddings, or
multi-token prediction); ``use_embwgrad`` marks ``embwgrad_dense`` a GPTModel's embedding that its
stage looks up more than once without that mark (the main lookup plus multi-token prediction's,
or two or more multi-token prediction layers on the last stage), and warns for both, since
nothing gets faster there.

Two differences from the stock forward, neither in the output: the mask is applied with
``masked_fill_`` where Megatron indexes with a boolean mask (which on CUDA synchronises with the
host), and ``deterministic_mode`` (where Megatron looks up ``weight[masked_input]``, whose
backward sums each id's rows in one sequence) gets ``F.embedding``'s bits, which are
deterministic too but differ from that mode's for ids that occur more than 10 times.

Tested on CPU with megatron-core 0.13.0 and 0.16.1 at TP 1 and 2 (two processes over gloo), with and without
``reduce_scatter_embeddings``, fp32 and bf16 parameters, against the stock module: the output
bitwise, and main_grad bitwise against the core reference given the gradient that reached the
stock module's lookup (tests/test_megatron.py).
"""

import functools
import hashlib
import inspect
import io
import textwrap
import tokenize
import warnings

import torch

from .autograd import SHARED_FLAGS, embedding

__all__ = ["use_embwgrad", "vocab_parallel_forward"]

#: What the forward reads off a VocabParallelEmbedding (megatron-core 0.13-0.16's names; 0.12 has no tp_group).
_ATTRIBUTES = ("tp_group", "vocab_start_index", "vocab_end_index", "reduce_scatter_embeddings", "weight")

#: _fingerprint of the stock VocabParallelEmbedding.forward that vocab_parallel_forward follows
#: (megatron-core 0.13.0 to 0.16.1; the same under Python 3.11 and 3.12).
STOCK_FORWARD = "400a709994b12e25"


def _fingerprint(function) -> str | None:
    """A hash of function's tokens, without comments, layout or its docstring; None without its source."""
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        return None
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in skip]
    depth = 0
    for i, t in enumerate(tokens):  # the signature's colon; a string right after it is the docstring
        if t.type == tokenize.OP:
            depth += (t.string in "([{") - (t.string in ")]}")
            if t.string == ":" and depth == 0:
                break
    if i + 1 < len(tokens) and tokens[i + 1].type == tokenize.STRING:
        del tokens[i + 1]
    return hashlib.sha256(" ".join(t.string for t in tokens).encode()).hexdigest()[:16]


def _describe(model) -> str:
    if isinstance(model, (list, tuple)):
        return f"{type(model).__name__} of {', '.join(type(c).__name__ for c in model) or 'nothing'}"
    return type(model).__name__


def vocab_parallel_forward(self, input_: torch.Tensor) -> torch.Tensor:
    """``VocabParallelEmbedding.forward`` (megatron-core 0.13-0.16) with embwgrad's lookup; self is the module."""
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region, reduce_scatter_to_sequence_parallel_region

    group = self.tp_group
    if group.size() > 1:
        input_mask = (input_ < self.vocab_start_index) | (input_ >= self.vocab_end_index)
        masked_input = (input_ - self.vocab_start_index).masked_fill_(input_mask, 0)
    else:
        input_mask, masked_input = None, input_
    output_parallel = embedding(masked_input, self.weight, masked=input_mask)  # zero at masked tokens, as Megatron's
    if self.reduce_scatter_embeddings:
        output_parallel = output_parallel.transpose(0, 1).contiguous()  # [b, s, h] -> [s, b, h]
        return reduce_scatter_to_sequence_parallel_region(output_parallel, group=group)
    return reduce_from_tensor_model_parallel_region(output_parallel, group=group)


def use_embwgrad(model) -> int:
    """Give every ``VocabParallelEmbedding`` in model (itself included) embwgrad's forward.

    model: a ``torch.nn.Module``, or a list or tuple of them (the model chunks that Megatron's
    ``get_model`` returns, one per virtual pipeline stage; chunks without an embedding are fine).
    Returns how many modules it changed. Raises ValueError if there is none, or TypeError naming
    the attribute if a module lacks one that the forward reads (another megatron-core version).
    Warns (UserWarning) where a module's class has another forward than the stock one of
    megatron-core 0.13-0.16 (a subclass's own, or a later Megatron's): embwgrad's replaces it,
    so whatever that forward does differently would be dropped. Marks ``embwgrad_dense`` the
    weight of a GPTModel's embedding that its stage looks up more than once (its ``pre_process``
    and multi-token prediction's ``mtp_num_layers`` lookups where ``mtp_process``), and warns
    where a weight is so marked or marked ``zero_out_wgrad`` (more than one use on the pipeline
    stage): its backward stays the dense one, with the stock bits and cost (module docstring).
    """
    from megatron.core.tensor_parallel.layers import VocabParallelEmbedding

    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    if not chunks or not all(isinstance(c, torch.nn.Module) for c in chunks):
        raise TypeError(f"model must be a torch.nn.Module or a non-empty list or tuple of them, got {_describe(model)}")
    modules = [m for c in chunks for m in c.modules()]
    found = list({id(m): m for m in modules if isinstance(m, VocabParallelEmbedding)}.values())
    if not found:
        raise ValueError(f"model holds no megatron.core VocabParallelEmbedding ({_describe(model)})")
    for module in found:
        missing = [a for a in _ATTRIBUTES if not hasattr(module, a)]
        if missing:
            raise TypeError(f"this VocabParallelEmbedding has no {', '.join(missing)}: embwgrad's forward follows megatron-core 0.13-0.16's")
    for kind in {type(m) for m in found}:
        fingerprint = _fingerprint(kind.forward)
        if fingerprint is not None and fingerprint != STOCK_FORWARD:
            warnings.warn(f"{kind.__module__}.{kind.__qualname__}.forward is not the forward of megatron-core 0.13-0.16 that "
                          "embwgrad's follows (torch_frontend.megatron.vocab_parallel_forward), which replaces it: check the two "
                          "against each other", UserWarning, stacklevel=2)
    for module in modules:  # a GPTModel whose stage looks its embedding up more than once, unmarked
        word = getattr(getattr(module, "embedding", None), "word_embeddings", None)
        if any(word is m for m in found):
            mtp = getattr(getattr(module, "config", None), "mtp_num_layers", None) or 0
            if bool(getattr(module, "pre_process", False)) + (int(mtp) if getattr(module, "mtp_process", False) else 0) > 1:
                word.weight.embwgrad_dense = True  # (one of SHARED_FLAGS)
    shared = sum(any(getattr(m.weight, flag, False) for flag in SHARED_FLAGS) for m in found)
    if shared:
        warnings.warn(f"{shared} of the {len(found)} VocabParallelEmbedding weights have more than one use on this pipeline stage "
                      "(zero_out_wgrad or embwgrad_dense: tied input and output embeddings, or multi-token prediction): "
                      "autograd sums their uses' gradients and Megatron's hook adds the sum densely, so their backward stays "
                      "F.embedding's dense gradient, with the stock bits and no faster", UserWarning, stacklevel=2)
    for module in found:
        # A partial, not a bound method: a model pickled whole (torch.save) or deep-copied keeps it,
        # bound to the copy (a bound method pickles by name, and the module has no such attribute).
        module.forward = functools.partial(vocab_parallel_forward, module)
    return len(found)
