"""lpjax's kernels compiled on a real GPU at the sizes they are built for, and inside a SAC update.

The other kernel tests run these kernels on a GPU too (compiled there, :data:`tests.kernels.helpers.INTERPRET`),
but at the small shapes an interpreter affords. Here each Pallas backend the GPU runs meets full-size work: the
SAC layer (1024 x 1024, batch 1024), an LLM decode step (16 tokens, 4096 x 4096) and a ragged shape that pads
every axis, on fresh random data per case. Bounds (``u32 = 2^-24``, ``|x| @ |w|`` the sum of magnitudes):

* ``fp16_matmul`` with a float32 output: the products are exact in float32 (16-bit significands), so kernel and
  reference differ only in the order of the float32 sums, at most ``2 K u32 (|x| @ |w|)`` per element;
* ``fp8_blockwise_matmul``: both quantize alike and scale each 128-slice's exact partial sum alike; the same
  summation-order bound holds with the dequantized magnitudes;
* ``fp8`` on Mosaic GPU also: Hopper's fp8 tensor cores' accumulation error
  (:data:`tests.kernels.helpers.FP8_TENSOR_CORE_ERR`);
* ``int8_matmul``: the int32 sums are exact; the two scale multiplications and the bias addition in float32 add
  a few ulps of ``|ref| + 2 |b|``.

The fp8 kernels are checked against the definition in float64 on the codes and scales quantized on the GPU:
XLA's own fp8 dot, which the reference calls, may run on the GPU's fp8 tensor cores.

They run in ``make test-gpu`` only (marker ``gpu``): on a machine without a GPU the first test fails.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax import quant
from lpjax.agents import sac
from lpjax.kernels import fp8_blockwise_matmul, fp16_matmul, int8_matmul
from lpjax.methods import PrecisionMethods
from tests.kernels.helpers import ON_GPU, backend_params, fp8_tensor_core_err

pytestmark = pytest.mark.gpu

U32 = 2.0**-24
SHAPES = {"sac": (1024, 1024, 1024), "decode": (16, 4096, 4096), "ragged": (1000, 1100, 900)}
CASES = [(kernel, shape) for kernel in ("fp16", "fp8", "int8") for shape in SHAPES]


def test_a_gpu_is_present():
    assert ON_GPU, f"the gpu tier needs a GPU; JAX's default backend is {jax.default_backend()!r}"


def _operands(m, k, n, seed):
    kx, kw, kb = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(kx, (m, k), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(kw, (k, n), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
    return x, w, jax.random.normal(kb, (n,), jnp.float32)


def _dequantized(x, w):
    """The fp8 operands the kernel multiplies, quantized on the GPU as the kernel does, dequantized in float64."""
    qa, sa = quant.quantize_fp8_per_token_group(x)
    qw = quant.quantize_fp8_blockwise(w)
    a = np.asarray(qa, np.float64) * np.repeat(np.asarray(sa, np.float64), 128, axis=1)[:, : x.shape[1]]
    scales = np.repeat(np.repeat(np.asarray(qw.scales, np.float64), 128, axis=0), 128, axis=1)
    return a, np.asarray(qw.codes, np.float64) * scales[: w.shape[0], : w.shape[1]]


KERNELS = {
    "fp16": lambda x, w, b, impl: fp16_matmul(x, w, b, out_dtype=jnp.float32, impl=impl),
    "fp8": lambda x, w, b, impl: fp8_blockwise_matmul(x, w, bias=b, out_dtype=jnp.float32, impl=impl),
    "int8": lambda x, w, b, impl: int8_matmul(x, w, bias=b, out_dtype=jnp.float32, impl=impl),
}


@pytest.mark.parametrize(
    "impl, kernel, shape",
    backend_params("mosaic_gpu", CASES, eight_bit=True) + backend_params("triton", CASES),
)
def test_kernel_matches_reference_at_full_size(impl, kernel, shape):
    m, k, n = SHAPES[shape]
    x, w, b = _operands(m, k, n, seed=hash((impl, kernel, shape)) % 2**31)
    out = np.asarray(jax.jit(functools.partial(KERNELS[kernel], impl=impl))(x, w, b), np.float64)
    assert out.shape == (m, n)
    assert np.all(np.isfinite(out))
    b64 = np.asarray(b, np.float64)
    if kernel == "fp8":  # the definition in float64 (the reference's XLA dot may run on the fp8 tensor cores)
        a, w8 = _dequantized(x, w)
        ref, mag = a @ w8 + b64, np.abs(a) @ np.abs(w8)
        bound = 2 * k * U32 * mag + 2 * U32 * np.abs(ref) + fp8_tensor_core_err(impl) * mag
    else:
        ref = np.asarray(jax.jit(functools.partial(KERNELS[kernel], impl="reference"))(x, w, b), np.float64)
        if kernel == "int8":  # two float32 products and a sum, each rounded, bounded by |ref| + 2 |b|
            bound = 2 * 4 * U32 * (np.abs(ref) + 2 * np.abs(b64))
        else:
            mag = np.abs(np.asarray(x, np.float64)) @ np.abs(np.asarray(w, np.float64))
            bound = 2 * k * U32 * mag + 2 * U32 * np.abs(ref)
    err = np.abs(out - ref)
    assert np.all(err <= bound), f"max err {err.max():.3g}, max err/bound {np.max(err / bound):.3g}"
    # Far below the signal: a wrong tile, a missed scale or a skipped slice would be of the order of |ref|.
    assert np.linalg.norm(err) < 1e-2 * np.linalg.norm(ref)


@pytest.mark.parametrize("impl", backend_params("mosaic_gpu") + backend_params("triton"))
def test_fp16_matmul_gradients_at_the_sac_size(impl):
    """The custom VJP's two backward kernels (dx, dw) against the reference's, relu epilogue, bf16 operands."""
    m, k, n = SHAPES["sac"]
    x, w, b = _operands(m, k, n, seed=7)
    cot = jax.random.normal(jax.random.key(8), (m, n), jnp.float32)

    def grads(impl):
        loss = lambda x, w, b: jnp.sum(cot * fp16_matmul(x, w, b, activation="relu", impl=impl).astype(jnp.float32))
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, w, b)

    for got, ref in zip(grads(impl), grads("reference")):
        got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
        assert np.all(np.isfinite(got))
        # Both round the same float32 sums (different order) to bfloat16: within one bf16 ulp, bar sums that
        # cancel to far below their terms.
        scale = np.abs(ref) + 1e-3 * np.abs(ref).max()
        assert np.max(np.abs(got - ref) / scale) <= 2.0**-7


def _sac_update(policy, methods, matmul_impl):
    config = sac.SACConfig(policy=policy, methods=methods, matmul_impl=matmul_impl, batch_size=1024)
    obs_dim, action_dim = 24, 6
    agent = sac.init(jax.random.key(0), jnp.zeros((obs_dim,)), action_dim, config)
    keys = jax.random.split(jax.random.key(1), 3)
    batch = {
        "obs": jax.random.normal(keys[0], (1024, obs_dim)),
        "action": jnp.tanh(jax.random.normal(keys[1], (1024, action_dim))),
        "reward": jax.random.uniform(keys[2], (1024,)),
        "discount": jnp.full((1024,), 0.99),
        "next_obs": jax.random.normal(keys[0], (1024, obs_dim)) * 0.9,
    }
    update = jax.jit(sac.update)
    for _ in range(3):
        agent, metrics = update(agent, batch)
    return jax.device_get(metrics)


@pytest.mark.parametrize(
    "policy, methods",
    [("fp16", PrecisionMethods.paper()), ("fp8", PrecisionMethods())],
    ids=["fp16_paper_methods", "fp8"],
)
def test_sac_update_with_pallas_kernels_matches_xla(policy, methods):
    """The paper's SAC (1024 x 1024, batch 1024) takes three updates with ``matmul_impl="pallas"`` (the kernels
    inside the actor and critics, forward and backward) and with ``"xla"``: the same losses to rounding."""
    pallas, xla = _sac_update(policy, methods, "pallas"), _sac_update(policy, methods, "xla")
    for name in ("critic_loss", "actor_loss", "q", "entropy"):
        assert np.isfinite(pallas[name]), name
        np.testing.assert_allclose(pallas[name], xla[name], rtol=2e-2, atol=1e-3, err_msg=name)
