"""Kahan summation (parameter updates) and Kahan Polyak averaging (target networks)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpjax import optim
from tests.optim.helpers import any_bit_patterns, max_relative_error, random_tree


def _sum_updates(tx, params, updates_seq):
    """Applies a fixed sequence of updates through ``tx`` (jitted scan); returns the final params."""

    def body(carry, updates):
        params, state = carry
        increments, state = tx.update(updates, state, params)
        return (optax.apply_updates(params, increments), state), None

    run = jax.jit(lambda p, s, u: jax.lax.scan(body, (p, s), u)[0][0])
    return run(params, tx.init(params), updates_seq)


def test_kahan_summation_reduces_to_plain_summation_in_float64():
    with jax.enable_x64(True):
        params = random_tree(0, jnp.float64)
        rng = np.random.default_rng(1)
        updates_seq = jax.tree.map(lambda p: jnp.asarray(rng.normal(0, 1e-3, (50,) + p.shape)), params)
        got = _sum_updates(optim.kahan_summation(), params, updates_seq)
        expected = jax.tree.map(lambda p, u: p + u.sum(0), params, updates_seq)
        assert max_relative_error(got, expected) < 1e-12


def _ten_thousand_small_updates(tx, jit: bool):
    params = jnp.ones((8,), jnp.float16)
    update = jnp.full((8,), 1e-4, jnp.float16)  # a runtime array: XLA cannot fold the sum

    def body(carry, _):
        params, state = carry
        increments, state = tx.update(update, state, params)
        return (optax.apply_updates(params, increments), state), None

    def run(params):
        return jax.lax.scan(body, (params, tx.init(params)), None, length=10_000)[0][0]

    return (jax.jit(run) if jit else run)(params)


def test_ten_thousand_updates_of_1e4_are_lost_without_kahan_and_kept_with_it_under_jit():
    plain = _ten_thousand_small_updates(optax.identity(), jit=True)
    kahan = _ten_thousand_small_updates(optim.kahan_summation(), jit=True)
    np.testing.assert_array_equal(np.asarray(plain), 1.0)  # 1 + 1e-4 rounds back to 1 in float16
    # 1 + 10000 * float16(1e-4) = 1.99994; float16 spacing at 2 is 2**-9.
    np.testing.assert_allclose(np.asarray(kahan, np.float64), 1.0 + 10_000 * float(np.float16(1e-4)), atol=2.0**-9)


def test_kahan_compensation_survives_jit_bit_for_bit():
    eager = _ten_thousand_small_updates(optim.kahan_summation(), jit=False)
    jitted = _ten_thousand_small_updates(optim.kahan_summation(), jit=True)
    np.testing.assert_array_equal(np.asarray(eager), np.asarray(jitted))
    assert float(jitted[0]) > 1.99


def test_float32_compensation_buffer_for_float16_params():
    tx = optim.kahan_summation(compensation_dtype=jnp.float32)
    state = tx.init(jnp.ones((3,), jnp.float16))
    assert state.compensation.dtype == jnp.float32
    result = _ten_thousand_small_updates(tx, jit=True)
    assert result.dtype == jnp.float16
    np.testing.assert_allclose(np.asarray(result, np.float64), 1.0 + 10_000 * float(np.float16(1e-4)), atol=2.0**-9)


def test_kahan_summation_needs_params():
    tx = optim.kahan_summation()
    with pytest.raises(ValueError, match="needs the parameters"):
        tx.update(jnp.ones(2), tx.init(jnp.ones(2)))


def test_kahan_summation_handles_nested_tuples_and_dicts():
    params = ({"a": jnp.ones((2,), jnp.float16)}, jnp.ones((3,), jnp.float16))
    tx = optim.kahan_summation()
    increments, state = tx.update(jax.tree.map(lambda p: p * 1e-4, params), tx.init(params), params)
    assert jax.tree.structure(increments) == jax.tree.structure(params)
    assert jax.tree.structure(state.compensation) == jax.tree.structure(params)


def _polyak(online, target, steps, update_fn, state=None):
    def body(carry, _):
        target, state = carry
        target, state = update_fn(online, target, state)
        return (target, state), None

    return jax.jit(lambda t, s: jax.lax.scan(body, (t, s), None, length=steps)[0][0])(target, state)


def test_kahan_polyak_equals_plain_polyak_in_float64():
    with jax.enable_x64(True):
        online, target = random_tree(0, jnp.float64), random_tree(1, jnp.float64)
        polyak = optim.kahan_polyak(tau=0.005)
        got = _polyak(online, target, 300, polyak.update, polyak.init(target))
        plain = _polyak(online, target, 300, lambda o, t, s: (optax.incremental_update(o, t, 0.005), s), ())
        assert max_relative_error(got, plain) < 1e-12


def _reference_target(online, target, tau, steps):
    """Exact Polyak average after ``steps`` steps towards a fixed online value, in float64."""
    online, target = np.float64(online), np.float64(target)
    return online + (target - online) * (1.0 - tau) ** steps


@pytest.mark.parametrize("online, start", [(1.05, 1.0), (-3.0, -3.2), (0.5, 0.45)])
def test_fp16_plain_polyak_stalls_where_kahan_polyak_tracks_float64(online, start):
    # Once tau * (p - t) is below half a float16 ulp of t, t + tau (p - t) rounds back to t: plain Polyak stalls
    # short of the float64 trajectory (in the first two cases from the first step).
    tau, steps = 0.005, 400
    online_arr = jnp.full((4,), online, jnp.float16)
    target = jnp.full((4,), start, jnp.float16)
    polyak = optim.kahan_polyak(tau=tau)
    kahan = _polyak(online_arr, target, steps, polyak.update, polyak.init(target))
    plain = _polyak(online_arr, target, steps, lambda o, t, s: (optax.incremental_update(o, t, tau), s), ())
    reference = _reference_target(np.float16(online), np.float16(start), tau, steps)
    ulp = float(np.spacing(np.float16(reference)))
    assert np.all(np.abs(np.asarray(plain, np.float64) - reference) > 20 * ulp)
    np.testing.assert_allclose(np.asarray(kahan, np.float64), reference, atol=ulp)


def test_scaled_buffer_keeps_increments_below_float16_subnormals():
    # t = 1e-3, p - t = 1e-5: tau (p - t) = 5e-8 is below float16's smallest subnormal (6e-8), so an unscaled
    # Kahan buffer (scale=1) loses it; the 1e4-scaled buffer keeps it.
    tau, steps = 0.005, 20_000
    online, start = np.float16(1e-3) + np.float16(1e-5), np.float16(1e-3)
    online_arr, target = jnp.full((4,), online, jnp.float16), jnp.full((4,), start, jnp.float16)
    reference = _reference_target(online, start, tau, steps)
    results = {}
    for scale in (1.0, 1e4):
        polyak = optim.kahan_polyak(tau=tau, scale=scale)
        results[scale] = np.asarray(_polyak(online_arr, target, steps, polyak.update, polyak.init(target)), np.float64)
    ulp = float(np.spacing(np.float16(reference)))
    np.testing.assert_allclose(results[1e4], reference, atol=ulp)
    assert np.all(np.abs(results[1.0] - reference) > 3 * ulp)


def test_kahan_polyak_range_guard_never_produces_inf():
    # |p - t| = 3000 > 65504 / (1e4 * 0.005): the scaled increment would overflow float16; the guard falls back to
    # the plain Polyak step for those elements.
    online = jnp.asarray([3000.0, 1.0, -2000.0], jnp.float16)
    target = jnp.asarray([0.0, 0.999, 0.0], jnp.float16)
    polyak = optim.kahan_polyak(tau=0.005)
    new_target, state = jax.jit(polyak.update)(online, target, polyak.init(target))
    assert bool(jnp.all(jnp.isfinite(new_target))) and bool(jnp.all(jnp.isfinite(state.compensation)))
    np.testing.assert_allclose(np.asarray(new_target, np.float64)[[0, 2]], [15.0, -10.0], rtol=1e-3)
    assert float(state.compensation[0]) == 0.0


def test_kahan_polyak_jit_matches_eager():
    online, target = random_tree(0, jnp.float16), random_tree(1, jnp.float16)
    polyak = optim.kahan_polyak(tau=0.01, scale=1e2)
    state = polyak.init(target)
    eager = polyak.update(online, target, state)
    jitted = jax.jit(polyak.update)(online, target, state)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("tau, scale", [(0.005, 1e4), (0.01, 1e2), (0.3, 1.0)])
def test_kahan_polyak_jit_matches_eager_over_the_whole_range(dtype, tau, scale):
    # Eager runs each operation alone; jit fuses them, and XLA contracts a * b + c into a fused multiply-add. Both
    # must give the same bits: every rounding of the compensation is kept, whatever the compiler fuses.
    n = 4096
    online, target = any_bit_patterns(dtype, n, seed=0), any_bit_patterns(dtype, n, seed=1)
    compensation = (any_bit_patterns(dtype, n, seed=2, finite=True).astype(jnp.float32) * 1e-3).astype(dtype)
    polyak = optim.kahan_polyak(tau=tau, scale=scale)
    state = optim.KahanPolyakState(compensation)
    eager = polyak.update(online, target, state)
    jitted = jax.jit(polyak.update)(online, target, state)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_kahan_polyak_keeps_any_finite_target_finite(dtype):
    # Finite online and target values anywhere in the range, |p - t| beyond the dtype's maximum included: the
    # target stays finite and within [min(p, t), max(p, t)], and the compensation stays finite.
    n = 4096
    online, target = any_bit_patterns(dtype, n, seed=3, finite=True), any_bit_patterns(dtype, n, seed=4, finite=True)
    polyak = optim.kahan_polyak(tau=0.005)
    new_target, state = jax.jit(polyak.update)(online, target, polyak.init(target))
    p, t, new = (np.asarray(x, np.float64) for x in (online, target, new_target))
    assert np.all(np.isfinite(new)) and np.all(np.isfinite(np.asarray(state.compensation, np.float64)))
    assert np.all((new >= np.minimum(p, t)) & (new <= np.maximum(p, t)))


def test_kahan_polyak_steps_across_a_gap_wider_than_float16():
    # p - t overflows float16 (max 65504): the plain step goes through p/2 - t/2, which does not.
    online = jnp.asarray([60000.0, -65504.0, 40000.0], jnp.float16)
    target = jnp.asarray([-60000.0, 65504.0, -30000.0], jnp.float16)
    tau = 0.005
    polyak = optim.kahan_polyak(tau=tau)
    new_target, state = jax.jit(polyak.update)(online, target, polyak.init(target))
    p, t = np.asarray(online, np.float64), np.asarray(target, np.float64)
    np.testing.assert_allclose(np.asarray(new_target, np.float64), t + np.float64(np.float16(tau)) * (p - t), rtol=1e-3)
    np.testing.assert_array_equal(np.asarray(state.compensation), 0.0)


@pytest.mark.parametrize(
    "kwargs", [dict(tau=0.0), dict(tau=1.5), dict(tau=0.1, scale=0.0), dict(tau=0.1, scale=float("inf"))]
)
def test_kahan_polyak_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        optim.kahan_polyak(**kwargs)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(exponents=st.lists(st.integers(-24, 4), min_size=1, max_size=20), seed=st.integers(0, 10**6))
def test_a_zero_update_after_any_history_leaves_parameters_and_compensation_bit_identical(exponents, seed):
    # A skipped step hands Kahan all-zero updates: fl(p + c) must be p, whatever updates came before.
    rng = np.random.default_rng(seed)
    params = jnp.asarray(rng.normal(0, 1, 16), jnp.float16)
    tx = optim.kahan_summation()
    state = tx.init(params)
    update = jax.jit(tx.update)
    for e in exponents:
        u = jnp.asarray(rng.normal(0, 1, 16) * 2.0**e, jnp.float16)
        d, state = update(u, state, params)
        params = optax.apply_updates(params, d)
    d, new_state = update(jnp.zeros(16, jnp.float16), state, params)
    assert np.asarray(d).tobytes() == np.zeros(16, np.float16).tobytes()
    assert np.asarray(new_state.compensation).tobytes() == np.asarray(state.compensation).tobytes()


def test_an_update_past_the_largest_float16_leaves_the_parameter_finite():
    params = jnp.asarray([65504.0, -65504.0, 1.0], jnp.float16)
    tx = optim.kahan_summation()
    d, state = jax.jit(tx.update)(jnp.asarray([100.0, -100.0, 1e-4], jnp.float16), tx.init(params), params)
    new = optax.apply_updates(params, d)
    np.testing.assert_array_equal(np.asarray(new[:2]), [65504.0, -65504.0])
    assert float(state.compensation[0]) == 0.0 and float(state.compensation[2]) != 0.0
    naive = jax.jit(lambda p, u: p + u)(params, jnp.asarray([100.0, -100.0, 1e-4], jnp.float16))
    assert not bool(jnp.all(jnp.isfinite(naive)))


def test_subnormal_float16_parameters_are_not_flushed_to_zero():
    """Parameters below float16's smallest normal (6.1e-5) keep their value and take their updates, also with a
    float32 compensation buffer (where the sum is rounded from float32)."""
    params = {"w": jnp.asarray([3e-6, -2e-5, 6e-8], jnp.float16)}
    updates = {"w": jnp.asarray([1e-6, 1e-6, 0.0], jnp.float16)}
    want = (np.asarray(params["w"], np.float64) + np.asarray(updates["w"], np.float64)).astype(np.float16)
    for compensation_dtype in (None, jnp.float32):
        tx = optim.kahan_summation(compensation_dtype)
        increments, _ = jax.jit(tx.update)(updates, tx.init(params), params)
        got = np.asarray(optax.apply_updates(params, increments)["w"], np.float64)
        np.testing.assert_array_equal(got, want.astype(np.float64))
