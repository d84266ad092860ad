"""categorical_l2_project: a hand-computed case and the projection's properties (mass, mean, clipping, identity)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpjax.agents.d4pg import categorical_l2_project, expected_value

ATOMS = jnp.array([-1.0, 0.0, 1.0])
project = jax.jit(categorical_l2_project)  # one compile per shape instead of one per primitive


def test_hand_computed_three_atoms():
    # 0.5 -> half to 0, half to 1; -2 -> clipped to -1; 0.25 -> 3/4 to 0, 1/4 to 1.
    values = jnp.array([[0.5, -2.0, 0.25]])
    probs = jnp.array([[0.5, 0.3, 0.2]])
    expected = [[0.3, 0.5 * 0.5 + 0.75 * 0.2, 0.5 * 0.5 + 0.25 * 0.2]]
    np.testing.assert_allclose(np.asarray(project(values, probs, ATOMS)), expected, rtol=1e-6)


def test_expected_value_is_the_mean_of_the_softmax():
    np.testing.assert_allclose(float(expected_value(jnp.log(jnp.array([0.2, 0.3, 0.5])), ATOMS)), 0.3, rtol=1e-6)


def test_bellman_shift_of_a_uniform_support():
    # r + D z with r = 0.5, D = 0.5 on z = (-1, 0, 1): values (0, 0.5, 1).
    z = jnp.linspace(-1.0, 1.0, 3)
    out = project((0.5 + 0.5 * z)[None], jnp.array([[0.2, 0.4, 0.4]]), z)
    np.testing.assert_allclose(np.asarray(out), [[0.0, 0.2 + 0.2, 0.2 + 0.4]], rtol=1e-6)


def test_identity_when_the_values_are_the_atoms_and_clipping_to_the_ends():
    z = jnp.linspace(-150.0, 150.0, 51)
    probs = jax.nn.softmax(jax.random.normal(jax.random.key(0), (4, 51)))
    np.testing.assert_array_equal(np.asarray(project(jnp.broadcast_to(z, (4, 51)), probs, z)), np.asarray(probs))
    far = project(jnp.stack([z + 1e4, z - 1e4]), probs[:2], z)
    np.testing.assert_allclose(np.asarray(far[0]), np.eye(51)[-1], atol=1e-6)
    np.testing.assert_allclose(np.asarray(far[1]), np.eye(51)[0], atol=1e-6)


@settings(max_examples=30)
@given(st.integers(0, 2**31 - 1), st.floats(-3, 3), st.floats(0, 0.7))
def test_mass_is_preserved_and_the_mean_too_when_nothing_is_clipped(seed, reward, discount):
    keys = jax.random.split(jax.random.key(seed))
    z = jnp.sort(jax.random.uniform(keys[0], (7,), jnp.float32, -10, 10))  # an uneven support
    z = z.at[0].set(-10.0).at[-1].set(10.0)
    probs = jax.nn.softmax(jax.random.normal(keys[1], (2, 7)))
    values = reward + discount * z  # |values| <= 3 + 0.7 * 10: no clipping
    out = project(jnp.stack([values, values * 4]), probs, z)
    assert float(jnp.min(out)) >= 0
    np.testing.assert_allclose(np.asarray(out.sum(-1)), 1.0, rtol=1e-5)
    np.testing.assert_allclose(float(jnp.sum(out[0] * z)), float(jnp.sum(probs[0] * values)), atol=1e-4)


def test_jit_batch_axes_and_float64(run_x64):
    values = jnp.full((2, 3, 3), 0.5)
    probs = jnp.full((2, 3, 3), 1 / 3)
    out = project(values, probs, ATOMS)
    assert out.shape == (2, 3, 3) and out.dtype == jnp.float32
    out64 = run_x64(
        lambda: categorical_l2_project(
            jnp.array([[0.1]], jnp.float64), jnp.ones((1, 1)), jnp.array([0.0, 1.0], jnp.float64)
        )
    )
    assert out64.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(out64), [[0.9, 0.1]], rtol=1e-15)


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="at least 2"):
        categorical_l2_project(jnp.zeros((1, 1)), jnp.ones((1, 1)), jnp.zeros(1))
    with pytest.raises(ValueError, match="same shape"):
        categorical_l2_project(jnp.zeros((1, 3)), jnp.ones((1, 2)), ATOMS)
