"""Every Triton kernel variant compiles for sm_90 (the H200), on any machine: see scripts/compile_check.py."""

import os
import subprocess
import sys

import pytest

from tests.conftest import HAS_CUDA

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(HAS_CUDA, reason="for CPU-only CI: on a GPU every kernel is compiled and run by the GPU tests")
def test_triton_kernels_compile_for_hopper():
    # A fresh process: the check needs Triton's compiler, not the interpreter the CPU tests use.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "compile_check.py")], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") >= 40, proc.stdout
