"""Registers and stack of the torch sort path's partials kernel as the H200 compiles it, offline (sm_90).

    python scripts/registers.py                          (the default constexprs and register target, PARTIAL_MAXNREG)
    python scripts/registers.py RECORD_HINT=0 maxnreg=144 ...   (overrides; several sets: one per argument group, ';'-separated;
                                                          maxnreg=0: ptxas' own choice)

The GPU launch specialises what compile_check.py leaves generic: pointers and sizes divisible
by 16 (so grad rows load as 16-byte vectors), grad_dim1 = grad_stride_h = 1, one warp. Without
these hints the same kernel compiles to 255 registers and a stack; with them, pip Triton 3.6
reproduces the device's counts (NOTES v12: 139-141 registers). It prints the registers, the
stack, the spill instructions, the cp.async copies (LDGSTS: Triton's pipeliner took a loop) and the
shared memory, from Triton's bundled cuobjdump, so a change's effect on
occupancy can be checked before a device call, and a hash of the SASS: a refactor that leaves
it unchanged under pip Triton 3.6 (the H200's) leaves the device's machine code unchanged.
Compiles only; launches nothing.
"""

import hashlib
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton  # noqa: E402
from compile_check import compile_one  # noqa: E402

from embwgrad_core import CHUNK, NROWS  # noqa: E402
from embwgrad_core.dtypes import ROUNDING_CODE  # noqa: E402
from torch_frontend import embedding_wgrad as ew  # noqa: E402

#: Arguments that are multiples of 16 in the benchmark's calls (V = 129280, H = 7168, n = 4096-32768).
DIVISIBLE = {"ws_ptr", "grad_ptr", "main_grad_ptr", "partials_ptr", "flags_ptr", "ids_ptr", "n", "hidden", "max_long_runs", "grad_stride0",
             "main_grad_stride", "num_embeddings", "prefetch_tokens", "fold_programs", "group_cap", "tail_programs",
             "counts_ptr", "lone_tokens", "lone_programs"}
POINTERS = {"grad_ptr": "*bf16", "main_grad_ptr": "*fp32", "partials_ptr": "*fp32", "flags_ptr": "*i32", "ids_ptr": "*i64", "ws_ptr": "*i32", "counts_ptr": "*i32"}


def defaults() -> dict:
    """The sort path's constexprs for bf16 grad into fp32 main_grad, as _partials_stage passes them on the H200."""
    return {
        "grad_dim1": 1, "grad_stride_h": 1, "PDL": True, "FEATURE_PATH": False, "SPAN": NROWS, "CHUNK_SIZE": CHUNK,
        "GRAD_ROUNDING": ROUNDING_CODE["bfloat16"], "MAIN_ROUNDING": ROUNDING_CODE["float32"], "BLOCK_H": 1024, "PREFETCH": True,
        "RECORD_HINT": ew.RECORD_HINT, "L1_HINT": ew.RECORD_HINT and ew.RECORD_L1_HINT, "FOLD_H": 256, "FOLD_BATCH": 16, "PREFETCH_L2": True,
        "LONE": True,  # n above 4096 (LONE_TOKENS)
        "SCRATCH_POLICY": "evict_last" if ew.SCRATCH_EVICT_LAST else "", "FOLD_STAGES": 0,
        "SKIP_MIN": 0, "SKIP_BLOCK": ew.ZERO_SKIP_BLOCK, "SKIP_WIDE": ew.ZERO_SKIP_WIDE,  # zero_rows=False (accumulate's default)
        "PLAN_POLICY": "evict_last" if ew.PLAN_EVICT_LAST else "",  # merge sort (n <= MERGE_SORT_MAX_TOKENS)
        "PREFETCH_EVICT_LAST": ew.PREFETCH_EVICT_LAST,  # merge sort with PDL (PREFETCH_L2)
        "MASKED": False,  # masked=None (accumulate's default)
        "KEPT": False,  # (the masked route's: ids_ptr the compaction)
    }


def usage(constexprs: dict, maxnreg=None) -> str:
    kernel = compile_one(ew._partials_kernel, POINTERS, constexprs, num_warps=1, divisible=DIVISIBLE,
                         **({"maxnreg": maxnreg} if maxnreg else {}))
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        resources = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    regs = re.search(r"REG:(\d+)", resources).group(1)
    stack = re.search(r"STACK:(\d+)", resources).group(1)
    spills = len(re.findall(r"\b(STL|LDL)\b", sass))
    # A refactor that leaves this hash unchanged left the machine code unchanged (no GPU run needed).
    code = "\n".join(line for line in sass.splitlines() if "Function" not in line and "code for" not in line and ".text" not in line)
    digest = hashlib.sha256(code.encode()).hexdigest()[:12]
    return (f"{regs} registers, {stack} B stack, {spills} spill instructions, {sass.count('LDGSTS')} LDGSTS, "
            f"{kernel.metadata.shared} B shared, SASS {digest}")


def parse(arg: str):
    constexprs, maxnreg = defaults(), ew.PARTIAL_MAXNREG  # as _config sets it on the sort path
    for item in filter(None, arg.split()):
        name, value = item.split("=")
        if name == "maxnreg":
            maxnreg = int(value)
        else:
            constexprs[name] = int(value) if value.lstrip("-").isdigit() else value
    return constexprs, maxnreg


def main(argv):
    print("triton", triton.__version__)
    for arg in " ".join(argv).split(";") if argv else [""]:
        constexprs, maxnreg = parse(arg)
        print(f"{arg.strip() or 'default':40s} {usage(constexprs, maxnreg)}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
