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
@pytest.mark.parametrize(
    "make_inner",
    [
        lambda: optim.hadam(1e-2, eps=0.05),
        lambda: _injected_adam(1e-2, 0.05, jnp.float64),
        lambda: optax.inject_hyperparams(optim.hadam)(learning_rate=1e-2, eps=0.05),
    ],
    ids=["hadam", "injected_optax_adam", "injected_hadam"],
)
def test_constant_scale_equals_unscaled_adam_in_float64(make_inner):
    with jax.enable_x64(True):
        params = random_tree(0, jnp.float64)
        grads = [random_tree(i, jnp.float64, scale=0.1) for i in range(100)]
        ref, _, _ = run_steps(optax.adam(1e-2, eps=0.05), params, grads)
        tx = optim.compound_loss_scaling(make_inner(), init_scale=1024.0, growth_interval=10**6)
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
    return [np.asarray(x).tobytes() for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("bad", [jnp.inf, -jnp.inf, jnp.nan])
@pytest.mark.parametrize("inner", ["hadam", "injected_adam", "sgd"])
def test_nonfinite_gradients_skip_the_step_bit_identically_and_halve_the_scale(bad, inner):
    params = random_tree(0, jnp.float16)
    make = {
        "hadam": lambda: optim.hadam(1e-3),
        "injected_adam": lambda: _injected_adam(1e-3, 1e-8),
        "sgd": lambda: optax.sgd(1e-3, momentum=0.9),
    }[inner]
    tx = optax.chain(optim.compound_loss_scaling(make(), init_scale=1024.0), optim.kahan_summation())
    update = jax.jit(tx.update)
    state = tx.init(params)
    for i in range(3):
        updates, state = update(random_tree(10 + i, jnp.float16, scale=0.1), state, params)
        params = optax.apply_updates(params, updates)
    before_params, before = params, state
    grads = random_tree(99, jnp.float16)
    grads["w1"] = grads["w1"].at[2].set(bad)
    updates, state = update(grads, state, params)
    params = optax.apply_updates(params, updates)

    assert _bits(params) == _bits(before_params)
    assert all(float(jnp.max(jnp.abs(u))) == 0.0 for u in jax.tree.leaves(updates))
    scaler = state[0]
    assert float(scaler.scale) == 512.0 and int(scaler.skipped_steps) == 1 and int(scaler.good_steps) == 0
    # Parameters, moments, counters and the Kahan compensation are bit-identical; only the scale moved.
    assert _bits(scaler.inner_state) == _bits(before[0].inner_state)
    assert _bits(state[1]) == _bits(before[1])
    assert float(scaler.inner_scale) == float(before[0].inner_scale)


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
    assert history == [
        (8, 1),
        (8, 2),
        (8, 3),
        (8, 4),
        (16, 0),
        (16, 1),
        (16, 2),
        (8, 0),
        (8, 1),
        (8, 2),
        (8, 3),
        (8, 4),
    ]
    hadam = state.inner_state[0]
    assert float(hadam.scale) == float(hadam.moment_scale) == float(state.inner_scale) == 8.0
    assert int(hadam.count) == 11


def test_a_growth_moves_the_moments_lazily_and_exactly():
    # After the growing step the moments are still in the old unit (inner_scale); the next update moves them.
    params = random_tree(0, jnp.float32)
    tx = optim.compound_loss_scaling(optim.hadam(1e-3), init_scale=4.0, growth_interval=2)
    state = tx.init(params)
    g = random_tree(1, jnp.float32)
    _, state = tx.update(jax.tree.map(lambda x: 4.0 * x, g), state, params)
    _, state = tx.update(jax.tree.map(lambda x: 4.0 * x, g), state, params)  # grows to 8
    assert float(state.scale) == 8.0 and float(state.inner_scale) == 4.0
    mu = state.inner_state[0].mu
    _, state = tx.update(jax.tree.map(lambda x: 8.0 * x, g), state, params)
    expected = jax.tree.map(lambda m, x: 0.9 * 2.0 * m + 0.1 * 8.0 * x, mu, g)
    assert max_relative_error(state.inner_state[0].mu, expected) < 1e-6
    assert float(state.inner_scale) == 8.0


def test_backoff_stops_above_min_scale_on_the_init_scale_lattice():
    params = random_tree(0, jnp.float32)
    nan_grads = jax.tree.map(lambda x: x * jnp.nan, params)
    for init, floor in ((16.0, 2.0), (1e4, 1e4 / 2**13)):
        tx = optim.compound_loss_scaling(optim.hadam(1e-3), init_scale=init, min_scale=1.0 if init == 1e4 else floor)
        state = tx.init(params)
        update = jax.jit(tx.update)
        scales = []
        for _ in range(16):
            _, state = update(nan_grads, state, params)
            scales.append(float(state.scale))
        # Never below min_scale, and never off init_scale * 2^k: every change of unit is a power of two.
        assert min(scales) == floor >= (1.0 if init == 1e4 else floor)
        assert all(np.log2(init / s) == round(np.log2(init / s)) for s in scales)
        assert int(state.skipped_steps) == 16


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


def test_the_scale_recovers_after_a_transient():
    # A burst of huge gradients fills the moments near float16's top, which blocks growth; as the moments decay,
    # growth resumes (a bound kept from the burst would block it for the rest of training).
    params = jnp.ones((4,), jnp.float16)
    tx = optim.compound_loss_scaling(optim.hadam(1e-3, b1=0.5, b2=0.9), init_scale=1.0, growth_interval=5)
    update = jax.jit(tx.update)
    state = tx.init(params)
    for _ in range(30):
        _, state = update(jnp.full((4,), 6e4, jnp.float16), state, params)
    assert float(state.scale) == 1.0 and float(jnp.max(state.inner_state[0].nu_sqrt)) > 3e4
    for _ in range(300):
        grads = jnp.full((4,), 1.0, jnp.float16) * optim.loss_scale(state).astype(jnp.float16)
        _, state = update(grads, state, params)
    assert float(state.scale) >= 2.0**10
    assert bool(jnp.all(jnp.isfinite(state.inner_state[0].nu_sqrt)))


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


def test_state_dtypes_are_float32_scales_and_int32_counters_and_stable_under_updates():
    params = random_tree(0, jnp.float16)
    tx = optim.compound_loss_scaling(_injected_adam(1e-3, 1e-8))
    state = tx.init(params)
    assert state.scale.dtype == state.inner_scale.dtype == jnp.float32
    assert state.good_steps.dtype == jnp.int32 and state.skipped_steps.dtype == jnp.int32
    _, new_state = jax.jit(tx.update)(random_tree(1, jnp.float16, 1e-2), state, params)
    assert jax.tree.map(lambda x: x.dtype, new_state) == jax.tree.map(lambda x: x.dtype, state)
    injected = new_state.inner_state.hyperparams["eps"]
    assert injected.dtype == jnp.float32 and float(injected) == pytest.approx(1e-8 * 1e4)


@pytest.mark.parametrize(
    "make",
    [
        lambda: optim.compound_loss_scaling(optim.hadam(1e-3), **optim.PYTORCH_AMP_DEFAULTS),
        lambda: optim.low_precision_adam(1e-3, init_scale=2.0**16, growth_interval=2000),
        lambda: optim.low_precision_adam(1e-3, hadam=False, init_scale=2.0**16),
    ],
    ids=["hadam", "low_precision_adam", "low_precision_adam_without_hadam"],
)
def test_init_scale_two_to_the_sixteen_with_float16_parameters(make):
    # 2^16 is inf in float16: a scale cast to the moments' dtype made 0 * inf = nan moments right after init.
    params = random_tree(0, jnp.float16)
    tx = make()
    state = tx.init(params)
    assert float(optim.loss_scale(state)) == 65536.0
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(state))
    for i in range(5):
        grads = jax.tree.map(
            lambda g: (g.astype(jnp.float32) * optim.loss_scale(state) * 1e-3).astype(jnp.float16),
            random_tree(i, jnp.float32),
        )
        updates, state = jax.jit(tx.update)(grads, state, params)
        params = optax.apply_updates(params, updates)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves((params, state)))


