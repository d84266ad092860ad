"""low_precision_adam: each switch adds its transform; all off is exactly optax.adam."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lpjax import optim
from tests.optim.helpers import random_tree, run_steps


def test_all_switches_off_is_optax_adam_bit_for_bit():
    params = random_tree(0)
    grads = [random_tree(i, scale=0.1) for i in range(20)]
    ref, _, _ = run_steps(optax.adam(1e-3), params, grads)
    got, _, _ = run_steps(optim.low_precision_adam(1e-3, hadam=False, loss_scaling=False, kahan=False), params, grads)
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("hadam", [True, False])
@pytest.mark.parametrize("loss_scaling", [True, False])
@pytest.mark.parametrize("kahan", [True, False])
def test_every_combination_matches_adam_in_float64(hadam, loss_scaling, kahan):
    with jax.enable_x64(True):
        params = random_tree(0, jnp.float64)
        grads = [random_tree(i, jnp.float64, scale=0.1) for i in range(20)]
        ref, _, _ = run_steps(optax.adam(1e-2, eps=1e-3), params, grads)
        tx = optim.low_precision_adam(1e-2, eps=1e-3, hadam=hadam, loss_scaling=loss_scaling, kahan=kahan,
                                      init_scale=256.0)
        got, state, _ = run_steps(tx, params, grads, loss_scale_fn=optim.loss_scale_or_one)
        assert float(optim.loss_scale_or_one(state)) == (256.0 if loss_scaling else 1.0)
        for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10)
