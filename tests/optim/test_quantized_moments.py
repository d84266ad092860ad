"""Blockwise 8-bit moments: exact at block size 1, unbiased stochastic codes, hAdam converging to its
float32-moment self as blocks get finer, and the loss scaler's change of unit exact with quantized moments."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lpjax import optim
from lpjax.methods import PrecisionMethods, method_optimizer, moment_dtype_of
from lpjax.optim.quantized_moments import QUANTIZED_MOMENT_DTYPES, BlockQuantized, dequantize, quantize, zeros
from tests.optim.helpers import random_tree, run_steps

CODES = list(QUANTIZED_MOMENT_DTYPES)


@pytest.mark.parametrize("code_dtype", CODES)
def test_block_size_one_is_exact(code_dtype):
    x = jnp.asarray(np.random.default_rng(0).normal(size=(7, 5)) * 10.0 ** np.arange(-3, 2)[None], jnp.float32)
    q = quantize(x, code_dtype, block_size=1)
    np.testing.assert_array_equal(np.asarray(dequantize(q)), np.asarray(x))


@pytest.mark.parametrize("code_dtype", CODES)
def test_layout_shapes_and_the_block_maximum_is_exact(code_dtype):
    x = jnp.asarray(np.random.default_rng(1).normal(size=(3, 100)), jnp.float32)
    q = quantize(x, code_dtype, block_size=64)
    assert q.codes.shape == (5, 64) and q.scales.shape == (5,) and q.shape == (3, 100)
    assert q.codes.dtype == np.dtype(code_dtype) and q.scales.dtype == np.float32
    flat = np.abs(np.asarray(x).ravel())
    np.testing.assert_array_equal(np.asarray(q.scales[:-1]), flat[:256].reshape(4, 64).max(1))
    small = quantize(jnp.ones((3,)), code_dtype, block_size=64)  # a tensor smaller than a block: one block
    assert small.codes.shape == (1, 3)
    np.testing.assert_array_equal(np.asarray(dequantize(zeros((2, 3), code_dtype, 4))), np.zeros((2, 3)))


@pytest.mark.parametrize("code_dtype", CODES)
def test_stochastic_codes_are_unbiased(code_dtype):
    """Each element's samples take the two codes around it; their mean is within 5 standard errors of x."""
    x = jnp.asarray(np.random.default_rng(2).normal(size=(256,)), jnp.float32)
    n = 4000
    keys = jax.random.split(jax.random.PRNGKey(0), n)
    draw = lambda k: dequantize(quantize(x, code_dtype, 256, bits=jax.random.bits(k, x.shape, jnp.uint32)))
    samples = np.asarray(jax.jit(jax.vmap(draw))(keys))
    samples = samples.astype(np.float64)
    lo, hi, x = samples.min(0), samples.max(0), np.asarray(x, np.float64)
    between = hi > lo  # both neighbours drawn (elements within a few 1/n of a code may draw one only)
    assert between.mean() > 0.9
    assert np.all((lo <= x + 1e-6 * np.abs(x)) & (x - 1e-6 * np.abs(x) <= hi))
    p = np.clip((x - lo) / np.where(between, hi - lo, 1), 0, 1)
    standard_error = (hi - lo) * np.sqrt(p * (1 - p) / n)
    error = np.abs(samples.mean(0) - x)
    assert np.all(error[between] <= 5 * standard_error[between] + 1e-6 * np.abs(x[between]))


@pytest.mark.parametrize("code_dtype", CODES)
def test_keep_nonzero_never_stores_a_positive_value_as_zero(code_dtype):
    x = jnp.asarray(np.concatenate([[1.0], np.full(63, 1e-12)]), jnp.float32)
    for bits in (None, jax.random.bits(jax.random.PRNGKey(3), x.shape, jnp.uint32)):
        plain = np.asarray(dequantize(quantize(x, code_dtype, 64, bits=bits)))
        kept = np.asarray(dequantize(quantize(x, code_dtype, 64, bits=bits, keep_nonzero=True)))
        assert np.all(kept > 0)
        assert np.sum(plain == 0) > 0  # without it, the small values are lost


def _train(moment_dtype, block_size, steps=60, seed=0):
    params = {"w": jnp.ones((40, 30), jnp.float32), "b": jnp.zeros((30,), jnp.float32)}
    grads = [random_tree(seed + i, shapes=((40, 30), (30,))) for i in range(steps)]
    grads = [{"w": g["w0"], "b": g["w1"] * 1e-3} for g in grads]  # two scales of gradient
    tx = optim.hadam(1e-2, moment_dtype=moment_dtype, moment_block_size=block_size)
    return run_steps(tx, params, grads)[0]


