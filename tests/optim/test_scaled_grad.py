"""loss_scale / scaled_value_and_grad / skipped_steps: finding the scaler in any holder, scaling in float32,
counting skipped updates, refusing placements that cannot be correct."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from flax.training import train_state

from lpjax import optim
from tests.optim.helpers import random_tree


def _scaler(init_scale=64.0):
    return optim.compound_loss_scaling(optim.hadam(1e-3), init_scale=init_scale)


def _loss(params, x):
    return jnp.sum(jnp.tanh(params["w0"] @ x) ** 2)


@pytest.mark.parametrize("holder", ["raw", "chain", "multisteps", "inject", "train_state"])
def test_scaled_value_and_grad_finds_the_scale_and_returns_scaled_gradients(holder):
    params = random_tree(0)
    x = jnp.ones((4,))
    tx = {
        "raw": lambda: _scaler(),
        "chain": lambda: optax.chain(_scaler(), optim.kahan_summation()),
        "multisteps": lambda: optax.MultiSteps(_scaler(), every_k_schedule=2),
        "inject": lambda: optim.inject_hyperparams(optim.low_precision_adam)(1e-3, init_scale=64.0),
        "train_state": lambda: _scaler(),
    }[holder]()
    state = tx.init(params)
    if holder == "train_state":
        state = train_state.TrainState.create(apply_fn=None, params=params, tx=tx)
    loss, grads = jax.jit(optim.scaled_value_and_grad(_loss))(state, params, x)
    assert float(loss) == pytest.approx(float(_loss(params, x)))
    expected = jax.grad(lambda p: _loss(p, x) * 64.0)(params)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5)


def test_has_aux_argnums_and_no_scaler():
    params = random_tree(0)
    x = jnp.ones((4,))
    fun = lambda p, y: (_loss(p, y), {"norm": jnp.sum(y)})
    (loss, aux), (gp, gx) = optim.scaled_value_and_grad(fun, argnums=(0, 1), has_aux=True)(
        _scaler(8.0).init(params), params, x
    )
    assert float(aux["norm"]) == 4.0 and float(loss) == pytest.approx(float(_loss(params, x)))
    np.testing.assert_allclose(np.asarray(gx), 8.0 * np.asarray(jax.grad(_loss, argnums=1)(params, x)), rtol=1e-6)
    # Without a scaler the scale is 1: plain jax.value_and_grad.
    loss, grads = optim.scaled_value_and_grad(_loss)(optax.adam(1e-3).init(params), params, x)
    np.testing.assert_allclose(np.asarray(grads["w0"]), np.asarray(jax.grad(_loss)(params, x)["w0"]), rtol=1e-6)
    assert float(optim.loss_scale_or_one(optax.adam(1e-3).init(params))) == 1.0
    with pytest.raises(ValueError, match="found 0"):
        optim.loss_scale(optax.adam(1e-3).init(params))


def test_scale_above_float16_range_multiplies_a_float16_loss_in_float32():
    # A scale of 2^17 is inf in float16. The loss is reduced in float32, so the cotangent entering the float16
    # computation is 2^17 / 1024 and the float16 gradient is finite; casting the scale to float16 gives inf.
    w = jnp.full((1024,), 0.5, jnp.float16)
    loss = lambda w: jnp.mean(jnp.square(w), dtype=jnp.float32)
    state = optim.compound_loss_scaling(optim.hadam(1e-3), init_scale=2.0**17).init(w)
    _, grads = jax.jit(optim.scaled_value_and_grad(loss))(state, w)
    assert grads.dtype == jnp.float16 and bool(jnp.all(grads == 2.0**17 / 1024))
    cast = jax.grad(lambda w: loss(w) * optim.loss_scale(state).astype(jnp.float16))(w)
    assert not bool(jnp.all(jnp.isfinite(cast)))


class _Linear(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(3, 1, rngs=rngs, param_dtype=jnp.float16, dtype=jnp.float16)

    def __call__(self, x):
        return self.linear(x)


def test_nnx_optimizer_trains_in_float16_with_the_helper():
    model = _Linear(nnx.Rngs(0))
    tx = optax.chain(optim.compound_loss_scaling(optim.hadam(1e-2)), optim.kahan_summation())
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(64, 3)), jnp.float16)
    y = jnp.sum(x, axis=1, keepdims=True) * 0.5

    def loss_fn(model):
        return jnp.mean(jnp.square(model(x) - y), dtype=jnp.float32)

    @nnx.jit
    def step(model, optimizer):
        loss, grads = optim.scaled_value_and_grad(loss_fn)(optimizer, model)
        optimizer.update(model, grads)
        return loss

    first = float(step(model, optimizer))
    for _ in range(300):
        last = float(step(model, optimizer))
    assert float(optim.loss_scale(optimizer)) == 1e4
    assert np.isfinite(last) and last < 0.05 * first


def test_two_scalers_in_a_multi_transform_are_told_apart_by_label():
    params = {"actor": jnp.ones((3,)), "critic": jnp.ones((2,))}
    labels = {"actor": "actor", "critic": "critic"}
    tx = optax.multi_transform({"actor": _scaler(16.0), "critic": _scaler(32.0)}, labels)
    state = tx.init(params)
    with pytest.raises(ValueError, match="found 2.*label="):
        optim.loss_scale(state)
    assert float(optim.loss_scale(state, label="actor")) == 16.0
    assert float(optim.loss_scale(state, label="critic")) == 32.0
    with pytest.raises(ValueError, match="labels of the scalers found: \\['actor', 'critic'\\]"):
        optim.loss_scale(state, label="temperature")
    _, grads = optim.scaled_value_and_grad(lambda p: jnp.sum(p["critic"]), label="critic")(state, params)
    np.testing.assert_array_equal(np.asarray(grads["critic"]), 32.0)


@pytest.mark.parametrize("holder", ["raw", "chain", "multi_transform", "train_state"])
def test_skipped_steps_counts_the_updates_the_scaler_skipped(holder):
    params = {"actor": jnp.ones((3,), jnp.float16), "critic": jnp.ones((2,), jnp.float16)}
    tx = {
        "raw": lambda: _scaler(),
        "chain": lambda: optax.chain(_scaler(), optim.kahan_summation()),
        "multi_transform": lambda: optax.multi_transform(
            {"actor": _scaler(), "critic": optax.sgd(1e-2)}, {"actor": "actor", "critic": "critic"}
        ),
        "train_state": lambda: _scaler(),
    }[holder]()
    label = "actor" if holder == "multi_transform" else None
    state = (
        train_state.TrainState.create(apply_fn=None, params=params, tx=tx)
        if holder == "train_state"
        else tx.init(params)
    )

    @jax.jit
    def step(state, value):  # the gradient is a runtime value: inf or nan makes the scaler skip
        grads = jax.tree.map(lambda p: jnp.full_like(p, value), params)
        if holder == "train_state":
            return state.apply_gradients(grads=grads)
        return tx.update(grads, state, params)[1]

    counts = []
    for value in (1.0, jnp.inf, 1.0, jnp.nan, -jnp.inf, 1.0):
        state = step(state, jnp.float16(value))
        counts.append(optim.skipped_steps(state, label=label))
    assert all(c.dtype == jnp.int32 and c.shape == () for c in counts)
    assert [int(c) for c in counts] == [0, 1, 1, 2, 3, 3]
    assert float(optim.loss_scale(state, label=label)) == 64.0 / 8  # each skip halved the scale


def test_skipped_steps_without_a_scaler_is_zero_and_two_need_a_label():
    assert int(optim.skipped_steps(optax.adam(1e-3).init(jnp.ones(2)))) == 0  # nothing skips without a scaler
    params = {"actor": jnp.ones((3,)), "critic": jnp.ones((2,))}
    tx = optax.multi_transform({"actor": _scaler(), "critic": _scaler()}, {"actor": "actor", "critic": "critic"})
    with pytest.raises(ValueError, match="^skipped_steps expects exactly one .*found 2.*label="):
        optim.skipped_steps(tx.init(params))
    assert int(optim.skipped_steps(tx.init(params), label="critic")) == 0


def test_one_scaler_in_a_multi_transform_branch_needs_its_label():
    params = {"actor": jnp.ones((3,)), "critic": jnp.ones((2,))}
    tx = optax.multi_transform(
        {"actor": _scaler(16.0), "critic": optax.sgd(1e-2)}, {"actor": "actor", "critic": "critic"}
    )
    state = tx.init(params)
    with pytest.raises(ValueError, match="multi_transform branch \\['actor'\\].*label="):
        optim.loss_scale(state)
    assert float(optim.loss_scale(state, label="actor")) == 16.0


@pytest.mark.parametrize(
    "tx, message",
    [
        (optax.apply_if_finite(_scaler(), max_consecutive_errors=5), "apply_if_finite wraps compound_loss_scaling"),
        (optax.chain(optax.clip_by_global_norm(1.0), _scaler()), "Move them inside the scaler"),
    ],
)
def test_placements_that_cannot_be_correct_are_refused_with_the_fix(tx, message):
    with pytest.raises(ValueError, match=message):
        optim.loss_scale(tx.init(jnp.ones((2,))))


def test_apply_if_finite_outside_the_scaler_would_freeze_the_scale():
    # Why it is refused: apply_if_finite restores the scaler's state on a non-finite step, so the scale stays.
    tx = optax.apply_if_finite(_scaler(), max_consecutive_errors=5)
    state = tx.init(jnp.ones((2,)))
    _, state = tx.update(jnp.asarray([jnp.inf, 1.0]), state, jnp.ones((2,)))
    assert float(state.inner_state.scale) == 64.0  # never backed off


# --- nnx models with Dropout, BatchNorm and nnx.Rngs: flax's MNIST CNN ---------------------------------------------


def _mnist_cnn_problem(seed=0):
    """flax's MNIST example CNN (experiments.ports.flax_mnist), its loss, and a random batch of 28x28 images."""
    from experiments.ports import flax_mnist

    keys = jax.random.split(jax.random.key(seed))
    batch = {"image": jax.random.uniform(keys[0], (16, 28, 28, 1)), "label": jax.random.randint(keys[1], (16,), 0, 10)}
    return flax_mnist, flax_mnist.CNN(rngs=nnx.Rngs(seed)), batch


