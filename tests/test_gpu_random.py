"""Random inputs over the whole route space, on the GPU: torch against PyTorch's dense path, and
JAX against it, bit for bit.

The shared GPU cases (tests/cases.py gpu_cases) sit at chosen points. Here hypothesis draws the
rest of the space: n around every threshold of the routes and log-uniform up to 2**17, V from 1 up,
H from 1 to 7168, every dtype pairing, ids uniform, Zipf(a), all one id, a few ids, sorted, or a
vocab-parallel rank's (most of them 0 with zero grad rows), ids outside [0, V) (skipped by both
frontends: the dense path gets the others), int32 or int64, 1-D or 2-D, padding_idx given as
F.embedding takes it, zero_rows, and masked (its rows poisoned with NaN, expected on +0 rows).

Each run of the suite draws new examples (no example database); a failure prints the example and
the `--hypothesis-seed` that draws it again. EMBWGRAD_RANDOM_EXAMPLES sets the torch test's number
of examples (default 32); the JAX test takes a quarter of it, since XLA compiles each new shape.
EMBWGRAD_RANDOM_SECONDS ends a campaign cleanly within a time limit: no example starts after it.
On the CPU both skip (the interpreter tests draw their own random inputs: test_torch_frontend's
and test_jax_frontend's hypothesis tests), and the oracle itself is checked against the core
reference on small draws whose sums are exact in any order.
"""

import contextlib
import json
import os
import sys
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import jax
import jax_frontend
import torch_frontend
from embwgrad_core import reference
from embwgrad_core import CHUNK, FEATURE_PATH_MAX_TOKENS, MASKED_MERGE_SORT_MAX_TOKENS, MERGE_SORT_MAX_TOKENS
from embwgrad_core.constants import BF16_SCRATCH_MIN_TOKENS, FOLD_ROLE_MAX_TOKENS
from embwgrad_core.validate import normalize_padding_idx
from tests.cases import assert_bits_equal, release_compiled_code, zipf_ids
from tests.test_cross_framework import requires_gpus
from tests.test_torch_frontend import DEVICE, TORCH_DTYPES, assert_rows_bits_equal, dense_reference, requires_cuda, to_numpy, to_torch
from tests.test_torch_frontend import poisoned_scratch  # noqa: F401 (autouse: this module's scratch is poisoned too)
from torch_frontend.embedding_wgrad import FOLDERS_MAX_TOKENS
EXAMPLES = int(os.environ.get("EMBWGRAD_RANDOM_EXAMPLES", "32"))
#: The GPU tests' fewest tokens (default 1): a campaign on the routes of large n only, say
#: 65537 for the library sort (a uniform draw of n misses them: 16 of 403 examples in NOTES v71).
MIN_TOKENS = int(os.environ.get("EMBWGRAD_RANDOM_MIN_TOKENS", "1"))
#: A file to which each GPU example appends a line: the test, its seconds, the problem (for a campaign's record).
LOG = os.environ.get("EMBWGRAD_RANDOM_LOG")
#: Seconds after a GPU random test's first example from which it starts no example (default: no limit).
#: Those drawn after it return at once, so a campaign ends with pytest's own verdict inside a device
#: call, rather than cut off by a signal mid-example (session 70's one failure came at about its
#: process's last example, near its 250 s timeout: NOTES v75). Once an example has failed, every
#: later one runs, so hypothesis can still replay and shrink it.
SECONDS = float(os.environ.get("EMBWGRAD_RANDOM_SECONDS", "inf"))
_first_example: dict = {}  # test -> _clock() at its first example
_failed: set = set()  # tests with an example that raised an Exception
_clock = time.monotonic  # (a stand-in in the CPU test of out_of_time)

#: Token counts where a route or a launch setting changes (either frontend), drawn with an offset.
THRESHOLDS = (1, CHUNK, BF16_SCRATCH_MIN_TOKENS, FEATURE_PATH_MAX_TOKENS, 4096, FOLD_ROLE_MAX_TOKENS, FOLDERS_MAX_TOKENS,
              MERGE_SORT_MAX_TOKENS, MASKED_MERGE_SORT_MAX_TOKENS)
