"""The constants of PyTorch's CUDA embedding backward that embwgrad reproduces (SPEC.md).

Each is defined here once; kernels and references import them.
"""

import numpy as np

#: Rows summed into one fp32 partial on the sort path (PyTorch's NROWS_PER_THREAD).
NROWS = 10

#: Largest token count for which PyTorch takes the feature path; more tokens take the sort path.
FEATURE_PATH_MAX_TOKENS = 3072

#: Positions per chunk on the feature path: each chunk's sum is rounded to the grad dtype.
CHUNK = 32

#: Every sum is accumulated in this dtype, whatever the grad and main_grad dtypes.
ACC_DTYPE = np.dtype(np.float32)

#: The floating dtypes accepted for grad and for main_grad, by name.
SUPPORTED_DTYPES = ("float32", "bfloat16", "float16")

#: Up to this many tokens (on the sort path) the frontends sort with their own two kernels:
#: blocks of MERGE_BLOCK tokens sorted by counting, then every token ranked in each other
#: block by binary search (plan.merge_ranks is the model); above it they call their
#: framework's radix sort. An implementation choice, not arithmetic: any stable sort gives
#: the same bits. Measured on the H200 in benchmarks/NOTES.md.
MERGE_SORT_MAX_TOKENS = 32768

#: With accumulate's masked (Megatron's input_mask), up to this many tokens: the merge sort
#: then sorts only the tokens that the masked route keeps (every token of MASKED_LOOKUP_ID
#: leaves the plan; on a rank of TP = t about n / t of them), its grids sized by n but its
#: programs past the kept tokens idle. Without masked, or above it, the framework's radix sort
#: sorts all n tokens. H200, Megatron's ids (probe_tp.py --bound, rank 1, Zipf(1.1)), masked, us,
#: library sort with deferred records -> this route (benchmarks/NOTES.md v57): torch 49152 TP 8
#: 204.6 -> 157.7, 65536 TP 8 157.2 -> 106.6, 65536 TP 2 420.5 -> 387.2; JAX 65536 TP 8 160.2 ->
#: 110.3, 65536 TP 2 404.1 -> 395.6. Its worst case, masked given with no token masked (m = n),
#: at 65536 tokens over the whole vocabulary (probe_tp.py --none-masked), against the call
#: without masked: torch 1044 -> 1115 (uniform) and 607 -> 647 (Zipf), JAX 1031 -> 1090 and 609
#: -> 658, 6-8% slower; Megatron passes input_mask only with TP > 1. An implementation choice,
#: not arithmetic.
MASKED_MERGE_SORT_MAX_TOKENS = 65536

#: Most blocks the merge-rank sort splits n tokens into (plan.merge_block): each token runs
#: two binary searches in every block at once, so this bounds the lanes per token.
MERGE_MAX_BLOCKS = 64

#: Fewest tokens in one merge-rank block.
MERGE_MIN_BLOCK = 256

#: Partials-kernel programs per SM on the sort path, in both frontends: each strides the
#: partials' records (one per partial), so no program is spent on a slot that starts none.
#: Eight times the 16 one-warp programs that fit on an SM at once, so that the last ones end
#: together: 32 or 64 per SM measured slower for uniform ids, one program per (slot, H block)
#: far slower for repeated ids (benchmarks/NOTES.md, v4). The torch frontend takes fewer up to
#: 8192 tokens (SMALL_PARTIAL_PROGRAMS_PER_SM); the JAX frontend more at large H up to 8192 tokens
#: (PARTIAL_PROGRAM_ITEMS) and 256 above (LONG_PARTIAL_PROGRAMS_PER_SM; NOTES v43, v44). An
#: implementation choice, not arithmetic.
PARTIAL_PROGRAMS_PER_SM = 128

#: Sort path: up to this many tokens a few of the partials kernel's programs (FOLD_PROGRAMS_PER_SM
#: per SM, right after those of the long runs' partials) fold the long runs as their partials
#: arrive, so no long-run kernel follows; above, those few programs fall behind the many long
#: runs (32768 Zipf ids: 391 us against 343 with the long-run kernel, H200; benchmarks/NOTES.md
#: v8). An implementation choice, not arithmetic.
FOLD_ROLE_MAX_TOKENS = 8192

