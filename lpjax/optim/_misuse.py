"""Trace-time checks of how lpjax's transforms are wired together: misuse that would otherwise train silently wrong.

Two facts cannot be read off one transform's own arguments, so the transforms leave marks for each other, keyed
by the identity of the Python objects they exchange (concrete arrays eagerly, tracers under ``jit``/``vmap``/
``scan``). Nothing here touches the arrays' values or the compiled computation: the marks live only while
their objects do (weak references) and the checks run where Python runs, at trace time under ``jit``.

* **Was the loss scaled?** :func:`lpjax.optim.loss_scale` (and so :func:`lpjax.optim.scaled_value_and_grad`)
  records the scale object it read (:func:`note_scale_read`). The scaler's update asks
  :func:`check_scale_was_read` about the scale of the state it receives: the very object read means the loss
  was multiplied by it. A tracer that was not read is accepted when some scale was read after the scaler was
  built, because wrappers that run the scaler under ``lax.cond`` or ``jax.eval_shape`` (``optax.MultiSteps``)
  or gradients computed in another jitted function hand the update a new tracer of the same value. Otherwise
  the scaler warns, once: its gradients are ``1/scale`` of what it expects (it unscales them, or its
  compound path divides by ``scale * eps``), a run that trains at chance without a skip or an error.

  Limits, by construction: a concrete (eager) update whose gradients came from a jitted function warns
  although they may have been scaled; a program whose other optimizer reads its own scale under a
  transformation silences the warning for an unscaled scaler updated under one too; a loss multiplied by
  ``loss_scale(state)`` but differentiated with respect to something else is not seen.

* **Is the increment transform last?** :func:`lpjax.optim.kahan_summation` and
  :func:`lpjax.optim.stochastic_rounding` return the increments to add to the parameters; anything after them
  in a chain rescales or reinterprets increments that were already rounded (``chain(kahan_summation(),
  hadam(lr))`` feeds hAdam the parameters' rounding residue as gradients: the parameters never move). They mark
  their outputs (:func:`mark_increments`); lpjax's gradient-consuming transforms refuse marked input
  (:func:`refuse_increments`). States are checked too, wherever lpjax sees a whole optimizer state
  (:func:`check_increments_last`): an increment transform must close every chain it is in.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any, NamedTuple

import jax


class UnscaledLossWarning(UserWarning):
    """A :func:`lpjax.optim.compound_loss_scaling` update received gradients of a loss nobody multiplied by its
    scale (see :mod:`lpjax.optim._misuse`). Filter it by this class where that is intended."""


class _Registry:
    """Objects seen, by identity, without keeping them alive."""

    def __init__(self):
        self._refs: dict[int, tuple[weakref.ref, Any]] = {}
        self.count = 0  # how many objects were ever added

    def add(self, obj, tag: Any = True) -> None:
        key = id(obj)
        try:
            ref = weakref.ref(obj, lambda _, key=key: self._refs.pop(key, None))
        except TypeError:  # Python scalars and other objects without weak references: never jax values
            return
        self._refs[key] = (ref, tag)
        self.count += 1

    def tag(self, obj) -> Any:
        """The tag ``obj`` was added with, or ``None``."""
        entry = self._refs.get(id(obj))
        if entry is None or entry[0]() is not obj:
            return None
        return entry[1]


_SCALES_READ = _Registry()
_INCREMENTS = _Registry()


def _arrays(x):
    """``x`` and, for an ``nnx`` variable, the array it holds (the update sees the array)."""
    yield x
    if hasattr(x, "get_value"):
        yield x.get_value()


def note_scale_read(scale) -> None:
    """Records that ``scale`` (a scaler state's ``scale`` field) multiplied a loss."""
    for obj in _arrays(scale):
        _SCALES_READ.add(obj)


class ReadWatch(NamedTuple):
    """What a scaler remembers to decide whether its loss was scaled: the reads counted when it was built, and
    whether it has warned already."""

    reads_at_start: int
    warned: list


def watch_scale_reads() -> ReadWatch:
    """A :class:`ReadWatch` for a scaler built now."""
    return ReadWatch(_SCALES_READ.count, [])


def check_scale_was_read(scale, watch: ReadWatch) -> None:
    """Warns (once per ``watch``) when the scaler's ``scale`` was not read by :func:`lpjax.optim.loss_scale`."""
    if watch.warned or _SCALES_READ.tag(scale) is not None:
        return
    if isinstance(scale, jax.core.Tracer) and _SCALES_READ.count > watch.reads_at_start:
        return  # the same value read in an enclosing or another trace (see the module docstring)
    watch.warned.append(True)
    warnings.warn(
        "compound_loss_scaling got gradients of a loss that was not multiplied by its scale, so they are "
        "1/scale too small: compute them with lpjax.optim.scaled_value_and_grad(loss_fn)(opt_state, ...) or "
        "multiply the loss by lpjax.optim.loss_scale(opt_state).",
        UnscaledLossWarning,
        stacklevel=3,
    )


def mark_increments(increments, producer: str):
    """Marks the leaves of ``increments`` as the output of ``producer`` (an increment transform); returns them."""
    for leaf in jax.tree.leaves(increments):
        _INCREMENTS.add(leaf, producer)
    return increments


def refuse_increments(updates, consumer: str) -> None:
    """Raises if ``updates`` are an increment transform's output: it must be the last transform of the chain."""
    for leaf in jax.tree.leaves(updates):
        producer = _INCREMENTS.tag(leaf)
        if producer is not None:
            raise ValueError(_not_last_message(producer, consumer))


def _not_last_message(producer: str, follower: str | None = None) -> str:
    where = f"is followed by {follower}" if follower else "is not the last transform of its optax.chain"
    return (
        f"{producer} {where}: it returns the final parameter increments, which no transform may change. Put it "
        f"last: optax.chain(..., {producer}())."
    )


def _increment_states() -> dict[type, str]:
    """The states of the increment transforms, by type (imported here: those modules import this one)."""
    from lpjax.optim.kahan import KahanSummationState
    from lpjax.optim.stochastic_rounding import StochasticRoundingState

    return {KahanSummationState: "kahan_summation", StochasticRoundingState: "stochastic_rounding"}


def check_increments_last(opt_state) -> None:
    """Raises if an increment transform's state is followed by another transform's in a chain of ``opt_state``.

    ``optax.chain``'s state is a plain tuple of its transforms' states, in order: along the path to every
    increment transform's state, each such tuple must hold it (or the chain holding it) in its last place.
    """
    producers = _increment_states()
    is_increment = lambda node: type(node) in producers
    flat, _ = jax.tree_util.tree_flatten_with_path(opt_state, is_leaf=is_increment)
    for path, leaf in flat:
        if not is_increment(leaf):
            continue
        node = opt_state
        for key in path:
            if type(node) is tuple and isinstance(key, jax.tree_util.SequenceKey) and key.idx < len(node) - 1:
                raise ValueError(_not_last_message(producers[type(leaf)]))
            node = tree_child(node, key)
            if node is None:
                break


def tree_child(node, key):
    """The child of ``node`` under one ``jax.tree_util`` path entry, or ``None`` if it cannot be resolved."""
    if isinstance(key, jax.tree_util.GetAttrKey):
        return getattr(node, key.name, None)
    if isinstance(key, jax.tree_util.SequenceKey):
        return node[key.idx]
    if isinstance(key, jax.tree_util.DictKey):
        return node[key.key]
    return None
