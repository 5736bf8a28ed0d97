"""A target for Nsight Compute: one recorded call of the torch frontend per point, plus the plain
copy-add kernel of probe_stream at the same bytes and torch's device copy of the call's floor
bytes (read plus write), between cudaProfilerStart/Stop. (That copy is a cudaMemcpy, not a
kernel: Nsight Compute lists nothing for it; Nsight Systems times it.)

    ncu --profile-from-start off --clock-control none --section SpeedOfLight ... \
        python benchmarks/ncu_target.py [n:dist ...]
"""

import sys

import torch
from common import floor_bytes, ids_for
from probe_stream import stream_add

import torch_frontend
from tests.cases import REAL_H, REAL_V


def main(argv):
    points = [a.split(":") for a in argv] or [("8192", "uniform"), ("8192", "zipf"), ("4096", "uniform")]
    main_grad = torch.randn(REAL_V, REAL_H, device="cuda")
    for n, dist in points:
        n = int(n)
        grad = torch.randn(n, REAL_H, device="cuda").bfloat16()
        ids_np = ids_for(dist, n, REAL_V)
        ids = torch.from_numpy(ids_np).cuda()
        src = torch.empty(floor_bytes(ids_np, REAL_H) // 8, dtype=torch.float32, device="cuda")
        dst = torch.empty_like(src)
        for _ in range(2):  # the first call compiles and records, the second replays
            torch_frontend.accumulate(ids, grad, main_grad)
        stream_add(ids, grad, main_grad, n, REAL_H)
        torch.cuda.synchronize()
        print(f"profiling n={n} {dist}", flush=True)
        torch.cuda.profiler.start()
        torch_frontend.accumulate(ids, grad, main_grad)
        stream_add(ids, grad, main_grad, n, REAL_H)
        dst.copy_(src)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
