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
