"""Where does a Pallas kernel wait for its predecessor under XLA's PDL? (NOTES v17)

Two Pallas kernels in one jit, B reading A's output. A's programs trigger the dependent
launch at their start (inline PTX `griddepcontrol.launch_dependents`), then run a dependent
chain of multiply-adds for tens of microseconds and stamp their end (`%globaltimer_lo`). B's
programs stamp their start, then (variant "own wait") run `griddepcontrol.wait` themselves and
stamp again, then read A's output. Data dependencies order the inline assembly (each asm takes
the previous one's result), since Pallas emits it as pure.

If B's first stamp comes before A's last end, B ran code before A finished: XLA then did not put
a wait at B's start, and a kernel may place its own (as the torch frontend does). If B's stamps
all come after A's end, XLA waits at the start (or did not launch B early).

    python benchmarks/probe_jax_pdl_wait.py

Measured with jax 0.11.2 on the H200 (NOTES v17 item 5): in every variant B's first stamp comes
0.4-0.7 us after A's last end (0.8 with PDL off), and B reads A's values.
"""

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

G_A, G_B, WIDTH, STEPS = 264, 132, 128, 20000


def _asm(code, dep):
    """code with $0 an int32 result and $1 the (unused) int32 dep: its place follows dep's."""
    (r,) = plgpu.elementwise_inline_asm(code, args=[dep], constraints="=r,r", pack=1,
                                        result_shape_dtypes=[jax.ShapeDtypeStruct(dep.shape, jnp.int32)])
    return r


def _now(dep):
    return _asm("mov.u32 $0, %globaltimer_lo;", dep)


def kernel_a(out_ref, end_ref, *, trigger: bool):
    pid = pl.program_id(0)
    lane = lax.iota(jnp.int32, 1)
    dep = lane
    if trigger:
        dep = _asm("griddepcontrol.launch_dependents; mov.u32 $0, 0;", lane)
    x = jnp.full((WIDTH,), 1.0, jnp.float32) + jnp.sum(dep).astype(jnp.float32) * 0.0
    x = lax.fori_loop(0, STEPS, lambda i, x: x * 0.999999 + 1e-6, x)
    plgpu.store(out_ref.at[pid * WIDTH + lax.iota(jnp.int32, WIDTH)], x)
    plgpu.store(end_ref.at[pid + lane], _now(lane + (jnp.sum(x) * 0.0).astype(jnp.int32)))


def kernel_b(a_ref, stamps_ref, out_ref, *, own_wait: bool):
    pid = pl.program_id(0)
    lane = lax.iota(jnp.int32, 1)
    t1 = _now(lane)
    dep = t1 * 0
    if own_wait:
        dep = _asm("griddepcontrol.wait; mov.u32 $0, 0;", dep)
    t2 = _now(dep)
    v = plgpu.load(a_ref.at[pid * WIDTH + lax.iota(jnp.int32, WIDTH) + jnp.sum(t2 * 0)])
    plgpu.store(out_ref.at[pid * WIDTH + lax.iota(jnp.int32, WIDTH)], v)
    plgpu.store(stamps_ref.at[2 * pid + lane], t1)
    plgpu.store(stamps_ref.at[2 * pid + 1 + lane], t2)


def pair(trigger: bool, own_wait: bool, options: dict):
    def run():
        a, end = pl.pallas_call(functools.partial(kernel_a, trigger=trigger),
                                out_shape=(jax.ShapeDtypeStruct((G_A * WIDTH,), jnp.float32), jax.ShapeDtypeStruct((G_A,), jnp.int32)),
                                grid=(G_A,), compiler_params=plgpu.CompilerParams(num_warps=1), name="pdl_a")()
        stamps, b = pl.pallas_call(functools.partial(kernel_b, own_wait=own_wait),
                                   out_shape=(jax.ShapeDtypeStruct((2 * G_B,), jnp.int32), jax.ShapeDtypeStruct((G_B * WIDTH,), jnp.float32)),
                                   grid=(G_B,), compiler_params=plgpu.CompilerParams(num_warps=1), name="pdl_b")(a)
        return end, stamps, b, a

    return jax.jit(run, compiler_options={"xla_gpu_graph_min_graph_size": 1, **options})


def main():
    print("jax", jax.__version__, jax.devices()[0].device_kind, flush=True)
    for name, trigger, own_wait, options in [
        ("no trigger", False, False, {}),
        ("trigger", True, False, {}),
        ("trigger, own wait", True, True, {}),
        ("trigger, pdl on", True, False, {"xla_gpu_enable_pdl": True}),
        ("trigger, own wait, pdl on", True, True, {"xla_gpu_enable_pdl": True}),
        ("trigger, own wait, pdl off", True, True, {"xla_gpu_enable_pdl": False}),
    ]:
        fn = pair(trigger, own_wait, options)
        for rep in range(3):
            end, stamps, b, a = (np.asarray(x) for x in fn())
            # %globaltimer_lo wraps every 4.3 s: differences in int32 arithmetic
            a_end = end[np.argmax((end - end[0]).astype(np.int32))]
            t1 = (stamps[0::2] - a_end).astype(np.int32).astype(np.int64)
            t2 = (stamps[1::2] - a_end).astype(np.int32).astype(np.int64)
            span = int((end - end[0]).astype(np.int32).max() - (end - end[0]).astype(np.int32).min())
            same = bool((b.view(np.int32) == a[:G_B * WIDTH].view(np.int32)).all())
            print(f"{name:28s} rep {rep}: A's ends span {span / 1e3:7.1f} us; B's start - A's last end: "
                  f"min {t1.min() / 1e3:8.1f} us, median {np.median(t1) / 1e3:8.1f}; after B's wait: min {t2.min() / 1e3:8.1f}, "
                  f"median {np.median(t2) / 1e3:8.1f}; B read A's values: {same}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
