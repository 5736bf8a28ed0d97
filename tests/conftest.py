"""Test set-up that must happen before triton or jax is imported.

On a machine without CUDA, Triton kernels run in its interpreter (TRITON_INTERPRET=1) and
Pallas kernels in interpret mode. With EMBWGRAD_REQUIRE_GPU=1 (the GPU script sets it) a
missing GPU is an error, so GPU tests can never be skipped silently.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    import torch

    HAS_CUDA = torch.cuda.is_available()
except ImportError:  # a JAX-only environment
    HAS_CUDA = False

if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # Two CPU devices, so that the jax.shard_map tests split their data over a mesh of two.
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch and JAX share the GPU

if os.environ.get("EMBWGRAD_REQUIRE_GPU") == "1" and not HAS_CUDA:
    raise pytest.UsageError("EMBWGRAD_REQUIRE_GPU=1 but torch sees no CUDA device")


# GPU memory and the GPU suite's schedule. The GPU suite runs in several processes (scripts/gpu_all.sh,
# pytest-xdist). A test at the real shape holds GiBs of device memory (main_grad [129280, 7168] fp32
# is 3.45 GiB, and a test may hold four such), and each process keeps what it used: torch's caching
# allocator and JAX's pool (XLA's BFC allocator grows and never gives memory back). Dealt out one by
# one to four processes, such tests side by side and what the processes kept exhausted an 80 GB H100
# (session 72: three tests failed out of memory), so every test that may hold a GiB or more goes
# into one xdist group: under `--dist loadgroup` they run one at a time, in one process. Every other
# test is grouped with the other parameters of its function, so that one process compiles that
# function's kernels (dealt out one by one, the same 444 tests took 1.46 times as long in all as in
# chunks: session 72).
GPU_MEMORY_GROUP = "gpu-memory"
GPU_MEMORY_BYTES = 2**30  #: a case whose main_grad (as fp32) reaches this is big


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu_memory: a GPU test that may hold a GiB or more of device memory; under "
                            "`--dist loadgroup` all of them run in one process, one at a time (tests/conftest.py)")
    # pytest-xdist 3.8 groups by renaming each test's id, which pytest 9.2 ignores (pytest-xdist issue
    # 1386): the tests would be dealt out one by one, the big ones at once. Say so rather than run so.
    if HAS_CUDA and getattr(config.option, "dist", None) == "loadgroup":
        from importlib.metadata import version

        def release(name):
            return tuple(int(part) for part in version(name).split(".")[:2] if part.isdigit())

        if release("pytest") >= (9, 2) and release("pytest-xdist") <= (3, 8):
            raise pytest.UsageError(f"--dist loadgroup does not group tests with pytest {version('pytest')} and pytest-xdist "
                                    f"{version('pytest-xdist')} (pytest-xdist issue 1386); the GPU suite needs its groups "
                                    "(tests/conftest.py): use a pytest before 9.2")


def _holds_gpu_memory(item) -> bool:
    """The gpu_memory mark, or a parameter that makes the test big: a case (or a GPU case's name)
    whose [V, H] main_grad reaches GPU_MEMORY_BYTES as fp32."""
    if item.get_closest_marker("gpu_memory"):
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    from tests.cases import Case, gpu_cases_by_name  # (collection time: after the environment above is set)

    for value in params.values():
        case = gpu_cases_by_name().get(value) if isinstance(value, str) else value
        if isinstance(case, Case) and case.num_embeddings * case.hidden * 4 >= GPU_MEMORY_BYTES:
            return True
    return False


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    if not HAS_CUDA:
        return
    for item in items:
        # (a group's name joins the test's id after an "@": no "::", "/" or brackets in it, so that
        # reports still split the id into module and name)
        function = f"{item.module.__name__.rpartition('.')[2]}.{item.originalname}" if hasattr(item, "originalname") else "other"
        item.add_marker(pytest.mark.xdist_group(GPU_MEMORY_GROUP if _holds_gpu_memory(item) else function))


def pytest_runtest_teardown(item):
    """After each test, jax's compiled code let go if this process nears its limit of memory maps."""
    from tests.cases import release_compiled_code

    release_compiled_code()
