"""Wiring that would train silently wrong: each case raises one line naming the fix, at trace or init time, or (a
loss nobody scaled) warns once; the correct wirings stay silent."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from flax.training import train_state

from lpjax import optim

PARAMS = {"w": jnp.linspace(0.5, 1.5, 8, dtype=jnp.float16)}


def _loss(params, x=1.0):
    return jnp.mean(jnp.square(params["w"] * x - 0.25), dtype=jnp.float32)


def _raises_one_line(match, fn, *args):
    with pytest.raises(ValueError, match=match) as error:
        fn(*args)
    assert "\n" not in str(error.value), str(error.value)
    return str(error.value)


def _scaled_chain():
    return optax.chain(optim.compound_loss_scaling(optim.hadam(1e-3)), optim.kahan_summation())


# --- increment transforms must be last ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: optax.chain(optim.kahan_summation(), optim.hadam(1e-4)), "kahan_summation"),
        (lambda: optax.chain(optim.stochastic_rounding(), optim.hadam(1e-4)), "stochastic_rounding"),
        (lambda: optax.chain(optim.kahan_summation(), optim.compound_loss_scaling(optim.hadam(1e-4))), "kahan"),
        (lambda: optax.chain(_scaled_chain(), optax.scale(1.0)), "kahan_summation"),  # last of an inner chain only
        (lambda: optim.compound_loss_scaling(optax.chain(optim.kahan_summation(), optim.hadam(1e-4))), "kahan"),
    ],
    ids=["kahan_then_hadam", "rounding_then_hadam", "kahan_then_scaler", "nested_chain", "inside_the_scaler"],
)
def test_an_increment_transform_before_another_is_refused_by_the_helpers(make, name):
    state = make().init(PARAMS)
    message = _raises_one_line(f"{name}.*last", optim.scaled_value_and_grad(_loss), state, PARAMS)
    assert "optax.chain(..., " in message
    with pytest.raises(ValueError, match="last"):
        optim.loss_scale_or_one(state)


FOLLOWERS = {
    "hadam": lambda: optim.hadam(1e-4),
    "scaler": lambda: optim.compound_loss_scaling(optim.hadam(1e-4)),
    "kahan": optim.kahan_summation,
    "stochastic_rounding": optim.stochastic_rounding,
}


@pytest.mark.parametrize("first", ["kahan_summation", "stochastic_rounding"])
@pytest.mark.parametrize("follower", list(FOLLOWERS))
@pytest.mark.parametrize("jitted", [False, True])
def test_lpjax_transforms_refuse_an_increment_transforms_output(first, follower, jitted):
    # The case is chain(kahan_summation(), hadam(1e-4)) with plain jax.grad: no lpjax helper sees the state.
    tx = optax.chain(getattr(optim, first)(), FOLLOWERS[follower]())
    state = tx.init(PARAMS)
    update = jax.jit(tx.update) if jitted else tx.update
    _raises_one_line(f"{first} is followed by .*Put it last", update, jax.grad(_loss)(PARAMS), state, PARAMS)


@pytest.mark.parametrize(
    "make",
    [
        _scaled_chain,
        lambda: optim.compound_loss_scaling(optax.chain(optim.hadam(1e-4), optim.kahan_summation())),
        lambda: optax.chain(optim.compound_loss_scaling(optim.hadam(1e-4)), optim.stochastic_rounding()),
        lambda: optax.MultiSteps(_scaled_chain(), every_k_schedule=2),
        lambda: optim.low_precision_adam(1e-3),
    ],
    ids=["chain", "inside_the_scaler", "stochastic_rounding", "multisteps", "low_precision_adam"],
)
def test_increment_transforms_placed_last_are_accepted(make):
    tx = make()
    state = tx.init(PARAMS)

    @jax.jit
    def step(params, state):
        _, grads = optim.scaled_value_and_grad(_loss)(state, params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    params = PARAMS
    for _ in range(2):
        params, state = step(params, state)
    assert np.all(np.isfinite(np.asarray(params["w"])))


# --- the helper handed the wrong object ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "wrong, match",
    [
        (lambda tx, state: None, "got None instead of the optimizer's state"),
        (lambda tx, state: tx, "got the optimizer \\(an optax.GradientTransformation\\), not its state"),
        (lambda tx, state: PARAMS, "first argument is the same as fun's argument 0"),
    ],
    ids=["none", "optimizer", "params"],
)
def test_the_gradient_helper_refuses_what_is_not_an_optimizer_state(wrong, match):
    tx = _scaled_chain()
    bad = wrong(tx, tx.init(PARAMS))
    message = _raises_one_line(match, optim.scaled_value_and_grad(_loss), bad, PARAMS)
    assert "opt_state" in message
    if bad is not PARAMS:  # the readers refuse them too
        for reader in (optim.loss_scale, optim.loss_scale_or_one, optim.skipped_steps):
            with pytest.raises(ValueError, match=match):
                reader(bad)


def test_the_gradient_helper_refuses_an_nnx_model_in_the_optimizers_place():
    model = nnx.Linear(8, 1, rngs=nnx.Rngs(0))
    x = jnp.ones((4, 8))
    grad_fn = optim.scaled_value_and_grad(lambda m, x: jnp.mean(m(x)))
    _raises_one_line("nnx.Module \\(Linear\\).*pass the nnx.Optimizer first", grad_fn, model, model, x)


def test_a_plain_optimizer_state_still_means_scale_one():
    state = optax.adam(1e-3).init(PARAMS)
    loss, grads = optim.scaled_value_and_grad(_loss)(state, PARAMS)
    np.testing.assert_array_equal(np.asarray(grads["w"]), np.asarray(jax.grad(_loss)(PARAMS)["w"]))


# --- optax.apply_if_finite inside the scaler ----------------------------------------------------------------------


@pytest.mark.parametrize("inner", [optax.adam, optim.hadam])
def test_apply_if_finite_inside_the_scaler_with_float16_parameters_is_one_line_at_init(inner):
    tx = optim.compound_loss_scaling(optax.apply_if_finite(inner(1e-3), max_consecutive_errors=5))
    _raises_one_line("apply_if_finite inside compound_loss_scaling cannot take float16.*Remove", tx.init, PARAMS)
    # float32 parameters keep working (tests/optim/test_composition_table.py checks its updates)
    tx.init(jax.tree.map(lambda p: p.astype(jnp.float32), PARAMS))


# --- a loss nobody scaled ------------------------------------------------------------------------------------------


def _unscaled_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [w for w in caught if issubclass(w.category, optim.UnscaledLossWarning)]


@pytest.mark.parametrize("jitted", [False, True])
def test_gradients_of_an_unscaled_loss_warn_once(jitted):
    tx = _scaled_chain()
    update = jax.jit(tx.update) if jitted else tx.update

    def run():
        params, state = PARAMS, tx.init(PARAMS)
        for _ in range(3):
            updates, state = update(jax.grad(_loss)(params), state, params)
            params = optax.apply_updates(params, updates)

    caught = _unscaled_warnings(run)
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert "scaled_value_and_grad" in str(caught[0].message) and "\n" not in str(caught[0].message)


def test_nnx_value_and_grad_with_a_loss_scaler_warns():
    # The workaround: nnx.value_and_grad and an lpjax optimizer; the gradients are 1/scale too small.
    model = nnx.Linear(8, 1, rngs=nnx.Rngs(0), param_dtype=jnp.float16, dtype=jnp.float16)
    optimizer = nnx.Optimizer(model, _scaled_chain(), wrt=nnx.Param)
    x = jnp.ones((4, 8), jnp.float16)

    @nnx.jit
    def step(model, optimizer):
        grads = nnx.grad(lambda m: jnp.mean(m(x), dtype=jnp.float32))(model)
        optimizer.update(model, grads)

    assert len(_unscaled_warnings(lambda: step(model, optimizer))) == 1


def _step_with_the_helper(holder_kind):
    tx = {
        "chain": _scaled_chain,
        "multisteps": lambda: optax.MultiSteps(_scaled_chain(), every_k_schedule=2),
        "inject": lambda: optim.inject_hyperparams(optim.low_precision_adam)(1e-3),
        "train_state": _scaled_chain,
    }[holder_kind]()
    if holder_kind == "train_state":
        state = train_state.TrainState.create(apply_fn=None, params=PARAMS, tx=tx)

        def step(state):
            _, grads = optim.scaled_value_and_grad(_loss)(state, state.params)
            return state.apply_gradients(grads=grads)

        return step, state
    state = tx.init(PARAMS)

    def step(carry):
        params, state = carry
        _, grads = optim.scaled_value_and_grad(_loss)(state, params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return step, (PARAMS, state)


@pytest.mark.parametrize("holder_kind", ["chain", "multisteps", "inject", "train_state"])
@pytest.mark.parametrize("mode", ["eager", "jit", "scan"])
def test_the_helper_scales_and_nothing_warns(holder_kind, mode):
    step, carry = _step_with_the_helper(holder_kind)

    def run():
        nonlocal carry
        if mode == "scan":
            jax.lax.scan(lambda c, _: (step(c), None), carry, None, length=2)
            return
        stepper = jax.jit(step) if mode == "jit" else step
        for _ in range(2):
            carry = stepper(carry)

    assert _unscaled_warnings(run) == []


def test_gradients_from_another_jitted_function_do_not_warn():
    tx = _scaled_chain()
    state = tx.init(PARAMS)
    grads_fn = jax.jit(lambda state, params: optim.scaled_value_and_grad(_loss)(state, params)[1])
    update = jax.jit(tx.update)
    assert _unscaled_warnings(lambda: update(grads_fn(state, PARAMS), state, PARAMS)) == []
