"""lpjax.kernels.fp16_matmul: the Triton and Mosaic GPU kernels (interpret mode on a CPU, compiled on a GPU)
against the jnp reference and float64, the custom VJP against float32 autodiff, the CUDA lowering of both backends
for abstract GPUs, and argument checks.

Error bounds are elementwise and derived from the maths (``u = eps / 2`` is a dtype's unit roundoff):

* products of two float16 (11-bit) or bfloat16 (8-bit) significands are exact in float32 (24 bits), so the only
  float32 error in ``z = x @ w + b`` is the summation's, at most ``gamma_{K+1} ~ (K + 1) u32`` times
  ``|x| @ |w| + |b|`` (Higham, Accuracy and Stability, Thm 3.1), whatever the summation order;
* relu, elu and tanh are 1-Lipschitz, so they do not amplify that error; their float32 evaluation adds a few
  float32 ulps;
* rounding to ``out_dtype`` adds at most ``u_out |y|`` (or half the smallest subnormal near zero); two values
  that differ by ``d`` round to values that differ by at most ``d`` plus one ulp;
* Mosaic GPU's ELU evaluates ``exp(t) - 1`` rather than ``expm1(t)``: at most ``2^-22`` more, absolute.

Interpret mode is slow (a compile per shape and config), so shapes are small, each parametrized case covers
several options at once, and Mosaic GPU's interpreter (slower than Pallas' generic one) runs a subset of the
cases that still covers every activation, bias and output dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax.kernels.fp16_matmul import ACTIVATIONS, fp16_matmul
from tests.kernels.helpers import INTERPRET, backend_params, lowered, wgmma

F16, BF16, F32 = jnp.float16, jnp.bfloat16, jnp.float32
EPS32 = float(jnp.finfo(F32).eps)
EXP_MINUS_ONE_ERR = 2.0**-22  # |(exp(t) - 1) - expm1(t)| for t <= 0, Mosaic GPU's ELU


def _act_err(impl: str, activation: str) -> float:
    """Absolute error an implementation's activation may add beyond float32 rounding."""
    return EXP_MINUS_ONE_ERR if impl == "mosaic_gpu" and activation == "elu" else 0.0


def _eps(dtype) -> float:
    return float(jnp.finfo(dtype).eps)


def _subnormal(dtype) -> float:
    return float(jnp.finfo(dtype).smallest_subnormal)


