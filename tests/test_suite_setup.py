"""The suite's own set-up (tests/conftest.py): which tests share the GPU memory group."""

import os
import subprocess
import sys

# The whole suite collected in a fresh process (as the GPU run collects it), each test id printed with
# conftest's verdict on it.
COLLECT = """
import sys, pytest
class Verdicts:
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        conftest = sys.modules["conftest"]
        for item in items:
            print("VERDICT", int(conftest._holds_gpu_memory(item)), item.name)
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "tests/"], plugins=[Verdicts()]))
"""
BIG = ("test_gpu_bitwise_against_dense_and_core[real-uniform-8192-bfloat16]", "test_gpu_same_bits[real-odd-H-uniform-8192]",
       "test_gpu_cases_match_core_reference[real-main-bf16-zipf-8192]", "test_gpu_cuda_graph_and_no_host_sync[real-uniform-3073-bfloat16-False]",
       "test_gpu_grad_of_more_than_2_31_elements[3072-699053-64]", "test_gpu_extra_memory_is_a_few_n_h",
       "test_gpu_in_place_extra_memory_is_a_few_n_h", "test_gpu_replayed_launches_give_the_same_bits")
SMALL = ("test_gpu_bitwise_against_dense_and_core[feature-zipf-3072]", "test_gpu_same_bits[real-odd-H-zipf-6000]",
         "test_gpu_cuda_graph_and_no_host_sync[feature-zipf-3072-False]", "test_gpu_masked_same_bits[megatron-tp8-65537]")


def test_the_gpu_memory_group():
    """The tests that hold a GiB or more of device memory (cases at the real shape, the marked ones)
    are in the group that runs one at a time on the GPU; the GPU tests of smaller cases are not, and
    neither is any test that is not a GPU test."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, "-c", COLLECT], cwd=root, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    verdicts = {name: verdict for _, verdict, name in (line.split(" ", 2) for line in run.stdout.splitlines() if line.startswith("VERDICT "))}
    assert set(BIG) | set(SMALL) <= verdicts.keys(), (set(BIG) | set(SMALL)) - verdicts.keys()
    assert all(verdicts[name] == "1" for name in BIG)
    assert all(verdicts[name] == "0" for name in SMALL)
    big = [name for name, verdict in verdicts.items() if verdict == "1"]
    assert all("gpu" in name for name in big), big


# A fresh process on XLA:CPU compiles three new shapes of accumulate (Pallas interpret mode), then
# asks release_compiled_code() to let their code go, first at the real limit of memory maps (far off)
# and then at a stand-in limit of 2 maps.
RELEASE = """
import numpy as np, jax, jax.numpy as jnp
import jax_frontend
from tests import cases

def call(n):
    return np.asarray(jax_frontend.accumulate(jnp.arange(n, dtype=jnp.int32) % 5, jnp.full((n, 3), 0.1, jnp.float32),
                                              jnp.zeros((5, 3), jnp.float32)))

first = [call(n) for n in (37, 38, 39)]
compiled = cases.memory_maps()
print("KEPT", int(cases.release_compiled_code()), compiled, cases.memory_maps())
cases.memory_maps_limit = lambda: 2
print("RELEASED", int(cases.release_compiled_code()), compiled, cases.memory_maps())
print("SAME", int(all(np.array_equal(a.view(np.uint32), call(n).view(np.uint32)) for a, n in zip(first, (37, 38, 39)))))
"""


def test_compiled_code_released_near_the_limit_of_memory_maps():
    """tests.cases.release_compiled_code (after every test, and before each example of the JAX
    random tests): nothing while the process is far below half its limit of memory maps; at it,
    jax's caches are cleared and the maps of XLA:CPU's compiled code given back (three shapes hold
    about 600), and a shape called again compiles again and gives the same bits."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, "-c", RELEASE], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    fields = [line.split() for line in run.stdout.splitlines()]
    lines = {f[0]: [int(x) for x in f[1:]] for f in fields if f and f[0] in ("KEPT", "RELEASED", "SAME")}
    kept, released = lines["KEPT"], lines["RELEASED"]
    assert kept[0] == 0 and kept[2] >= kept[1] - 50, kept
    assert released[0] == 1 and released[2] < released[1] - 300, released
    assert lines["SAME"] == [1]
