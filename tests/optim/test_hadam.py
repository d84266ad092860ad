"""hAdam: identical to Adam in float64; survives float16 where Adam's g^2 and eps do not."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lpjax import optim
from tests.optim.helpers import max_relative_error, random_tree, run_steps


def test_hadam_equals_adam_in_float64_over_200_random_steps():
    with jax.enable_x64(True):
        params = random_tree(0, jnp.float64)
        grads = [
            random_tree(1 + i, jnp.float64, scale=10.0 ** np.random.default_rng(i).uniform(-4, 2)) for i in range(200)
        ]
        ref, _, ref_updates = run_steps(optax.adam(1e-3, eps=1e-3), params, grads)
        got, _, got_updates = run_steps(optim.hadam(1e-3, eps=1e-3), params, grads)
        assert max_relative_error(got, ref) < 1e-10
        assert max(max_relative_error(u, r) for u, r in zip(got_updates, ref_updates)) < 1e-10


def test_hadam_learning_rate_schedule_matches_adam_in_float64():
    schedule = optax.cosine_decay_schedule(1e-2, decay_steps=50)
    with jax.enable_x64(True):
        params = random_tree(0, jnp.float64)
        grads = [random_tree(i, jnp.float64) for i in range(60)]
        ref, _, _ = run_steps(optax.adam(schedule), params, grads)
        got, _, _ = run_steps(optim.hadam(schedule), params, grads)
        assert max_relative_error(got, ref) < 1e-10


def test_hadam_keeps_sqrt_of_adams_second_moment():
    with jax.enable_x64(True):
        params = random_tree(0, jnp.float64)
        grads = [random_tree(i, jnp.float64) for i in range(20)]
        _, adam_state, _ = run_steps(optax.scale_by_adam(), params, grads)
        _, hadam_state, _ = run_steps(optim.scale_by_hadam(), params, grads)
        assert max_relative_error(hadam_state.nu_sqrt, jax.tree.map(jnp.sqrt, adam_state.nu)) < 1e-12
        assert int(hadam_state.count) == 20


def _one_fp16_update(tx, grad_value: float, lr_sign_check: bool = True):
    """One jitted update of a float16 parameter with a float16 runtime gradient."""
    params = jnp.ones((4,), jnp.float16)
    grad = jnp.full((4,), grad_value, jnp.float16)
    state = tx.init(params)
    updates, _ = jax.jit(tx.update)(grad, state, params)
    return updates


@pytest.mark.parametrize("grad_value", [3e-5, 1e-4])
def test_fp16_adam_second_moment_underflow_breaks_adam_not_hadam(grad_value):
    # (1 - b2) g^2 = 1e-3 * 1e-8 underflows float16 (smallest subnormal 6e-8): Adam divides m by 0 + eps(=0).
    lr = 1e-3
    adam = _one_fp16_update(optax.adam(lr), grad_value)
    hadam = _one_fp16_update(optim.hadam(lr, eps=1e-4), grad_value)
    assert not bool(jnp.all(jnp.isfinite(adam)))
    # Exact first Adam step: -lr * g / (|g| + eps), i.e. about -lr for |g| >> eps.
    expected = -lr * grad_value / (grad_value + 1e-4)
    np.testing.assert_allclose(np.asarray(hadam, np.float64), expected, rtol=2e-2)


def test_fp16_adam_second_moment_overflow_loses_update_hadam_keeps_it():
    # g = 300: g^2 = 9e4 > 65504, so v = inf and Adam's update m / (inf + eps) is 0: the step is lost.
    lr = 1e-3
    adam = _one_fp16_update(optax.adam(lr, eps=1e-4), 300.0)
    hadam = _one_fp16_update(optim.hadam(lr, eps=1e-4), 300.0)
    assert bool(jnp.all(adam == 0))
    np.testing.assert_allclose(np.asarray(hadam, np.float64), -lr, rtol=2e-3)


def test_fp16_eps_underflow_gives_nan_for_adam_and_finite_for_hadam_with_compound_scaling():
    # eps = 1e-8 is 0 in float16, so a zero gradient entry gives 0 / 0 = nan for plain Adam. Compound loss scaling
    # carries eps * scale = 1e-4, which float16 represents.
    params = jnp.ones((3,), jnp.float16)
    grads = jnp.asarray([0.0, 1e-3, -2e-2], jnp.float16)
    adam = optax.adam(1e-3)
    adam_updates, _ = jax.jit(adam.update)(grads, adam.init(params), params)
    assert bool(jnp.isnan(adam_updates[0]))

    tx = optim.compound_loss_scaling(optim.hadam(1e-3))
    state = tx.init(params)
    scaled = grads * optim.loss_scale(state).astype(jnp.float16)
    updates, state = jax.jit(tx.update)(scaled, state, params)
    assert bool(jnp.all(jnp.isfinite(updates)))
    assert float(updates[0]) == 0.0
    np.testing.assert_allclose(np.asarray(updates[1:], np.float64), [-1e-3, 1e-3], rtol=2e-2)
    assert int(state.skipped_steps) == 0


def test_hadam_state_dtypes_follow_params_and_jit_matches_eager():
    params = random_tree(0, jnp.float16)
    grads = random_tree(1, jnp.float16, scale=1e-2)
    tx = optim.hadam(1e-3, eps=1e-4)
    state = tx.init(params)
    eager_updates, eager_state = tx.update(grads, state, params)
    jit_updates, jit_state = jax.jit(tx.update)(grads, state, params)
    assert jax.tree.map(lambda x: x.dtype, jit_state) == jax.tree.map(lambda x: x.dtype, state)
    for a, b in zip(jax.tree.leaves((eager_updates, eager_state)), jax.tree.leaves((jit_updates, jit_state))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_hadam_state_can_be_donated_to_a_jitted_step():
    params = random_tree(0, jnp.float16)
    tx = optim.hadam(1e-3, eps=1e-4)

    @jax.jit
    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    donating = jax.jit(step, donate_argnums=(0, 1))
    params, state = donating(params, tx.init(params), random_tree(1, jnp.float16))
    assert bool(jnp.all(jnp.isfinite(state[0].nu_sqrt["w0"])))


def test_zero_denominator_gives_a_zero_update_not_nan():
    # With eps = 0 and zero gradients w_hat + eps == 0. Exact arithmetic gives m / (w + eps) = 0 there.
    params = jnp.ones((3,), jnp.float16)
    tx = optim.hadam(1e-3, eps=0.0)
    updates, _ = jax.jit(tx.update)(jnp.asarray([0.0, 0.0, 1e-3], jnp.float16), tx.init(params), params)
    np.testing.assert_array_equal(np.asarray(updates[:2]), 0.0)
    assert float(updates[2]) < 0


def test_float16_root_second_moment_is_rounded_once_from_the_exact_value():
    # w' = sqrt(b2 w^2 + (1 - b2) g^2) evaluated in float32 and rounded once: within one float16 ulp of the
    # float64 value, and correctly rounded for nearly every input (float32 error only matters at ties).
    rng = np.random.default_rng(0)
    g = (rng.standard_normal(20_000) * 10.0 ** rng.uniform(-6, 4, 20_000)).astype(np.float16)
    w = np.abs(rng.standard_normal(20_000) * 10.0 ** rng.uniform(-6, 4, 20_000)).astype(np.float16)
    tx = optim.scale_by_hadam(eps=1e-4)
    state = tx.init(jnp.zeros(g.shape, jnp.float16))._replace(nu_sqrt=jnp.asarray(w))
    _, state = jax.jit(tx.update)(jnp.asarray(g), state)
    got = np.asarray(state.nu_sqrt, np.float64)
    exact = np.sqrt(0.999 * w.astype(np.float64) ** 2 + 0.001 * g.astype(np.float64) ** 2)
    assert np.all(np.abs(got - exact) <= np.spacing(exact.astype(np.float16)).astype(np.float64))
    assert np.mean(got == exact.astype(np.float16).astype(np.float64)) > 0.99


def _naive_float16_direction(m, w, t, b1=0.9, b2=0.999, eps=1e-4):
    """hAdam's direction with the bias corrections divided out in float16, as the update used to compute it."""
    m_hat = m / jnp.asarray(1 - b1**t, m.dtype)
    w_hat = w / jnp.asarray(np.sqrt(1 - b2**t), w.dtype)
    return m_hat / (w_hat + jnp.asarray(eps, w.dtype))


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_gradients_at_the_top_of_the_range_give_finite_exact_first_updates(dtype):
    # Step 1: m_hat / w_hat = g / |g| exactly. Dividing m by (1 - b1) overflows float16 at g = 65504 (and bfloat16,
    # and float32, near bfloat16's max); hAdam never forms m_hat.
    top = float(jnp.finfo(dtype).max)
    grads = jnp.asarray([top, -top, top / 3, 1.0, -0.25], dtype)
    tx = optim.scale_by_hadam(eps=1e-30)
    updates, state = jax.jit(tx.update)(grads, tx.init(jnp.zeros(grads.shape, dtype)))
    # Exact up to the rounding of the stored moments (two ulps of the moments' dtype).
    np.testing.assert_allclose(
        np.asarray(updates, np.float32), np.sign(np.asarray(grads, np.float32)), rtol=2 * float(jnp.finfo(dtype).eps)
    )
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in (state.mu, state.nu_sqrt))
    if dtype == jnp.float16:
        naive = jax.jit(_naive_float16_direction, static_argnums=2)(state.mu, state.nu_sqrt, 1)
        assert not bool(jnp.all(jnp.isfinite(naive)))