def _inputs(m, k, n, dtype, bias_dtype, seed=0):
    """x ~ N(0, 1), w ~ N(0, 1/K) (so z is O(1) and the activations are exercised on both sides), b ~ N(0, 1/4)."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(m, k)), dtype)
    w = jnp.asarray(rng.normal(size=(k, n)) / np.sqrt(k), dtype)
    b = None if bias_dtype is None else jnp.asarray(rng.normal(size=(n,)) * 0.5, bias_dtype)
    return x, w, b


def _np_act(z: np.ndarray, activation: str) -> np.ndarray:
    if activation == "relu":
        return np.maximum(z, 0.0)
    if activation == "elu":
        return np.where(z > 0, z, np.expm1(np.minimum(z, 0.0)))
    if activation == "tanh":
        return np.tanh(z)
    return z


def _f64(a) -> np.ndarray:
    return np.asarray(jnp.asarray(a, F32), np.float64)  # exact: every input dtype embeds in float32


# (M, K, N), input dtype, activation, out dtype (None = input dtype), bias dtype (None = no bias), blocks.
# Every (activation, out dtype) pair appears once, every shape with both input dtypes, bias in several dtypes.
FORWARD_CASES = [
    ((1, 16, 8), F16, "none", F32, None, 64),
    ((3, 70, 130), BF16, "none", F16, F32, 64),
    ((64, 128, 256), F16, "none", BF16, BF16, 64),
    ((130, 65, 33), BF16, "relu", F32, F32, 64),
    ((1, 16, 8), BF16, "relu", F16, None, 64),
    ((3, 70, 130), F16, "relu", None, F16, 64),
    ((64, 128, 256), BF16, "elu", F32, None, 64),
    ((130, 65, 33), F16, "elu", None, F32, 16),  # 16-blocks: a 9 x 3 grid, 5 steps of the K loop
    ((3, 70, 130), BF16, "elu", None, F32, 64),
    ((130, 65, 33), F16, "tanh", F32, BF16, 64),
    ((64, 128, 256), F16, "tanh", None, F32, 32),
    ((1, 16, 8), BF16, "tanh", None, F32, 64),
]


# Mosaic GPU: every activation, out dtype and input dtype, with and without bias; blocks 16 and 32 (block_m is
# raised to 64, a warpgroup) give several N tiles and K steps.
MOSAIC_GPU_CASES = [FORWARD_CASES[i] for i in (1, 3, 7, 10)]


@pytest.mark.parametrize(
    "impl,shape,dtype,activation,out_dtype,bias_dtype,block",
    backend_params("triton", FORWARD_CASES) + backend_params("mosaic_gpu", MOSAIC_GPU_CASES),
)
def test_pallas_matches_reference_and_float64(impl, shape, dtype, activation, out_dtype, bias_dtype, block):
    m, k, n = shape
    x, w, b = _inputs(m, k, n, dtype, bias_dtype)
    kw = {"activation": activation, "out_dtype": out_dtype, "block_m": block, "block_n": block, "block_k": block}
    y = fp16_matmul(x, w, b, impl=impl, interpret=INTERPRET, **kw)
    y_ref = fp16_matmul(x, w, b, impl="reference", **kw)
    out = np.dtype(dtype if out_dtype is None else out_dtype)
    assert y.shape == y_ref.shape == (m, n) and y.dtype == y_ref.dtype == out

    x64, w64 = _f64(x), _f64(w)
    b64 = np.zeros(n) if b is None else _f64(b)
    mag = np.abs(x64) @ np.abs(w64) + np.abs(b64)  # scale of the float32 summation error
    sum_err = (k + 1) * EPS32 * mag  # 2 gamma_{K+1}: covers the difference of two summation orders
    y64, y_f, y_ref_f = _np_act(x64 @ w64 + b64, activation), _f64(y), _f64(y_ref)

    # Pallas vs reference: same exact products, same f32 epilogue; only the summation order differs (<= sum_err
    # between the two z), then each is rounded to out_dtype: at most one out_dtype ulp apart on top (1.01 covers
    # the second-order terms: the ulp is that of the larger of the two values).
    act_err = _act_err(impl, activation)
    bound = sum_err + act_err + 1.01 * (_eps(out) + 4 * EPS32) * np.abs(y_ref_f) + _subnormal(out)
    err = np.abs(y_f - y_ref_f)
    assert np.all(err <= bound), f"max err {err.max():.3g}, max err/bound {np.max(err / bound):.3g}"

    # vs float64 on the same (rounded) inputs: one f32 summation (<= sum_err / 2, bounded by sum_err), a few
    # f32 ulps for the activation, then one rounding to out_dtype (<= u_out |y|, or half a subnormal).
    for got in (y_f, y_ref_f):
        bound64 = sum_err + act_err + 0.5 * _eps(out) * np.abs(y64) + 4 * EPS32 * np.abs(y64) + 0.5 * _subnormal(out)
        err64 = np.abs(got - y64)
        assert np.all(err64 <= bound64), f"max err {err64.max():.3g}, max err/bound {np.max(err64 / bound64):.3g}"


# Gradients: dtype, out dtype (None = input dtype), bias dtype.
GRAD_DTYPES = [(F16, None, F32), (BF16, F32, BF16)]


GRAD_CASES = [(act, *dtypes) for act in ACTIVATIONS for dtypes in GRAD_DTYPES]


# Mosaic GPU: one case (its interpreter is slow) whose backward pass needs the saved pre-activation z.
@pytest.mark.parametrize(
    "impl,activation,dtype,out_dtype,bias_dtype",
    backend_params("triton", GRAD_CASES) + backend_params("mosaic_gpu", [("elu", *GRAD_DTYPES[0])]),
)
def test_gradients_match_float32_autodiff(impl, activation, dtype, out_dtype, bias_dtype):
    m, k, n = 5, 40, 24  # ragged: every one of the three kernels (forward, dx, dw) pads
    x, w, b = _inputs(m, k, n, dtype, bias_dtype, seed=1)
    c = jnp.asarray(np.random.default_rng(2).normal(size=(m, n)), F32)

    def loss(impl, x, w, b):
        y = fp16_matmul(x, w, b, activation=activation, out_dtype=out_dtype, impl=impl, interpret=INTERPRET)
        return jnp.sum(c * y.astype(F32))

    def loss32(x, w, b):  # the float32 computation on the same (rounded) inputs, differentiated by JAX
        z = jnp.dot(x, w, precision="highest") + b
        act = {"none": lambda z: z, "relu": jax.nn.relu, "elu": jax.nn.elu, "tanh": jnp.tanh}[activation]
        return jnp.sum(c * act(z))

    x32, w32, b32 = (jnp.asarray(a, F32) for a in (x, w, b))
    g32 = [_f64(g) for g in jax.grad(loss32, argnums=(0, 1, 2))(x32, w32, b32)]
    # |dz| of the float32 computation: the scale of the backward matmuls' errors.
    dz = np.abs(_f64(jax.grad(lambda z: loss32(jnp.zeros_like(x32), w32, z))(jnp.dot(x32, w32) + b32)))
    x64, w64 = np.abs(_f64(x)), np.abs(_f64(w))
    u_in, u_out = _eps(dtype) / 2, _eps(dtype if out_dtype is None else out_dtype) / 2
    # dy = c is rounded to out_dtype (u_out) and dz to the input dtype (u_in) before the backward matmuls, whose
    # products are exact and whose f32 sums add ~(terms) u32; dx and dw are then rounded to the input dtype
    # (u_in |g|). Factor 2 of slack on the first-order terms covers second-order terms and the f32 noise of
    # z and act'(z). The subnormal terms cover float16 flushing of tiny dz entries and results.
    mags = [dz @ w64.T, x64.T @ dz, dz.sum(0)]
    tiny = _subnormal(dtype) * (1 + max(m, n, k))
    bounds = [
        u_in * np.abs(g32[0]) + 2 * (u_out + u_in + n * EPS32) * mags[0] + tiny,
        u_in * np.abs(g32[1]) + 2 * (u_out + u_in + m * EPS32) * mags[1] + tiny,
        # db = sum(dz) in f32 (dz not rounded to the input dtype), then rounded to b's dtype.
        _eps(bias_dtype) / 2 * np.abs(g32[2]) + 2 * (u_out + m * EPS32) * mags[2],
    ]
    for backend in (impl, "reference"):
        grads = jax.grad(functools.partial(loss, backend), argnums=(0, 1, 2))(x, w, b)
        assert [g.dtype for g in grads] == [x.dtype, w.dtype, b.dtype]
        for name, g, ref, bound in zip(("dx", "dw", "db"), grads, g32, bounds):
            err = np.abs(_f64(g) - ref)
            assert np.all(np.isfinite(_f64(g)))
            assert np.all(err <= bound), f"{backend} {name}: max err/bound {np.max(err / bound):.3g}"


@pytest.mark.parametrize("impl", backend_params("triton"))
def test_backward_runs_the_kernel_on_half_precision_operands(impl):
    """The custom VJP is used: 3 kernels (forward + dx + dw), and the backward matmuls take float16 operands
    (plain autodiff of the reference would multiply the float32 cotangent instead). Mosaic GPU's backward pass is
    checked on its lowering (:func:`test_lowers_for_cuda_on_every_backend_and_arch`)."""
    x, w, b = _inputs(3, 20, 5, F16, F32)

    def grad_jaxpr(impl):
        f = lambda x, w, b: fp16_matmul(x, w, b, activation="tanh", impl=impl, interpret=INTERPRET).astype(F32).sum()
        return jax.make_jaxpr(jax.grad(f, argnums=(0, 1, 2)))(x, w, b)

    assert str(grad_jaxpr(impl)).count("pallas_call[") == 3
    dots = [e for e in grad_jaxpr("reference").jaxpr.eqns if e.primitive.name == "dot_general"]
    assert len(dots) == 3
    assert all(v.aval.dtype == F16 for e in dots for v in e.invars)
    assert all(e.outvars[0].aval.dtype == F32 for e in dots)  # float32 accumulation


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
def test_lowers_for_cuda_on_every_backend_and_arch(dtype):
    """``impl="pallas"`` lowers to one Mosaic GPU kernel of float32-accumulating half-precision ``wgmma`` for an
    H100 and to one Triton kernel for an L4 or an A100; ``impl="triton"`` still lowers for an H100. The backward
    pass runs 3 kernels (forward, dx, dw) on the same backend, Mosaic GPU's with half-precision operands only."""
    x, w, b = _inputs(3, 130, 130, dtype, F32)  # ragged: K = 130 pads to 192, N to 192
    fn = functools.partial(fp16_matmul, interpret=False, activation="relu")
    grad = jax.grad(lambda x, w, b: fn(x, w, b).astype(F32).sum(), argnums=(0, 1, 2))
    op = {F16: "f16", BF16: "bf16"}[dtype]
    mosaic = {"triton_calls": 0, "mosaic_gpu_calls": 1, "wgmma": [wgmma(64, 64, 16, "f32", op)]}
    triton = {"triton_calls": 1, "mosaic_gpu_calls": 0, "wgmma": []}

    assert lowered(fn, x, w, b, arch="sm_90") == mosaic
    assert lowered(grad, x, w, b, arch="sm_90") == mosaic | {"mosaic_gpu_calls": 3}
    assert lowered(functools.partial(fn, impl="triton"), x, w, b, arch="sm_90") == triton
    for arch in ("sm_89", "sm_80"):
        assert lowered(fn, x, w, b, arch=arch) == triton
    assert lowered(grad, x, w, b, arch="sm_80") == triton | {"triton_calls": 3}
    for act in ("elu", "tanh"):  # exp(t) - 1 / expm1 / tanh in the epilogue, and the saved f32 pre-activation
        fn_act = functools.partial(fp16_matmul, interpret=False, activation=act, out_dtype=F32)
        assert lowered(fn_act, x, w, b, arch="sm_90") == mosaic
        assert lowered(fn_act, x, w, b, arch="sm_80") == triton

    for arch in ("sm_90", "sm_80"):
        for bad in ({"block_m": 48}, {"block_k": 8}, {"block_n": 0}):
            with pytest.raises(ValueError, match="block"):
                lowered(functools.partial(fn, **bad), x, w, b, arch=arch)
    with pytest.raises(ValueError, match="block_n must be <= 256"):
        lowered(functools.partial(fn, block_n=512), x, w, b, arch="sm_90")
    with pytest.raises(ValueError, match="needs an sm_90 GPU"):
        lowered(functools.partial(fn, impl="mosaic_gpu"), x, w, b, arch="sm_80")


