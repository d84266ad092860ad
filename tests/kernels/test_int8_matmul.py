"""lpjax.kernels.int8_matmul: the Triton and Mosaic GPU kernels (interpret mode on a CPU, compiled on a GPU) vs
the jnp reference, exact int32 sums, error bounds, and the CUDA lowering of both backends for abstract GPUs.

Bounds asserted:

* int32 accumulations: exactly equal to NumPy's int64 ``q_x @ q_w`` (unit scales, float32 output, sums below
  2^24 so the float32 result is the integer itself), for every implementation and several block shapes;
* either kernel vs reference: element-wise within one ulp of ``out_dtype`` (at least 1e-6 for float32: XLA may
  fuse the epilogue's multiply and bias add into an FMA in one of them);
* vs the dequantized product ``dequant(q_x) @ dequant(q_w) + bias`` in float32: ``mean|y - d| / mean|d| <
  max(eps(out_dtype), 1e-5)`` (only the output rounding differs);
* vs the unquantized ``x @ w + bias``, element-wise and rigorous: with ``|x - x^| <= s_x / 2`` and
  ``|w - w^| <= s_w / 2``, ``|y - xw| <= s_x/2 sum_k |w_kn| + s_w/2 sum_k |x_mk| + K s_x s_w / 4`` (+ the
  output rounding); and ``mean|y - xw| / mean|xw| < 0.02`` (measured 0.007-0.009).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax import quant
from lpjax.kernels import lower_for_cuda
from lpjax.kernels.int8_matmul import MAX_K, int8_matmul
from tests.kernels.helpers import INTERPRET, backend_params, lowered, wgmma

run = jax.jit(int8_matmul, static_argnames=("out_dtype", "impl", "interpret", "block_m", "block_n", "block_k"))

# (M, K, N, input dtype, out dtype, bias, blocks): ragged M, K and N, several tiles, every out dtype.
CASES = [
    (1, 128, 128, jnp.float32, jnp.float32, False, {}),
    (3, 200, 130, jnp.bfloat16, jnp.bfloat16, True, {}),
    (64, 256, 384, jnp.float32, jnp.float32, True, dict(block_n=128, block_k=128)),
    (70, 129, 300, jnp.float16, jnp.float16, True, dict(block_m=32, block_k=32)),
    (70, 129, 300, jnp.float32, jnp.bfloat16, False, dict(block_m=16, block_n=16, block_k=16)),
]
MOSAIC_GPU_CASES = [CASES[1], CASES[3]]  # ragged, bias, several N tiles and K steps (block_m is raised to 64)


def _operands(m, k, n, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed + m + k + n)
    x = rng.standard_normal((m, k)) * 2.0 ** rng.integers(-3, 4, (m, 1))
    w = rng.standard_normal((k, n)) / np.sqrt(k) * 2.0 ** rng.integers(-3, 4, (1, n))
    return jnp.asarray(x, dtype), jnp.asarray(w, dtype), jnp.asarray(rng.standard_normal((n,)), dtype)


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.mean(np.abs(a - b)) / np.mean(np.abs(b)))


@pytest.mark.parametrize(
    "impl, m, k, n, dtype, out_dtype, with_bias, blocks",
    backend_params("triton", CASES) + backend_params("mosaic_gpu", MOSAIC_GPU_CASES, eight_bit=True),
)
def test_pallas_matches_reference_and_error_bounds(impl, m, k, n, dtype, out_dtype, with_bias, blocks):
    x, w, b = _operands(m, k, n, dtype)
    bias = b if with_bias else None
    out = run(x, w, bias=bias, out_dtype=out_dtype, impl=impl, interpret=INTERPRET, **blocks)
    ref = run(x, w, bias=bias, out_dtype=out_dtype, impl="reference")
    assert out.shape == ref.shape == (m, n) and out.dtype == ref.dtype == out_dtype
    eps = max(float(jnp.finfo(out_dtype).eps), 1e-6)
    out64, ref64 = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    np.testing.assert_allclose(out64, ref64, rtol=eps, atol=eps * np.abs(ref64).max())

    qx, sx = quant.quantize_int8_per_token(x)
    qw = quant.quantize_int8_weight(w)
    b64 = np.zeros(n) if bias is None else np.asarray(bias, np.float64)
    dq = (
        np.asarray(quant.dequantize_int8(qx, sx), np.float64)
        @ np.asarray(quant.dequantize_int8(qw.codes, qw.scales), np.float64)
        + b64
    )
    assert _rel(out, dq) < eps and _rel(ref, dq) < eps

    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    exact = x64 @ w64 + b64
    sx64, sw64 = np.asarray(sx, np.float64), np.asarray(qw.scales, np.float64)[None, :]
    bound = sx64 / 2 * np.abs(w64).sum(0)[None, :] + sw64 / 2 * np.abs(x64).sum(1)[:, None] + k * sx64 * sw64 / 4
    bound += eps * np.abs(out64) + 1e-6 * (np.abs(x64) @ np.abs(w64) + np.abs(b64))
    assert np.all(np.abs(out64 - exact) <= bound)
    assert _rel(out, exact) < 0.02


@pytest.mark.parametrize(
    "impl, blocks",
    backend_params("reference", [({},)])
    + backend_params("triton", [(dict(block_m=32, block_k=32),), (dict(block_m=16, block_n=128, block_k=128),)])
    + backend_params("mosaic_gpu", [(dict(block_n=128, block_k=32),)], eight_bit=True),
)
def test_int32_accumulation_is_exact(impl, blocks):
    m, k, n = 70, 300, 129
    rng = np.random.default_rng(0)
    qx = rng.integers(-128, 128, (m, k), dtype=np.int8)  # the full int8 range, -128 included
    qw = rng.integers(-128, 128, (k, n), dtype=np.int8)
    exact = qx.astype(np.int64) @ qw.astype(np.int64)
    assert np.abs(exact).max() < 2**24
    out = run(
        (jnp.asarray(qx), jnp.ones((m, 1))),
        quant.Int8Weight(jnp.asarray(qw), jnp.ones((n,))),
        impl=impl,
        interpret=INTERPRET,
        **blocks,
    )
    np.testing.assert_array_equal(np.asarray(out).astype(np.int64), exact)


def test_pre_quantized_operands_give_the_same_result():
    x, w, b = _operands(70, 129, 300)
    qx, sx = quant.quantize_int8_per_token(x)
    qw = quant.quantize_int8_weight(w)
    for impl in ("reference", "pallas"):
        a = run(x, w, bias=b, impl=impl, interpret=INTERPRET)
        c = run((qx, sx), qw, bias=b, impl=impl, interpret=INTERPRET)
        np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(
        run((qx, sx[:, 0]), qw, bias=b, impl="reference"), run(x, w, bias=b, impl="reference")
    )


def test_has_no_gradient():
    x, w, _ = _operands(3, 20, 10)
    with pytest.raises(TypeError, match="no gradient"):
        jax.grad(lambda x: int8_matmul(x, w, impl="reference").sum())(x)


@pytest.mark.parametrize("blocks, n_tile", [({}, 64), (dict(block_m=16, block_n=128, block_k=32), 128)])
def test_lowers_for_cuda_on_every_backend_and_arch(blocks, n_tile):
    """For an H100, ``impl="pallas"`` lowers to one Mosaic GPU kernel whose only matmul is the s8 ``wgmma`` with
    an int32 accumulator over a (64 rows, ``block_n`` columns, 32 K) step (``block_m`` is raised to 64, a
    warpgroup's rows). For an A100 it lowers to Triton, as ``impl="triton"`` does for an H100."""
    x = jax.ShapeDtypeStruct((70, 300), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((300, 129), jnp.bfloat16)
    b = jax.ShapeDtypeStruct((129,), jnp.float32)

    def fn(x, w, b, impl="pallas"):
        return int8_matmul(x, w, bias=b, out_dtype=jnp.bfloat16, impl=impl, interpret=False, **blocks)

    triton = {"triton_calls": 1, "mosaic_gpu_calls": 0, "wgmma": []}
    assert lowered(fn, x, w, b, arch="sm_90") == {
        "triton_calls": 0,
        "mosaic_gpu_calls": 1,
        "wgmma": [wgmma(64, n_tile, 32, "s32", "s8")],
    }
    assert lowered(functools.partial(fn, impl="triton"), x, w, b, arch="sm_90") == triton
    assert lowered(fn, x, w, b, arch="sm_80") == triton
    with pytest.raises(ValueError, match="needs an sm_90 GPU"):
        lowered(functools.partial(fn, impl="mosaic_gpu"), x, w, b, arch="sm_80")


@pytest.mark.parametrize("name", ["block_m", "block_n", "block_k"])
def test_non_power_of_two_blocks_fail_before_lowering(name):
    x = jax.ShapeDtypeStruct((70, 300), jnp.float32)
    w = jax.ShapeDtypeStruct((300, 129), jnp.float32)
    fn = functools.partial(int8_matmul, impl="pallas", interpret=False, **{name: 48})
    with pytest.raises(ValueError, match=f"{name} must be a positive power of two"):
        lower_for_cuda(fn, x, w)


def test_bad_inputs_raise():
    x, w, b = _operands(4, 130, 20)
    qx, sx = quant.quantize_int8_per_token(x)
    qw = quant.quantize_int8_weight(w)
    bad = [
        (dict(x=x.astype(jnp.int32)), "x must have dtype"),
        (dict(x=x[None]), "matrix"),
        (dict(x=(qx, sx, sx)), "tuple"),
        (dict(x=(qx.astype(jnp.int32), sx)), "x codes must have dtype"),
        (dict(x=(qx, sx.astype(jnp.float16))), "x scales must have dtype"),
        (dict(x=(qx, sx[:2])), "x scales must have shape"),
        (dict(w=w[:100]), "Contraction"),
        (dict(w=w.astype(jnp.int8)), "w must have dtype"),
        (dict(w=quant.Int8Weight(qw.codes, qw.scales[:3])), "scales"),
        (dict(w=quant.Int8Weight(qw.codes.astype(jnp.int32), qw.scales)), "w.codes must have dtype"),
        (dict(w=jnp.zeros((MAX_K + 1, 2)), x=jnp.zeros((1, MAX_K + 1))), "overflow"),
        (dict(bias=b[:5]), "bias must have shape"),
        (dict(out_dtype=jnp.int32), "out_dtype"),
        (dict(out_dtype="not a dtype"), "out_dtype"),
        (dict(impl="cuda"), "impl must be one of"),
        (dict(block_k=96), "power of two"),
        (dict(block_n=8), ">= 16"),
    ]
    for change, match in bad:
        kwargs = dict(x=x, w=w, bias=b) | change
        with pytest.raises(ValueError, match=match):
            int8_matmul(kwargs.pop("x"), kwargs.pop("w"), **kwargs)