#: Programs per SM that fold long runs inside the partials kernel (NOTES v8: 2 and 8 measured slower).
FOLD_PROGRAMS_PER_SM = 4

#: The masked route (accumulate's masked on the merge sort), in both frontends: at most this many
#: partials programs per SM, by n, as (up to n tokens, programs) (embwgrad_core.plan.
#: masked_partial_programs_per_sm). The launch settings follow n, the work the m kept tokens (about
#: n / 8 on a rank of TP 8), which wants fewer programs than n does. H200, Megatron's TP input
#: masked, us, n's setting -> 96 per SM: torch (graph replay, 128 per SM above 8192 tokens; NOTES
#: v58) TP8 16384 61.3 -> 56.3, 32768 61.9 -> 58.7, 65536 106.9 -> 103.4, TP2 32768 218.7 -> 217.6,
#: 65536 387.7 -> 387.7; JAX (chains of 300 calls, 256 per SM above 8192 tokens, each tree in its own
#: process, two rounds; NOTES v59) TP8 16384 63.6-63.8 -> 50.5-56.0, 32768 70.6-71.4 -> 58.6-58.8,
#: 65536 108.2 -> 99.6-100.3, TP2 65536 394.8 -> 398.2 (0.9% slower). 96 -> 64 per SM (NOTES v60;
#: JAX 20 calls unrolled in one jit): up to 16384 tokens faster, torch TP8 8192 41.9 -> 36.8, 12288
#: 42.1 -> 38.7, 16384 56.3 -> 54.3 (v58), TP2 8192 69.3 -> 66.9, 4096 even; JAX TP8 4096 29.0 ->
#: 26.4, 8192 35.0 -> 32.4, 12288 39.3 -> 38.2, 16384 50.3 -> 49.2, TP2 8192 66.4-67.2 -> 65.0; above,
#: TP8 even or 0.3 us faster but TP2 slower: 32768 torch +1.5, 65536 torch +7.6, JAX +2.3 (v58,
#: v60). 64 -> 48 per SM up to 8192 tokens (NOTES v61; same process, torch graph replay / JAX 20
#: calls unrolled): TP8 4096 32.0 -> 29.4 / 26.4 -> 25.1, TP8 8192 36.8 -> 34.3 / 32.0 -> 30.2, TP2
#: 8192 67.0 -> 66.8 / 65.5 -> 65.7; at 16384 TP8 torch 48.1 -> 46.1, JAX even, but TP2 torch 113.3
#: -> 116.6, so 64 stays there. Spreading the working programs among the idle ones instead (v61):
#: no faster anywhere (torch TP8 16384 +2.8 us, JAX +2.0), removed. An implementation choice, not
#: arithmetic.
MASKED_PARTIAL_PROGRAMS_PER_SM = ((8192, 48), (16384, 64), (MASKED_MERGE_SORT_MAX_TOKENS, 96))

#: Feature path with bf16 grads, from this many tokens, in both frontends: the long runs' partials
#: go to scratch as bf16 bits, half the bytes of fp32, the same bits after the fold (PyTorch
#: rounds each of them to bf16 before any use). H200, torch (JAX): 2048 Zipf 70.8 -> 63.2 us
#: (68.0 -> 58.3), 3072 Zipf 103.1 -> 90.5 (97.1 -> 83.1), but 1024 Zipf 40.1 -> 41.7 (42.7 ->
#: 44.0); 1024 uniform unchanged (benchmarks/NOTES.md v18 item 4). An implementation choice, not arithmetic.
BF16_SCRATCH_MIN_TOKENS = 2048

#: Sort path, both frontends, when the caller says grad has many zero rows (accumulate's
#: zero_rows=True, as for Megatron's vocab-parallel lookup on a rank of TP > 1, whose other ranks'
#: tokens all look up id 0 with zero grad rows): a long run of at least this many partials keeps,
#: for each of its partials and H blocks, a flag saying whether the partial is nonzero there. A
#: partial of more than one row whose fp32 sum is all +0 is not stored (in a shorter run, with no
#: flags, every partial is stored: its fold reads them all), and the fold skips the
#: blocks of ZERO_SKIP_BLOCK partials whose flags are all 0 and, in the other blocks, the zero
#: partials' loads. Exact: a run's sum starts at +0 and an fp32 sum that starts at +0 is never
#: -0, so adding +0 leaves it as it is (NaN and Inf have nonzero bits, so are never skipped).
#: Opt-in because the flags cost calls without zero rows 0.4-4 us (torch) and 1-2 us (JAX) on
#: the H200. An implementation choice, not arithmetic; measured in benchmarks/NOTES.md v29.
ZERO_SKIP_MIN_PARTIALS = 128