def test_jit_default_interpret_leading_axes_and_empty_operands():
    x, w, b = _inputs(6, 24, 10, F16, F32)
    f = functools.partial(fp16_matmul, activation="relu")  # interpret=None: interpret mode on a CPU
    y = jax.jit(f)(x, w, b)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(f(x, w, b)))
    # (..., K) inputs are flattened into M and restored; (K,) gives (N,).
    y3 = fp16_matmul(x.reshape(2, 3, 24), w, b, activation="relu", impl="reference")
    assert y3.shape == (2, 3, 10)
    y2 = fp16_matmul(x, w, b, activation="relu", impl="reference")
    np.testing.assert_array_equal(np.asarray(y3.reshape(6, 10)), np.asarray(y2))
    assert fp16_matmul(x[0], w, b, impl="reference").shape == (10,)
    # Empty operands: no kernel launch; K = 0 gives act(b).
    assert fp16_matmul(x[:0], w, b, interpret=INTERPRET).shape == (0, 10)
    y0 = fp16_matmul(x[:, :0], w[:0], b, activation="relu", out_dtype=F32, interpret=INTERPRET)
    np.testing.assert_array_equal(np.asarray(y0), np.broadcast_to(np.maximum(np.asarray(b), 0), (6, 10)))


def test_bad_inputs_raise_clear_errors():
    x, w, b = _inputs(4, 16, 8, F16, F32)
    cases = [
        ({"x": x[0, 0]}, "scalar"),
        ({"w": w[0]}, "w must be a matrix"),
        ({"w": w[None]}, "w must be a matrix"),
        ({"w": w[:8]}, "Contraction sizes differ"),
        ({"x": x.astype(jnp.int8)}, "x must have dtype"),
        ({"x": x.astype(F32), "w": w.astype(F32)}, "x must have dtype"),
        ({"w": w.astype(BF16)}, "same dtype"),
        ({"b": b[:4]}, "b must have shape"),
        ({"b": b.astype(jnp.int32)}, "b must have a float dtype"),
        ({"activation": "gelu"}, "activation must be one of"),
        ({"impl": "xla"}, "impl must be one of"),
        ({"out_dtype": jnp.int32}, "out_dtype must be one of"),
        ({"block_m": 48}, "block_m must be a positive power of two"),
    ]
    for overrides, match in cases:
        kw = {"x": x, "w": w, "b": b, "impl": "reference"} | overrides
        with pytest.raises(ValueError, match=match):
            fp16_matmul(kw.pop("x"), kw.pop("w"), kw.pop("b"), **kw)
