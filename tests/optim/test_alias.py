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
        tx = optim.low_precision_adam(
            1e-2, eps=1e-3, hadam=hadam, loss_scaling=loss_scaling, kahan=kahan, init_scale=256.0
        )
        got, state, _ = run_steps(tx, params, grads, loss_scale_fn=optim.loss_scale_or_one)
        assert float(optim.loss_scale_or_one(state)) == (256.0 if loss_scaling else 1.0)
        for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10)


FACTORIES = {
    "hadam": (optim.hadam, dict(learning_rate=1e-3)),
    "scale_by_hadam": (optim.scale_by_hadam, dict(b1=0.8, moment_dtype=jnp.float32)),
    "low_precision_adam": (optim.low_precision_adam, dict(learning_rate=1e-3, init_scale=2.0**16)),
    "low_precision_adam_without_hadam": (optim.low_precision_adam, dict(learning_rate=1e-3, hadam=False)),
    "kahan_summation": (optim.kahan_summation, dict(compensation_dtype=jnp.float32)),
    "compound_loss_scaling": (optim.compound_loss_scaling, dict(inner=optim.hadam(1e-3), growth_interval=3)),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
@pytest.mark.parametrize("inject", ["lpjax", "optax_float32"])
def test_inject_hyperparams_works_with_every_factory_under_jit(name, inject):
    factory, kwargs = FACTORIES[name]
    wrapper = (
        optim.inject_hyperparams(factory)
        if inject == "lpjax"
        else optax.inject_hyperparams(
            factory, static_args=[k for k in kwargs if k.endswith("dtype")], hyperparam_dtype=jnp.float32
        )
    )
    params = random_tree(0, jnp.float16)
    grads = [jax.tree.map(lambda g: (g * 100).astype(jnp.float16), random_tree(i, jnp.float32, 0.1)) for i in range(6)]
    injected = wrapper(**kwargs)
    state = injected.init(params)
    floats = [v for v in state.hyperparams.values() if jnp.issubdtype(v.dtype, jnp.floating)]
    assert all(v.dtype == jnp.float32 for v in floats) and (floats or name == "kahan_summation")
    got, _, _ = run_steps(injected, params, grads)
    ref, _, _ = run_steps(factory(**kwargs), params, grads)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_optax_inject_hyperparams_of_low_precision_adam_in_float16_raises_with_the_fix():
    with pytest.raises(ValueError, match="lpjax.optim.inject_hyperparams"):
        optax.inject_hyperparams(optim.low_precision_adam)(learning_rate=1e-3).init(random_tree(0, jnp.float16))


def test_injected_learning_rate_changes_mid_run():
    params = random_tree(0, jnp.float32)
    tx = optim.inject_hyperparams(optim.low_precision_adam)(learning_rate=1e-3, kahan=False)
    state = tx.init(params)
    update = jax.jit(tx.update)
    grads = jax.tree.map(lambda g: g * optim.loss_scale(state), random_tree(1, jnp.float32))
    u1, state = update(grads, state, params)
    state.hyperparams["learning_rate"] = jnp.asarray(1e-4, jnp.float32)
    u2, state = update(grads, state, params)
    # The same gradient twice: Adam's direction is +-1 both times, so the second step is ten times smaller.
    np.testing.assert_allclose(np.asarray(u2["w0"]) / np.asarray(u1["w0"]), 0.1, rtol=1e-3)


def test_moment_dtype_switch():
    params = random_tree(0, jnp.float16)
    for hadam in (True, False):
        tx = optim.low_precision_adam(1e-3, hadam=hadam, moment_dtype=jnp.float32)
        moments = [x for x in jax.tree.leaves(tx.init(params)) if x.size > 1]
        assert {x.dtype for x in moments} >= {np.dtype(np.float32)}


def test_optax_inject_hyperparams_of_low_precision_adam_runs_jitted_with_float32_params():
    # The failure: TracerBoolConversionError at the first jitted step (the switches are static, the
    # scaler's own hyperparameters may be traced).
    params = random_tree(0, jnp.float32)
    tx = optax.inject_hyperparams(optim.low_precision_adam)(learning_rate=1e-3, growth_interval=2)
    grads = [jax.tree.map(lambda g: g * 1e4, random_tree(i, jnp.float32)) for i in range(5)]
    got, state, _ = run_steps(tx, params, grads)
    ref, _, _ = run_steps(optim.low_precision_adam(1e-3, growth_interval=2), params, grads)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(optim.loss_scale(state)) > 1e4  # grew under the injected growth_interval
