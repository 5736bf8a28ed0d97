"""torch_frontend.megatron against megatron-core's own VocabParallelEmbedding.

One process per rank: gloo on a CPU, NCCL on GPUs (TP 2 needs two). On a GPU the ids are 8192
tokens, so that TP 2 takes the masked route of the merge sort; on a CPU (the interpreters) 120.

- test_vocab_parallel_embedding_against_megatrons: TP 1 and 2, with and without
  reduce_scatter_embeddings (sequence parallel), fp32 and bf16 parameters. On each rank the stock
  module and a copy given embwgrad's forward run the same ids and upstream gradient. The outputs
  must be bitwise equal, and the copy's main_grad bitwise equal to the core reference given the
  gradient that reached the stock module's F.embedding (the other ranks' tokens' rows zeroed by
  Megatron). On a GPU also to main_grad plus the stock module's weight.grad, as Megatron's DDP
  would add it (CUDA's embedding_dense_backward, deterministic); on a CPU the stock grad is CPU
  PyTorch's (index_add_ order), not the reference.
- test_under_megatrons_ddp: Megatron's own DistributedDataParallel (its grad buffer as main_grad,
  its backward hook, overlap_grad_reduce on and off, two micro-batches, bf16 parameters into fp32
  main_grad, and into a bf16 buffer with grad_reduce_in_fp32 off): the buffer holds the core's bits.
- test_a_gpt_model_under_megatrons_ddp: a real GPTModel (local layer spec, rope, two layers) inside
  Float16Module and Megatron's DDP, as get_model builds it, two micro-batches of the language-model
  loss, untied, tied (share_embeddings_and_output_weights) and with one multi-token prediction
  layer: every parameter's main_grad bitwise equal to the stock model's, and an untied embedding's
  to the core's bits for the gradient that reached the stock lookup.
- test_a_weight_with_more_than_one_use_under_megatrons_ddp: the weight marked zero_out_wgrad, as
  Megatron marks one with more than one use on a pipeline stage (two lookups, as multi-token
  prediction's, and a tied output matmul): under Megatron's DDP the buffer holds the stock
  module's bits (its dense gradient), and use_embwgrad warns.

Needs megatron-core (the `megatron` extra). .ci/run installs it and sets
EMBWGRAD_REQUIRE_MEGATRON=1, so that CI cannot skip these.
"""

import contextlib
import copy
import io
import os
import types
import warnings

import numpy as np
import pytest
import torch

try:
    from megatron.core import ModelParallelConfig, parallel_state
    from megatron.core.tensor_parallel.layers import VocabParallelEmbedding
except ImportError as e:
    if os.environ.get("EMBWGRAD_REQUIRE_MEGATRON") == "1":
        raise
    pytest.skip(f"megatron-core is not installed (pip install -e '.[megatron]'): {e}", allow_module_level=True)

import torch_frontend.megatron as tfm
from embwgrad_core import reference
from tests.cases import assert_bits_equal, zipf_ids
from tests.test_torch_frontend import to_numpy

HAS_CUDA = torch.cuda.is_available()
VOCAB, HIDDEN = (4096, 256) if HAS_CUDA else (64, 24)
BATCH, SEQ = (4, 2048) if HAS_CUDA else (3, 40)


def _store(folder) -> str:
    """The ranks' init_method: a file in the test's own folder (no port to collide with another worker's)."""
    return f"file://{folder / 'store'}"


@contextlib.contextmanager
def _lookup_gradient(captured: list):
    """F.embedding's output records the gradient that reaches it (the stock module's lookup)."""
    real = torch.nn.functional.embedding

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        out.register_hook(lambda g: captured.append(g.detach().clone()))
        return out

    torch.nn.functional.embedding = spy
    try:
        yield
    finally:
        torch.nn.functional.embedding = real


