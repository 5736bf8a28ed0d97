"""torch_frontend.embedding: F.embedding's forward, a backward that adds into weight.main_grad.

Each test runs on the CPU (kernels in Triton's interpreter, expected bits from the core's NumPy
reference) and on the GPU (expected bits from embedding_dense_backward + add_ with deterministic
algorithms), with the sizes of each machine.
"""

import pytest
import torch
import torch.nn.functional as F

import torch_frontend
from embwgrad_core import reference
from tests.cases import assert_bits_equal, zipf_ids
from tests.test_torch_frontend import DEVICE, HAS_CUDA, dense_reference, to_numpy

# CPU: the feature path's kernels, tiny; GPU: the sort path at a size with long runs.
V, H, B, S = (50, 12, 3, 8) if not HAS_CUDA else (4096, 1024, 8, 512)


def _inputs(seed=0, padding_idx=None):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.from_numpy(zipf_ids(B * S, V, seed=seed).reshape(B, S))
    if padding_idx is not None:
        ids[0, :3] = padding_idx % V
    weight = torch.randn(V, H, generator=gen).to(torch.bfloat16)
    grad_out = torch.randn(B, S, H, generator=gen).to(torch.bfloat16)
    main_grad = torch.randn(V, H, generator=gen)
    return ids.to(DEVICE), weight.to(DEVICE).requires_grad_(), grad_out.to(DEVICE), main_grad.to(DEVICE)


def _expected(ids, grad, main_grad, padding_idx=None):
    """main_grad after the backward: PyTorch's dense path on the GPU, the core reference on CPU."""
    if HAS_CUDA:
        return dense_reference(ids, grad, main_grad, -1 if padding_idx is None else padding_idx % V)
    out = reference.accumulate(ids.numpy(), to_numpy(grad), main_grad.numpy(), padding_idx=padding_idx)
    return torch.from_numpy(out)


def _assert_same(actual, expected, what):
    assert_bits_equal(to_numpy(actual), to_numpy(expected), what)


@pytest.mark.parametrize("padding_idx", [None, 3, -2])
def test_without_main_grad_it_is_f_embedding(padding_idx):
    ids, weight, grad_out, _ = _inputs(padding_idx=padding_idx)
    theirs = weight.detach().clone().requires_grad_()
    out = torch_frontend.embedding(ids, weight, padding_idx=padding_idx)
    ref = F.embedding(ids, theirs, padding_idx=padding_idx)
    _assert_same(out, ref, "output")
    out.backward(grad_out)
    ref.backward(grad_out)
    _assert_same(weight.grad, theirs.grad, "weight.grad")


@pytest.mark.parametrize("padding_idx, zero_rows", [(None, False), (5, False), (None, True)])
def test_adds_into_main_grad_over_micro_batches(padding_idx, zero_rows):
    ids, weight, grad_out, main_grad = _inputs(padding_idx=padding_idx)
    ids2, _, grad_out2, _ = _inputs(seed=1, padding_idx=padding_idx)
    weight.main_grad = main_grad.clone()
    for i, g in ((ids, grad_out), (ids2, grad_out2)):
        torch_frontend.embedding(i, weight, padding_idx=padding_idx, zero_rows=zero_rows).backward(g)
    expected = _expected(ids2, grad_out2, _expected(ids, grad_out, main_grad, padding_idx), padding_idx)
    _assert_same(weight.main_grad, expected, "main_grad")
    assert weight.grad is None  # without Megatron's flag autograd gets nothing


def test_overwrite_main_grad_gets_the_dense_gradient():
    """Megatron-FSDP marks its parameters overwrite_main_grad (a fused layer must overwrite the bucket
    it fetches; main_grad may be a stale view): main_grad is left alone and autograd gets F.embedding's
    own gradient, which FSDP's hook copies into the bucket."""
    ids, weight, grad_out, main_grad = _inputs()
    theirs = weight.detach().clone().requires_grad_()
    weight.main_grad, weight.overwrite_main_grad, weight.grad_added_to_main_grad = main_grad.clone(), True, False
    torch_frontend.embedding(ids, weight).backward(grad_out)
    F.embedding(ids, theirs).backward(grad_out)
    _assert_same(weight.grad, theirs.grad, "weight.grad")
    _assert_same(weight.main_grad, main_grad, "main_grad (untouched)")
    assert weight.grad_added_to_main_grad is False


@pytest.mark.parametrize("with_main_grad", [True, False])
def test_masked_tokens_look_up_zeros(with_main_grad):
    """masked (Megatron's input_mask): the forward zeroes those output rows, as VocabParallelEmbedding
    does, and the backward takes their gradient rows as zero without reading them (NaN here)."""
    ids, weight, grad_out, main_grad = _inputs()
    masked = ids % 3 == 0
    theirs = weight.detach().clone().requires_grad_()
    out = torch_frontend.embedding(ids, weight, masked=masked)
    ref = F.embedding(ids, theirs).masked_fill(masked[..., None], 0)
    _assert_same(out, ref, "output")
    if with_main_grad:
        weight.main_grad = main_grad.clone()
    out.backward(grad_out.masked_fill(masked[..., None], float("nan")))
    zeroed = grad_out.masked_fill(masked[..., None], 0)
    if with_main_grad:
        _assert_same(weight.main_grad, _expected(ids, zeroed, main_grad), "main_grad")
    else:
        ref.backward(zeroed)
        _assert_same(weight.grad, theirs.grad, "weight.grad")


