"""lpjax.nn.Dense: identical to flax's Dense with matmul_impl="xla"; the kernels behind a policy; clear errors."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax.nn import MLP, Dense, policy_dense
from lpjax.precision import Policy, get_policy


@pytest.mark.parametrize("policy", ["fp32", "fp16", "bf16", "mixed_fp16"])
def test_xla_impl_is_flax_dense(policy):
    """Same parameters, same outputs, bit for bit: lpjax's Dense can replace flax's without changing a run."""
    p = get_policy(policy)
    x = jax.random.normal(jax.random.key(0), (5, 3, 17))
    ours, theirs = Dense(9, p), nn.Dense(9, dtype=p.compute_dtype, param_dtype=p.param_dtype)
    params = ours.init(jax.random.key(1), x)
    assert jax.tree.structure(params) == jax.tree.structure(theirs.init(jax.random.key(1), x))
    assert jax.tree.all(
        jax.tree.map(
            lambda a, b: a.dtype == b.dtype and bool(jnp.all(a == b)), params, theirs.init(jax.random.key(1), x)
        )
    )
    y = ours.apply(params, x)
    assert y.shape == (5, 3, 9) and y.dtype == p.compute_dtype
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(theirs.apply(params, x), np.float32))


def test_mlp_keeps_flax_parameter_names():
    """Checkpoints of earlier runs (flax Dense layers named Dense_i) still load into the MLP."""
    params = MLP((8, 8), 2).init(jax.random.key(0), jnp.ones((1, 3)))["params"]
    assert sorted(params) == ["Dense_0", "Dense_1", "Dense_2"]
    assert sorted(params["Dense_0"]) == ["bias", "kernel"]


@pytest.mark.parametrize("activation", ["none", "relu", "elu", "tanh"])
@pytest.mark.parametrize("compute", ["float16", "bfloat16"])
def test_half_kernel_follows_the_policy(compute, activation):
    """matmul_impl="reference"/"pallas" route a half-precision policy to lpjax.kernels.fp16_matmul, fused activation
    included, and agree with the XLA path to the rounding of the compute dtype."""
    policy = Policy("float32", compute, "float32")
    x = jax.random.normal(jax.random.key(0), (2, 6, 40))
    layer = Dense(24, policy, activation=activation)
    params = layer.init(jax.random.key(1), x)
    xla = np.asarray(layer.apply(params, x), np.float32)
    ulp = float(jnp.finfo(policy.compute_dtype).eps)
    for impl in ("reference", "pallas"):
        y = Dense(24, policy, impl, activation=activation).apply(params, x)
        assert y.shape == (2, 6, 24) and y.dtype == policy.compute_dtype
        # XLA rounds x @ w to the compute dtype before the bias and activation; the kernel rounds once at the end
        np.testing.assert_allclose(np.asarray(y, np.float32), xla, rtol=4 * ulp, atol=4 * ulp * np.abs(xla).max())


def test_fp8_policy_runs_blockwise_w8a8():
    """The "fp8" policy quantizes the GEMM (error well above bf16 rounding, bounded by E4M3's 3-bit mantissa)."""
    policy = get_policy("fp8")
    x = jax.random.normal(jax.random.key(0), (4, 300))
    layer = Dense(200, policy)
    params = layer.init(jax.random.key(1), x)
    y = layer.apply(params, x)
    assert y.dtype == jnp.bfloat16 and y.shape == (4, 200)
    kernel, bias = params["params"]["kernel"], params["params"]["bias"]
    exact = np.asarray(x @ kernel + bias, np.float64)
    err = np.abs(np.asarray(y, np.float64) - exact).mean() / np.abs(exact).mean()
    assert 1e-3 < err < 0.06
    pallas = Dense(200, policy, "pallas").apply(params, x)
    np.testing.assert_allclose(np.asarray(pallas, np.float32), np.asarray(y, np.float32), rtol=1e-2, atol=1e-2)


def test_fp8_dense_trains_straight_through():
    """Gradients of an fp8 layer are the straight-through ones: close to the float32 layer's."""
    x = jax.random.normal(jax.random.key(0), (8, 128))
    layer8, layer32 = Dense(128, "fp8"), Dense(128, "fp32")
    params = layer32.init(jax.random.key(1), x)

    def loss(layer):
        return lambda p: jnp.mean(jnp.square(layer.apply(p, x).astype(jnp.float32) - 1.0))

    g8, g32 = jax.grad(loss(layer8))(params), jax.grad(loss(layer32))(params)
    for a, b in zip(jax.tree.leaves(g8), jax.tree.leaves(g32)):
        assert a.dtype == b.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(a)))
        assert float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b)) < 0.1


def test_jit_and_functional_form_agree():
    x, w, b = jnp.ones((3, 16)), jnp.full((16, 8), 0.5), jnp.arange(8.0)
    f = jax.jit(lambda x, w, b: policy_dense(x, w, b, policy="fp32", activation="relu"))
    np.testing.assert_array_equal(f(x, w, b), jax.nn.relu(x @ w + b))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(matmul_impl="triton"), "matmul_impl must be one of"),
        (dict(activation="gelu"), "activation must be one of"),
        (dict(matmul_impl="pallas"), "matmul dtype is float32"),
        (dict(policy="params=float32,compute=float32,matmul=float8_e5m2"), "No dense matmul"),
    ],
)
def test_bad_options_raise(kwargs, match):
    args = dict(policy="fp32") | kwargs
    with pytest.raises(ValueError, match=match):
        policy_dense(jnp.ones((2, 4)), jnp.ones((4, 3)), None, **args)


def test_relu_gradient_is_jax_relus_and_its_only_residual_is_its_output():
    from lpjax.nn.dense import relu

    x = jnp.asarray([-2.0, -0.0, 0.0, 1e-8, 3.0], jnp.float32)
    np.testing.assert_array_equal(np.asarray(relu(x)), np.asarray(jax.nn.relu(x)))
    for dtype in (jnp.float32, jnp.float16):
        xs = x.astype(dtype)
        np.testing.assert_array_equal(
            np.asarray(jax.grad(lambda v: jnp.sum(relu(v) * 3))(xs)),
            np.asarray(jax.grad(lambda v: jnp.sum(jax.nn.relu(v) * 3))(xs)),
        )
    w = jnp.ones((5, 4), jnp.float32)
    _, backward = jax.vjp(lambda v: relu(v) @ w, x)
    residual_shapes = [(leaf.shape, leaf.dtype) for leaf in jax.tree.leaves(backward)]
    assert not any(dtype == jnp.bool_ for _, dtype in residual_shapes)  # jax.nn.relu keeps a mask
    _, plain = jax.vjp(lambda v: jax.nn.relu(v) @ w, x)
    assert sum(leaf.nbytes for leaf in jax.tree.leaves(backward)) < sum(leaf.nbytes for leaf in jax.tree.leaves(plain))