#: Partials whose flags a fold reads at once (one vector load), and skips together when all are
#: 0. H200, 8192 / 32768 tokens on a rank of TP 8 (NOTES v29): 64 / 128 / 256, torch 70.0 / 67.0
#: / 65.9 and 222.6 / 214.2 / 209.1 us, JAX 70.7 / 73.3 / 65.0 and 200.3 / 192.5 / 192.9.
ZERO_SKIP_BLOCK = 256

#: Blocks of ZERO_SKIP_BLOCK flags a fold checks at once for zeros (one vector load): first only
#: until a block with a 0 turns up (Megatron's row 0 run: its first), then to skip the wide blocks
#: of zeros; in the others each block's nonzero partials are found in its flags' vector and
#: loaded a batch at once. (Session 29's form read every block's flags twice, 256 at a time, and
#: each partial's flag of a block with a nonzero one: a chain of round trips, 12-23 blocks long at
#: 32768-65536 tokens on a rank of TP 8.) H200, rank 1 of TP 8 at 32768 / 65536 tokens, session
#: 29's form against 1 / 4 / 8 blocks (NOTES v53), us: torch masked 107.8 / 92.8 / 93.9 / 94.4 and
#: 173.5 / 165.4 / 161.5 / 159.2, zero_rows 200.0 / 184.2 / 186.5 / 188.1 and 363.9 / 352.0 / 349.6 /
#: 349.5; JAX masked 112.8 / 98.5 / 98.6 / 102.3 at 32768, zero_rows 191.9 / 176.1 / 177.2 / 180.3 and
#: 342.7 / 330.9 / 325.9 (8 not reached); 8192 and 16384 tokens unchanged (3-6 blocks).
ZERO_SKIP_WIDE = 4

#: Merge sort, both frontends: the rows of the first positions are read into L2 ahead of their
#: items, with L2 priority evict_last (torch: prefetched by the partials kernel during the plan,
#: FIRST_TOKENS and PREFETCH_EVICT_LAST there; JAX: read by extra merge-kernel programs, ROWS_AHEAD).
#: Those counts were measured at H = 7168, where 256 positions gained and 512 lost (NOTES v41):
#: what the lines take of L2 is what counts, so at a larger H fewer positions, at most this many
#: row elements (positions x H; plan.rows_ahead). H200, us (NOTES v42), 256 positions -> this
#: bound's 112 (or 96-128 measured) at H = 16384: JAX 8192 uniform 351.6 -> 348.0-348.2, 8192
#: Zipf 204.2 -> 202.0-202.2, 32768 uniform 1257 -> 1255-1256; torch 8192 uniform 335.5-336.1
#: -> 334.0-334.9, 8192 Zipf 184.1-184.2 -> 183.0; at H = 12288 (149 positions; 128 measured)
#: JAX 255.3-255.5 -> 253.8-254.0 and 149.8-150.4 -> 148.0-149.2, torch 8192 Zipf 136.3 -> 135.1-135.2.
#: An implementation choice, not arithmetic.
ROWS_AHEAD_ELEMENTS = 256 * 7168

#: The id that Megatron's vocab-parallel lookup gives the tokens of other ranks' shards
#: (``masked_input[input_mask] = 0``). :func:`embwgrad_core.plan.make_masked_plan` leaves
#: masked tokens of this id out of the sort; a masked token of any other id stays in it.
MASKED_LOOKUP_ID = 0

#: The masked route's compaction, in both frontends: tokens per program of its two kernels (a
#: count per block, then each token's slot). 256 and 512 measured alike, 6.8-9.3 us alone at
#: 4096-65536 tokens (H200, benchmarks/NOTES.md v55 item 5). An implementation choice.
COMPACT_BLOCK = 512

#: Columns per program of the masked route's row-0 kernel, in both frontends: not tuned.
ROW0_BLOCK_H = 256

#: Path names, as :func:`embwgrad_core.plan.torch_path` returns them.
FEATURE = "feature"
SORT = "sort"