def test_grad_of_a_transposed_output():
    # Megatron's embedding returns [b, s, H] and transposes it to [s, b, H]: the lookup's grad is a
    # strided view, read in place.
    ids, weight, grad_out, main_grad = _inputs()
    weight.main_grad = main_grad.clone()
    sbh = grad_out.transpose(0, 1).contiguous()
    torch_frontend.embedding(ids, weight).transpose(0, 1).contiguous().backward(sbh)
    _assert_same(weight.main_grad, _expected(ids, grad_out, main_grad), "main_grad")


def _megatron_hook(weight, seen=None):
    """A stand-in for the hook Megatron's DDP puts on a parameter's gradient accumulator: it adds
    param.grad into main_grad unless the flag says that was done (or zero_out_wgrad is set), then
    drops it. seen: the gradients it was given. Keep the accumulator it returns (as Megatron's DDP
    keeps its grad_accs): the tensor holds its own only weakly, and the hook goes with it."""
    def hook(*_):
        if seen is not None:
            seen.append((weight.grad.shape, weight.grad.dtype))
        if weight.grad is not None and (not weight.grad_added_to_main_grad or getattr(weight, "zero_out_wgrad", False)):
            weight.main_grad.add_(weight.grad.data)
        weight.grad = None

    accumulator = weight.expand_as(weight).grad_fn.next_functions[0][0]
    accumulator.register_hook(hook)
    return accumulator


def test_megatron_ddp_hook_convention():
    # Megatron's DDP: every parameter has grad_added_to_main_grad, and a hook on its gradient
    # accumulator adds param.grad into main_grad unless the flag says that was done, then drops it.
    ids, weight, grad_out, main_grad = _inputs()
    weight.main_grad = main_grad.clone()
    weight.grad_added_to_main_grad = False
    seen = []
    accumulator = _megatron_hook(weight, seen)  # noqa: F841 (kept alive)
    torch_frontend.embedding(ids, weight).backward(grad_out)
    assert seen == [(weight.shape, weight.dtype)]  # the dummy, which the hook skips
    assert weight.grad_added_to_main_grad is True and weight.grad is None
    _assert_same(weight.main_grad, _expected(ids, grad_out, main_grad), "main_grad")


@pytest.mark.parametrize("uses, flag", [("two lookups", "zero_out_wgrad"), ("tied output", "zero_out_wgrad"),
                                         ("two lookups", "embwgrad_dense")])
def test_a_weight_with_two_uses_gets_megatrons_bits(uses, flag):
    """Megatron sets zero_out_wgrad on a weight with more than one use on one pipeline stage (tied
    input and output embeddings, or multi-token prediction's second lookup), use_embwgrad sets
    embwgrad_dense where a stage looks it up more than once unmarked: autograd sums the uses' bf16
    gradients and the hook adds that sum. The lookup then hands autograd its dense gradient, so
    main_grad gets the bits of the stock lookups (F.embedding), where adding each lookup's share
    into main_grad on its own would round differently (checked here too, so the case has teeth)."""
    ids, weight, grad_out, main_grad = _inputs()
    ids2, _, grad_out2, _ = _inputs(seed=1)
    theirs = weight.detach().clone().requires_grad_()

    def step(w, lookup):
        out = lookup(ids, w)
        if uses == "two lookups":
            (out * grad_out).sum().add((lookup(ids2, w) * grad_out2).sum()).backward()
        else:  # the output layer's logits through the same weight (no fused wgrad: autograd sums)
            (out * grad_out).sum().add((torch.matmul(grad_out2[:1, :4], w.t()) * 1).sum()).backward()

    for w, lookup in ((weight, torch_frontend.embedding), (theirs, F.embedding)):
        w.main_grad, w.grad_added_to_main_grad = main_grad.clone(), False
        setattr(w, flag, True)
        accumulator = _megatron_hook(w)  # noqa: F841 (kept alive)
        step(w, lookup)
    _assert_same(weight.main_grad, theirs.main_grad, "main_grad against the stock lookups'")
    if uses == "two lookups":  # each lookup's share added on its own: other bits
        separate = _expected(ids2, grad_out2, _expected(ids, grad_out, main_grad))
        assert not torch.equal(separate.view(torch.int32), theirs.main_grad.view(torch.int32))


def test_bad_input():
    ids, weight, grad_out, main_grad = _inputs()
    with pytest.raises(TypeError, match="ids"):
        torch_frontend.embedding(ids.float(), weight)
    with pytest.raises(ValueError, match="weight"):
        torch_frontend.embedding(ids, weight[0])
    with pytest.raises(ValueError, match="padding_idx"):
        torch_frontend.embedding(ids, weight, padding_idx=V)
    with pytest.raises(TypeError, match="zero_rows"):
        torch_frontend.embedding(ids, weight, zero_rows="yes")
    weight.main_grad = main_grad[:, :-1].clone()
    before = weight.main_grad.clone()
    out = torch_frontend.embedding(ids, weight)
    with pytest.raises(ValueError, match="main_grad"):
        out.backward(grad_out)
    _assert_same(weight.main_grad, before, "main_grad after a bad call")


def test_under_torch_compile():
    # accumulate is a graph break (torch.compiler.disable): the compiled step gives the same bits.
    ids, weight, grad_out, main_grad = _inputs()
    weight.main_grad = main_grad.clone()
    torch._dynamo.reset()
    step = torch.compile(lambda i, w: torch_frontend.embedding(i, w) * 2, backend="aot_eager")
    step(ids, weight).backward(grad_out)
    _assert_same(weight.main_grad, _expected(ids, grad_out * 2, main_grad), "main_grad")
