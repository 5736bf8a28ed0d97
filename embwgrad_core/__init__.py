"""embwgrad_core: the framework-neutral definition of embwgrad (NumPy and ml_dtypes only).

Constants and rules of PyTorch CUDA's embedding backward (SPEC.md), the choice of path, key
packing, the sort / run / partial plan, and the exact NumPy reference that every
implementation is tested against. Importing it imports no torch, jax or triton.
"""

from . import constants, dtypes, plan, reference, validate
from .constants import ACC_DTYPE, BF16_SCRATCH_MIN_TOKENS, CHUNK, COMPACT_BLOCK, FEATURE, FEATURE_PATH_MAX_TOKENS, FOLD_PROGRAMS_PER_SM, FOLD_ROLE_MAX_TOKENS, MASKED_LOOKUP_ID, MASKED_MERGE_SORT_MAX_TOKENS, MASKED_PARTIAL_PROGRAMS_PER_SM, MERGE_MAX_BLOCKS, MERGE_SORT_MAX_TOKENS, NROWS, PARTIAL_PROGRAMS_PER_SM, ROW0_BLOCK_H, ROWS_AHEAD_ELEMENTS, SORT, SUPPORTED_DTYPES, ZERO_SKIP_BLOCK, ZERO_SKIP_MIN_PARTIALS, ZERO_SKIP_WIDE
from .plan import KeyPacking, Plan, key_packing, make_masked_plan, make_plan, masked_compaction, masked_partial_programs_per_sm, masked_split, merge_block, merge_sorted, merge_ranks, merge_tiles, pack_keys, partial_buffer_rows, partial_row, rows_ahead, torch_path
from .validate import Problem, check_args, check_masked

__all__ = [
    "ACC_DTYPE",
    "BF16_SCRATCH_MIN_TOKENS",
    "CHUNK",
    "COMPACT_BLOCK",
    "FEATURE",
    "FEATURE_PATH_MAX_TOKENS",
    "FOLD_PROGRAMS_PER_SM",
    "FOLD_ROLE_MAX_TOKENS",
    "MASKED_LOOKUP_ID",
    "MASKED_MERGE_SORT_MAX_TOKENS",
    "MASKED_PARTIAL_PROGRAMS_PER_SM",
    "MERGE_MAX_BLOCKS",
    "MERGE_SORT_MAX_TOKENS",
    "NROWS",
    "PARTIAL_PROGRAMS_PER_SM",
    "ROW0_BLOCK_H",
    "ROWS_AHEAD_ELEMENTS",
    "SORT",
    "SUPPORTED_DTYPES",
    "ZERO_SKIP_BLOCK",
    "ZERO_SKIP_MIN_PARTIALS",
    "ZERO_SKIP_WIDE",
    "KeyPacking",
    "Plan",
    "Problem",
    "check_args",
    "check_masked",
    "constants",
    "dtypes",
    "key_packing",
    "make_masked_plan",
    "make_plan",
    "masked_compaction",
    "masked_partial_programs_per_sm",
    "masked_split",
    "merge_block",
    "merge_ranks",
    "merge_sorted",
    "merge_tiles",
    "pack_keys",
    "partial_buffer_rows",
    "partial_row",
    "rows_ahead",
    "plan",
    "reference",
    "torch_path",
    "validate",
]