@contextlib.contextmanager
def _process(rank: int, world: int, store: str):
    """One rank of TP = world: its device, with torch.distributed and Megatron's groups set up."""
    if HAS_CUDA:
        torch.cuda.set_device(rank)
    else:  # Megatron's reduce-scatter and DDP buffers allocate on torch.cuda.current_device()
        torch.cuda.current_device = lambda: "cpu"
    torch.distributed.init_process_group("nccl" if HAS_CUDA else "gloo", init_method=store, rank=rank, world_size=world)
    try:
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
        yield f"cuda:{rank}" if HAS_CUDA else "cpu"
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()


def _ddp_world() -> int:
    """TP for the tests under Megatron's DDP: 2 on a CPU (gloo) or on two GPUs, else 1."""
    return 2 if not HAS_CUDA or torch.cuda.device_count() >= 2 else 1


def _converts_with_warning(model) -> bool:
    """use_embwgrad(model) converts one module; whether it warned of a weight with more than one use."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tfm.use_embwgrad(model) == 1
    return any("more than one use" in str(w.message) for w in caught)


def _megatron_ids(start: int, end: int, seed: int = 5):
    """Zipf ids over the whole vocabulary, both shards' first rows among them, and Megatron's masked_input."""
    ids = torch.from_numpy(zipf_ids(BATCH * SEQ, VOCAB, seed=seed).reshape(BATCH, SEQ))
    ids[0, :4] = torch.tensor([0, VOCAB // 2, 0, VOCAB // 2])
    local = ids - start
    local[(ids < start) | (ids >= end)] = 0
    return ids, local


def _rank(rank: int, world: int, store: str, sequence_parallel: bool, dtype: torch.dtype):
    with _process(rank, world, store) as device:
        config = ModelParallelConfig(tensor_model_parallel_size=world, sequence_parallel=sequence_parallel,
                                     use_cpu_initialization=True, params_dtype=dtype)  # (GPU init needs Megatron's RNG tracker)
        make = lambda: VocabParallelEmbedding(VOCAB, HIDDEN, init_method=torch.nn.init.normal_, config=config,  # noqa: E731
                                              reduce_scatter_embeddings=sequence_parallel)
        stock, ours = make().to(device), make().to(device)
        with torch.no_grad():
            ours.weight.copy_(stock.weight)
        assert tfm.use_embwgrad(ours) == 1
        assert ours.forward.func is tfm.vocab_parallel_forward and ours.forward.args == (ours,)

        # Long runs at both shards' first rows, and every rank's row 0 holds real tokens besides the
        # other shard's (looked up as 0 there).
        ids, local = (t.to(device) for t in _megatron_ids(stock.vocab_start_index, stock.vocab_end_index))
        main_grad = torch.randn(ours.weight.shape, generator=torch.Generator().manual_seed(7)).to(device)
        ours.weight.main_grad = main_grad.clone()
        ours.weight.grad_added_to_main_grad = False  # as Megatron's DDP sets it

        captured = []
        with _lookup_gradient(captured):
            out_stock = stock(ids)
        out_ours = ours(ids)
        assert out_ours.shape == out_stock.shape and out_ours.dtype == out_stock.dtype
        assert_bits_equal(to_numpy(out_ours), to_numpy(out_stock), f"output, rank {rank}")
        # The same upstream gradient on every rank where the output is replicated, the rank's own
        # sequence slice's where it is scattered.
        upstream = torch.randn(out_stock.shape, generator=torch.Generator().manual_seed(11 + (rank if sequence_parallel else 0)))
        upstream = upstream.to(device, dtype)
        torch.use_deterministic_algorithms(True)  # the stock lookup's backward: CUDA's deterministic path
        out_stock.backward(upstream)
        torch.use_deterministic_algorithms(False)
        out_ours.backward(upstream)

        (lookup_grad,) = captured
        if world > 1:
            assert bool((lookup_grad[(local == 0) & (ids != stock.vocab_start_index)] == 0).all())  # Megatron zeroed the other ranks' rows
        expected = reference.accumulate(to_numpy(local), to_numpy(lookup_grad), to_numpy(main_grad))
        assert_bits_equal(to_numpy(ours.weight.main_grad), expected, f"main_grad, rank {rank}")
        assert ours.weight.grad_added_to_main_grad is True
        if HAS_CUDA:  # as Megatron's DDP adds the stock grad into main_grad (main_grad holds no -0)
            assert_bits_equal(to_numpy(ours.weight.main_grad), to_numpy(main_grad.add_(stock.weight.grad)), f"main_grad against Megatron's, rank {rank}")


@pytest.mark.parametrize("world, sequence_parallel, dtype", [
    (1, False, torch.float32),
    (2, False, torch.float32),
    (2, True, torch.float32),
    (2, True, torch.bfloat16),
], ids=lambda v: str(v).replace("torch.", ""))
def test_vocab_parallel_embedding_against_megatrons(world, sequence_parallel, dtype, tmp_path):
    if HAS_CUDA and torch.cuda.device_count() < world:
        pytest.skip(f"TP {world} needs {world} GPUs (scripts/gpu_two.sh)")
    torch.multiprocessing.spawn(_rank, args=(world, _store(tmp_path), sequence_parallel, dtype), nprocs=world)


def _ddp_rank(rank: int, world: int, store: str, overlap: bool, fp32_buffer: bool = True):
    """Two micro-batches through Megatron's own DistributedDataParallel (its grad buffer as main_grad,
    its backward hook, bf16 parameters with fp32 main_grad): the buffer after finish_grad_sync holds
    the core's bits for the two lookups' gradients added in turn (TP = world, one data-parallel rank,
    so the reduction leaves it as it is)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer import TransformerConfig

    with _process(rank, world, store) as device:
        config = TransformerConfig(num_layers=1, hidden_size=HIDDEN, num_attention_heads=world, tensor_model_parallel_size=world,
                                   use_cpu_initialization=True, params_dtype=torch.bfloat16, bf16=True)
        stock = VocabParallelEmbedding(VOCAB, HIDDEN, init_method=torch.nn.init.normal_, config=config).to(device)
        model = torch.nn.Sequential(VocabParallelEmbedding(VOCAB, HIDDEN, init_method=torch.nn.init.normal_, config=config)).to(device)
        with torch.no_grad():
            model[0].weight.copy_(stock.weight)
        tfm.use_embwgrad(model)
        ddp = DistributedDataParallel(config, DistributedDataParallelConfig(grad_reduce_in_fp32=fp32_buffer, overlap_grad_reduce=overlap), model)
        weight = model[0].weight
        ddp.zero_grad_buffer()
        expected = to_numpy(torch.zeros(weight.shape, dtype=torch.float32 if fp32_buffer else torch.bfloat16))
        for step, seed in enumerate((5, 6)):
            ids, local = (t.to(device) for t in _megatron_ids(stock.vocab_start_index, stock.vocab_end_index, seed))
            upstream = torch.randn(BATCH, SEQ, HIDDEN, generator=torch.Generator().manual_seed(seed)).to(device, torch.bfloat16)
            captured = []
            with _lookup_gradient(captured):
                stock(ids).backward(upstream)
            with ddp.no_sync() if step == 0 else contextlib.nullcontext():
                ddp(ids).backward(upstream)
            expected = reference.accumulate(to_numpy(local), to_numpy(captured[0]), expected)
        ddp.finish_grad_sync()
        assert weight.main_grad.dtype == (torch.float32 if fp32_buffer else torch.bfloat16)
        assert_bits_equal(to_numpy(weight.main_grad), expected, f"DDP's main_grad, rank {rank}")