@pytest.mark.slow
def test_hadam_with_8bit_moments_converges_to_hadam_as_blocks_get_finer():
    reference = _train(jnp.float32, 1)
    for code_dtype in CODES:
        exact = _train(code_dtype, 1)
        for name in reference:  # block size 1: float32 moments, the same optimizer
            np.testing.assert_allclose(np.asarray(exact[name]), np.asarray(reference[name]), rtol=0, atol=1e-6)
        moved = float(jnp.mean(jnp.abs(reference["w"] - 1.0)))
        errors = [float(jnp.mean(jnp.abs(_train(code_dtype, b)["w"] - reference["w"]))) for b in (2, 16, 256)]
        assert errors == sorted(errors), (code_dtype, errors)  # finer blocks, closer to hAdam
        assert errors[-1] < 0.25 * moved, (code_dtype, errors, moved)


def test_hadam_state_holds_8bit_codes_and_float32_scales():
    params = {"w": jnp.ones((1000,), jnp.float16)}
    state = optim.hadam(1e-3, moment_dtype=jnp.int8, moment_block_size=100).init(params)[0]
    assert isinstance(state.mu["w"], BlockQuantized) and isinstance(state.nu_sqrt["w"], BlockQuantized)
    nbytes = sum(x.nbytes for x in jax.tree.leaves((state.mu, state.nu_sqrt)))
    assert nbytes == 2 * (1000 + 4 * 10)


def test_the_loss_scalers_rescale_is_exact_with_quantized_moments():
    """compound_loss_scaling(hAdam with 8-bit moments) on scaled gradients, with the scale growing, backing off on
    an inf step and growing again, gives bit for bit the parameters of the same hAdam on the true gradients:
    codes are relative to their block's maximum, so power-of-two changes of unit leave them unchanged."""
    params = random_tree(0, jnp.float32)
    grads = [random_tree(10 + i, jnp.float32, scale=1e-2) for i in range(30)]
    for code_dtype in CODES:
        want, _, _ = run_steps(optim.hadam(1e-3, moment_dtype=code_dtype, moment_block_size=4), params, grads)
        inner = optim.hadam(1e-3, moment_dtype=code_dtype, moment_block_size=4)
        tx = optim.compound_loss_scaling(inner, init_scale=2.0**10, growth_interval=5)
        state = tx.init(params)
        got = params
        update = jax.jit(tx.update)
        scales = set()
        for i, g in enumerate(grads):
            if i == 12:  # an overflowing step: skipped, the scale halves
                bad = jax.tree.map(lambda x: x.at[0].set(jnp.inf), g)
                _, state = update(bad, state, got)
            scale = optim.loss_scale(state)
            scales.add(float(scale))
            updates, state = update(jax.tree.map(lambda x: x * scale, g), state, got)
            got = optax.apply_updates(got, updates)
        assert len(scales) >= 3
        for name in want:
            np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]))


def test_method_config_switch():
    assert moment_dtype_of("int8") == np.int8
    assert moment_dtype_of("fp8") == np.dtype(jnp.float8_e4m3fn)
    with pytest.raises(ValueError, match="moment_dtype also accepts 'int8'"):
        PrecisionMethods(moment_dtype="int9")
    with pytest.raises(ValueError, match="moment_block_size"):
        PrecisionMethods(moment_block_size=0)
    with pytest.raises(ValueError, match="needs hadam=True"):
        method_optimizer(1e-3, PrecisionMethods(moment_dtype="int8"))
    methods = PrecisionMethods(hadam=True, loss_scaling=True, moment_dtype="fp8", moment_block_size=32)
    params = {"w": jnp.ones((64,), jnp.float16)}
    tx = method_optimizer(1e-3, methods)
    state = tx.init(params)
    leaves = jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, BlockQuantized))
    moments = [x for x in leaves if isinstance(x, BlockQuantized)]
    assert len(moments) == 2 and all(m.codes.shape == (2, 32) for m in moments)
    grads = {"w": jnp.full((64,), 0.5, jnp.float16) * optim.loss_scale(state).astype(jnp.float16)}
    updates, _ = jax.jit(tx.update)(grads, state, params)
    assert np.all(np.asarray(updates["w"], np.float32) < 0)


def test_the_method_configs_default_block_size_is_the_transforms():
    """PrecisionMethods cannot import lpjax.optim (which reads it): the two defaults are kept equal here."""
    from lpjax.optim.quantized_moments import DEFAULT_BLOCK_SIZE

    assert PrecisionMethods().moment_block_size == DEFAULT_BLOCK_SIZE
