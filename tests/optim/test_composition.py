"""lpjax transforms inside other people's optax code: chain, MultiSteps, inject_hyperparams, flax TrainState,
vmap, tree_map, and an orbax save/restore round trip of every state."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import linen as nn
from flax.training import train_state

from lpjax import optim
from tests.optim.helpers import max_relative_error, random_tree, run_steps


def test_chain_with_clipping_and_weight_decay_matches_optax_adamw_chain_in_float64():
    def build(adam_like):
        return optax.chain(
            optax.clip_by_global_norm(0.5),
            adam_like,
            optax.add_decayed_weights(1e-2),
            optax.scale_by_learning_rate(1e-2),
        )

    with jax.enable_x64(True):
        params = random_tree(0, jnp.float64)
        grads = [random_tree(i, jnp.float64) for i in range(50)]
        ref, _, _ = run_steps(build(optax.scale_by_adam(eps=1e-3)), params, grads)
        got, _, _ = run_steps(
            optax.chain(build(optim.scale_by_hadam(eps=1e-3)), optim.kahan_summation()), params, grads
        )
        assert max_relative_error(got, ref) < 1e-10


def test_loss_scaled_chain_with_weight_decay_and_update_clipping_matches_unscaled_reference_in_float64():
    # Everything inside the scaler sees scaled gradients and returns unscaled updates; scale-dependent transforms
    # (weight decay, clipping of the update) therefore go inside after Adam, or after the scaler.
    def adamw(adam_like):
        return optax.chain(adam_like, optax.add_decayed_weights(1e-2), optax.scale_by_learning_rate(1e-2))

    with jax.enable_x64(True):
        params = random_tree(0, jnp.float64)
        grads = [random_tree(i, jnp.float64) for i in range(50)]
        ref, _, _ = run_steps(
            optax.chain(adamw(optax.scale_by_adam(eps=1e-3)), optax.clip_by_global_norm(1e-2)), params, grads
        )
        tx = optax.chain(
            optim.compound_loss_scaling(adamw(optim.scale_by_hadam(eps=1e-3)), growth_interval=20),
            optax.clip_by_global_norm(1e-2),
            optim.kahan_summation(),
        )
        got, state, _ = run_steps(tx, params, grads, loss_scale_fn=optim.loss_scale)
        assert float(optim.loss_scale(state)) == 4e4  # grew twice in 50 steps
        assert max_relative_error(got, ref) < 1e-10


def test_multisteps_accumulates_scaled_gradients_at_a_constant_scale():
    with jax.enable_x64(True):
        params = random_tree(0, jnp.float64)
        grads = [random_tree(i, jnp.float64) for i in range(40)]
        # MultiSteps accumulates in float32 unless told otherwise; float64 keeps the comparison exact.
        multi = lambda tx: optax.MultiSteps(tx, every_k_schedule=4, accumulator_dtype=jnp.float64)
        ref, _, _ = run_steps(multi(optax.adam(1e-2, eps=1e-3)), params, grads)
        tx = multi(optim.compound_loss_scaling(optim.hadam(1e-2, eps=1e-3), growth_interval=3))
        got, state, _ = run_steps(tx, params, grads, loss_scale_fn=optim.loss_scale)
        assert float(optim.loss_scale(state)) == 8e4  # 10 inner steps: grew after the 3rd, 6th and 9th
        assert max_relative_error(got, ref) < 1e-10


def test_inject_hyperparams_changes_hadam_learning_rate_mid_run():
    params = random_tree(0, jnp.float32)
    grads = [random_tree(i, jnp.float32) for i in range(10)]
    tx = optax.inject_hyperparams(optim.hadam)(learning_rate=1e-2)
    state = tx.init(params)
    reference = optim.hadam(1e-2)
    ref_state = reference.init(params)
    got, ref = params, params
    for i, g in enumerate(grads):
        if i == 5:
            state.hyperparams["learning_rate"] = jnp.asarray(1e-3, jnp.float32)
            reference = optim.hadam(1e-3)
        updates, state = jax.jit(tx.update)(g, state, got)
        got = optax.apply_updates(got, updates)
        ref_updates, ref_state = reference.update(g, ref_state, ref)
        ref = optax.apply_updates(ref, ref_updates)
    assert max_relative_error(got, ref) < 1e-5


class _MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(nn.tanh(nn.Dense(16)(x)))


def test_flax_train_state_with_full_lpjax_chain_in_float16_learns():
    model = _MLP()
    x = jnp.asarray(np.random.default_rng(0).normal(size=(64, 3)), jnp.float16)
    y = jnp.sum(x, axis=1, keepdims=True) * 0.5
    params = jax.tree.map(lambda p: p.astype(jnp.float16), model.init(jax.random.key(0), x))
    tx = optax.chain(optim.compound_loss_scaling(optim.hadam(3e-3)), optim.kahan_summation())
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)

    def loss_fn(p):
        return jnp.mean(jnp.square(model.apply(p, x) - y))

    @jax.jit
    def step(state):
        scale = optim.loss_scale(state.opt_state)
        grads = jax.grad(lambda p: loss_fn(p) * scale.astype(jnp.float16))(state.params)
        return state.apply_gradients(grads=grads)

    first = float(loss_fn(state.params))
    for _ in range(300):
        state = step(state)
    last = float(loss_fn(state.params))
    assert np.isfinite(last) and last < 0.1 * first
    assert jax.tree.leaves(state.params)[0].dtype == jnp.float16
    assert int(state.step) == 300


def _states():
    """One instance of every lpjax optimizer state, on float16 params, after one update."""
    params = random_tree(0, jnp.float16)
    grads = random_tree(1, jnp.float16, scale=10.0)
    txs = {
        "hadam": optim.hadam(1e-3, eps=1e-4),
        "loss_scaled_hadam": optim.compound_loss_scaling(optim.hadam(1e-3)),
        "loss_scaled_adam": optim.compound_loss_scaling(
            optax.inject_hyperparams(optax.adam, hyperparam_dtype=jnp.float32)(learning_rate=1e-3)
        ),
        "kahan": optim.kahan_summation(),
        "full_chain": optax.chain(optim.compound_loss_scaling(optim.hadam(1e-3)), optim.kahan_summation()),
    }
    states = {name: tx.update(grads, tx.init(params), params)[1] for name, tx in txs.items()}
    polyak = optim.kahan_polyak(0.005)
    states["kahan_polyak"] = polyak.update(grads, params, polyak.init(params))[1]
    return states


@pytest.mark.parametrize(
    "name", ["hadam", "loss_scaled_hadam", "loss_scaled_adam", "kahan", "full_chain", "kahan_polyak"]
)
def test_states_survive_jit_vmap_tree_map_and_orbax(name, tmp_path):
    state = _states()[name]
    leaves, treedef = jax.tree.flatten(state)

    jitted = jax.jit(lambda s: s)(state)
    assert jax.tree.structure(jitted) == treedef

    mapped = jax.tree.map(lambda x: x, state)
    assert type(mapped) is type(state)

    batched = jax.tree.map(lambda x: jnp.stack([x, x]), state)
    unbatched = jax.vmap(lambda s: s)(batched)
    assert jax.tree.structure(unbatched) == treedef

    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "state", state)
    checkpointer.wait_until_finished()
    restored = checkpointer.restore(tmp_path / "state", jax.tree.map(ocp.utils.to_shape_dtype_struct, state))
    assert jax.tree.structure(restored) == treedef
    for a, b in zip(leaves, jax.tree.leaves(restored)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_vmap_over_a_batch_of_optimizers():
    tx = optax.chain(optim.compound_loss_scaling(optim.hadam(1e-3)), optim.kahan_summation())
    params = jnp.stack([jnp.ones((3,), jnp.float16), -jnp.ones((3,), jnp.float16)])
    grads = jnp.stack([jnp.full((3,), 10.0, jnp.float16), jnp.full((3,), jnp.inf, jnp.float16)])
    states = jax.vmap(tx.init)(params)
    updates, states = jax.jit(jax.vmap(tx.update))(grads, states, params)
    scaler = states[0]
    np.testing.assert_array_equal(np.asarray(scaler.scale), [1e4, 5e3])
    np.testing.assert_array_equal(np.asarray(scaler.skipped_steps), [0, 1])
    assert float(updates[0, 0]) < 0 and float(jnp.max(jnp.abs(updates[1]))) == 0.0
