"""lpjax.nn modules: dtypes follow the precision policy; the encoder's float16 fixes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax import nn as lnn
from lpjax.precision import get_policy


@pytest.mark.parametrize("policy", ["fp32", "fp16", "bf16", "mixed_fp16"])
def test_mlp_params_and_outputs_follow_the_policy(policy):
    mlp = lnn.MLP((8, 8), 3, policy)
    params = mlp.init(jax.random.key(0), jnp.ones((2, 4)))
    out = mlp.apply(params, jnp.ones((2, 4)))
    p = get_policy(policy)
    assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {p.param_dtype}
    assert out.dtype == p.compute_dtype and out.shape == (2, 3)


def test_actor_log_std_is_within_bounds_and_critic_has_two_heads():
    actor = lnn.TanhGaussianActor((8,), 3, (-5.0, 2.0))
    obs = jnp.asarray(np.random.default_rng(0).normal(size=(64, 4)) * 100, jnp.float32)
    params = actor.init(jax.random.key(0), obs)
    mean, log_std = actor.apply(params, obs)
    assert mean.shape == log_std.shape == (64, 3)
    assert float(jnp.min(log_std)) >= -5.0 and float(jnp.max(log_std)) <= 2.0
    critic = lnn.DoubleCritic((8,))
    cp = critic.init(jax.random.key(1), obs, mean)
    assert critic.apply(cp, obs, mean).shape == (2, 64)
    assert set(cp["params"]) == {"q1", "q2"}


def test_standardized_dense_uses_a_zero_mean_unit_variance_kernel():
    layer = lnn.StandardizedDense(4)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 10)), jnp.float32)
    params = layer.init(jax.random.key(0), x)
    params = jax.tree.map(lambda p: p * 1000.0 + 7.0, params)  # any scale/shift of the raw kernel...
    out = layer.apply(params, x)
    kernel = params["params"]["kernel"]
    standardized = (kernel - kernel.mean(0)) / jnp.sqrt(kernel.var(0) + 1e-5)
    np.testing.assert_allclose(np.asarray(out), np.asarray(x @ standardized + params["params"]["bias"]), rtol=1e-4)


def test_pixel_encoder_clips_before_layernorm_and_is_finite_in_fp16():
    encoder = lnn.PixelEncoder(policy="fp16")
    images = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 84, 84, 9)), jnp.uint8)
    params = encoder.init(jax.random.key(0), images)
    out = encoder.apply(params, images)
    assert out.shape == (2, 50) and out.dtype == jnp.float16 and bool(jnp.all(jnp.isfinite(out)))
    assert params["params"]["linear"]["kernel"].shape == (35 * 35 * 32, 50)


def _fp8_casts(fn, *args) -> int:
    """How many times ``fn``'s jaxpr quantizes to float8_e4m3fn (weights and activations of each fp8 GEMM)."""
    return str(jax.make_jaxpr(fn)(*args)).count("float8_e4m3fn")


def test_high_precision_ends_keep_the_first_and_last_layers_out_of_fp8():
    """With an fp8 policy every layer's GEMM is fp8; with high_precision_ends only the hidden-to-hidden ones are, the
    parameters are the same, and the output is closer to the float32 network's."""
    x = jax.random.normal(jax.random.key(0), (512, 6))
    params = lnn.MLP((256, 256), 4, "fp32").init(jax.random.key(1), x)
    reference = lnn.MLP((256, 256), 4, "fp32").apply(params, x)
    hidden = jnp.ones((512, 256))
    dense = lnn.Dense(256, "fp8")
    one_gemm = _fp8_casts(dense.apply, dense.init(jax.random.key(2), hidden), hidden)
    assert one_gemm > 0
    errors, casts = {}, {}
    for ends in (False, True):
        mlp = lnn.MLP((256, 256), 4, "fp8", high_precision_ends=ends)
        assert jax.tree.structure(mlp.init(jax.random.key(1), x)) == jax.tree.structure(params)
        casts[ends] = _fp8_casts(mlp.apply, params, x)
        out = mlp.apply(params, x).astype(jnp.float32)
        errors[ends] = float(jnp.sqrt(jnp.mean((out - reference) ** 2)) / jnp.std(reference))
    assert casts[True] == one_gemm < casts[False]  # only the 256 x 256 layer quantizes
    assert errors[True] < 0.8 * errors[False]
    same = lnn.MLP((256, 256), 4, "bf16", high_precision_ends=True).apply(params, x)
    np.testing.assert_array_equal(np.asarray(same), np.asarray(lnn.MLP((256, 256), 4, "bf16").apply(params, x)))
