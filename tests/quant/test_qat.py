"""QAT of lpjax.quant.qat: fake quantization is D(Q(x)) forward and the identity backward (straight-through), and
the quantization delay switches it on at ``step >= delay``, also with a traced step under ``jit``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax import quant


def _x(seed=0, shape=(12, 7)):
    return jax.random.normal(jax.random.key(seed), shape) * jnp.logspace(-1, 1, shape[-1]) + 0.3


def _params():
    keys = jax.random.split(jax.random.key(1), 3)
    return {
        "params": {
            "Dense_0": {"kernel": jax.random.normal(keys[0], (5, 8)), "bias": jnp.full(8, 0.1)},
            "Dense_1": {"kernel": jax.random.normal(keys[1], (8, 3)), "bias": jax.random.normal(keys[2], (3,))},
        }
    }


def _apply(params, obs):
    p = params["params"]
    h = jnp.tanh(obs @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"])
    return h @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"]


def _loss(params, obs, target):
    return jnp.mean(jnp.square(_apply(params, obs) - target))


OBS = jax.random.normal(jax.random.key(2), (16, 5))
TARGET = jax.random.normal(jax.random.key(3), (16, 3))


def _assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("bits, axis", [(2, None), (4, -1), (8, None), (8, 0), (16, -1)])
def test_forward_is_dequantize_of_quantize(bits, axis):
    x = _x()
    expected = quant.uniform_dequantize(*quant.uniform_quantize(x, bits, axis))
    np.testing.assert_array_equal(np.asarray(quant.fake_quantize(x, bits, axis)), np.asarray(expected))
    np.testing.assert_array_equal(
        np.asarray(jax.jit(quant.fake_quantize, static_argnums=(1, 2))(x, bits, axis)), np.asarray(expected)
    )


def test_dtype_is_preserved():
    x = _x().astype(jnp.bfloat16)
    y = quant.fake_quantize(x, 4)
    assert y.dtype == jnp.bfloat16 and y.shape == x.shape
    assert jax.grad(lambda v: jnp.sum(quant.fake_quantize(v, 4).astype(jnp.float32)))(x).dtype == jnp.bfloat16


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_gradient_is_straight_through(bits):
    x = _x(1)
    # A linear loss: d/dx sum(c * fq(x)) = c exactly, as without fake quantization (no clipping anywhere).
    c = jax.random.normal(jax.random.key(4), x.shape)
    grad = jax.grad(lambda v: jnp.sum(c * quant.fake_quantize(v, bits)))(x)
    np.testing.assert_array_equal(np.asarray(grad), np.asarray(c))

    # A nonlinear loss: the chain rule stops at fq, d/dx L(fq(x)) = L'(fq(x)) (the STE), under jit too.
    def loss(v):
        return jnp.sum(jnp.sin(v) * v)

    q = quant.fake_quantize(x, bits, -1)
    for grad_fn in (
        jax.grad(lambda v: loss(quant.fake_quantize(v, bits, -1))),
        jax.jit(jax.grad(lambda v: loss(quant.fake_quantize(v, bits, -1)))),
    ):
        np.testing.assert_allclose(np.asarray(grad_fn(x)), np.asarray(jax.grad(loss)(q)), rtol=1e-6)
    # Forward mode agrees: the tangent passes through unchanged.
    _, tangent = jax.jvp(lambda v: quant.fake_quantize(v, bits), (x,), (c,))
    np.testing.assert_array_equal(np.asarray(tangent), np.asarray(c))


def test_fake_quantize_params_quantizes_weights_only():
    params = _params()
    q = quant.fake_quantize_params(params, 4, step=5, delay=0)
    for name in ("Dense_0", "Dense_1"):
        kernel = params["params"][name]["kernel"]
        np.testing.assert_array_equal(
            np.asarray(q["params"][name]["kernel"]), np.asarray(quant.fake_quantize(kernel, 4))
        )
        assert q["params"][name]["bias"] is params["params"][name]["bias"]
    per_channel = quant.fake_quantize_params(params, 4, step=5, delay=0, per_channel=True)
    kernel = params["params"]["Dense_0"]["kernel"]
    np.testing.assert_array_equal(
        np.asarray(per_channel["params"]["Dense_0"]["kernel"]), np.asarray(quant.fake_quantize(kernel, 4, -1))
    )


def test_delay_is_respected_with_python_ints():
    params = _params()
    assert quant.fake_quantize_params(params, 4, step=9, delay=10) is params
    quantized = quant.fake_quantize_params(params, 4, step=10, delay=10)
    assert not np.array_equal(
        np.asarray(quantized["params"]["Dense_0"]["kernel"]), np.asarray(params["params"]["Dense_0"]["kernel"])
    )


def test_delay_under_jit_with_a_traced_step_and_straight_through_gradient():
    params = _params()
    traces = []

    @jax.jit
    def grads(params, step):
        traces.append(1)

        def loss(p):
            return _loss(quant.fake_quantize_params(p, 4, step, delay=100), OBS, TARGET)

        return jax.grad(loss)(params), quant.fake_quantize_params(params, 4, step, delay=100)

    fq = quant.fake_quantize_params(params, 4, step=0, delay=0)
    for step, expected_params in ((0, params), (99, params), (100, fq), (12345, fq)):
        grad, seen = grads(params, jnp.asarray(step, jnp.int32))
        _assert_trees_equal(seen, expected_params)
        # Straight-through: the gradient is that of the loss at the parameters the forward pass saw.
        expected_grad = jax.grad(_loss)(expected_params, OBS, TARGET)
        for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(expected_grad)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)  # jit vs eager sums
    assert len(traces) == 1  # one compilation for every step: the switch is inside the graph

    traced_delay = jax.jit(lambda p, s, d: quant.fake_quantize_params(p, 4, s, d))
    _assert_trees_equal(traced_delay(params, jnp.int32(3), jnp.int32(4)), params)
    _assert_trees_equal(traced_delay(params, jnp.int32(4), jnp.int32(4)), fq)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(bits=1, step=0, delay=0), "bits"),
        (dict(bits=8.0, step=0, delay=0), "bits"),
        (dict(bits=8, step=0, delay=-1), "delay must be >= 0"),
        (dict(bits=8, step=1.5, delay=0), "step must be"),
        (dict(bits=8, step=jnp.float32(1.0), delay=0), "step must be"),
        (dict(bits=8, step=0, delay="5"), "delay must"),
        (dict(bits=8, step=jnp.arange(3), delay=0), "step must be"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        quant.fake_quantize_params(_params(), **kwargs)


def test_bad_fake_quantize_arguments_raise():
    with pytest.raises(ValueError, match="bits"):
        quant.fake_quantize(_x(), 17)
    with pytest.raises(ValueError, match="floating dtype"):
        quant.fake_quantize(jnp.arange(3), 8)