def test_moment_coefficients_are_not_rounded_to_float16():
    # m_1 = (1 - b1) g. With g = 1: round(0.1) = 0.0999755859375 in float16, whereas 1 - float16(0.9) = 0.10009765625.
    tx = optim.scale_by_hadam()
    _, state = jax.jit(tx.update)(jnp.ones((1,), jnp.float16), tx.init(jnp.zeros((1,), jnp.float16)))
    assert float(state.mu[0]) == float(np.float16(0.1))
    assert float(state.mu[0]) != float(1 - np.float16(0.9))


def test_float32_moments_for_float16_parameters():
    params = random_tree(0, jnp.float16)
    grads = [random_tree(i, jnp.float16, scale=1e-3) for i in range(20)]
    tx = optim.hadam(1e-3, moment_dtype=jnp.float32)
    state = tx.init(params)
    assert {x.dtype for x in jax.tree.leaves((state[0].mu, state[0].nu_sqrt))} == {np.dtype(np.float32)}
    _, state, updates = run_steps(tx, params, grads)
    assert {x.dtype for x in jax.tree.leaves(updates[-1])} == {np.dtype(np.float32)}
    # The same as float32 hAdam on the same (float16) gradients, up to float16 rounding of the parameters.
    f32 = lambda tree: jax.tree.map(lambda x: x.astype(jnp.float32), tree)
    _, ref_state, _ = run_steps(optim.hadam(1e-3), f32(params), [f32(g) for g in grads])
    assert max_relative_error(state[0].nu_sqrt, ref_state[0].nu_sqrt) < 1e-6


