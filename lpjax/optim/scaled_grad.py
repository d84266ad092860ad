"""The loss scale of any optimizer state, the gradients of a loss scaled by it, and the updates it skipped.

:func:`loss_scale` finds the :class:`lpjax.optim.CompoundLossScalingState` in whatever holds it: a raw optax state,
``optax.chain``, ``optax.MultiSteps``, ``optax.inject_hyperparams``, an ``optax.multi_transform`` branch, a flax
``TrainState`` or an ``nnx.Optimizer``. :func:`scaled_value_and_grad` is the train-step helper built on it, in the
spirit of flax's ``DynamicScale.value_and_grad``: it multiplies the loss by the scale in float32, differentiates,
and returns the unscaled loss with the scaled gradients the scaler expects. Skipping and backing off stay with the
optimizer, so the train step is the usual two lines::

    loss, grads = lpjax.optim.scaled_value_and_grad(loss_fn)(state.opt_state, state.params, batch)
    state = state.apply_gradients(grads=grads)

and :func:`skipped_steps` reads how many updates the scaler has skipped, the number to log beside the scale. For
a ``flax.nnx`` model the helper is ``nnx.value_and_grad``'s twin, with the optimizer as its first argument::

    (loss, logits), grads = lpjax.optim.scaled_value_and_grad(loss_fn, has_aux=True)(optimizer, model, batch, rngs)
    optimizer.update(model, grads)

(parameters differentiated, batch statistics and rng counters updated in place, as ``nnx.value_and_grad`` does).

The scale is a float32 value that may exceed float16's range (2^16 is inf in float16): it multiplies the loss in
float32, and the cotangent that enters a float16 computation is the scale divided by whatever the loss's
float32 tail divides by (a mean over a batch, say). A loss reduced in float32 therefore supports scales far above
65504; a float16 scalar loss caps the scale at 65504, which the scaler finds by itself (an inf gradient is a
skipped step and a back-off).

Placements that cannot be correct are refused here, at the first :func:`loss_scale`, with what to do instead:
a scaler inside ``optax.apply_if_finite`` (which would restore the scaler's own state on every non-finite step,
freezing the scale), a scaler after other transforms in an ``optax.chain`` (they would see scaled gradients), and
a scaler in a ``multi_transform`` branch without ``label=`` (other branches must not get its scale), and an
increment transform (``kahan_summation``, ``stochastic_rounding``) that is not last. What is never an optimizer
state (``None``, the optimizer itself, the parameters or the model) is refused by every function here. Reading
the scale marks it (:mod:`lpjax.optim._misuse`): a scaler updated with gradients of a loss that nobody
multiplied by its scale warns once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from lpjax.optim import _misuse
from lpjax.optim._misuse import tree_child
from lpjax.optim.loss_scaling import CompoundLossScalingState

_BRANCHING_STATES = tuple(
    t for t in (getattr(optax, "MultiTransformState", None), getattr(optax, "PartitionState", None)) if t is not None
)


def _is_scaler(node) -> bool:
    return isinstance(node, CompoundLossScalingState)


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
                "apply_if_finite."
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
        child = tree_child(node, key)
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


def _check_holder(opt_state, caller: str) -> None:
    """Raises for what is never an optimizer state: ``None`` and the optimizer itself (its ``init``/``update``
    pair has no state, so a scaler in it would silently read as scale 1)."""
    if opt_state is None:
        raise ValueError(
            f"{caller} got None instead of the optimizer's state: pass opt_state = tx.init(params) (or the "
            "TrainState / nnx.Optimizer that holds it)."
        )
    if isinstance(opt_state, optax.GradientTransformation):
        raise ValueError(
            f"{caller} got the optimizer (an optax.GradientTransformation), not its state: pass "
            "opt_state = tx.init(params) (or the TrainState / nnx.Optimizer that holds it)."
        )


def _check_not_arguments(opt_state, args, argnums) -> None:
    """Raises when the first argument of a :func:`scaled_value_and_grad` function is what it differentiates
    (the parameters, or the ``nnx`` model) rather than an optimizer state: it holds no scaler, so the scale
    would silently be 1."""
    if isinstance(opt_state, nnx.Module):
        raise ValueError(
            f"scaled_value_and_grad's first argument is an nnx.Module ({type(opt_state).__name__}) that holds no "
            "optimizer state: pass the nnx.Optimizer first, then fun's arguments: grad_fn(optimizer, model, ...)."
        )
    structure = jax.tree.structure(opt_state)
    for i in (argnums,) if isinstance(argnums, int) else argnums:
        if i < len(args) and (args[i] is opt_state or jax.tree.structure(args[i]) == structure):
            raise ValueError(
                "scaled_value_and_grad's function takes the optimizer's state first and then fun's arguments, "
                f"but its first argument is the same as fun's argument {i} (the parameters or the model): call "
                "grad_fn(opt_state, *args) (a TrainState or an nnx.Optimizer may stand for opt_state)."
            )


def loss_scale(opt_state, label: str | None = None) -> chex.Array:
    """Returns the current loss scale (float32) held by the :class:`CompoundLossScalingState` in ``opt_state``.

    Reading the scale marks it as used (see :mod:`lpjax.optim._misuse`): the scaler's update then knows that the
    loss was multiplied by it, and warns when it was not.

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
    _check_holder(opt_state, "loss_scale")
    _misuse.check_increments_last(opt_state)
    path, node = _find_scaler(opt_state, label, "loss_scale")
    if _check_placement(opt_state, path) and label is None:
        raise ValueError(
            f"The loss scaler sits in multi_transform branch {_labels(path)}: only that branch's gradients may carry "
            "its scale. Pass label= and scale only that branch's loss terms, or wrap the whole multi_transform in "
            "one compound_loss_scaling."
        )
    _misuse.note_scale_read(node.scale)
    return _value(node.scale)