HIDDEN = (1, 8, 100, 256, 1031, 4096, 7168)
DTYPES = ("bfloat16", "float16", "float32")
#: grad and main_grad at most this many elements each (main_grad fp32: 512 MB).
MAX_ELEMENTS = 2**27
MAX_VOCAB = 2**21
DISTRIBUTIONS = ("uniform", "zipf", "one", "few", "sorted", "vocab-parallel")
RANDOM = settings(deadline=None, database=None, print_blob=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
RANDOM_SMALL = settings(RANDOM, derandomize=True)  # (the CPU's draws, the same in every CI run)


@st.composite
def problems(draw, int64_ids: bool = True, min_n: int = 1, max_n: int = 2**17, max_hidden: int = max(HIDDEN),
             max_elements: int = MAX_ELEMENTS):
    """A dict of the drawn problem's parameters (the arrays are made from its seed on the device).
    n lies in [min_n, max_n]: a threshold or log-uniform draw below min_n is drawn again uniformly."""
    if draw(st.booleans()):
        n = draw(st.sampled_from(THRESHOLDS)) + draw(st.sampled_from((-1, 0, 1, 9)))
    else:
        n = draw(st.integers(0, 16).flatmap(lambda b: st.integers(2**b, 2 ** (b + 1))))
    n = max(n, 1)
    if n < min_n:
        n = draw(st.integers(min_n, max(min_n, max_n)))
    n = min(n, max_n)
    hidden = draw(st.sampled_from([h for h in HIDDEN if n * h <= max_elements and h <= max_hidden]))
    vocab = draw(st.one_of(st.integers(1, 64), st.integers(65, max(65, min(MAX_VOCAB, max_elements // hidden)))))
    masked = draw(st.booleans())
    return dict(
        n=n, hidden=hidden, vocab=vocab,
        rows=draw(st.sampled_from([r for r in (1, 2, 4, 8) if n % r == 0])),  # ids [rows, n / rows]
        dist=draw(st.sampled_from(DISTRIBUTIONS)),
        zipf_a=draw(st.sampled_from((1.01, 1.1, 1.5, 2.5))),
        outside=draw(st.sampled_from((0.0, 0.0, 0.0, 0.05, 1.0))),  # share of ids outside [0, V)
        id_dtype=draw(st.sampled_from(("int32", "int64") if int64_ids else ("int32",))),
        grad_dtype=draw(st.sampled_from(DTYPES)),
        main_dtype=draw(st.sampled_from(DTYPES)),
        padding=draw(st.sampled_from((None, "occurring", "negative"))),
        zero_rows=masked or draw(st.booleans()),
        masked=masked,
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def make_inputs(p: dict, small_integers: bool = False):
    """(ids, grad, main_grad, masked or None, padding_idx) on the device for problem p. grad is drawn
    at exponents -8 to 8 (so sums round), or (small_integers) from -1, 0 and 1 (so every sum of at
    most 256 is exact in any order and dtype); its zero rows (vocab-parallel) are +0 or -0.
    main_grad holds no zero, so the dense path's +0 leaves its absent rows' bits as ours are left."""
    n, hidden, vocab = p["n"], p["hidden"], p["vocab"]
    rng = np.random.default_rng(p["seed"])
    zero = np.zeros(n, bool)
    if p["dist"] == "uniform":
        ids = rng.integers(0, vocab, n)
    elif p["dist"] in ("zipf", "sorted"):
        ids = zipf_ids(n, vocab, a=p["zipf_a"], seed=p["seed"])
        ids = np.sort(ids) if p["dist"] == "sorted" else ids
    elif p["dist"] == "one":
        ids = np.full(n, rng.integers(0, vocab))
    elif p["dist"] == "few":
        ids = rng.choice(rng.integers(0, vocab, rng.integers(2, 6)), n)
    else:  # a rank of TP = 8: other shards' tokens looked up as 0, their grad rows zeroed
        ids = zipf_ids(n, vocab, a=p["zipf_a"], seed=p["seed"])
        zero = rng.random(n) < 7 / 8
        ids[zero] = 0
    far = [-1, -7, vocab, vocab + 100, 2**31 - 1, -(2**31)] + ([2**33, -(2**40)] if p["id_dtype"] == "int64" else [])
    outside = rng.random(n) < p["outside"]
    ids = np.where(outside, rng.choice(far, n), ids).astype(p["id_dtype"])
    masked = (zero | (rng.random(n) < 0.3)) & ~outside if p["masked"] else None
    padding_idx = None
    if p["padding"] is not None:
        inside = ids[(ids >= 0) & (ids < vocab)]
        padding_idx = int(inside[0]) if inside.size else 0
        padding_idx -= vocab if p["padding"] == "negative" else 0

    gen = torch.Generator(device=DEVICE).manual_seed(p["seed"])
    if small_integers:
        grad = torch.randint(-1, 2, (n, hidden), device=DEVICE, generator=gen).float()
    else:
        grad = torch.ldexp(torch.randn(n, hidden, device=DEVICE, generator=gen),
                           torch.randint(-8, 9, (n, hidden), device=DEVICE, generator=gen))
    zero_t = torch.from_numpy(zero).to(DEVICE)
    signs = torch.where(torch.rand(n, 1, device=DEVICE, generator=gen) < 0.5, -0.0, 0.0)
    grad = torch.where(zero_t[:, None], signs, grad).to(TORCH_DTYPES[p["grad_dtype"]])
    main_grad = torch.randn(vocab, hidden, device=DEVICE, generator=gen).to(TORCH_DTYPES[p["main_dtype"]])
    main_grad = main_grad.masked_fill(main_grad == 0, 1.0)  # (fp16 turns tiny values into -0)
    shape = (p["rows"], n // p["rows"]) if p["rows"] > 1 else (n,)
    ids_t = torch.from_numpy(ids).to(DEVICE).reshape(shape)
    masked_t = None if masked is None else torch.from_numpy(masked).to(DEVICE).reshape(shape)
    return ids_t, grad.reshape(*shape, hidden), main_grad, masked_t, padding_idx


def core_bits(ids, grad, main_grad, masked, padding_idx):
    """The core reference's result, on main_grad's device: the oracle where PyTorch's own kernels
    give other bits (under compute-sanitizer, tests/test_gpu_racecheck.py)."""
    out = reference.accumulate(to_numpy(ids), to_numpy(grad), to_numpy(main_grad), padding_idx=padding_idx,
                               masked=None if masked is None else to_numpy(masked))
    return to_torch(out, device=main_grad.device)


def expected_bits(ids, grad, main_grad, masked, padding_idx):
    """PyTorch's dense path, the masked tokens' rows taken as +0. The frontends skip ids outside
    [0, V), for which the dense path has no defined result; here they go to a spare row V, which
    leaves n, and so PyTorch's choice of path and every other row's arithmetic, as they were."""
    vocab, hidden = main_grad.shape
    ids, grad = ids.reshape(-1), grad.reshape(-1, hidden)
    if masked is not None:
        grad = grad.masked_fill(masked.reshape(-1, 1), 0.0)
    ids = torch.where((ids >= 0) & (ids < vocab), ids, vocab)
    padding = -1 if padding_idx is None else normalize_padding_idx(padding_idx, vocab)
    spare = torch.cat([main_grad, main_grad.new_ones(1, hidden)])
    return dense_reference(ids, grad, spare, padding)[:vocab]


@settings(RANDOM_SMALL, max_examples=30)
@given(p=problems(max_n=256, max_hidden=100, max_elements=2**16))
def test_random_oracle_is_the_core_reference(p):
    """The oracle of the random GPU tests (the dense path with ids outside [0, V) on a spare row,
    masked rows +0, padding_idx normalised) on sums that are exact in any order: the core
    reference's bits, on whichever device torch has (its dense CPU path sums in another order)."""
    ids, grad, main_grad, masked, padding_idx = make_inputs(p, small_integers=True)
    expected = expected_bits(ids, grad, main_grad, masked, padding_idx)
    assert_bits_equal(to_numpy(expected), to_numpy(core_bits(ids, grad, main_grad, masked, padding_idx)))


@settings(RANDOM_SMALL, max_examples=40)
@given(p=problems(min_n=MASKED_MERGE_SORT_MAX_TOKENS + 1))
def test_random_problems_keep_to_their_bounds(p):
    """A campaign narrowed to large n (EMBWGRAD_RANDOM_MIN_TOKENS) draws only there, and every draw
    fits the GPU tests' bounds: grad and main_grad of at most MAX_ELEMENTS elements, ids' rows dividing n."""
    assert MASKED_MERGE_SORT_MAX_TOKENS < p["n"] <= 2**17
    assert p["n"] * p["hidden"] <= MAX_ELEMENTS and 1 <= p["vocab"] <= max(65, min(MAX_VOCAB, MAX_ELEMENTS // p["hidden"]))
    assert p["n"] % p["rows"] == 0


@contextlib.contextmanager
def logged(test: str, p: dict):
    """Appends the example's line to LOG (if set) once it has passed or failed, with the error's
    first 2000 characters (a campaign cut short, by a timeout say, keeps them)."""
    start, outcome = time.perf_counter(), "passed"
    try:
        yield
    except BaseException as e:
        outcome = f"{type(e).__name__}: {str(e)[:2000]}"
        if isinstance(e, Exception):
            _failed.add(test)
        raise
    finally:
        if LOG:
            with open(LOG, "a") as f:
                f.write(json.dumps(dict(test=test, outcome=outcome, seconds=round(time.perf_counter() - start, 3), **p)) + "\n")


def out_of_time(test: str) -> bool:
    """Whether `test`'s time (EMBWGRAD_RANDOM_SECONDS from its first example) is up, and none of its
    examples has failed: then the example is not run."""
    start = _first_example.setdefault(test, _clock())
    return test not in _failed and _clock() - start >= SECONDS


def test_random_campaign_ends_at_its_seconds(monkeypatch):
    """EMBWGRAD_RANDOM_SECONDS: from that long after a test's first example, its examples are not
    run, unless one of them has failed (an Exception; a KeyboardInterrupt is not a failure)."""
    now = [100.0]
    for name, value in (("SECONDS", 10.0), ("LOG", None), ("_first_example", {}), ("_failed", set()), ("_clock", lambda: now[0])):
        monkeypatch.setattr(sys.modules[__name__], name, value)
    assert not out_of_time("a")  # (its first example starts its clock)
    now[0] = 109.9
    assert not out_of_time("a") and not out_of_time("b")
    now[0] = 110.0
    assert out_of_time("a") and not out_of_time("b")
    with pytest.raises(KeyboardInterrupt), logged("a", {}):
        raise KeyboardInterrupt
    assert out_of_time("a")
    with pytest.raises(AssertionError), logged("a", {}):
        raise AssertionError
    assert not out_of_time("a")
    now[0] = 119.8
    assert not out_of_time("b")  # (its clock started at 109.9)
    now[0] = 119.9
    assert out_of_time("b")


def poisoned(grad, masked):
    """grad with the masked tokens' rows NaN, so that a read of one shows in the bits."""
    return grad if masked is None else grad.masked_fill(masked[..., None], float("nan"))


#: Failed once on an H100 in session 70's campaign (the 192nd example of one of three processes; 578
#: passed), its error not kept. Not reproduced since (NOTES v71): it and 16 variants 54 times with and
#: without the poisoned scratch, under initcheck, and among 4303 random examples of its route; not yet explained
#: (the others ran about 193 each in their 250 s, so the timeout may have made it: NOTES v75).
SESSION_70_FAILURE = dict(n=94228, hidden=1031, vocab=16, rows=2, dist="zipf", zipf_a=2.5, outside=1.0, id_dtype="int64", grad_dtype="float32",
                          main_dtype="bfloat16", padding="occurring", zero_rows=True, masked=True, seed=4096)


@requires_cuda
@settings(RANDOM, max_examples=EXAMPLES)
@given(p=problems(min_n=MIN_TOKENS))
@example(p=SESSION_70_FAILURE)
def test_gpu_random_inputs_torch(p):
    """torch_frontend.accumulate against the dense path, twice (the second call replays the
    first's launches where its key repeats)."""
    if out_of_time("torch"):
        return
    with logged("torch", p):
        torch_example(p)


def torch_example(p, oracle=expected_bits):
    ids, grad, main_grad, masked, padding_idx = make_inputs(p)
    expected = oracle(ids, grad, main_grad, masked, padding_idx)
    for _ in range(2):
        out = main_grad.clone()
        torch_frontend.accumulate(ids, poisoned(grad, masked), out, padding_idx=padding_idx, zero_rows=p["zero_rows"], masked=masked)
        assert_rows_bits_equal(out, expected, f" of {p}")


@requires_gpus
@settings(RANDOM, max_examples=max(1, EXAMPLES // 4))
@given(p=problems(int64_ids=False, min_n=MIN_TOKENS))
def test_gpu_random_inputs_jax(p):
    """jax_frontend.accumulate (int32 ids, as JAX without x64 has them) against the dense path."""
    if out_of_time("jax"):
        return
    release_compiled_code()  # (each example compiles its own shapes: NOTES v75 item 3)
    with logged("jax", p):
        jax_example(p)


def jax_example(p, oracle=expected_bits):
    ids, grad, main_grad, masked, padding_idx = make_inputs(p)
    expected = oracle(ids, grad, main_grad, masked, padding_idx)
    to_jax = jax.dlpack.from_dlpack
    out = jax_frontend.accumulate(jax.numpy.asarray(ids.cpu().numpy()), to_jax(poisoned(grad, masked).contiguous()),
                                  jax.numpy.array(to_jax(main_grad), copy=True), padding_idx=padding_idx,
                                  zero_rows=p["zero_rows"], masked=None if masked is None else jax.numpy.asarray(masked.cpu().numpy()))
    out.block_until_ready()
    assert_rows_bits_equal(torch.from_dlpack(out), expected, f" of {p}")