def test_a_change_of_unit_is_one_rounding_even_for_subnormal_moments():
    # The scaler halves `scale`; the next update multiplies the stored moments by 1/2 in float32 and rounds once.
    # Rounding the halved moment to float16 first (an eager rescale) loses the last bit of odd subnormals.
    rng = np.random.default_rng(0)
    m = (rng.integers(1, 1024, 4096) * 2.0**-24).astype(np.float16)  # every float16 subnormal magnitude
    tx = optim.scale_by_hadam()
    state = tx.init(jnp.zeros(m.shape, jnp.float16))._replace(mu=jnp.asarray(m), nu_sqrt=jnp.ones(m.shape, jnp.float16))
    state = optim.rescale_moments((state,), 0.5)[0]
    _, new = jax.jit(tx.update)(jnp.zeros(m.shape, jnp.float16), state)
    exact = (0.9 * 0.5 * m.astype(np.float64)).astype(np.float16)
    np.testing.assert_array_equal(np.asarray(new.mu), exact)
    eager = (0.9 * (0.5 * m.astype(np.float64)).astype(np.float16).astype(np.float64)).astype(np.float16)
    assert np.any(eager != exact)
    assert float(new.moment_scale) == float(new.scale) == 0.5


def test_optax_inject_hyperparams_in_float16_is_refused_and_lpjax_inject_stores_float32():
    params = random_tree(0, jnp.float16)
    with pytest.raises(ValueError, match="lpjax.optim.inject_hyperparams"):
        optax.inject_hyperparams(optim.hadam)(learning_rate=1e-3).init(params)
    tx = optim.inject_hyperparams(optim.hadam)(learning_rate=1e-3, eps=1e-8, moment_dtype=jnp.float32)
    state = tx.init(params)
    assert {k: v.dtype for k, v in state.hyperparams.items()} == {
        k: np.dtype(np.float32) for k in ("learning_rate", "b1", "b2", "eps")
    }
    grads = [random_tree(i, jnp.float16, 1e-2) for i in range(5)]
    got, _, _ = run_steps(tx, params, grads)
    ref, _, _ = run_steps(optim.hadam(1e-3, eps=1e-8, moment_dtype=jnp.float32), params, grads)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