def loss_scale_or_one(opt_state, label: str | None = None) -> chex.Array:
    """:func:`loss_scale` if ``opt_state`` holds a loss scaler, else float32 1: code that may or may not be
    loss-scaled (an ablation switch) multiplies its loss by this. ``None`` or an optimizer instead of its state
    raise, as in :func:`loss_scale`."""
    _check_holder(opt_state, "loss_scale_or_one")
    if _scalers(opt_state):
        return loss_scale(opt_state, label)
    _misuse.check_increments_last(opt_state)
    return jnp.ones([], jnp.float32)


def skipped_steps(opt_state, label: str | None = None) -> chex.Array:
    """The number of updates (int32) the loss scaler in ``opt_state`` has skipped for non-finite gradients, over
    its whole life (the count is part of the state, so it survives checkpoints); 0 where ``opt_state`` holds no
    scaler, which skips nothing.

    A skipped update leaves the parameters where they were, so a run whose count keeps rising has stopped
    learning even though its losses may look merely noisy: learners log it beside the loss scale. The scaler is
    found as :func:`loss_scale` finds it (``label`` picks a ``multi_transform`` branch).
    """
    _check_holder(opt_state, "skipped_steps")
    if not _scalers(opt_state):
        return jnp.zeros([], jnp.int32)
    _, node = _find_scaler(opt_state, label, "skipped_steps")
    return _value(node.skipped_steps, jnp.int32)


def _holds_nnx_objects(args, kwargs) -> bool:
    """Whether any argument is an ``nnx`` graph node (a module, ``nnx.Rngs``, a variable): their state must be
    differentiated and updated as ``nnx.grad`` does, not as a plain pytree."""
    is_node = nnx.graph.is_graph_node
    return any(is_node(x) for x in jax.tree.leaves((args, kwargs), is_leaf=is_node))


def scaled_value_and_grad(
    fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False, label: str | None = None
) -> Callable[..., tuple[Any, Any]]:
    """``jax.value_and_grad`` (or ``nnx.value_and_grad``) of ``fun`` with its loss multiplied by the loss scale
    found in an optimizer state.

    The call site differs from the unscaled one by the function's name and one first argument::

        loss, grads = jax.value_and_grad(loss_fn)(params, batch)                                   # before
        loss, grads = lpjax.optim.scaled_value_and_grad(loss_fn)(opt_state, params, batch)         # after
        (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, batch, rngs)      # before
        (loss, logits), grads = lpjax.optim.scaled_value_and_grad(loss_fn, has_aux=True)(optimizer, model, batch, rngs)

    ``flax.nnx`` objects among the arguments (a model with ``Dropout`` or ``BatchNorm``, ``nnx.Rngs``) are handled
    as ``nnx.value_and_grad`` handles them: a model at ``argnums`` is differentiated with respect to its
    ``nnx.Param`` variables only (the gradients are an ``nnx.State``), and every other state (batch statistics,
    rng counters) is updated in place.

    Args:
      fun: ``fun(*args, **kwargs) -> loss`` (or ``(loss, aux)`` with ``has_aux``); the loss is a scalar of any
        floating dtype.
      argnums: which positional arguments of ``fun`` to differentiate, as in ``jax.grad``.
      has_aux: whether ``fun`` returns ``(loss, aux)``.
      label: the ``multi_transform`` branch whose scaler to use (see :func:`loss_scale`).

    Returns:
      ``grad_fn(opt_state, *args, **kwargs) -> (loss, grads)`` (``((loss, aux), grads)`` with ``has_aux``), where
      ``opt_state`` is anything :func:`loss_scale` accepts (a raw state, a flax ``TrainState``, an
      ``nnx.Optimizer``), ``loss`` is ``fun``'s own (unscaled) value and ``grads`` are the gradients of
      ``float32(loss) * scale``, ready for ``tx.update``. Without a scaler in ``opt_state`` the scale is 1 and
      this is ``jax.value_and_grad``.

    Raises:
      ValueError: ``opt_state`` is ``None``, the optimizer itself, or one of ``fun``'s differentiated arguments
        (the parameters, the model), or a placement :func:`loss_scale` refuses.
    """

    def grad_fn(opt_state, *args, **kwargs):
        _check_holder(opt_state, "scaled_value_and_grad")
        if not _scalers(opt_state):
            _check_not_arguments(opt_state, args, argnums)
        scale = loss_scale_or_one(opt_state, label)

        def scaled(*inner_args, **inner_kwargs):
            out = fun(*inner_args, **inner_kwargs)
            loss, aux = out if has_aux else (out, None)
            return jnp.asarray(loss).astype(jnp.float32) * scale, (loss, aux)

        grad = nnx.grad if _holds_nnx_objects(args, kwargs) else jax.grad
        grads, (loss, aux) = grad(scaled, argnums=argnums, has_aux=True)(*args, **kwargs)
        return ((loss, aux), grads) if has_aux else (loss, grads)

    return grad_fn
