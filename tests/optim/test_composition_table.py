"""The composition rule: under loss scaling, a chain's updates equal the same chain's updates on the unscaled
gradients (float64, to rounding), for chains built from optax's standard pieces.

Each chain is run twice on the same gradient stream: as is, on the true gradients, and wrapped in
``compound_loss_scaling`` on gradients multiplied by the current loss scale. The scale changes during the run
(growth every 4 applied steps, a back-off at each injected inf, whose step the reference simply never sees), and
``init_scale`` is not a power of two, so unscaling rounds.
"""

import jax
import jax.numpy as jnp
import optax
import pytest

from lpjax import optim
from tests.optim.helpers import max_relative_error, random_tree

STEPS = 30
BAD = {6, 7, 19}
MASK = {"w0": True, "w1": False, "w2": True}
LABELS = {"w0": "adam", "w1": "sgd", "w2": "adam"}


def _schedule():
    return optax.warmup_cosine_decay_schedule(0.0, 1e-2, warmup_steps=5, decay_steps=25)


# (id, factory, the path the scaler takes, whether a skipped step is injected)
CHAINS = [
    ("hadam", lambda: optim.hadam(1e-2, eps=1e-3), "compound", True),
    (
        "injected_adamw",
        lambda: optim.inject_hyperparams(optax.adamw)(1e-2, eps=1e-3, weight_decay=1e-2),
        "compound",
        True,
    ),
    (
        "hadam_schedule_weight_decay",
        lambda: optax.chain(
            optim.scale_by_hadam(eps=1e-3), optax.add_decayed_weights(1e-2), optax.scale_by_learning_rate(_schedule())
        ),
        "compound",
        True,
    ),
    (
        "hadam_then_update_clipping",
        lambda: optax.chain(optim.hadam(1e-2, eps=1e-3), optax.clip_by_global_norm(1e-2)),
        "compound",
        True,
    ),
    (
        "gradient_clipping_then_hadam",
        lambda: optax.chain(optax.clip_by_global_norm(0.5), optim.hadam(1e-2, eps=1e-3)),
        "unscaled",
        True,
    ),
    (
        "l2_regularisation_then_hadam",
        lambda: optax.chain(optax.add_decayed_weights(1e-2), optim.hadam(1e-2, eps=1e-3)),
        "unscaled",
        True,
    ),
    ("sgd", lambda: optax.sgd(1e-2), "unscaled", True),
    ("nesterov_momentum", lambda: optax.sgd(_schedule(), momentum=0.9, nesterov=True), "unscaled", True),
    ("lion", lambda: optax.lion(1e-3), "unscaled", True),
    ("adafactor", lambda: optax.adafactor(1e-2), "unscaled", True),
    ("masked_hadam", lambda: optax.masked(optim.hadam(1e-2, eps=1e-3), MASK), "unscaled", True),
    (
        "multi_transform_hadam_sgd",
        lambda: optax.multi_transform({"adam": optim.hadam(1e-2, eps=1e-3), "sgd": optax.sgd(1e-2)}, LABELS),
        "unscaled",
        True,
    ),
    (
        "multisteps_inside",
        lambda: optax.MultiSteps(optim.hadam(1e-2, eps=1e-3), every_k_schedule=3, accumulator_dtype=jnp.float64),
        "unscaled",
        True,
    ),
    ("optax_adam_closure_eps", lambda: optax.adam(1e-2, eps=1e-3), "unscaled", True),
    ("apply_if_finite_inside", lambda: optax.apply_if_finite(optim.hadam(1e-2, eps=1e-3), 5), "unscaled", True),
]


def _run_reference(tx, params, grads):
    state = tx.init(params)
    update = jax.jit(tx.update)
    for i, g in enumerate(grads):
        if i in BAD:
            continue
        updates, state = update(g, state, params)
        params = optax.apply_updates(params, updates)
    return params


def _run_scaled(tx, params, grads, inject_bad):
    tx = optim.compound_loss_scaling(tx, init_scale=1000.0, growth_interval=4)
    state = tx.init(params)
    update = jax.jit(tx.update)
    scales = set()
    for i, g in enumerate(grads):
        scale = optim.loss_scale(state)
        scales.add(float(scale))
        scaled = jax.tree.map(lambda x: x * scale, g)
        if i in BAD:
            if not inject_bad:
                continue
            scaled = jax.tree.map(lambda x: x.at[(0,) * x.ndim].set(jnp.inf), scaled)
        updates, state = update(scaled, state, params)
        params = optax.apply_updates(params, updates)
    return params, state, scales


@pytest.mark.parametrize("name, make, path, inject_bad", CHAINS, ids=[c[0] for c in CHAINS])
def test_loss_scaled_chain_equals_the_chain_on_true_gradients_in_float64(name, make, path, inject_bad):
    with jax.enable_x64(True):
        params = random_tree(0, jnp.float64)
        grads = [random_tree(1 + i, jnp.float64, scale=0.3) for i in range(STEPS)]
        reference = _run_reference(make(), params, grads)
        got, state, scales = _run_scaled(make(), params, grads, inject_bad)
        assert int(state.skipped_steps) == len(BAD)
        assert len(scales) >= 4, scales
        assert ("compound" if float(state.inner_scale) != 1.0 else "unscaled") == path
        assert max_relative_error(got, reference) < 1e-9
        assert max_relative_error(got, params) > 1e-4  # the chain did move the parameters
