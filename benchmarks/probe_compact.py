"""How long the masked route's compaction takes (NOTES v55 items 4-5, 7), checked against the core.

    python benchmarks/probe_compact.py                          (GPU: Megatron's TP 8 ids, CUDA graphs)
    TRITON_INTERPRET=1 python benchmarks/probe_compact.py --check   (CPU: small cases, the interpreter)

The torch frontend's _compact_stage (two Triton kernels, one prefix count over positions; no
program waits on another) timed alone in a CUDA graph, beside the torch frontend's masked call
on the same input, and its output checked against embwgrad_core.masked_split. (Session 55 first
timed a twin of these kernels written here, 6.8-9.3 us alone at 4096-65536 tokens; the route's
own kernels replaced it.)
"""

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from embwgrad_core import SORT, masked_split  # noqa: E402
from torch_frontend import embedding_wgrad as ew  # noqa: E402


def compact(ids, masked_u8, main_grad, hidden_grad):
    """_compact_stage's output (int32 [_COMPACT_ARRAYS * n + 3]) for these tokens."""
    problem = ew._check(ids, hidden_grad, main_grad, None)
    cfg = ew._config(problem, SORT, ew._interpreting(), *((4, False) if ew._interpreting() else ew._device_traits(main_grad.device.index)),
                     zero_rows=True)
    return ew._compact_stage(ids, masked_u8, problem, cfg, ew._Launcher())


def check(ids_np, masked_np, num_embeddings: int, out) -> bool:
    """_compact_stage's arrays and header against embwgrad_core.masked_split, exactly."""
    n = ids_np.size
    want = masked_split(ids_np, num_embeddings, masked_np)
    got = out.cpu().numpy()
    kept, real = want[0].size, want[2].size
    header_ok = got[ew._COMPACT_ARRAYS.value * n :].tolist() == [kept, real, n - kept]
    return header_ok and all(np.array_equal(got[a * n : a * n + w.size], w) for a, w in enumerate((want[1], want[0], want[2], want[3])))


def cpu_check():
    rng = np.random.default_rng(0)
    ok = True
    for n, share in [(1, 1.0), (300, 0.5), (1000, 0.875), (777, 0.0), (640, 1.0)]:
        masked = rng.random(n) < share
        ids = np.where(masked | (rng.random(n) < 0.2), 0, rng.integers(-2, 50, n))
        out = compact(torch.from_numpy(ids), torch.from_numpy(masked.astype(np.uint8)), torch.zeros(48, 4), torch.zeros(n, 4))
        good = check(ids, masked, 48, out)
        ok &= good
        print(f"n={n} masked share {share}: {'exact' if good else 'DIFFERENT'}", flush=True)
    return ok


def gpu_probe():
    from bench_torch import graph_ms
    from probe_tp import torch_inputs

    import torch_frontend

    points = [(int(p.split(":")[0]), int(p.split(":")[1])) for p in os.environ.get("PROBE_POINTS", "4096:8,8192:8,32768:8,65536:8").split(",")]
    print("| tokens, TP | masked call (us) | compaction alone (us) |\n|---|---|---|")
    for n, tp in points:
        ids, grad, main_grad, local, inside = torch_inputs(n, tp)
        masked = torch.from_numpy(~inside).cuda()
        t_masked = graph_ms(lambda: torch_frontend.accumulate(ids, grad, main_grad, masked=masked)) * 1e3
        good = check(local, ~inside, main_grad.shape[0], compact(ids, masked.view(torch.uint8), main_grad, grad))
        t = graph_ms(lambda: compact(ids, masked.view(torch.uint8), main_grad, grad)) * 1e3
        print(f"| {n}, {tp} | {t_masked:.1f} | {t:.1f}{'' if good else ' DIFFERENT'} |", flush=True)


if __name__ == "__main__":
    if "--check" in sys.argv:
        sys.exit(0 if cpu_check() else 1)
    gpu_probe()
