"""lpjax.kernels.fp8_blockwise_matmul: the Triton and Mosaic GPU kernels (interpret mode on a CPU, compiled on a
GPU) vs the jnp reference vs float64 NumPy, gradients, and the CUDA lowering of both backends for abstract GPUs.

Bounds asserted (``rel(a, b) = mean|a - b| / mean|b|``):

* either kernel vs reference (evaluated on the CPU): element-wise within one ulp of ``out_dtype`` (``rtol = eps``,
  at least 1e-6 for float32) plus the float32 summation order inside a 128-slice (``2 * 128 u32 |a| @ |w|``), plus, for
  Mosaic GPU compiled on a Hopper GPU, the fp8 tensor cores' accumulation error
  (:data:`tests.kernels.helpers.FP8_TENSOR_CORE_ERR` of ``|a| @ |w|``). The data's per-group scales differ
  within each row and each 128-block column, so a kernel that did not scale each slice's partial sum by its own
  scales before adding it (DeepGEMM's promotion) would miss this bound by far;
* vs the dequantized product ``dequant(qa) @ dequant(qw) + bias`` in float32 (vLLM's test): ``rel < 1e-3``, or
  ``< 2^-8`` for a bfloat16 output, whose own rounding (unit roundoff ``2^-8``) is of that size;
* vs a float64 NumPy implementation of the same formula, with codes from ml_dtypes: ``|ref - C| <= 1e-5 max|C|``
  (float32 accumulation over at most a few hundred terms);
* vs the unquantized float32 ``x @ w + bias``: ``rel < 2^-4`` for Gaussian data, the per-code worst case
  (measured 0.026-0.039: each e4m3 code has a relative error of up to 2^-4, RMS about 2^-4 / sqrt(3), in both
  factors), and element-wise ``|y - xw| <= ((1 + 2^-4)^2 - 1) xw`` for positive data with all codes normal (no
  cancellation, so the per-product bound carries over to the sums; measured 0.013 against 0.129).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from lpjax import quant
from lpjax.kernels import lower_for_cuda
from lpjax.kernels.fp8_blockwise_matmul import fp8_blockwise_matmul
from tests.kernels.helpers import INTERPRET, backend_params, fp8_tensor_core_err, lowered, on_host, wgmma

run = jax.jit(fp8_blockwise_matmul, static_argnames=("out_dtype", "impl", "interpret", "block_m"))

# (M, K, N, input dtype, out dtype, bias, block_m): ragged M, K and N, several M tiles, every out dtype.
CASES = [
    (1, 128, 128, jnp.float32, jnp.float32, False, 64),
    (3, 200, 130, jnp.bfloat16, jnp.bfloat16, True, 64),
    (64, 256, 384, jnp.float32, jnp.float32, True, 64),
    (70, 129, 300, jnp.float16, jnp.float16, True, 32),
    (70, 129, 300, jnp.float32, jnp.bfloat16, False, 16),
]
MOSAIC_GPU_CASES = [CASES[1], CASES[3]]  # 2 M tiles (block_m is raised to 64), 3 N tiles, 2 K slices, bias


def _operands(m, k, n, dtype=jnp.float32, seed=0, positive=False):
    rng = np.random.default_rng(seed + m + k + n)
    if positive:
        x, w, b = rng.uniform(0.5, 1.0, (m, k)), rng.uniform(0.5, 1.0, (k, n)), rng.uniform(0.5, 1.0, (n,))
    else:
        # Column / row magnitudes spread over 2^+-3 so that the per-group and per-tile scales differ.
        x = rng.standard_normal((m, k)) * 2.0 ** rng.integers(-3, 4, (m, 1))
        w = rng.standard_normal((k, n)) / np.sqrt(k) * 2.0 ** rng.integers(-3, 4, (1, n))
        b = rng.standard_normal((n,))
    return jnp.asarray(x, dtype), jnp.asarray(w, dtype), jnp.asarray(b, dtype)


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.mean(np.abs(a - b)) / np.mean(np.abs(b)))


def _dequantized_operands(x, w):
    a = quant.dequantize_fp8_per_token_group(*quant.quantize_fp8_per_token_group(x))
    return a, quant.dequantize_fp8_blockwise(quant.quantize_fp8_blockwise(w))


def _dequantized_product(x, w, bias):
    y = jnp.dot(*_dequantized_operands(x, w), precision=jax.lax.Precision.HIGHEST)
    return y if bias is None else y + bias.astype(jnp.float32)


@pytest.mark.parametrize(
    "impl, m, k, n, dtype, out_dtype, with_bias, block_m",
    backend_params("triton", CASES) + backend_params("mosaic_gpu", MOSAIC_GPU_CASES, eight_bit=True),
)
def test_pallas_matches_reference_and_dequantized_product(impl, m, k, n, dtype, out_dtype, with_bias, block_m):
    x, w, b = _operands(m, k, n, dtype)
    bias = b if with_bias else None
    out = run(x, w, bias=bias, out_dtype=out_dtype, impl=impl, interpret=INTERPRET, block_m=block_m)
    ref = on_host(run, x, w, bias=bias, out_dtype=out_dtype, impl="reference")
    assert out.shape == ref.shape == (m, n) and out.dtype == ref.dtype == out_dtype
    eps = max(float(jnp.finfo(out_dtype).eps), 1e-6)
    a, b = (np.abs(np.asarray(v, np.float64)) for v in _dequantized_operands(x, w))
    err = np.abs(np.asarray(out, np.float64) - np.asarray(ref, np.float64))
    sum_order = 2 * 128 * 2.0**-24 * (a @ b)  # two float32 sums of one 128-slice's exact products
    bound = eps * np.abs(np.asarray(ref, np.float64)) + eps + sum_order + fp8_tensor_core_err(impl) * (a @ b)
    assert np.all(err <= bound), f"max err/bound {np.max(err / bound):.3g}"

    dq = _dequantized_product(x, w, bias)
    bound = 2.0**-8 if out_dtype == jnp.bfloat16 else 1e-3
    assert _rel(out, dq) < bound and _rel(ref, dq) < bound
    full = jnp.dot(x.astype(jnp.float32), w.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    full = full if bias is None else full + bias.astype(jnp.float32)
    assert _rel(out, full) < 2.0**-4


def test_pre_quantized_weight_gives_the_same_result():
    x, w, b = _operands(70, 129, 300)
    qw = quant.quantize_fp8_blockwise(w)
    for impl, block_m in (("reference", 64), ("pallas", 32)):
        a = run(x, w, bias=b, impl=impl, interpret=INTERPRET, block_m=block_m)
        c = run(x, qw, bias=b, impl=impl, interpret=INTERPRET, block_m=block_m)
        np.testing.assert_array_equal(a, c)


def _numpy_blockwise_fp8_matmul(x, w, bias):
    """The blockwise-FP8 formula in float64 NumPy, with its own quantization through ml_dtypes."""

    def quantize(v, rows, cols):
        v = np.asarray(v, np.float32)
        r, c = v.shape
        s = np.ones((-(-r // rows), -(-c // cols)), np.float32)
        for i in range(s.shape[0]):
            for j in range(s.shape[1]):
                amax = np.abs(v[i * rows : (i + 1) * rows, j * cols : (j + 1) * cols]).max()
                s[i, j] = amax * np.float32(1 / 448) if amax > 0 else 1.0
        full = np.repeat(np.repeat(s, rows, 0), cols, 1)[:r, :c]
        q = np.clip(v * (np.float32(1) / full), -448, 448).astype(ml_dtypes.float8_e4m3fn)
        return q.astype(np.float64), s.astype(np.float64)

    qa, sa = quantize(x, 1, 128)
    qw, sw = quantize(w, 128, 128)
    m, n = qa.shape[0], qw.shape[1]
    c = np.zeros((m, n))
    for g in range(sa.shape[1]):
        ks = slice(g * 128, (g + 1) * 128)
        c += (qa[:, ks] @ qw[ks, :]) * sa[:, g : g + 1] * np.repeat(sw[g], 128)[None, :n]
    return c + np.asarray(bias, np.float64)


@pytest.mark.parametrize("m, k, n", [(3, 200, 130), (70, 300, 257)])
def test_reference_matches_float64_numpy(m, k, n):
    x, w, b = _operands(m, k, n, seed=1)
    c = _numpy_blockwise_fp8_matmul(x, w, b)
    ref = np.asarray(run(x, w, bias=b, impl="reference"), np.float64)
    assert np.max(np.abs(ref - c)) <= 1e-5 * np.max(np.abs(c))


def test_positive_data_elementwise_bound_vs_float32_matmul():
    x, w, _ = _operands(70, 129, 300, positive=True)
    y = np.asarray(run(x, w, impl="reference"), np.float64)
    exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    assert np.all(np.abs(y - exact) <= ((1 + 2.0**-4) ** 2 - 1) * exact * (1 + 1e-5))


def _ste_loss(x, w, b, cot):
    """x @ dequant(quant(w)) + b with a straight-through weight: value of the fp8 weight, gradient of w."""
    w_ste = w + jax.lax.stop_gradient(quant.dequantize_fp8_blockwise(quant.quantize_fp8_blockwise(w)) - w)
    return jnp.sum((jnp.dot(x, w_ste, precision=jax.lax.Precision.HIGHEST) + b) * cot)


@pytest.mark.parametrize("impl", ["reference", "pallas"])
def test_straight_through_gradients(impl):
    x, w, b = _operands(3, 200, 130, seed=2)
    cot = jnp.asarray(np.random.default_rng(0).standard_normal((3, 130)), jnp.float32)
    loss = lambda x, w, b: jnp.sum(run(x, w, bias=b, impl=impl, interpret=INTERPRET) * cot)
    grads = jax.grad(loss, argnums=(0, 1, 2))(x, w, b)
    expected = jax.grad(_ste_loss, argnums=(0, 1, 2))(x, w, b, cot)
    for g, e in zip(grads, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5 * float(jnp.abs(e).max()))
    # A pre-quantized weight is a constant: same dx, zero cotangent for codes and scales.
    qw = quant.quantize_fp8_blockwise(w)
    dx, dqw = jax.grad(loss, argnums=(0, 1))(x, qw, b)
    np.testing.assert_allclose(dx, expected[0], rtol=1e-5, atol=1e-5 * float(jnp.abs(expected[0]).max()))
    assert isinstance(dqw, quant.Fp8BlockwiseWeight)
    assert not np.asarray(dqw.codes, np.float32).any() and not np.asarray(dqw.scales).any()


def test_gradients_have_the_primal_dtypes():
    x, w, b = _operands(3, 200, 130, dtype=jnp.bfloat16)
    grads = jax.grad(
        lambda *a: run(*a[:2], bias=a[2], out_dtype=jnp.float32, impl="reference").sum(), argnums=(0, 1, 2)
    )(x, w, b)
    assert [g.dtype for g in grads] == [jnp.bfloat16] * 3
    np.testing.assert_allclose(np.asarray(grads[2], np.float32), 3.0)


@pytest.mark.parametrize("block_m", [16, 64])
def test_lowers_for_cuda_on_every_backend_and_arch(block_m):
    """For an H100, ``impl="pallas"`` lowers to one Mosaic GPU kernel whose only matmul is the e4m3 ``wgmma`` with a
    float32 accumulator over a (64 rows, 128 columns, 32 K) step: a warpgroup's rows, one weight block's columns
    (``block_m`` is raised to 64). For an L4 (sm_89, the first GPU with fp8 tensor cores) it lowers to Triton, as
    ``impl="triton"`` does for an H100."""
    x = jax.ShapeDtypeStruct((70, 300), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((300, 129), jnp.bfloat16)
    b = jax.ShapeDtypeStruct((129,), jnp.float32)

    def fn(x, w, b, impl="pallas"):
        return fp8_blockwise_matmul(x, w, bias=b, out_dtype=jnp.bfloat16, impl=impl, interpret=False, block_m=block_m)

    triton = {"triton_calls": 1, "mosaic_gpu_calls": 0, "wgmma": []}
    assert lowered(fn, x, w, b, arch="sm_90") == {
        "triton_calls": 0,
        "mosaic_gpu_calls": 1,
        "wgmma": [wgmma(64, 128, 32, "f32", "e4m3")],
    }
    assert lowered(functools.partial(fn, impl="triton"), x, w, b, arch="sm_90") == triton
    assert lowered(fn, x, w, b, arch="sm_89") == triton
    with pytest.raises(ValueError, match="needs an sm_90 GPU"):
        lowered(functools.partial(fn, impl="mosaic_gpu"), x, w, b, arch="sm_89")


def test_non_power_of_two_block_m_fails_before_lowering():
    x = jax.ShapeDtypeStruct((70, 300), jnp.float32)
    w = jax.ShapeDtypeStruct((300, 129), jnp.float32)
    fn = functools.partial(fp8_blockwise_matmul, impl="pallas", interpret=False, block_m=48)
    with pytest.raises(ValueError, match="block_m must be a positive power of two"):
        lower_for_cuda(fn, x, w)


def test_bad_inputs_raise():
    x, w, b = _operands(4, 130, 20)
    qw = quant.quantize_fp8_blockwise(w)
    bad = [
        (dict(x=x.astype(jnp.int32)), "x must have dtype"),
        (dict(x=x.astype(jnp.float8_e4m3fn)), "x must have dtype"),
        (dict(x=x[None]), "matrix"),
        (dict(w=w[:100]), "Contraction"),
        (dict(w=w.astype(jnp.int8)), "w must have dtype"),
        (dict(w=quant.Fp8BlockwiseWeight(qw.codes, qw.scales[:, :0])), "scales must have shape"),
        (dict(w=quant.Fp8BlockwiseWeight(qw.codes.astype(jnp.float32), qw.scales)), "codes must have dtype"),
        (dict(bias=b[:5]), "bias must have shape"),
        (dict(out_dtype=jnp.int8), "out_dtype"),
        (dict(out_dtype=jnp.float8_e4m3fn), "out_dtype"),
        (dict(impl="xla"), "impl must be one of"),
        (dict(block_m=48), "power of two"),
        (dict(block_m=8), ">= 16"),
    ]
    for change, match in bad:
        kwargs = dict(x=x, w=w, bias=b) | change
        with pytest.raises(ValueError, match=match):
            fp8_blockwise_matmul(kwargs.pop("x"), kwargs.pop("w"), **kwargs)
