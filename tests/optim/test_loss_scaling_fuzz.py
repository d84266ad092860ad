"""Fuzz: over the whole float16 and bfloat16 range, a step is applied with finite results or skipped untouched.

Gradients are drawn as raw 16-bit patterns, so every value occurs: zeros, subnormals, normals up to the largest
finite value, infinities and nans, at any position. For each drawn sequence of steps, every step must be either

* applied: parameters and the whole optimizer state finite, skipped-step count unchanged; or
* skipped: parameters and the inner and Kahan states bit-identical, the count up by one, the scale backed off.

hypothesis runs derandomized (a fixed sequence of examples), so the test cannot fail by chance.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpjax import optim

SIZE = 12
STEPS = 4


def _bits(tree):
    return [np.asarray(x).tobytes() for x in jax.tree.leaves(tree)]


def _finite(tree) -> bool:
    return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact))


@functools.cache
def _optimizer(dtype_name: str, init_scale: float, kahan: bool, inner: str):
    make = {
        "hadam": lambda: optim.hadam(1e-3),
        "adam": lambda: optim.inject_hyperparams(optax.adam)(learning_rate=1e-3),
        "sgd": lambda: optax.sgd(1e-3, momentum=0.9),
    }[inner]
    scaler = optim.compound_loss_scaling(make(), init_scale=init_scale, growth_interval=2)
    tx = optax.chain(scaler, optim.kahan_summation()) if kahan else optax.chain(scaler)
    return tx, jax.jit(tx.update)


def _check_steps(dtype, patterns, params_seed, init_scale, kahan, inner):
    tx, update = _optimizer(np.dtype(dtype).name, init_scale, kahan, inner)
    params = jnp.asarray(np.random.default_rng(params_seed).normal(0, 1, SIZE), dtype)
    state = tx.init(params)
    for step in range(STEPS):
        grads = jax.lax.bitcast_convert_type(jnp.asarray(patterns[step], jnp.uint16), dtype)
        updates, new_state = update(grads, state, params)
        new_params = optax.apply_updates(params, updates)
        scaler, new_scaler = state[0], new_state[0]
        if int(new_scaler.skipped_steps) == int(scaler.skipped_steps):
            assert bool(jnp.all(jnp.isfinite(grads))) or inner != "hadam"
            assert _finite(new_params) and _finite(new_state), (step, grads)
        else:
            assert int(new_scaler.skipped_steps) == int(scaler.skipped_steps) + 1
            assert _bits(new_params) == _bits(params)
            assert _bits(new_scaler.inner_state) == _bits(scaler.inner_state)
            assert _bits(new_state[1:]) == _bits(state[1:])
            assert float(new_scaler.scale) in (float(scaler.scale) / 2, float(scaler.scale))
            assert float(new_scaler.scale) >= 1.0
        if not bool(jnp.all(jnp.isfinite(grads))):
            assert int(new_scaler.skipped_steps) == int(scaler.skipped_steps) + 1
        params, state = new_params, new_state


def _steps_of(values):
    return st.lists(st.lists(values, min_size=SIZE, max_size=SIZE), min_size=STEPS, max_size=STEPS)


_ANY = st.integers(0, 2**16 - 1)
# Mostly finite values (the exponent field below all ones), so that applied steps are exercised as much as skips.
_FINITE = {
    jnp.float16: st.one_of(st.integers(0, 0x7BFF), st.integers(0x8000, 0xFBFF)),
    jnp.bfloat16: st.one_of(st.integers(0, 0x7F7F), st.integers(0x8000, 0xFF7F)),
}


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=["float16", "bfloat16"])
@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    data=st.data(),
    params_seed=st.integers(0, 3),
    init_scale=st.sampled_from([1.0, 1e4, 2.0**16]),
    kahan=st.booleans(),
    inner=st.sampled_from(["hadam", "adam", "sgd"]),
)
def test_steps_are_applied_finite_or_skipped_untouched(dtype, data, params_seed, init_scale, kahan, inner):
    patterns = data.draw(st.one_of(_steps_of(_ANY), _steps_of(_FINITE[dtype])), label="bit patterns")
    _check_steps(dtype, patterns, params_seed, init_scale, kahan, inner)