@pytest.mark.parametrize("overlap, fp32_buffer", [(False, True), (True, True), (False, False)],
                         ids=["overlap_grad_reduce-off", "overlap_grad_reduce-on", "bf16-grad-buffer"])
def test_under_megatrons_ddp(overlap, fp32_buffer, tmp_path):
    """fp32_buffer False: grad_reduce_in_fp32 off, so main_grad is a bf16 view of Megatron's buffer."""
    world = _ddp_world()
    torch.multiprocessing.spawn(_ddp_rank, args=(world, _store(tmp_path), overlap, fp32_buffer), nprocs=world)


class _TwoUses(torch.nn.Module):
    """The weight used three times on one stage: the main lookup, a second one (multi-token
    prediction's), and a tied output matmul on this rank's vocabulary shard."""

    def __init__(self, config):
        super().__init__()
        self.embedding = VocabParallelEmbedding(VOCAB, HIDDEN, init_method=torch.nn.init.normal_, config=config)

    def forward(self, ids, ids2):
        hidden = self.embedding(ids) + self.embedding(ids2)
        return torch.matmul(hidden[:, :2], self.embedding.weight.t())


def _two_uses_rank(rank: int, world: int, store: str):
    """Stock and embwgrad's modules, each under Megatron's DDP, weight marked zero_out_wgrad as
    Megatron's LanguageModule marks a shared one at pipeline size 1: the grad buffers bitwise equal."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer import TransformerConfig

    with _process(rank, world, store) as device:
        config = TransformerConfig(num_layers=1, hidden_size=HIDDEN, num_attention_heads=world, tensor_model_parallel_size=world,
                                   use_cpu_initialization=True, params_dtype=torch.bfloat16, bf16=True)
        stock, ours = _TwoUses(config).to(device), _TwoUses(config).to(device)
        with torch.no_grad():
            ours.embedding.weight.copy_(stock.embedding.weight)
        for model in (stock, ours):
            model.embedding.weight.zero_out_wgrad = True
        assert _converts_with_warning(ours)
        buffers = []
        for model in (stock, ours):
            ddp = DistributedDataParallel(config, DistributedDataParallelConfig(grad_reduce_in_fp32=True), model)
            ddp.zero_grad_buffer()
            ids, _ = _megatron_ids(model.embedding.vocab_start_index, model.embedding.vocab_end_index, seed=5)
            ids2, _ = _megatron_ids(model.embedding.vocab_start_index, model.embedding.vocab_end_index, seed=6)
            out = ddp(ids.to(device), ids2.to(device))
            # (no deterministic mode: CUDA's embedding backward is the same either way, and the
            # tied matmul's cuBLAS would need CUBLAS_WORKSPACE_CONFIG under it; both models run the same ops)
            out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(device, out.dtype))
            ddp.finish_grad_sync()
            buffers.append(model.embedding.weight.main_grad)
        assert bool(buffers[0].ne(0).any())
        assert_bits_equal(to_numpy(buffers[1]), to_numpy(buffers[0]), f"DDP's main_grad against the stock module's, rank {rank}")


def test_a_weight_with_more_than_one_use_under_megatrons_ddp(tmp_path):
    world = _ddp_world()
    torch.multiprocessing.spawn(_two_uses_rank, args=(world, _store(tmp_path)), nprocs=world)


def _gpt_rank(rank: int, world: int, store: str, layout: str):
    """A real GPTModel (local layer spec, two layers), stock and with use_embwgrad, each inside
    Float16Module and Megatron's DDP as Megatron's get_model builds them, two micro-batches of the
    language-model loss: every parameter's main_grad bitwise equal to the stock model's, but an
    untied embedding's, which gets the core's bits for the gradient that reached the stock lookup
    (on a GPU also the stock's). Tied embeddings (zero_out_wgrad at pipeline size 1) take the
    dense gradient, so there every main_grad equals the stock model's."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.tensor_parallel import random as tp_random
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    with _process(rank, world, store) as device:
        if HAS_CUDA:
            tp_random.model_parallel_cuda_manual_seed(1234)
        else:  # the dropout RNG tracker holds CUDA states; dropout is off here
            tp_random.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
        config = TransformerConfig(num_layers=2, hidden_size=HIDDEN, num_attention_heads=2 * world, tensor_model_parallel_size=world,
                                   use_cpu_initialization=True, params_dtype=torch.bfloat16, bf16=True,
                                   attention_dropout=0.0, hidden_dropout=0.0, mtp_num_layers=1 if layout == "mtp" else None,
                                   **({"mtp_loss_scaling_factor": 0.1} if layout == "mtp" else {}))  # (0.13 has no default)
        spec = get_gpt_layer_local_spec()
        mtp = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False) if layout == "mtp" else None
        tied = layout != "untied"  # (MTP's second lookup: Megatron marks the weight as for tied embeddings)
        models, buffers, captured = [], [], []
        for convert in (False, True):
            torch.manual_seed(0)
            gpt = GPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=SEQ, mtp_block_spec=mtp,
                           share_embeddings_and_output_weights=layout == "tied", position_embedding_type="rope").to(device)
            if convert:
                with torch.no_grad():  # the same parameters as the stock model's
                    for mine, theirs in zip(gpt.parameters(), models[0].parameters()):
                        mine.copy_(theirs)
                assert _converts_with_warning(gpt) is tied
            assert bool(getattr(gpt.embedding.word_embeddings.weight, "zero_out_wgrad", False)) is tied
            ddp = DistributedDataParallel(config, DistributedDataParallelConfig(grad_reduce_in_fp32=True),
                                          Float16Module(config, gpt))
            ddp.zero_grad_buffer()
            mask = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool, device=device), diagonal=1)[None, None]
            positions = torch.arange(SEQ, device=device)[None].expand(BATCH, SEQ)
            embedding = gpt.embedding.word_embeddings
            for step, seed in enumerate((5, 6)):
                ids, local = (t.to(device) for t in _megatron_ids(embedding.vocab_start_index, embedding.vocab_end_index, seed))
                got = []
                with _lookup_gradient(got) if not convert else contextlib.nullcontext():
                    with ddp.no_sync() if step == 0 else contextlib.nullcontext():
                        ddp(ids, positions, mask, labels=ids.roll(-1, 1)).float().mean().backward()
                if not convert:  # the stock lookup's ids and the gradient that reached it
                    captured.append((local, got[0]))
            ddp.finish_grad_sync()
            models.append(gpt)
            buffers.append({name: p.main_grad for name, p in gpt.named_parameters()})
        stock, ours = buffers
        assert stock.keys() == ours.keys() and any(bool(g.ne(0).any()) for g in ours.values())
        expected = np.zeros(models[0].embedding.word_embeddings.weight.shape, np.float32)
        for local, grad in captured:
            expected = reference.accumulate(to_numpy(local), to_numpy(grad), expected)
        word = "embedding.word_embeddings.weight"
        for name in stock:
            if name == word and not tied:
                assert_bits_equal(to_numpy(ours[name]), expected, f"{name}, rank {rank}")
                if HAS_CUDA:
                    assert_bits_equal(to_numpy(ours[name]), to_numpy(stock[name]), f"{name} against the stock model's, rank {rank}")
            else:
                assert_bits_equal(to_numpy(ours[name]), to_numpy(stock[name]), f"{name} against the stock model's, rank {rank}")