def test_nnx_model_with_dropout_batchnorm_and_rngs_is_differentiated_as_nnx_value_and_grad_does():
    port, model, batch = _mnist_cnn_problem()
    optimizer = nnx.Optimizer(model, optax.chain(_scaler(64.0), optim.kahan_summation()), wrt=nnx.Param)
    scaled_model, plain_model = nnx.clone(model), nnx.clone(model)
    scaled_rngs, plain_rngs = nnx.Rngs(7), nnx.Rngs(7)  # the same dropout masks

    (loss, logits), grads = optim.scaled_value_and_grad(port.loss_fn, has_aux=True)(
        optimizer, scaled_model, batch, scaled_rngs
    )
    (ref_loss, ref_logits), ref_grads = nnx.value_and_grad(port.loss_fn, has_aux=True)(plain_model, batch, plain_rngs)

    assert float(loss) == float(ref_loss) and bool(jnp.all(logits == ref_logits))
    assert isinstance(grads, nnx.State) and jax.tree.structure(grads) == jax.tree.structure(ref_grads)
    assert jax.tree.structure(grads) == jax.tree.structure(nnx.state(model, nnx.Param))  # parameters only
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        np.testing.assert_allclose(np.asarray(g), 64.0 * np.asarray(r), rtol=1e-5, atol=1e-6)
    # Everything that is not a parameter was updated in place, exactly as nnx.value_and_grad updates it.
    np.testing.assert_array_equal(
        np.asarray(scaled_model.batch_norm1.mean.get_value()), np.asarray(plain_model.batch_norm1.mean.get_value())
    )
    assert not np.array_equal(
        np.asarray(scaled_model.batch_norm1.mean.get_value()), np.asarray(model.batch_norm1.mean.get_value())
    )
    assert int(scaled_rngs.default.count.get_value()) == int(plain_rngs.default.count.get_value()) > 0


