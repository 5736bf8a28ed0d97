"""torch_frontend and jax_frontend give the same bits on the same inputs.

CPU: a few shared CPU cases (SAME_BITS_CPU) through Triton's interpreter (the conftest sets
TRITON_INTERPRET=1 when torch sees no CUDA device) and through Pallas interpret mode. GPU
(skipped unless torch sees CUDA and jax's default backend is "gpu"): every shared GPU case
through both sets of kernels, compared on the device.
"""

import numpy as np
import pytest
import torch

import jax
import jax.numpy as jnp

import jax_frontend
import torch_frontend
from tests.cases import Case, assert_bits_equal, cpu_cases, gpu_cases
from tests.test_jax_frontend import assert_rows_equal_on_device, to_jax
from tests.test_jax_frontend import run_kernels as run_jax
from tests.test_torch_frontend import TORCH_DTYPES, dense_reference, to_numpy, to_torch
from tests.test_torch_frontend import run_kernels as run_torch

ON_BOTH_GPUS = torch.cuda.is_available() and jax.default_backend() == "gpu"
requires_gpus = pytest.mark.skipif(not ON_BOTH_GPUS, reason="needs CUDA in torch and a GPU backend in jax")


# Each frontend's own test_kernels_match_core_reference matches every CPU case bit for bit against
# the core reference, on the same seeded arrays, so torch and JAX agree on all of them by
# transitivity. Here, on the CPU, a direct check of a few: each path's main dtypes, each path's
# special values (-0, subnormals, sums that overflow), and ids out of range. Through both
# interpreters the whole list took 172 s of the CI workers' time (session 45), torch-path-3073
# about 100 s more (session 33). The GPU test below runs every GPU case.
SAME_BITS_CPU = ("s-runs-bf16-f32", "f-runs-bf16-f32", "s-specials", "f-specials", "ids-out-of-range")
SAME_BITS_CASES = [c for c in cpu_cases() if c.name in SAME_BITS_CPU]
assert len(SAME_BITS_CASES) == len(SAME_BITS_CPU), "SAME_BITS_CPU names a case cpu_cases() lacks"


@pytest.mark.parametrize("case", SAME_BITS_CASES, ids=lambda c: c.name)
def test_same_bits(case: Case):
    ids, grad, main_grad = case.arrays()
    out = to_torch(main_grad)
    run_torch(case, to_torch(ids), to_torch(grad), out)
    assert_bits_equal(run_jax(case, ids, grad, main_grad), to_numpy(out))


@requires_gpus
@pytest.mark.parametrize("case", gpu_cases(), ids=lambda c: c.name)
def test_gpu_same_bits(case: Case):
    ids, grad = case.ids_and_grad()
    gen = torch.Generator(device="cuda").manual_seed(case.seed)
    main_grad = torch.randn(case.num_embeddings, case.hidden, device="cuda", generator=gen).to(TORCH_DTYPES[case.main_grad_dtype])
    main_grad_jax = jnp.array(jax.dlpack.from_dlpack(main_grad), copy=True)  # the same bits, owned by jax
    torch_frontend.accumulate(to_torch(ids), to_torch(grad), main_grad, padding_idx=case.padding_idx)
    out = jax_frontend.accumulate(to_jax(ids), to_jax(grad), main_grad_jax, padding_idx=case.padding_idx)
    torch.cuda.synchronize()
    assert_rows_equal_on_device(out, jax.dlpack.from_dlpack(main_grad), what="jax vs torch")


@requires_gpus
@pytest.mark.parametrize("case", [c for c in gpu_cases() if c.zero_positions is not None], ids=lambda c: c.name)
def test_gpu_masked_same_bits(case: Case):
    """masked on the GPU cases with zero rows (Megatron's input_mask, and the padding run below the
    zero skip): the masked rows NaN, so that a read shows; JAX's bits are torch's, which
    test_torch_frontend's test_gpu_masked_megatron_bitwise checks against the dense path."""
    ids, grad = case.ids_and_grad()
    masked = case.masked()
    grad = np.where(masked[:, None], np.asarray(np.nan, grad.dtype), grad)
    gen = torch.Generator(device="cuda").manual_seed(case.seed)
    main_grad = torch.randn(case.num_embeddings, case.hidden, device="cuda", generator=gen).to(TORCH_DTYPES[case.main_grad_dtype])
    main_grad_jax = jnp.array(jax.dlpack.from_dlpack(main_grad), copy=True)
    torch_frontend.accumulate(to_torch(ids), to_torch(grad), main_grad, masked=to_torch(masked))
    out = jax_frontend.accumulate(to_jax(ids), to_jax(grad), main_grad_jax, masked=to_jax(masked))
    torch.cuda.synchronize()
    assert not bool(torch.isnan(main_grad).any())
    assert_rows_equal_on_device(out, jax.dlpack.from_dlpack(main_grad), what="jax vs torch")


# grad of more than 2**31 elements (4.3 GB of bf16; byte offsets past 2**32): the merge sort, the
# library sort (above MERGE_SORT_MAX_TOKENS) and the feature path (n <= 3072), each with a long
# run whose partials lie far into scratch. (n, H, V); every n * H > 2**31.
HUGE_GRADS = [(32768, 65537, 3000), (2**19, 4099, 20000), (3072, 699053, 64)]


@requires_gpus
@pytest.mark.gpu_memory  # grad of 4.3 GB and more (tests/conftest.py)
@pytest.mark.parametrize("n, hidden, vocab", HUGE_GRADS, ids=lambda v: str(v))
def test_gpu_grad_of_more_than_2_31_elements(n, hidden, vocab):
    """Every address in 64 bits: torch against the dense path, JAX against torch, bit for bit."""
    assert n * hidden > 2**31
    gen = torch.Generator(device="cuda").manual_seed(n)
    ids = torch.randint(0, vocab, (n,), device="cuda", generator=gen, dtype=torch.int32)
    ids[::7] = 1  # a run of n / 7 tokens
    grad = torch.randn(n, hidden, device="cuda", generator=gen, dtype=torch.bfloat16)
    main_grad = torch.randn(vocab, hidden, device="cuda", generator=gen)
    main_grad_jax = jnp.array(jax.dlpack.from_dlpack(main_grad), copy=True)
    expected = dense_reference(ids, grad, main_grad, -1)
    torch_frontend.accumulate(ids, grad, main_grad)
    assert torch.equal(main_grad.view(torch.int32), expected.view(torch.int32))
    del expected
    out = jax_frontend.accumulate(jax.dlpack.from_dlpack(ids), jax.dlpack.from_dlpack(grad), main_grad_jax)
    assert_rows_equal_on_device(out, jax.dlpack.from_dlpack(main_grad), what="jax vs torch")