@pytest.mark.parametrize("layout", ["untied", "tied", "mtp"])
def test_a_gpt_model_under_megatrons_ddp(layout, tmp_path):
    world = _ddp_world()
    torch.multiprocessing.spawn(_gpt_rank, args=(world, _store(tmp_path), layout), nprocs=world)


def test_use_embwgrad_rejects_a_model_without_one():
    with pytest.raises(ValueError, match="no megatron.core VocabParallelEmbedding"):
        tfm.use_embwgrad(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        tfm.use_embwgrad(object())
    with pytest.raises(TypeError, match="list of Linear, int"):
        tfm.use_embwgrad([torch.nn.Linear(2, 2), 3])
    with pytest.raises(TypeError, match="non-empty"):
        tfm.use_embwgrad([])
    with pytest.raises(ValueError, match="no megatron.core VocabParallelEmbedding \\(list of Linear, Linear\\)"):
        tfm.use_embwgrad([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)])
    module = VocabParallelEmbedding.__new__(VocabParallelEmbedding)
    torch.nn.Module.__init__(module)
    with pytest.raises(TypeError, match="has no tp_group"):
        tfm.use_embwgrad(module)


def _bare(kind):
    """A VocabParallelEmbedding (or subclass) with the attributes the forward reads, without Megatron's set-up."""
    module = kind.__new__(kind)
    torch.nn.Module.__init__(module)
    module.tp_group, module.vocab_start_index, module.vocab_end_index, module.reduce_scatter_embeddings = None, 0, 8, False
    module.weight = torch.nn.Parameter(torch.zeros(8, 4))
    return module


