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
