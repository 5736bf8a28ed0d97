"""PyTorch side of the benchmark: torch frontend, dense path, index_add_, and the floor.

Medians from triton.testing.do_bench (L2 flushed between repetitions). The torch frontend is
timed twice: called eagerly, host launch cost included (what a training step sees when the
host does not run ahead), and as one call captured in a CUDA graph (the GPU's time). The floor is the
bytes that must move over the device-to-device copy bandwidth measured in this process.
On a CPU it runs the kernels under TRITON_INTERPRET=1 at a small shape (exactness only:
interpreter times say nothing about a GPU).
"""

import contextlib
import dataclasses
import os
import sys
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import triton  # noqa: E402
from common import Record, floor_bytes, ids_for, parse_args, probe_shape, sizes, write  # noqa: E402

import torch_frontend  # noqa: E402
from embwgrad_core import reference, torch_path  # noqa: E402
from torch_frontend import embedding_wgrad as ew  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"


def median_ms(fn) -> float:
    if ON_GPU:
        return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    t = time.perf_counter()  # the interpreter: one run, to show it runs, not how fast a GPU is
    fn()
    return (time.perf_counter() - t) * 1e3


def capture_graph(fn) -> torch.cuda.CUDAGraph:
    """fn captured in a CUDA graph, after one warm-up run on a side stream (compiles, records launches)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def graph_ms(fn) -> float:
    """Median of fn captured in a CUDA graph and replayed: its GPU time without host launch cost."""
    return median_ms(capture_graph(fn).replay)


@contextlib.contextmanager
def config_overrides(**fields):
    """Inside, torch_frontend calls run with these _Config fields replaced (for the probes).

    A value may be a function of the problem's own config (for a field derived from n).
    The launches recorded for replay belong to a config, so they are dropped on the way in and out.
    """
    original = ew._config

    def replaced(*a, **k):
        cfg = original(*a, **k)
        return dataclasses.replace(cfg, **{f: v(cfg) if callable(v) else v for f, v in fields.items()})

    ew._config = replaced
    ew._CALLS.clear()
    try:
        yield
    finally:
        ew._config = original
        ew._CALLS.clear()


def copy_bandwidth() -> float:
    """Bytes per ms of a large device-to-device copy, read plus write."""
    src = torch.empty(2**28, dtype=torch.float32, device=DEVICE)  # 1 GiB
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / median_ms(lambda: dst.copy_(src))


def dense(ids, grad, main_grad):
    gw = torch.ops.aten.embedding_dense_backward(grad, ids, main_grad.shape[0], -1, False)
    main_grad.add_(gw)


def dense_expected(ids, grad, main_grad):
    """A copy of main_grad after PyTorch's dense path with deterministic algorithms: the bits to match."""
    expected = main_grad.clone()
    torch.use_deterministic_algorithms(True)
    try:
        dense(ids, grad, expected)
    finally:
        torch.use_deterministic_algorithms(False)
    return expected


def same_bits(a, b) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def probe_inputs(points):
    """The torch probes' inputs at the real shape (tests.cases.REAL_V, REAL_H; PROBE_SHAPE for
    another), seeded: one main_grad, then per (n, dist) point (n, dist, ids as NumPy, ids, bf16
    grad, main_grad, and main_grad after the deterministic dense path)."""
    vocab, hidden = probe_shape()
    torch.manual_seed(0)
    main_grad = torch.randn(vocab, hidden, device="cuda")
    for n, dist in points:
        grad = torch.randn(n, hidden, device="cuda").bfloat16()
        ids_np = ids_for(dist, n, vocab)
        ids = torch.from_numpy(ids_np).cuda()
        yield n, dist, ids_np, ids, grad, main_grad, dense_expected(ids, grad, main_grad)


def main(argv=None):
    args = parse_args(argv)
    ns, vocab, hidden = sizes(args, ON_GPU)
    torch.manual_seed(0)
    main_grad = torch.randn(vocab, hidden, device=DEVICE)
    records = []
    bandwidth = copy_bandwidth() if ON_GPU else None
    for n in ns:
        grad = torch.randn(n, hidden, device=DEVICE).bfloat16()
        for dist in args.dists:
            ids_np = ids_for(dist, n, vocab)
            ids = torch.from_numpy(ids_np).to(DEVICE)
            # Exactness at this point: PyTorch's dense path (GPU) or the core reference (CPU). The
            # first call of a shape records its kernels, the second replays them: check both.
            first = main_grad.clone()
            torch_frontend.accumulate(ids, grad, first)
            out = main_grad.clone()
            torch_frontend.accumulate(ids, grad, out)
            exact_first = same_bits(first, out)
            del first
            if ON_GPU:
                expected = dense_expected(ids, grad, main_grad)
                exact = same_bits(out, expected) and exact_first
                del expected
            else:
                expected = reference.accumulate(ids_np, ew._to_numpy(grad), main_grad.numpy())
                exact = bool((out.numpy().view(np.int32) == expected.view(np.int32)).all()) and exact_first
            del out
            work = main_grad.clone()
            rec = lambda series, ms, **kw: records.append(Record("torch", series, n, dist, ms, device="gpu" if ON_GPU else "cpu", **kw))  # noqa: E731
            rec("embwgrad", median_ms(lambda: torch_frontend.accumulate(ids, grad, work)), exact=exact, note=torch_path(n))
            print(f"  embwgrad n={n} {dist}: {records[-1].ms:.4f} ms exact={exact}", flush=True)
            if ON_GPU:
                rec("embwgrad_graph", graph_ms(lambda: torch_frontend.accumulate(ids, grad, work)), note="one call in a CUDA graph")
                rec("dense", median_ms(lambda: dense(ids, grad, work)))
                rec("index_add", median_ms(lambda: work.index_add_(0, ids, grad.float())))
                rec("floor", floor_bytes(ids_np, hidden) / bandwidth, note=f"{bandwidth / 1e9:.2f} TB/s copy")
            del work
    write(records, args.json)


if __name__ == "__main__":
    sys.exit(main())