@pytest.mark.parametrize("pre_process, mtp_process, mtp_num_layers, marked", [
    (True, False, None, False),  # the first stage's lookup (or PP 1 without MTP)
    (False, True, 1, False),     # DeepSeek-V3's one MTP layer on the last stage
    (False, True, 2, True),      # two MTP layers on the last stage: two lookups
    (True, True, 1, True),       # the main lookup and MTP's on one stage, without zero_out_wgrad
])
def test_use_embwgrad_marks_an_embedding_its_stage_looks_up_more_than_once(pre_process, mtp_process, mtp_num_layers, marked):
    """A GPTModel's stage looks its embedding up once if pre_process and once per MTP layer if
    mtp_process (megatron-core 0.13-0.16's attributes, on a stand-in): more than once, use_embwgrad
    marks the weight embwgrad_dense, whose backward stays dense (tests/test_torch_autograd.py), and warns."""
    gpt = torch.nn.Module()
    gpt.embedding = torch.nn.Module()
    gpt.embedding.word_embeddings = _bare(VocabParallelEmbedding)
    gpt.pre_process, gpt.mtp_process = pre_process, mtp_process
    gpt.config = types.SimpleNamespace(mtp_num_layers=mtp_num_layers)
    assert _converts_with_warning(gpt) is marked
    assert getattr(gpt.embedding.word_embeddings.weight, "embwgrad_dense", False) is marked


