"""Every Triton kernel variant compiles for sm_90 (the H200), on any machine: see scripts/compile_check.py."""

import os
import subprocess
import sys

import pytest

from tests.conftest import HAS_CUDA

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script_output(name: str, *args: str) -> str:
    """stdout of scripts/<name>, which must succeed. A fresh process: the scripts need Triton's
    compiler, not the interpreter the CPU tests use."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", name), *args], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.skipif(HAS_CUDA, reason="for CPU-only CI: on a GPU every kernel is compiled and run by the GPU tests")
def test_triton_kernels_compile_for_hopper():
    out = _script_output("compile_check.py")
    assert out.count("ok ") >= 40, out


@pytest.mark.skipif(HAS_CUDA, reason="for CPU-only CI: the GPU tests run on an H200 only")
def test_triton_kernels_compile_for_ampere_and_blackwell():
    # Not tested on these GPUs, but compiled as the launcher would run them there: sm_80 (A100)
    # without programmatic dependent launch or the L2 prefetch, sm_100 (B200) with them.
    out = _script_output("compile_check.py", "80", "100")
    assert out.count("ok   sm_80 ") >= 40 and out.count("ok   sm_100 ") >= 40 and "FAIL" not in out, out


@pytest.mark.skipif(HAS_CUDA, reason="for CPU-only CI: on a GPU the benchmarks measure the kernel as compiled")
def test_partials_kernel_fits_its_register_target_without_spills():
    # The sort path's partials kernel is launched with a register target (PARTIAL_MAXNREG: 12
    # one-warp programs per SM; benchmarks/NOTES.md v20). If an edit, or another Triton, makes
    # it spill there, its speed must be measured again.
    line = _script_output("registers.py").strip().splitlines()[-1]
    assert " 0 B stack, 0 spill instructions" in line, line
