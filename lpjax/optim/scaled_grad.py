"""The loss scale of any optimizer state, the gradients of a loss scaled by it, and the updates it skipped.

:func:`loss_scale` finds the :class:`lpjax.optim.CompoundLossScalingState` in whatever holds it: a raw optax state,
``optax.chain``, ``optax.MultiSteps``, ``optax.inject_hyperparams``, an ``optax.multi_transform`` branch, a flax
``TrainState`` or an ``nnx.Optimizer``. :func:`scaled_value_and_grad` is the train-step helper built on it, in the
spirit of flax's ``DynamicScale.value_and_grad``: it multiplies the loss by the scale in float32, differentiates,
and returns the unscaled loss with the scaled gradients the scaler expects. Skipping and backing off stay with the
optimizer, so the train step is the usual two lines::

    loss, grads = lpjax.optim.scaled_value_and_grad(loss_fn)(state.opt_state, state.params, batch)
    state = state.apply_gradients(grads=grads)

and :func:`skipped_steps` reads how many updates the scaler has skipped, the number to log beside the scale.

The scale is a float32 value that may exceed float16's range (2^16 is inf in float16): it multiplies the loss in
float32, and the cotangent that enters a float16 computation is the scale divided by whatever the loss's
float32 tail divides by (a mean over a batch, say). A loss reduced in float32 therefore supports scales far above
65504; a float16 scalar loss caps the scale at 65504, which the scaler finds by itself (an inf gradient is a
skipped step and a back-off).

Placements that cannot be correct are refused here, at the first :func:`loss_scale`, with what to do instead:
a scaler inside ``optax.apply_if_finite`` (which would restore the scaler's own state on every non-finite step,
freezing the scale), a scaler after other transforms in an ``optax.chain`` (they would see scaled gradients), and
a scaler in a ``multi_transform`` branch without ``label=`` (other branches must not get its scale).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp
import optax

from lpjax.optim.loss_scaling import CompoundLossScalingState

_BRANCHING_STATES = tuple(
    t for t in (getattr(optax, "MultiTransformState", None), getattr(optax, "PartitionState", None)) if t is not None
)


def _is_scaler(node) -> bool:
    return isinstance(node, CompoundLossScalingState)


def _child(node, key):
    """The child of ``node`` under one ``jax.tree_util`` path entry, or ``None`` if it cannot be resolved."""
    if isinstance(key, jax.tree_util.GetAttrKey):
        return getattr(node, key.name, None)
    if isinstance(key, jax.tree_util.SequenceKey):
        return node[key.idx]
    if isinstance(key, jax.tree_util.DictKey):
        return node[key.key]
    return None


def _labels(path) -> list:
    return [key.key for key in path if isinstance(key, jax.tree_util.DictKey)]


def _check_placement(holder, path) -> bool:
    """Raises for an incorrect placement of the scaler at ``path``; returns whether it sits in a branch."""
    node, in_branch = holder, False
    for key in path:
        if isinstance(node, optax.ApplyIfFiniteState):
            raise ValueError(
                "optax.apply_if_finite wraps compound_loss_scaling: on a non-finite step it restores the scaler's own "
                "state, so the scale never backs off. compound_loss_scaling already skips non-finite steps: remove "
                "apply_if_finite, or put it inside the scaler."
            )
        if isinstance(node, _BRANCHING_STATES):
            in_branch = True
        if (
            type(node) is tuple
            and isinstance(key, jax.tree_util.SequenceKey)
            and any(not _scalers(sibling) for sibling in node[: key.idx])
        ):
            raise ValueError(
                "compound_loss_scaling follows other transforms in an optax.chain, which therefore receive the "
                "loss-scaled gradients (a clipping threshold or weight decay would be off by the scale). Move "
                "them inside the scaler: compound_loss_scaling(optax.chain(...))."
            )
        child = _child(node, key)
        if child is None:
            break
        node = child
    return in_branch


def _scalers(holder) -> list[tuple[Any, CompoundLossScalingState]]:
    """Every ``(path, scaler state)`` in ``holder``."""
    flat, _ = jax.tree_util.tree_flatten_with_path(holder, is_leaf=_is_scaler)
    return [(path, node) for path, node in flat if _is_scaler(node)]


def _value(x, dtype=jnp.float32) -> chex.Array:
    """The array behind a leaf (an ``nnx`` variable holds it as ``get_value()``)."""
    return jnp.asarray(x.get_value() if hasattr(x, "get_value") else x, dtype)


def _find_scaler(opt_state, label: str | None, caller: str) -> tuple[Any, CompoundLossScalingState]:
    """The one ``(path, scaler state)`` of ``opt_state`` (of its ``label`` branch); raises unless exactly one."""
    found = _scalers(opt_state)
    if label is not None:
        matching = [(path, node) for path, node in found if label in _labels(path)]
        if len(matching) != 1:
            available = sorted({str(lab) for path, _ in found for lab in _labels(path)})
            raise ValueError(
                f"{caller}(label={label!r}) matches {len(matching)} loss scalers; labels of the "
                f"scalers found: {available or 'none'}."
            )
        found = matching
    if len(found) != 1:
        where = ", ".join(jax.tree_util.keystr(path) or "<root>" for path, _ in found)
        raise ValueError(
            f"{caller} expects exactly one CompoundLossScalingState in opt_state, found {len(found)}"
            + (f" (at {where}); pass label= to pick a multi_transform branch." if found else ".")
        )
    return found[0]


def loss_scale(opt_state, label: str | None = None) -> chex.Array:
    """Returns the current loss scale (float32) held by the :class:`CompoundLossScalingState` in ``opt_state``.

    Args:
      opt_state: anything holding exactly one scaler, or several told apart by ``label``: a raw optax state, a
        chain, ``MultiSteps``, ``inject_hyperparams``, a ``multi_transform`` state, a flax ``TrainState`` or an
        ``nnx.Optimizer``.
      label: the ``multi_transform`` label of the branch whose scaler to read. Required when the scaler sits in a
        branch: only that branch's loss terms may be multiplied by it.

    Raises:
      ValueError: no scaler, an ambiguous or unlabelled one, or a placement that cannot be correct (see the module
        docstring); the message says what to do.
    """
    path, node = _find_scaler(opt_state, label, "loss_scale")
    if _check_placement(opt_state, path) and label is None:
        raise ValueError(
            f"The loss scaler sits in multi_transform branch {_labels(path)}: only that branch's gradients may carry "
            "its scale. Pass label= and scale only that branch's loss terms, or wrap the whole multi_transform in "
            "one compound_loss_scaling."
        )
    return _value(node.scale)


def loss_scale_or_one(opt_state, label: str | None = None) -> chex.Array:
    """:func:`loss_scale` if ``opt_state`` holds a loss scaler, else float32 1: code that may or may not be
    loss-scaled (an ablation switch) multiplies its loss by this."""
    return loss_scale(opt_state, label) if _scalers(opt_state) else jnp.ones([], jnp.float32)


def skipped_steps(opt_state, label: str | None = None) -> chex.Array:
    """The number of updates (int32) the loss scaler in ``opt_state`` has skipped for non-finite gradients, over
    its whole life (the count is part of the state, so it survives checkpoints); 0 where ``opt_state`` holds no
    scaler, which skips nothing.

    A skipped update leaves the parameters where they were, so a run whose count keeps rising has stopped
    learning even though its losses may look merely noisy: learners log it beside the loss scale. The scaler is
    found as :func:`loss_scale` finds it (``label`` picks a ``multi_transform`` branch).
    """
    if not _scalers(opt_state):
        return jnp.zeros([], jnp.int32)
    _, node = _find_scaler(opt_state, label, "skipped_steps")
    return _value(node.skipped_steps, jnp.int32)


def scaled_value_and_grad(
    fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False, label: str | None = None
) -> Callable[..., tuple[Any, Any]]:
    """``jax.value_and_grad`` of ``fun`` with its loss multiplied by the loss scale found in an optimizer state.

    Args:
      fun: ``fun(*args, **kwargs) -> loss`` (or ``(loss, aux)`` with ``has_aux``); the loss is a scalar of any
        floating dtype.
      argnums: which positional arguments of ``fun`` to differentiate, as in ``jax.grad``.
      has_aux: whether ``fun`` returns ``(loss, aux)``.
      label: the ``multi_transform`` branch whose scaler to use (see :func:`loss_scale`).

    Returns:
      ``grad_fn(opt_state, *args, **kwargs) -> (loss, grads)`` (``((loss, aux), grads)`` with ``has_aux``), where
      ``opt_state`` is anything :func:`loss_scale` accepts, ``loss`` is ``fun``'s own (unscaled) value and
      ``grads`` are the gradients of ``float32(loss) * scale``, ready for ``tx.update``. Without a scaler in
      ``opt_state`` the scale is 1 and this is ``jax.value_and_grad``.
    """

    def grad_fn(opt_state, *args, **kwargs):
        scale = loss_scale_or_one(opt_state, label)

        def scaled(*inner_args, **inner_kwargs):
            out = fun(*inner_args, **inner_kwargs)
            loss, aux = out if has_aux else (out, None)
            return jnp.asarray(loss).astype(jnp.float32) * scale, (loss, aux)

        grads, (loss, aux) = jax.grad(scaled, argnums=argnums, has_aux=True)(*args, **kwargs)
        return ((loss, aux), grads) if has_aux else (loss, grads)

    return grad_fn
