"""Back-to-back eager calls (no L2 flush, nothing between them): GPU time per call from CUDA
events around the loop, host time per call from the launch loop, under _Config variants.

    python benchmarks/probe_loop.py
"""

import time

import torch
from bench_torch import config_overrides
from common import ids_for

import torch_frontend
from tests.cases import REAL_H, REAL_V

VARIANTS = {"default": {}, "no-pdl": dict(pdl=False)}


def main():
    main_grad = torch.randn(REAL_V, REAL_H, device="cuda")
    for n, dist in ((1024, "uniform"), (4096, "uniform"), (8192, "uniform"), (8192, "zipf")):
        grad = torch.randn(n, REAL_H, device="cuda").bfloat16()
        ids = torch.from_numpy(ids_for(dist, n, REAL_V)).cuda()
        for name, over in VARIANTS.items():
            with config_overrides(**over):
                for _ in range(20):
                    torch_frontend.accumulate(ids, grad, main_grad)
                torch.cuda.synchronize()
                reps = 500
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t = time.perf_counter()
                start.record()
                for _ in range(reps):
                    torch_frontend.accumulate(ids, grad, main_grad)
                end.record()
                host = (time.perf_counter() - t) / reps * 1e6
                torch.cuda.synchronize()
                gpu = start.elapsed_time(end) / reps * 1e3
                # the same with a sleep kernel ahead, so the host runs ahead and GPU time is the GPU's own
                torch.cuda._sleep(100_000_000)  # ~50 ms, longer than the host needs to queue 200 calls
                start.record()
                for _ in range(200):
                    torch_frontend.accumulate(ids, grad, main_grad)
                end.record()
                torch.cuda.synchronize()
                ahead = start.elapsed_time(end) / 200 * 1e3
            print(f"n={n:5d} {dist:7s} {name:8s} host {host:6.1f} us/call  gpu(loop) {gpu:6.1f}  gpu(host ahead) {ahead:6.1f}", flush=True)

if __name__ == "__main__":
    main()
