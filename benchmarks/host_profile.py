"""Host time of one eager torch call, by part (for n where the GPU finishes before the host).

    python benchmarks/host_profile.py          (H200: cProfile of 2000 calls at 1024 tokens, then a timed split)
"""

import cProfile
import pstats
import time

import torch
from common import ids_for

import torch_frontend
from tests.cases import REAL_H, REAL_V
from torch_frontend import embedding_wgrad as ew


def main():
    main_grad = torch.zeros(REAL_V, REAL_H, device="cuda")
    for n in (1024, 4096):
        grad = torch.randn(n, REAL_H, device="cuda").bfloat16()
        ids = torch.from_numpy(ids_for("uniform", n, REAL_V)).cuda()
        call = lambda: torch_frontend.accumulate(ids, grad, main_grad)  # noqa: E731
        for _ in range(50):
            call()
        torch.cuda.synchronize()
        reps = 2000
        t = time.perf_counter()
        for _ in range(reps):
            call()
        host = (time.perf_counter() - t) / reps * 1e6
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / reps * 1e6
        print(f"n={n}: host {host:.1f} us per call (launch loop), wall {wall:.1f} us per call", flush=True)
        # parts
        problem = ew._check(ids, grad, main_grad, None)
        path = ew.torch_path(n)
        parts = {
            "_check": lambda: ew._check(ids, grad, main_grad, None),
            "_config": lambda: ew._config(problem, path, False, *ew._device_traits(0)),
            "_call_key": lambda: ew._call_key(ids, grad, main_grad, problem, path),
            "torch.empty ws": lambda: torch.empty(16 * n, dtype=torch.int32, device="cuda"),
            "torch.empty partials": lambda: torch.empty(2 * n, REAL_H, dtype=torch.float32, device="cuda"),
            "ids.reshape": lambda: ids.reshape(-1),
            "_position_strides": lambda: ew._position_strides(grad),
            "torch.cuda.current_stream": lambda: torch.cuda.current_stream().cuda_stream,
        }
        for name, fn in parts.items():
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            print(f"   {name:28s} {(time.perf_counter() - t) / reps * 1e6:7.2f} us", flush=True)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(reps):
            call()
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
