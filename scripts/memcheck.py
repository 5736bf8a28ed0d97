"""One frontend's kernels on every route, for compute-sanitizer's memcheck (run by scripts/memcheck.sh).

    python scripts/memcheck.py torch|jax

Small shapes (memcheck slows kernels many times), chosen to reach every route and edge: the
feature path; the sort path by the merge sort without and with lone tokens; few records (fewer
items than the partials kernel's tail programs); long runs folded inside the partials kernel and
by the long-run kernel; the library sort's route; padding_idx; a strided grad (torch). Each call's
result is also compared bit for bit with the core's NumPy reference, so a case that stays inside
its buffers but computes wrong fails too. Exit status 1 on any mismatch; memcheck's own errors
come from compute-sanitizer (--error-exitcode in memcheck.sh).

With PYTORCH_NO_CUDA_MEMORY_CACHING=1 (memcheck.sh) every torch tensor, the plan's workspace and
scratch included, is an allocation of its own, so memcheck sees any access past one. JAX
(XLA_PYTHON_CLIENT_ALLOCATOR=platform): ids, grad and main_grad are allocations of their own,
but a jitted call's intermediates (the plan's arrays) share XLA's temporary buffer, so an access
just past one of those is seen only at that buffer's ends.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from embwgrad_core import reference  # noqa: E402
from embwgrad_core.dtypes import bits  # noqa: E402
from tests.cases import Case, runs_ids, uniform_ids, zipf_ids  # noqa: E402

#: bf16 grad into fp32 main_grad; the case's seed draws its arrays (Case.arrays).
CASES = [
    Case("feature zipf 1000", zipf_ids(1000, 500, seed=1), 256, 500, seed=0),
    Case("feature padding 3000", zipf_ids(3000, 400, seed=2), 128, 400, padding_idx=0, seed=1),
    Case("merge zipf 4000 (no lone tokens)", zipf_ids(4000, 3000, seed=3), 256, 3000, seed=2),
    Case("merge uniform 6000 (lone tokens)", uniform_ids(6000, 50000, seed=4), 128, 50000, seed=3),
    Case("merge two runs 3100 (few records)", runs_ids((1500, 1600), 50, seed=5), 64, 50, seed=4),
    Case("merge one token twice 3073", runs_ids((2,) + (1,) * 3071, 40000, seed=6), 64, 40000, seed=5),
    Case("merge zipf 8192 (folders)", zipf_ids(8192, 1000, seed=7), 256, 1000, seed=6),
    Case("merge zipf 12000 (long-run kernel)", zipf_ids(12000, 2000, seed=8), 128, 2000, seed=7),
    Case("merge padding 9000", zipf_ids(9000, 300, seed=9), 96, 300, padding_idx=3, seed=8),
    Case("library sort uniform 40000", uniform_ids(40000, 5000, seed=10), 64, 5000, seed=9),
]


def case_arrays(case: Case):
    """(ids, grad, main_grad) as NumPy arrays, and main_grad after the core reference."""
    ids, grad, main_grad = case.arrays()
    return ids, grad, main_grad, reference.accumulate(ids, grad, main_grad, padding_idx=case.padding_idx)


def run_torch() -> int:
    import torch

    import torch_frontend

    device = "cuda" if torch.cuda.is_available() else "cpu"  # (CPU: TRITON_INTERPRET=1, to check this script)
    bad = 0
    for k, case in enumerate(CASES[: int(os.environ.get("MEMCHECK_CASES", len(CASES)))]):
        ids_np, grad_np, main_np, want = case_arrays(case)
        name, hidden, pad = case.name, case.hidden, case.padding_idx
        grad = torch.from_numpy(grad_np.view(np.int16)).view(torch.bfloat16).to(device)
        for layout in ("contiguous", "strided") if k == 3 else ("contiguous",):
            main_grad = torch.from_numpy(main_np.copy()).to(device)  # (on the CPU from_numpy would share main_np)
            ids_t, g = torch.from_numpy(ids_np).to(device), grad
            if layout == "strided":  # [b, s, H] seen in [s, b, H] storage, read in place (positions unchanged)
                ids_t, g = ids_t.view(2, -1), grad.view(2, -1, hidden).transpose(0, 1).contiguous().transpose(0, 1)
            torch_frontend.accumulate(ids_t, g, main_grad, padding_idx=pad)
            same = np.array_equal(bits(main_grad.cpu().numpy()), bits(want))
            bad += not same
            print(f"torch {name} {layout}: {'bitwise' if same else 'DIFFERENT'}", flush=True)
    return bad


def run_jax() -> int:
    import jax.numpy as jnp

    import jax_frontend

    bad = 0
    for case in CASES[: int(os.environ.get("MEMCHECK_CASES", len(CASES)))]:
        ids_np, grad_np, main_np, want = case_arrays(case)
        name, pad = case.name, case.padding_idx
        out = jax_frontend.accumulate(jnp.asarray(ids_np, jnp.int32), jnp.asarray(grad_np), jnp.asarray(main_np), padding_idx=pad)
        same = np.array_equal(bits(np.asarray(out)), bits(want))
        bad += not same
        print(f"jax {name}: {'bitwise' if same else 'DIFFERENT'}", flush=True)
    return bad


if __name__ == "__main__":
    frontend = sys.argv[1] if len(sys.argv) > 1 else "torch"
    failures = {"torch": run_torch, "jax": run_jax}[frontend]()
    print(f"{frontend}: {failures} case(s) differ", flush=True)
    sys.exit(1 if failures else 0)