def test_use_embwgrad_takes_megatrons_model_chunks():
    """Megatron's get_model returns a list of chunks (virtual pipeline stages); some hold no embedding.
    Each module is changed once, also where two chunks share it."""
    first, shared = _bare(VocabParallelEmbedding), _bare(VocabParallelEmbedding)
    chunks = [torch.nn.Sequential(first, shared), torch.nn.Linear(2, 2), torch.nn.Sequential(shared)]
    assert tfm.use_embwgrad(chunks) == 2
    assert tfm.use_embwgrad(tuple(chunks)) == 2
    assert all(m.forward.func is tfm.vocab_parallel_forward and m.forward.args == (m,) for m in (first, shared))


def test_a_converted_model_pickles_and_copies():
    """torch.save of the whole model, and copy.deepcopy (an EMA copy), keep embwgrad's forward,
    bound to the copy."""
    model = torch.nn.Sequential(_bare(VocabParallelEmbedding))
    tfm.use_embwgrad(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for twin in (torch.load(buffer, weights_only=False), copy.deepcopy(model)):
        assert twin[0] is not model[0] and twin[0].forward.func is tfm.vocab_parallel_forward and twin[0].forward.args == (twin[0],)


def test_use_embwgrad_warns_where_the_forward_is_not_megatrons():
    """The stock forward's fingerprint is the one embwgrad's follows (no warning); a subclass's own
    forward, which use_embwgrad would drop, warns."""
    assert tfm._fingerprint(VocabParallelEmbedding.forward) == tfm.STOCK_FORWARD
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tfm.use_embwgrad(_bare(VocabParallelEmbedding)) == 1

    class Scaled(VocabParallelEmbedding):
        def forward(self, input_):
            return super().forward(input_) * 2

    with pytest.warns(UserWarning, match="Scaled.forward is not the forward of megatron-core"):
        assert tfm.use_embwgrad(torch.nn.Sequential(_bare(Scaled), _bare(VocabParallelEmbedding))) == 2