@pytest.mark.parametrize(
    "inner, message",
    [
        (optax.inject_hyperparams(optax.adam)(learning_rate=1e-3), "injected eps is a float16 array"),
        (optax.inject_hyperparams(optim.hadam)(learning_rate=1e-3), "learning_rate is a float16 array"),
    ],
)
def test_injected_hyperparameters_in_float16_are_refused_with_the_fix(inner, message):
    with pytest.raises(ValueError, match=message) as error:
        optim.compound_loss_scaling(inner).init(jnp.ones((2,), jnp.float16))
    assert "lpjax.optim.inject_hyperparams" in str(error.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(init_scale=0.0),
        dict(min_scale=4.0, init_scale=2.0),
        dict(growth_factor=1.0),
        dict(backoff_factor=1.0),
        dict(growth_interval=0),
        dict(growth_interval=2.5),
        dict(init_scale=np.inf),
    ],
)
def test_bad_arguments_raise(kwargs):
    with pytest.raises(ValueError):
        optim.compound_loss_scaling(optim.hadam(1e-3), **kwargs)


def test_all_finite_is_exact_where_a_sum_would_overflow():
    # Finite values whose float32 sum overflows are finite; a single nan or inf anywhere is not.
    big = jnp.full((1000,), 3e38, jnp.float32)
    assert bool(jax.jit(optim.all_finite)({"a": big, "b": jnp.ones(3, jnp.bfloat16) * 3e38}))
    for bad in (jnp.nan, jnp.inf, -jnp.inf):
        for position in (0, 517, 999):
            assert not bool(jax.jit(optim.all_finite)({"a": big.at[position].set(bad)}))
    assert bool(optim.all_finite({})) and bool(optim.all_finite({"steps": jnp.arange(3)}))


@pytest.mark.parametrize(
    "make_inner",
    [lambda: optim.hadam(1e-2, eps=0.05), lambda: _injected_adam(1e-2, 0.05, jnp.float64)],
    ids=["hadam", "adam"],
)
def test_a_skip_right_after_a_growth_keeps_the_units_consistent(make_inner):
    # The growth is applied lazily at the next update; if that update is skipped, the pending change of unit must
    # survive it exactly once.
    with jax.enable_x64(True):
        params = random_tree(0, jnp.float64)
        grads = [random_tree(i, jnp.float64, scale=0.1) for i in range(12)]
        ref, _, _ = run_steps(optax.adam(1e-2, eps=0.05), params, grads)
        tx = optim.compound_loss_scaling(make_inner(), init_scale=3.0, growth_interval=2)
        state, got = tx.init(params), params
        for i, g in enumerate(grads):
            scale = optim.loss_scale(state)
            if i in (2, 5, 6):  # right after the growths at steps 1 and 4, and twice in a row
                bad = jax.tree.map(lambda x: (x * scale).at[(0,) * x.ndim].set(jnp.nan), g)
                updates, state = tx.update(bad, state, got)
                got = optax.apply_updates(got, updates)
                scale = optim.loss_scale(state)
            updates, state = tx.update(jax.tree.map(lambda x: x * scale, g), state, got)
            got = optax.apply_updates(got, updates)
        assert int(state.skipped_steps) == 3
        assert max_relative_error(got, ref) < 1e-10
