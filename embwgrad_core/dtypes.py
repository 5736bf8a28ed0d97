"""Dtype names and exact round-to-nearest-even, shared by the references and the frontends.

Dtypes are named by string ("float32", "bfloat16", "float16") so that NumPy, torch and JAX
dtypes meet on common ground. Rounding is RNE with subnormals kept (SPEC.md, "Edges").
"""

import ml_dtypes
import numpy as np

from .constants import ACC_DTYPE, SUPPORTED_DTYPES

_NUMPY = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
}

#: Code of each dtype's rounding, as kernels take it (a compile-time constant).
ROUNDING_CODE = {"float32": 0, "bfloat16": 1, "float16": 2}


def dtype_name(dtype) -> str:
    """The supported dtype's name ("float32", "bfloat16", "float16") for a NumPy, torch or JAX dtype.

    Raises TypeError for anything else.
    """
    name = str(dtype).rsplit(".", 1)[-1]
    if name not in SUPPORTED_DTYPES:
        raise TypeError(f"dtype {dtype} is not one of {SUPPORTED_DTYPES}")
    return name


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy (ml_dtypes for bfloat16) dtype of a supported dtype name."""
    return _NUMPY[dtype_name(name)]


def round_to(x: np.ndarray, name: str) -> np.ndarray:
    """Round fp32 values to dtype `name` (RNE, subnormals kept) and return them as fp32 again."""
    x = np.asarray(x, dtype=ACC_DTYPE)
    if dtype_name(name) == "float32":
        return x
    with np.errstate(over="ignore"):  # overflow to inf is the rounding's answer
        return x.astype(_NUMPY[name]).astype(ACC_DTYPE)


def bits(x: np.ndarray) -> np.ndarray:
    """The integer view of a float array, for bitwise comparisons."""
    x = np.asarray(x)
    return x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])
