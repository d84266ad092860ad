"""Compound loss scaling: identity in float64, skip/backoff/growth semantics, moment rescaling, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lpjax import optim
from tests.optim.helpers import max_relative_error, random_tree, run_steps


def _injected_adam(lr, eps, dtype=jnp.float32):
    return optax.inject_hyperparams(optax.adam, hyperparam_dtype=dtype)(learning_rate=lr, eps=eps)


# eps is chosen large relative to the gradients so that a wrongly scaled eps changes the updates visibly.
@pytest.mark.parametrize("make_inner", [
    lambda: optim.hadam(1e-2, eps=0.05),
    lambda: _injected_adam(1e-2, 0.05, jnp.float64),
    lambda: optax.inject_hyperparams(optim.hadam)(learning_rate=1e-2, eps=0.05),
], ids=["hadam", "injected_optax_adam", "injected_hadam"])
def test_constant_scale_equals_unscaled_adam_in_float64(make_inner):
    with jax.enable_x64(True):
        params = random_tree(0, jnp.float64)
        grads = [random_tree(i, jnp.float64, scale=0.1) for i in range(100)]
        ref, _, _ = run_steps(optax.adam(1e-2, eps=0.05), params, grads)
        tx = optim.compound_loss_scaling(make_inner(), init_scale=1024.0, growth_interval=10 ** 6)
        got, state, _ = run_steps(tx, params, grads, loss_scale_fn=optim.loss_scale)
        assert float(optim.loss_scale(state)) == 1024.0
        assert max_relative_error(got, ref) < 1e-10


def test_changing_scale_equals_unscaled_adam_in_float64():
    # Growth every 7 finite steps and an injected overflow every 17 steps: the rescaled moments keep the updates
    # identical to Adam's.
    with jax.enable_x64(True):
        params = random_tree(0, jnp.float64)
        grads = [random_tree(i, jnp.float64, scale=0.1) for i in range(60)]
        ref, _, _ = run_steps(optax.adam(1e-2, eps=0.05), params, grads)
        tx = optim.compound_loss_scaling(optim.hadam(1e-2, eps=0.05), init_scale=100.0, growth_interval=7)
        update = jax.jit(tx.update)
        state = tx.init(params)
        got = params
        scales = []
        for i, g in enumerate(grads):
            if i % 17 == 5:  # an overflowing step is skipped, then the same gradient is retried at a lower scale
                bad = jax.tree.map(lambda x: x.at[(0,) * x.ndim].set(jnp.inf), g)
                updates, state = update(bad, state, got)
                got = optax.apply_updates(got, updates)
            scale = optim.loss_scale(state)
            scales.append(float(scale))
            updates, state = update(jax.tree.map(lambda x: x * scale, g), state, got)
            got = optax.apply_updates(got, updates)
        assert len(set(scales)) > 3, scales
        assert max_relative_error(got, ref) < 1e-10


def _bits(tree):
    return [np.asarray(x).view(np.uint8).tobytes() for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("bad", [jnp.inf, -jnp.inf, jnp.nan])
def test_nonfinite_gradients_skip_the_step_and_halve_the_scale(bad):
    params = random_tree(0, jnp.float16)
    tx = optim.compound_loss_scaling(optim.hadam(1e-3), init_scale=1024.0)
    update = jax.jit(tx.update)
    state = tx.init(params)
    for i in range(3):
        updates, state = update(random_tree(10 + i, jnp.float16, scale=10.0), state, params)
        params = optax.apply_updates(params, updates)
    before_params, before = params, state
    grads = random_tree(99, jnp.float16)
    grads["w1"] = grads["w1"].at[2].set(bad)
    updates, state = update(grads, state, params)
    params = optax.apply_updates(params, updates)

    assert _bits(params) == _bits(before_params)
    assert all(float(jnp.max(jnp.abs(u))) == 0.0 for u in jax.tree.leaves(updates))
    assert float(state.scale) == 512.0 and int(state.skipped_steps) == 1 and int(state.good_steps) == 0
    hadam_before, hadam_after = before.inner_state[0], state.inner_state[0]
    assert int(hadam_after.count) == int(hadam_before.count) == 3
    # The moments are the same numbers in units of the new scale: exactly half (power-of-two rescale).
    half = jnp.float16(0.5)
    assert _bits(hadam_after.mu) == _bits(jax.tree.map(lambda m: m * half, hadam_before.mu))
    assert _bits(hadam_after.nu_sqrt) == _bits(jax.tree.map(lambda w: w * half, hadam_before.nu_sqrt))
    assert float(hadam_after.eps_scale) == 512.0


def test_growth_happens_after_exactly_growth_interval_finite_steps():
    params = random_tree(0, jnp.float32)
    tx = optim.compound_loss_scaling(optim.hadam(1e-3), init_scale=8.0, growth_interval=5)
    update = jax.jit(tx.update)
    state = tx.init(params)
    history = []
    for i in range(12):
        grads = random_tree(i, jnp.float32)
        if i == 7:
            grads["w0"] = grads["w0"] * jnp.inf
        _, state = update(grads, state, params)
        history.append((float(state.scale), int(state.good_steps)))
    # Steps 1-4: counting; step 5 grows to 16 and resets; steps 6-7 count; step 8 (i=7) overflows: 8 and reset;
    # then 4 more finite steps do not reach the interval.
    assert history == [(8, 1), (8, 2), (8, 3), (8, 4), (16, 0), (16, 1), (16, 2), (8, 0),
                       (8, 1), (8, 2), (8, 3), (8, 4)]
    hadam = state.inner_state[0]
    assert float(hadam.eps_scale) == 8.0 and int(hadam.count) == 11


def test_growth_rescales_the_moments_by_the_growth_factor():
    params = random_tree(0, jnp.float32)
    tx = optim.compound_loss_scaling(optim.hadam(1e-3), init_scale=4.0, growth_interval=2)
    state = tx.init(params)
    _, state = tx.update(random_tree(1, jnp.float32), state, params)
    mu_before = state.inner_state[0].mu
    _, state = tx.update(random_tree(1, jnp.float32), state, params)  # same gradient: m moves then doubles
    expected = jax.tree.map(lambda m, g: 2.0 * (0.9 * m + 0.1 * g), mu_before, random_tree(1, jnp.float32))
    assert float(state.scale) == 8.0
    assert max_relative_error(state.inner_state[0].mu, expected) < 1e-6


def test_scale_never_goes_below_min_scale():
    params = random_tree(0, jnp.float32)
    tx = optim.compound_loss_scaling(optim.hadam(1e-3), init_scale=16.0, min_scale=2.0)
    state = tx.init(params)
    nan_grads = jax.tree.map(lambda x: x * jnp.nan, params)
    scales = []
    for _ in range(6):
        _, state = jax.jit(tx.update)(nan_grads, state, params)
        scales.append(float(state.scale))
    assert scales == [8.0, 4.0, 2.0, 2.0, 2.0, 2.0]
    assert float(state.inner_state[0].eps_scale) == 2.0
    assert int(state.skipped_steps) == 6


def test_growth_that_would_overflow_float16_moments_is_refused():
    params = jnp.ones((2,), jnp.float16)
    tx = optim.compound_loss_scaling(optim.hadam(1e-3, b1=0.0), init_scale=1.0, growth_interval=1)
    state = tx.init(params)
    # With b1 = 0, m = g = 60000 fits float16, but the doubled moment would not: the scale must stay at 1.
    updates, state = jax.jit(tx.update)(jnp.full((2,), 6e4, jnp.float16), state, params)
    assert float(state.scale) == 1.0
    assert bool(jnp.all(jnp.isfinite(state.inner_state[0].nu_sqrt)))
    assert bool(jnp.all(jnp.isfinite(updates)))
    assert int(state.skipped_steps) == 0


def test_float16_optax_adam_under_scaling_backs_off_instead_of_storing_inf():
    # Scaled gradients 1e4 * 0.05 = 500: Adam's v = g^2 overflows float16. The wrapper must not keep an infinite
    # second moment; it skips and lowers the scale until g^2 fits.
    params = jnp.ones((4,), jnp.float16)
    tx = optim.compound_loss_scaling(_injected_adam(1e-3, 1e-8))
    state = tx.init(params)
    update = jax.jit(tx.update)
    for _ in range(8):
        grads = jnp.full((4,), 0.05, jnp.float16) * optim.loss_scale(state).astype(jnp.float16)
        updates, state = update(grads, state, params)
    inner = state.inner_state.inner_state[0]
    assert bool(jnp.all(jnp.isfinite(inner.nu)))
    assert int(state.skipped_steps) >= 1 and float(state.scale) < 1e4
    assert bool(jnp.all(jnp.isfinite(updates))) and float(updates[0]) < 0


def test_state_dtypes_are_float32_scale_and_int32_counters_and_stable_under_updates():
    params = random_tree(0, jnp.float16)
    tx = optim.compound_loss_scaling(_injected_adam(1e-3, 1e-8))
    state = tx.init(params)
    assert state.scale.dtype == jnp.float32
    assert state.good_steps.dtype == jnp.int32 and state.skipped_steps.dtype == jnp.int32
    _, new_state = jax.jit(tx.update)(random_tree(1, jnp.float16, 1e-2), state, params)
    assert jax.tree.map(lambda x: x.dtype, new_state) == jax.tree.map(lambda x: x.dtype, state)
    injected = state.inner_state.hyperparams["eps"]
    assert injected.dtype == jnp.float32 and float(injected) == pytest.approx(1e-8 * 1e4)


def test_pytorch_amp_defaults_option():
    tx = optim.compound_loss_scaling(optim.hadam(1e-3), **optim.PYTORCH_AMP_DEFAULTS)
    state = tx.init(jnp.ones((2,)))
    assert float(optim.loss_scale(state)) == 65536.0
    assert optim.PYTORCH_AMP_DEFAULTS["growth_interval"] == 2000


@pytest.mark.parametrize("inner, message", [
    (optax.adam(1e-3), "keeps eps in a closure"),
    (optax.inject_hyperparams(optax.adam)(learning_rate=1e-3), "eps is 0 in float16"),
    (optax.sgd(1e-3), "found no ScaleByHAdamState or ScaleByAdamState"),
])
def test_unsupported_inner_transforms_raise_clear_errors(inner, message):
    with pytest.raises(ValueError, match=message):
        optim.compound_loss_scaling(inner).init(jnp.ones((2,), jnp.float16))


@pytest.mark.parametrize("kwargs", [
    dict(init_scale=0.0), dict(min_scale=4.0, init_scale=2.0), dict(growth_factor=1.0),
    dict(backoff_factor=1.0), dict(growth_interval=0), dict(growth_interval=2.5),
])
def test_bad_arguments_raise(kwargs):
    with pytest.raises(ValueError):
        optim.compound_loss_scaling(optim.hadam(1e-3), **kwargs)


def test_loss_scale_finds_the_state_in_a_chain_and_rejects_ambiguity():
    params = jnp.ones((2,))
    tx = optax.chain(optax.clip(1.0), optim.compound_loss_scaling(optim.hadam(1e-3), init_scale=32.0))
    assert float(optim.loss_scale(tx.init(params))) == 32.0
    with pytest.raises(ValueError, match="found 0"):
        optim.loss_scale(optim.hadam(1e-3).init(params))
    two = optax.chain(optim.compound_loss_scaling(optim.hadam(1e-3)), optim.compound_loss_scaling(optim.hadam(1e-3)))
    with pytest.raises(ValueError, match="found 2"):
        optim.loss_scale(two.init(params))


def test_grad_bound_tracks_the_largest_finite_gradient_in_current_units():
    params = jnp.ones((3,), jnp.float16)
    tx = optim.compound_loss_scaling(optim.hadam(1e-3), init_scale=64.0, growth_interval=2)
    update = jax.jit(tx.update)
    state = tx.init(params)
    _, state = update(jnp.asarray([1.0, -300.0, 2.0], jnp.float16), state, params)
    assert float(state.grad_bound) == 300.0
    _, state = update(jnp.asarray([jnp.nan, 1e4, 0.0], jnp.float16), state, params)  # skipped: not counted, halved
    assert float(state.grad_bound) == 150.0 and float(state.scale) == 32.0
    _, state = update(jnp.asarray([5.0, 6.0, 7.0], jnp.float16), state, params)
    _, state = update(jnp.asarray([5.0, 6.0, 7.0], jnp.float16), state, params)  # grows: bound doubles with it
    assert float(state.scale) == 64.0 and float(state.grad_bound) == 300.0
