"""Whole torch calls under _Config variants, side by side in one process (benchmarks/NOTES.md, v4).

Each variant is first checked bit for bit against the deterministic dense path, then timed as
one call in a CUDA graph (the GPU's time) and eagerly (host launch cost included).

    python benchmarks/probe_calls.py            (every variant)
    python benchmarks/probe_calls.py p64,p128   (those named)
"""

import sys

import torch
from bench_torch import config_overrides, copy_bandwidth, graph_ms, median_ms, probe_inputs, same_bits
from common import floor_bytes, print_variant_table, probe_points, probe_shape

import torch_frontend
from torch_frontend import embedding_wgrad as ew

SMS = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
#: name -> _Config fields to override
VARIANTS = {
    "default": {},
    # v29: zero partials (Megatron's masked tokens) skipped by the folds: off, more flags a block, more runs flagged
    "skip off": dict(zero_skip=0),
    "skip block 256": dict(skip_block=256),
    "skip block 128": dict(skip_block=128),
    "skip min 32": dict(zero_skip=32),
    "skip block 512": dict(skip_block=512),
    "skip block 1024": dict(skip_block=1024),
    "skip block 2048": dict(skip_block=2048),
    # session 53: masked's plan and records, but the partials kernel without the mask's bytes (it
    # reads the masked rows; exact only where they are zero, as on Megatron's input)
    "masked reads off": dict(masked_reads=False),
    # session 53: a fold reads its flags skip_wide blocks at a time, first only until a block with
    # a 0, and gathers a block's nonzero partials from its flags (_fold_nonzero)
    "wide 1": dict(skip_wide=1),
    "wide 4": dict(skip_wide=4),
    "wide 8": dict(skip_wide=8),
    # v27: a long run's fold is a chain of loads in batches: narrower columns, more partials in flight
    "fold 64x64": dict(fold_h=64, fold_batch=64),
    "fold 32x64": dict(fold_h=32, fold_batch=64),
    "fold 32x128": dict(fold_h=32, fold_batch=128),
    "long 32x128": dict(long_block_h=32, long_batch=128),
    "long 64x64": dict(long_block_h=64, long_batch=64),
    # v27: the folds' sums pipelined through shared memory (_fold_piped): stages, partials per stage
    "fp s4 b4": dict(fold_stages=4, fold_batch=4),
    "fp s8 b2": dict(fold_stages=8, fold_batch=2),
    "fp s3 b8": dict(fold_stages=3, fold_batch=8),
    "fp s4 b8 h128": dict(fold_stages=4, fold_batch=8, fold_h=128),
    "lp s4 b8": dict(long_stages=4, long_batch=8),
    "lp s8 b4": dict(long_stages=8, long_batch=4),
    "lp s4 b16": dict(long_stages=4, long_batch=16),
    "fp s4 b4 lp s4 b8": dict(fold_stages=4, fold_batch=4, long_stages=4, long_batch=8),
    "count plain": dict(count_aggregate=False),  # v27: one atomic per token in the lone tokens' count, as before
    "lp off": dict(long_stages=0, long_batch=32),  # v27: _long_runs_kernel's sums unpipelined, as before (LONG_FOLD)
    # v27, for probe_tp.py's inputs: fold items and partials grids
    "fold_h 128": dict(fold_h=128),
    "fold_h 64": dict(fold_h=64),
    "fold batch 32": dict(fold_batch=32),
    "pp 12 t0": dict(partial_programs=12 * SMS, tail_programs=0),
    "pp 24 t0": dict(partial_programs=24 * SMS, tail_programs=0),
    "pp 48 t0": dict(partial_programs=48 * SMS, tail_programs=0),
    "pp 24 t0 f64": dict(partial_programs=24 * SMS, tail_programs=0, fold_h=64, fold_batch=64),
    "pp 12 t0 f64": dict(partial_programs=12 * SMS, tail_programs=0, fold_h=64, fold_batch=64),
    # v8: long runs folded by the partials kernel's first programs up to FOLD_ROLE_MAX_TOKENS;
    # "fold kernel" folds them in the long-run kernel, started early, at every size.
    "fold kernel": dict(fold_programs=0),
    "fold role": dict(fold_programs=4 * SMS),
    # v20: with 12 programs per SM (PARTIAL_MAXNREG) the 4 folders per SM hold a third of the slots.
    "fold role 3": dict(fold_programs=3 * SMS),
    "fold role 5": dict(fold_programs=5 * SMS),
    # v57 (not yet measured): the masked route's launch settings follow n, its work the m kept tokens
    # (about n / 8 at TP 8): the settings _config gives about 4096-8192 tokens, alone and together.
    "pp 96": dict(partial_programs=96 * SMS),
    "long 64": dict(long_programs=64),
    "as kept": dict(fold_programs=4 * SMS, partial_programs=96 * SMS, long_programs=64),
    "no kept prefetch": dict(kept_prefetch=False),  # v57: the masked route without its first kept tokens' rows prefetched
    "no kept lone": dict(kept_lone=False),  # v57: the masked route without lone tokens (its first kept tokens of ids that occur once)
    "no kept first": dict(kept_prefetch=False, kept_lone=False),  # v57: both off, as main before
    # v58: session 58 measured "pp 96" 3-5 us faster on the masked route at TP8 16384-65536 and kept
    # lone tokens +4 us at 16384, -5 at 32768: their combinations, and fewer programs still.
    "pp 64": dict(partial_programs=64 * SMS),
    "pp 96 no lone": dict(partial_programs=96 * SMS, kept_lone=False),
    "pp 96 fold": dict(partial_programs=96 * SMS, fold_programs=4 * SMS),
    # v58, after MASKED_PARTIAL_PROGRAMS_PER_SM and kept lone tokens only without folders: the settings before.
    "pp 128": dict(partial_programs=128 * SMS),
    # v60, after 64 per SM on the masked route up to 16384 tokens: fewer still (v61: 48 up to 8192).
    "pp 48": dict(partial_programs=48 * SMS),
    "pp 32": dict(partial_programs=32 * SMS),
    "kept lone": dict(kept_lone=True),
    # v9 (not yet measured): the merge kernel's searches spread over more programs. At 4096
    # tokens its 1024 lanes per program make 64 programs (about half the SMs), each thread
    # issuing 16 scattered loads per search step; 256 or 512 lanes make 4x or 2x the programs.
    "merge lanes 512": dict(merge_u=lambda cfg: max(1, 512 // cfg.merge_blocks)),
    "merge lanes 256": dict(merge_u=lambda cfg: max(1, 256 // cfg.merge_blocks)),
    # v10: the records of the first positions first (a group of merge programs orders them), and
    # their rows prefetched into L2 by the partials kernel's programs before their wait; the
    # last programs take one item each. The default: first 256, tail 24 per SM.
    "no group": dict(first_tokens=0, l2_prefetch_tokens=0),
    "group only": dict(l2_prefetch_tokens=0),
    "first 512": dict(first_tokens=512, l2_prefetch_tokens=512),
    "tail 0": dict(tail_programs=0),
    "tail 12": dict(tail_programs=12 * SMS),
    # v11: the merge compares each token with every window's last key first, then searches one
    # window (default: 16 keys up to MERGE_WINDOW_MAX_TOKENS, none above).
    "window 0": dict(merge_window=0),
    "window 8": dict(merge_window=8),
    "window 32": dict(merge_window=32),
    # v11: the long runs' partials stored with L2 priority evict_last (the default) or not.
    "no evict last": dict(scratch_evict_last=False),
    # v40: the merge sort's positions and records kept in L2 with evict_last (PLAN_EVICT_LAST), or not.
    "no plan evict last": dict(plan_evict_last=False),
    # v41: the first positions' rows prefetched into L2 with priority evict_last (createpolicy), so
    # that they survive until their items come; more of them than the first records' group. The
    # default since v41: main_grad's lines only (PREFETCH_EVICT_LAST = 2); 3: grad's too; 1: grad's only.
    "no pf evict_last": dict(prefetch_evict_last=0),
    "pf evict_last": dict(prefetch_evict_last=3),
    "pf evict_last 2": dict(prefetch_evict_last=3),  # (the same again, later in the run)
    "default 2": {},
    "pf 512": dict(l2_prefetch_tokens=512),
    "pf 128": dict(l2_prefetch_tokens=128),
    "pf 128 2": dict(l2_prefetch_tokens=128),
    "pf evict_last 512": dict(prefetch_evict_last=3, l2_prefetch_tokens=512),
    "pf evict_last 512 2": dict(prefetch_evict_last=3, l2_prefetch_tokens=512),
    "pf evict_last 1024": dict(prefetch_evict_last=3, l2_prefetch_tokens=1024),
    "pf evict_last first 512": dict(prefetch_evict_last=3, first_tokens=512, l2_prefetch_tokens=512),
    "pf evict_last grad": dict(prefetch_evict_last=1),
    "pf evict_last main": dict(prefetch_evict_last=2),
    "pf evict_last 128": dict(prefetch_evict_last=3, l2_prefetch_tokens=128),
    "pf evict_last 384": dict(prefetch_evict_last=3, l2_prefetch_tokens=384),
    "pf evict_last grad 512": dict(prefetch_evict_last=1, l2_prefetch_tokens=512),
    # v11: merge blocks of 128 tokens where they were 256 (block sort half the compares; twice
    # the blocks per search), 1024 or 2048 lanes per merge program.
    "block 128": dict(merge_block=128, merge_blocks=lambda c: 2 * c.merge_blocks, merge_u=lambda c: max(1, 1024 // (2 * c.merge_blocks)),
                      merge_tile=128, merge_block_i=16),
    "block 128 lanes 2048": dict(merge_block=128, merge_blocks=lambda c: 2 * c.merge_blocks,
                                 merge_u=lambda c: max(1, 2048 // (2 * c.merge_blocks)), merge_tile=128, merge_block_i=16),
    # v12: the block sort's and the merge's warps per program (default 4).
    "merge warps 2": dict(merge_warps=2),
    "merge warps 8": dict(merge_warps=8),
    # v12: the partials kernel's next record: asked into L1 before this item's rows and loaded
    # after them (the default), loaded before them (as up to v11), or loaded after them unasked.
    "record first": dict(record_hint=False),
    "no L1 hint": dict(l1_hint=False),
    "L1 hint": dict(l1_hint=True),  # v20: off by default since the register target (RECORD_L1_HINT)
    # v12: fewer partials programs (each pays a header and a record round trip before its rows).
    "pp 128": dict(partial_programs=128 * SMS),
    "pp 96": dict(partial_programs=96 * SMS),
    "pp 64": dict(partial_programs=64 * SMS),
    "pp 48": dict(partial_programs=48 * SMS),
    # v43: more programs at large H (items per program grow with H's blocks: NOTES v42 item 9).
    "pp 192": dict(partial_programs=192 * SMS),
    "pp 192 again": dict(partial_programs=192 * SMS),
    "pp 256": dict(partial_programs=256 * SMS),
    "pp 256 again": dict(partial_programs=256 * SMS),
    "pp 384": dict(partial_programs=384 * SMS),
    "lanes 1024": dict(merge_u=lambda cfg: max(1, 1024 // cfg.merge_blocks)),
    "first 0": dict(first_tokens=0, l2_prefetch_tokens=0),
    "pp 48 tail 12": dict(partial_programs=48 * SMS, tail_programs=12 * SMS),
    "tail 6": dict(tail_programs=6 * SMS),
    # session 14: a grid of about one resident wave (15 programs of 135-141 registers fit an SM), so
    # each program pays its header and first record round trips once; strided, no one-item tail.
    "pp 15 tail 0": dict(partial_programs=15 * SMS, tail_programs=0),
    "pp 30 tail 0": dict(partial_programs=30 * SMS, tail_programs=0),
    "pp 45 tail 0": dict(partial_programs=45 * SMS, tail_programs=0),
    "pp 32 tail 8": dict(partial_programs=32 * SMS, tail_programs=8 * SMS),
    # v13: lone tokens (ids that occur once) added by programs of their own, first in the partials
    # kernel's grid, while the merge runs (default: LONE_TOKENS, LONE_PER_PROGRAM positions each).
    "lone 0": dict(lone_tokens=0),
    "lone 1": dict(lone_tokens=1),  # the machinery (counts, the partials kernel's later launch) without the work
    "lone 256": dict(lone_tokens=256),
    "lone 512": dict(lone_tokens=512),
    "lone 1024": dict(lone_tokens=1024),
    "lone 2048": dict(lone_tokens=2048),
    "lone 1024 no prefetch": dict(lone_tokens=1024, l2_prefetch_tokens=0),
    "lone per 1": dict(lone_per_program=1),
    "lone per 4": dict(lone_per_program=4),
    "lone per 8": dict(lone_per_program=8),
    # v17, measured in v18 item 1: the feature path's rank kernel (n <= 3072) runs one program per
    # 32 tokens, each comparing them with all n keys (96 programs at 3072 tokens, 0.15 waves).
    # More warps per program (16 landed: RANK_WARPS), and longer steps (block_j keys compared
    # per step; the default is 256).
    "rank warps 4": dict(rank_warps=4),
    "rank warps 8": dict(rank_warps=8),
    "rank warps 16": dict(rank_warps=16),
    "rank warps 8 bj 512": dict(rank_warps=8, block_j=512),
    "rank warps 16 bj 1024": dict(rank_warps=16, block_j=1024),
    # v19: merge blocks of 512 tokens where they are 256 (half the blocks to search, twice the block
    # sort's compares), the same lanes per merge program, the first 512 positions' records first.
    "block 512": dict(merge_block=512, merge_blocks=lambda c: max(1, c.merge_blocks // 2), merge_u=lambda c: 2 * c.merge_u, merge_block_i=64,
                      merge_tile=32, first_tokens=512),
    # v19: fewer registers for the partials kernel, so more one-warp programs per SM (the long runs'
    # partials' phase is bound by the warps in flight: NOTES v19).
    "maxnreg 128": dict(partial_maxnreg=128),
    "maxnreg 120": dict(partial_maxnreg=120),
    "maxnreg 112": dict(partial_maxnreg=112),
    "maxnreg 96": dict(partial_maxnreg=96),
    # v20: a register target above the compiler's own (140 under Triton 3.6): ptxas then keeps more
    # of a ten-row partial's rows in flight (maxnreg 184: positions 1-7 at once, then about six
    # rows), and fewer programs fit an SM (12 / 11 / 10 / 9 at 168 / 184 / 200 / 216, which takes
    # 204; below 168 ptxas spills). Triton 3.9 compiles the kernel to 185 registers on its own (NOTES v20).
    # 168 is now the sort path's default (PARTIAL_MAXNREG); "own registers" is ptxas' choice.
    "own registers": dict(partial_maxnreg=None),
    "maxnreg 168": dict(partial_maxnreg=168),
    "maxnreg 184": dict(partial_maxnreg=184),
    "maxnreg 200": dict(partial_maxnreg=200),
    "maxnreg 216": dict(partial_maxnreg=216),  # ptxas takes 204
    "maxnreg 168 fold 32": dict(partial_maxnreg=168, fold_batch=32),  # the folders load 32 partials at once (no spills offline)
    # v19: two-warp partials programs (more warps in flight per SM while the long runs' partials are
    # summed; v9 item 6 measured them much slower in an older kernel).
    "partial warps 2": dict(partial_warps=2),
    "partial warps 2 pp 64": dict(partial_warps=2, partial_programs=64 * SMS),
    # v24: more warps per SM at a lower register target: two-warp programs (122 registers at
    # 128: 8 programs, 16 warps per SM) or 512-column items (one warp, 112 registers: 18 per SM),
    # so that all ten rows of a long run's partial can be in flight (16 columns a thread).
    "w2 r128": dict(partial_warps=2, partial_maxnreg=128),
    "w2 r128 f2": dict(partial_warps=2, partial_maxnreg=128, fold_programs=2 * SMS),
    "w2 r128 f2 t12": dict(partial_warps=2, partial_maxnreg=128, fold_programs=2 * SMS, tail_programs=12 * SMS),
    "bh512 r112": dict(block_h=512, partial_maxnreg=112),
    "bh512 r112 f6": dict(block_h=512, partial_maxnreg=112, fold_programs=6 * SMS),
    "bh512 r128": dict(block_h=512, partial_maxnreg=128),
    "default again": {},  # a second measurement of the default in the same process
}
POINTS = probe_points(  # or PROBE_POINTS
    [(4096, "uniform"), (8192, "uniform"), (8192, "zipf"), (16384, "uniform"), (16384, "zipf"), (32768, "uniform"), (32768, "zipf")])


def main(argv):
    only = argv[0].split(",") if argv else list(VARIANTS)
    print("torch_frontend from", torch_frontend.__file__, flush=True)
    bw = copy_bandwidth()
    results = {}
    hidden = probe_shape()[1]
    for n, dist, ids_np, ids, grad, main_grad, expected in probe_inputs(POINTS):
        floor = floor_bytes(ids_np, hidden) / bw * 1e3
        for name in only:
            with config_overrides(**VARIANTS[name]):
                work = main_grad.clone()
                torch_frontend.accumulate(ids, grad, work)
                exact = same_bits(work, expected)
                if (n, dist) == POINTS[0]:  # each kernel's registers and spills, once per variant
                    kernels = [k for call in ew._CALLS.values() for k in call.kernels]
                    print(name, ", ".join(f"{k.name.split('_kernel')[0]} {k.n_regs} regs {k.n_spills} spills" for k in kernels), flush=True)
                graph = graph_ms(lambda work=work: torch_frontend.accumulate(ids, grad, work)) * 1e3
                eager = median_ms(lambda work=work: torch_frontend.accumulate(ids, grad, work)) * 1e3
                del work
            results[(n, dist, name)] = (graph, exact)
            print(f"n={n:6d} {dist:7s} {name:22s} graph {graph:8.1f} us  eager {eager:8.1f} us  floor {floor:7.1f} us  exact={exact}", flush=True)
    print_variant_table("variant (graph, us)", POINTS, only, results, "NOT EXACT")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
