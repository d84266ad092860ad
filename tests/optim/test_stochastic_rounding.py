"""Stochastic rounding: identity on representable values, unbiased against float64, never corrupting a parameter,
kept by jit, deterministic given its key, and tracking float64 where round-to-nearest stalls."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from lpjax.agents.sac import SACConfig
from lpjax.agents.training import TARGET_ROUNDING_SEED, target_updater
from lpjax.methods import PrecisionMethods, method_optimizer
from lpjax.optim import (
    KahanPolyakState,
    KahanSummationState,
    StochasticRoundingState,
    stochastic_round,
    stochastic_rounding,
    stochastic_rounding_polyak,
)

DTYPES = [jnp.float16, jnp.bfloat16]


def _all_finite_values(dtype) -> np.ndarray:
    """Every finite value of a 16-bit float dtype (both zeros, subnormals and the extremes included).

    bfloat16's subnormals are left out: they are float32 subnormals, which XLA:CPU flushes to zero in float32
    arithmetic (float16's subnormals are normal float32 values and are all included)."""
    values = np.arange(2**16, dtype=np.uint16).view(np.dtype(dtype)).astype(np.float32)
    values = values[np.isfinite(values)]
    if np.dtype(dtype) == np.dtype(jnp.bfloat16):
        values = values[(values == 0) | (np.abs(values) >= np.finfo(np.float32).tiny)]
    return values


@pytest.mark.parametrize("dtype", DTYPES)
def test_identity_on_every_representable_value(dtype):
    x = jnp.asarray(_all_finite_values(dtype))
    got = stochastic_round(x, dtype, jax.random.PRNGKey(0))
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_result_is_one_of_the_two_neighbours_over_the_whole_range(dtype):
    """Fuzz: random float32 values between every pair of adjacent finite values, subnormals and the largest
    binade included; the result is always the neighbour below or above."""
    finite = np.sort(_all_finite_values(dtype))
    finite = finite[~((finite == 0) & np.signbit(finite))]  # one zero
    lo, hi = finite[:-1], finite[1:]
    if np.dtype(dtype) == np.dtype(jnp.bfloat16):  # around zero the (left out) subnormals lie between
        adjacent = np.minimum(np.abs(lo), np.abs(hi)) >= np.finfo(np.float32).tiny
        lo, hi = lo[adjacent], hi[adjacent]
    rng = np.random.default_rng(1)
    x = (lo.astype(np.float64) + rng.uniform(0, 1, lo.shape) * (hi.astype(np.float64) - lo)).astype(np.float32)
    x = np.clip(x, lo, hi)
    got = np.asarray(stochastic_round(jnp.asarray(x), dtype, jax.random.PRNGKey(1)), np.float32)
    assert np.all((got == lo) | (got == hi))
    assert np.all(np.isfinite(got))


@pytest.mark.parametrize("dtype", DTYPES)
def test_beyond_range_and_non_finite_values(dtype):
    big = float(ml_dtypes.finfo(dtype).max)
    past = float(np.nextafter(np.float32(big), np.float32(np.inf)))  # the next float32 above the largest value
    x = jnp.asarray([big, -big, past, -past, np.inf, -np.inf, np.nan], jnp.float32)
    got = np.asarray(stochastic_round(x, dtype, jax.random.PRNGKey(0)), np.float32)
    np.testing.assert_array_equal(got[:6], [big, -big, np.inf, -np.inf, np.inf, -np.inf])
    assert np.isnan(got[6])


@pytest.mark.parametrize("dtype", DTYPES)
def test_unbiased_against_float64(dtype):
    """E[SR(x)] = x: the mean of 20,000 roundings of each value is within 5 standard errors of x (computed in
    float64), for values of every magnitude: float16 subnormals (bfloat16: near 2^-110), around 1, negative,
    and in the largest binade."""
    finfo = ml_dtypes.finfo(dtype)
    big = float(finfo.max)
    # float16's subnormals. For bfloat16, 2^-110: below 2^-119 its ulp is a float32 subnormal, which XLA:CPU may
    # flush to zero (the rounding then goes down; see lpjax.optim.stochastic_rounding).
    tiny = float(finfo.smallest_subnormal) if np.dtype(dtype) == np.float16 else 2.0**-110
    x32 = np.asarray(
        [0.3 * tiny, 2.71 * tiny, 1.0 + 1e-4, -1.0 - 3e-4, 0.1, 123.456, -7.77e-3, 0.97 * big, -0.93 * big],
        np.float32,
    )
    n = 20_000
    keys = jax.random.split(jax.random.PRNGKey(7), n)
    samples = np.asarray(jax.jit(jax.vmap(lambda k: stochastic_round(jnp.asarray(x32), dtype, k)))(keys))
    samples = samples.astype(np.float64)
    lo, hi = samples.min(0), samples.max(0)
    x = x32.astype(np.float64)
    p = (x - lo) / (hi - lo)
    standard_error = (hi - lo) * np.sqrt(p * (1 - p) / n)
    assert np.all(lo <= x) and np.all(x <= hi)
    assert np.all(np.abs(samples.mean(0) - x) <= 5 * standard_error + 1e-300)
    assert np.all(p > 0) and np.all(p < 1)  # every value lies strictly between two neighbours


def test_requires_a_wider_input_and_a_16_bit_target():
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        stochastic_round(jnp.ones(3), jnp.float32, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="wider"):
        stochastic_round(jnp.ones(3, jnp.float16), jnp.float16, jax.random.PRNGKey(0))


def _small_steps(dtype, steps: int, transform, jit: bool = True):
    """``steps`` updates of ``1e-4`` (rounded to ``dtype``) to a ``dtype`` parameter at 1.0."""
    params = {"w": jnp.ones((4,), dtype)}
    update = {"w": jnp.full((4,), 1e-4, dtype)}
    state = transform.init(params)

    def step(carry, _):
        params, state = carry
        increments, state = transform.update(update, state, params)
        return (optax.apply_updates(params, increments), state), None

    run = lambda p, s: jax.lax.scan(step, (p, s), None, length=steps)[0]
    return (jax.jit(run) if jit else run)(params, state)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ten_thousand_updates_of_1e4_track_float64_where_round_to_nearest_stalls(dtype):
    exact = 1.0 + 10_000 * float(np.asarray(1e-4, dtype))  # float64 sum of the rounded updates
    plain = optax.GradientTransformation(lambda p: optax.EmptyState(), lambda u, s, p=None: (u, s))
    stalled, _ = _small_steps(dtype, 10_000, plain)
    assert np.all(np.asarray(stalled["w"], np.float64) == 1.0)  # 1 + 1e-4 rounds back to 1
    params, state = _small_steps(dtype, 10_000, stochastic_rounding(3))
    got = np.asarray(params["w"], np.float64)
    # Each step rounds 1 + k ulp + 1e-4 up by one ulp with probability q = 1e-4 / ulp (ulp = 2^-10 for float16 in
    # [1, 2), 2^-7 for bfloat16), so the error after n steps is a random walk of standard deviation
    # ulp * sqrt(n q (1 - q)): 0.030 for float16, 0.088 for bfloat16, against a move of 1.0. The test allows 4 of
    # them, and a round-to-nearest that stalls is 11 (bfloat16) to 34 (float16) of them away.
    ulp = float(ml_dtypes.finfo(dtype).eps)
    q = float(np.asarray(1e-4, dtype)) / ulp
    random_walk = ulp * np.sqrt(10_000 * q * (1 - q))
    assert np.all(np.abs(got - exact) < 4 * random_walk), (got, exact, random_walk)
    assert 4 * random_walk < 0.4 * (exact - 1.0)
    assert isinstance(state, StochasticRoundingState)


def test_jit_keeps_the_rounding_bit_for_bit():
    """The compiled transform rounds exactly as the eager one with the same key: nothing is folded into a
    round-to-nearest."""
    jitted, _ = _small_steps(jnp.float16, 300, stochastic_rounding(5), jit=True)
    eager, _ = _small_steps(jnp.float16, 300, stochastic_rounding(5), jit=False)
    np.testing.assert_array_equal(np.asarray(jitted["w"]), np.asarray(eager["w"]))
    assert float(jitted["w"][0]) > 1.0


def test_identity_in_float64_and_plain_addition_for_wide_parameters():
    """Exact arithmetic: float64 (and float32) parameters are updated by plain addition."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        params = {"a": jnp.asarray(rng.normal(size=(5,))), "b": jnp.asarray(rng.normal(size=(2, 3)), jnp.float32)}
        updates = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape) * 1e-6, p.dtype), params)
        tx = stochastic_rounding(0)
        increments, _ = tx.update(updates, tx.init(params), params)
        new = optax.apply_updates(params, increments)
        for name in params:
            np.testing.assert_array_equal(np.asarray(new[name]), np.asarray(params[name] + updates[name]))


def test_zero_update_leaves_parameters_bit_identical_and_the_key_advances():
    params = {"w": jnp.asarray(np.random.default_rng(0).normal(size=64), jnp.float16)}
    tx = stochastic_rounding(0)
    state = tx.init(params)
    increments, new_state = jax.jit(tx.update)(jax.tree.map(jnp.zeros_like, params), state, params)
    new = optax.apply_updates(params, increments)
    np.testing.assert_array_equal(np.asarray(new["w"]).view(np.uint16), np.asarray(params["w"]).view(np.uint16))
    assert not np.array_equal(np.asarray(new_state.key), np.asarray(state.key))


def test_a_parameter_is_never_made_non_finite():
    """Near-max parameters pushed past the range, and inf/nan updates: the parameter keeps its value."""
    big = float(np.finfo(np.float16).max)
    params = {"w": jnp.asarray([big, -big, 1.0, 2.0, 3.0, 6e-8], jnp.float16)}
    updates = {"w": jnp.asarray([64.0, -64.0, np.inf, -np.inf, np.nan, -1e-9], jnp.float32)}
    tx = stochastic_rounding(0)
    increments, _ = tx.update(updates, tx.init(params), params)
    new = np.asarray(optax.apply_updates(params, increments)["w"], np.float32)
    assert np.all(np.isfinite(new))
    np.testing.assert_array_equal(new[:5], np.asarray(params["w"][:5], np.float32))


def test_deterministic_given_the_seed_and_resumable_from_its_state():
    """Two halves with the state carried over round exactly like one uninterrupted run."""
    whole, _ = _small_steps(jnp.float16, 200, stochastic_rounding(11))
    tx = stochastic_rounding(11)
    params = {"w": jnp.ones((4,), jnp.float16)}
    update = {"w": jnp.full((4,), 1e-4, jnp.float16)}
    state = tx.init(params)
    step = jax.jit(tx.update)
    for _ in range(100):
        d, state = step(update, state, params)
        params = optax.apply_updates(params, d)
    saved = jax.tree.map(np.asarray, state)  # what a checkpoint holds
    state = jax.tree.map(jnp.asarray, saved)
    for _ in range(100):
        d, state = step(update, state, params)
        params = optax.apply_updates(params, d)
    np.testing.assert_array_equal(np.asarray(params["w"]), np.asarray(whole["w"]))
    other, _ = _small_steps(jnp.float16, 200, stochastic_rounding(12))
    assert not np.array_equal(np.asarray(other["w"]), np.asarray(whole["w"]))


def test_needs_params():
    tx = stochastic_rounding()
    with pytest.raises(ValueError, match="needs the parameters"):
        tx.update({"w": jnp.ones(2)}, tx.init({"w": jnp.ones(2)}))


@pytest.mark.parametrize("dtype", DTYPES)
def test_polyak_tracks_float64_where_plain_polyak_stalls(dtype):
    """Target at 1.0 following an online value 1.01 with tau = 0.005: each step moves it by 5e-5, below half
    an ulp of 1 in float16 and bfloat16, so the plain update never moves; the stochastically rounded one
    follows t_k = 1.01 - 0.01 (1 - tau)^k."""
    tau, steps = 0.005, 400
    online = {"w": jnp.full((256,), 1.01, dtype)}
    target = {"w": jnp.ones((256,), dtype)}
    exact = float(np.asarray(1.01, dtype)) - (float(np.asarray(1.01, dtype)) - 1.0) * (1 - tau) ** steps
    plain = target
    for _ in range(steps):
        plain = optax.incremental_update(online, plain, tau)
    assert np.all(np.asarray(plain["w"], np.float64) == 1.0)
    polyak = stochastic_rounding_polyak(tau, seed=0)
    run = jax.jit(
        lambda t, s: jax.lax.scan(lambda c, _: (polyak.update(online, *c), None), (t, s), None, length=steps)[0]
    )
    got, _ = run(target, polyak.init(target))
    mean = float(np.mean(np.asarray(got["w"], np.float64)))
    ulp = float(ml_dtypes.finfo(dtype).eps)
    assert abs(mean - exact) < 0.05 * (exact - 1.0) + ulp / 8, (mean, exact)


def test_polyak_is_plain_polyak_in_float64():
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        online = {"w": jnp.asarray(rng.normal(size=(7,)))}
        target = {"w": jnp.asarray(rng.normal(size=(7,)))}
        polyak = stochastic_rounding_polyak(0.05)
        got, _ = polyak.update(online, target, polyak.init(target))
        want = optax.incremental_update(online, target, 0.05)
        np.testing.assert_allclose(np.asarray(got["w"]), np.asarray(want["w"]), rtol=1e-15)
    with pytest.raises(ValueError, match="0 < tau <= 1"):
        stochastic_rounding_polyak(0.0)


def test_method_optimizer_and_target_updater_use_it():
    methods = PrecisionMethods(hadam=True, loss_scaling=True, stochastic_rounding=True)
    params = {"w": jnp.ones((3,), jnp.float16)}
    state = method_optimizer(1e-3, methods, rounding_seed=4).init(params)
    assert isinstance(state[-1], StochasticRoundingState)
    np.testing.assert_array_equal(np.asarray(state[-1].key), np.asarray(jax.random.PRNGKey(4)))
    updater = target_updater(SACConfig(methods=methods))
    target_state = updater.init(params)
    assert isinstance(target_state, StochasticRoundingState)
    np.testing.assert_array_equal(np.asarray(target_state.key), np.asarray(jax.random.PRNGKey(TARGET_ROUNDING_SEED)))
    online = {"w": jnp.full((3,), 1.5, jnp.float16)}
    moved, new_state = updater.update(online, params, target_state, jnp.asarray(0))
    assert np.all(np.asarray(moved["w"], np.float32) > 1.0)
    assert not np.array_equal(np.asarray(new_state.key), np.asarray(target_state.key))


@pytest.mark.parametrize("kahan", ["kahan_gradients", "kahan_momentum"])
def test_with_one_kahan_switch_it_rounds_the_other_update(kahan):
    """Stochastic rounding takes the update that no Kahan buffer compensates; the Kahan one keeps its buffer.

    The target side is checked by what it does: with tau = 0.005 and p = 1.0625, a target update moves an fp16
    target at 1.0 by at most 3.1e-4, under half its ulp (4.9e-4): round to nearest stalls, while Kahan and
    stochastic rounding (on average over 4096 elements; its noise there is ~1e-4) follow the float64 recursion
    to 1.0396 in 200 updates."""
    methods = PrecisionMethods(hadam=True, loss_scaling=True, stochastic_rounding=True, **{kahan: True})
    params = {"w": jnp.ones((4096,), jnp.float16)}
    opt_state = method_optimizer(1e-3, methods).init(params)
    rounding = StochasticRoundingState if kahan == "kahan_momentum" else KahanSummationState
    assert isinstance(opt_state[-1], rounding)
    assert not any(isinstance(s, (StochasticRoundingState, KahanSummationState)) for s in opt_state[:-1])
    updater = target_updater(SACConfig(methods=methods, tau=0.005, target_update_period=1))
    target_state = updater.init(params)
    assert isinstance(target_state, KahanPolyakState if kahan == "kahan_momentum" else StochasticRoundingState)

    online = {"w": jnp.full((4096,), 1.0625, jnp.float16)}
    step = jax.jit(lambda t, c: updater.update(online, t, c, jnp.asarray(0)))
    target, exact, naive = params, 1.0, np.float16(1.0)
    for _ in range(200):
        target, target_state = step(target, target_state)
        exact += 0.005 * (1.0625 - exact)
        naive = np.float16(naive + np.float16(0.005) * (np.float16(1.0625) - naive))
    assert naive == 1.0 and exact > 1.039
    assert abs(np.asarray(target["w"], np.float64).mean() - exact) < 5e-4