def test_flax_mnist_cnn_trains_in_float16_through_the_helper_under_nnx_jit():
    """The call of the issue, ``scaled_value_and_grad(loss_fn, has_aux=True)(optimizer, model, batch, rngs)``, in
    flax's own train step with the model in float16 (lpjax.precision.set_policy): no error, no warning."""
    from lpjax.precision import set_policy

    port, model, batch = _mnist_cnn_problem()
    model = set_policy(model, "fp16")
    tx = optax.chain(optim.compound_loss_scaling(optax.sgd(0.05, 0.9)), optim.kahan_summation())
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    rngs = nnx.Rngs(1)

    @nnx.jit
    def train_step(model, optimizer, batch, rngs):
        (loss, logits), grads = optim.scaled_value_and_grad(port.loss_fn, has_aux=True)(optimizer, model, batch, rngs)
        optimizer.update(model, grads)
        return loss

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no dtype (FutureWarning) or unscaled-loss warning
        losses = [float(train_step(model, optimizer, batch, rngs)) for _ in range(30)]
    assert all(np.isfinite(losses)) and losses[-1] < 0.2 * losses[0], losses
    assert model.conv1.kernel.get_value().dtype == jnp.float16
    assert model.batch_norm1.mean.get_value().dtype == jnp.float32
    assert int(optim.skipped_steps(optimizer)) == 0
