"""Does a vector plgpu.atomic_add (a tensor of indices) add anything? Run: python benchmarks/probe_atomic_jax.py

Found in session 51 (NOTES v51): on the H200 with jax 0.11.2 and Triton 3.6 every vector variant
below leaves a[5:9] at [0, 0, 0, 0] (masked or not, its result used or not), while the scalar loop
gives the expected [64, 128, 192, 256]; in interpret mode (CPU) all of them are right. So the
JAX kernels use scalar atomics only. Re-run this on a new jax to see whether that still holds.
(Interpret mode has no masked atomic, so on the CPU the mask is dropped and mask_inrange also
adds past a[9]: WRONG there by construction.)
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

n, B = 1024, 256
cpu = jax.default_backend() == "cpu"

def make(variant):
    def k(a_in, a_ref, o_ref):
        lane = lax.iota(jnp.int32, B)
        lanes = lane % 64 == 63
        val = lane + 1
        if variant == "mask":
            plgpu.atomic_add(a_ref, jnp.where(lanes, 5 + lane // 64, n + lane), val, mask=None if cpu else lanes)
        elif variant == "mask_used":
            old = plgpu.atomic_add(a_ref, jnp.where(lanes, 5 + lane // 64, n + lane), val, mask=None if cpu else lanes)
            o_ref[...] = old
        elif variant == "mask_inrange":
            plgpu.atomic_add(a_ref, jnp.where(lanes, 5 + lane // 64, 100 + lane), val, mask=None if cpu else lanes)
        elif variant == "zero_values":
            plgpu.atomic_add(a_ref, jnp.where(lanes, 5 + lane // 64, 100 + lane), jnp.where(lanes, val, 0))
        elif variant == "mask_i32val":
            plgpu.atomic_add(a_ref, jnp.where(lanes, 5 + lane // 64, 100 + lane), jnp.where(lanes, val, 0), mask=None if cpu else lanes)
        elif variant == "scalar_loop":
            def body(j, c):
                plgpu.atomic_add(a_ref, 5 + j, jnp.sum(jnp.where(lane // 64 == j, jnp.where(lanes, val, 0), 0)))
                return c
            lax.fori_loop(0, 4, body, None)
    return k

sd = jax.ShapeDtypeStruct((n,), jnp.int32)
exp = [64, 128, 192, 256]
for v in ("mask", "mask_used", "mask_inrange", "zero_values", "mask_i32val", "scalar_loop"):
    a, o = pl.pallas_call(make(v), out_shape=[sd, jax.ShapeDtypeStruct((B,), jnp.int32)], grid=(1,), input_output_aliases={0: 0},
                          compiler_params=plgpu.CompilerParams(num_warps=4), interpret=cpu)(jnp.zeros((n,), jnp.int32))
    a = np.asarray(a)
    ok = a[5:9].tolist() == exp and int((a != 0).sum()) == 4
    print(f"atomic {v:13s} a[5:9] = {a[5:9].tolist()} (expected {exp}), other nonzero: {int((a != 0).sum() - (a[5:9] != 0).sum())}: {'right' if ok else 'WRONG'}", flush=True)
