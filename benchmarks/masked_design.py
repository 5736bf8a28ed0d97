"""A design check for masked tokens (NOTES "What should move next" (c)), NumPy only, on the CPU.

Megatron's vocab-parallel lookup hands `accumulate` ids where the tokens of other ranks' shards
are looked up as row r (0) with zero grad rows. Their rows need not be read: adding +0 to a sum
that starts at +0 leaves it. But on the sort path they still decide where row r's 10-row
partials begin, and the fold's order of those partials is part of the bits. The design: drop
the masked tokens from the sort (as ids outside [0, V) are today), and

1. chunk each real token of row r by its rank among row r's real and masked tokens together
   (so the plan needs, per real token of r, the number of masked tokens at earlier positions);
   a chunk of masked tokens only is a +0 partial, which the fold may skip;
2. on the feature path nothing more (its chunks are blocks of positions);
3. add row r's sum to main_grad whenever a masked token exists, even with no real token of r:
   the dense path adds +0 there (-0 becomes +0).

This script compares that computation with the core reference on the masked input, bit for
bit, on random cases (both paths, H = 2048 so that fp32 differences survive the bf16
rounding), and shows that chunking by the real tokens' ranks alone (today's skip) differs.

    python benchmarks/masked_design.py
"""

import os
import sys

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from embwgrad_core import reference  # noqa: E402
from embwgrad_core.constants import CHUNK, NROWS  # noqa: E402
from embwgrad_core.dtypes import round_to  # noqa: E402


def dense(ids, valid, grad, main_grad, r, path):
    """The reference on Megatron's input: masked tokens looked up as r, their grad rows zero."""
    zeroed = np.where(valid[:, None], grad, 0).astype(grad.dtype)
    return reference.accumulate(np.where(valid, ids, r), zeroed, main_grad, path=path)


def dropped(ids, valid, grad, main_grad, r, path, count_masked=True):
    """The design: masked tokens dropped, row r chunked by ranks that count them (count_masked)."""
    vocab = main_grad.shape[0]
    out = main_grad.copy()
    rows, values = reference.weight_grad_rows(np.where(valid & (ids != r), ids, vocab), grad, vocab, path=path)
    out[rows] = round_to(out[rows] + values.astype(np.float32), "float32")
    member = ~valid | (ids == r)  # row r's tokens, masked or real, in position order
    if not member.any():
        return out
    pos = np.flatnonzero(member)
    real = valid[pos]
    if path == "sort":
        rank = np.arange(pos.size) if count_masked else np.cumsum(real) - 1
        chunk = rank // NROWS
    else:
        chunk = pos // CHUNK
    acc = np.zeros(grad.shape[1], np.float32)
    for c in np.unique(chunk[real]):  # chunks of masked tokens only are skipped
        s = np.zeros(grad.shape[1], np.float32)
        for p in pos[(chunk == c) & real]:
            s = s + grad[p].astype(np.float32)
        acc = acc + s if path == "sort" else round_to(acc + round_to(s, "bfloat16"), "bfloat16")
    gw = round_to(acc, "bfloat16") if path == "sort" else acc
    out[r] = round_to(out[r] + gw, "float32")
    return out


def main():
    rng = np.random.default_rng(0)
    trials, differ = 0, {True: 0, False: 0}
    for _ in range(60):
        n, vocab, hidden = int(rng.integers(1, 300)), int(rng.integers(2, 6)), 2048
        r = int(rng.integers(0, vocab))
        ids = rng.integers(0, vocab, n)
        valid = rng.random(n) < rng.random()
        grad = (rng.standard_normal((n, hidden)) * 10.0 ** rng.integers(-3, 3, (n, 1))).astype(ml_dtypes.bfloat16)
        grad[rng.random((n, hidden)) < 0.1] = -0.0
        main_grad = rng.standard_normal((vocab, hidden)).astype(np.float32)
        main_grad[rng.random((vocab, hidden)) < 0.2] = -0.0
        for path in ("sort", "feature"):
            want = dense(ids, valid, grad, main_grad, r, path).view(np.int32)
            trials += 1
            for count_masked in (True, False):
                got = dropped(ids, valid, grad, main_grad, r, path, count_masked).view(np.int32)
                differ[count_masked] += not np.array_equal(got, want)
    print(f"{trials} cases: the design differs from the masked input's bits in {differ[True]}; "
          f"chunking row r by its real tokens alone differs in {differ[False]}")
    return 1 if differ[True] else 0


if __name__ == "__main__":
    sys.exit(main())
