"""Compound (dynamic) loss scaling that wraps any optax optimizer (Björck et al., 2021, Sec. 4.2).

The caller multiplies its loss by the current scale ``s`` (read it with :func:`loss_scale`, or let
:func:`lpjax.optim.scaled_value_and_grad` do it), so the gradients arrive as ``s g``.

**Two paths, one rule.** Under loss scaling, the wrapped chain's updates equal the same chain's updates on the
unscaled gradients ``g`` (to rounding). How the scaler achieves it depends on the transform that receives the
gradients first, which :func:`compound_loss_scaling` reads off the inner state's structure at trace time:

* *Compound path* (the paper's): the first transform is scale-invariant: :func:`lpjax.optim.scale_by_hadam`
  (``hadam``), or optax's ``scale_by_adam`` (``adam``, ``adamw``, ...) built with ``optax.inject_hyperparams`` so that
  its ``eps`` is in the state. The gradients are **never unscaled**: the moments live in scaled units (``s m``,
  ``s w`` or ``s^2 v``) and ``eps`` is multiplied by ``s``, so ``(s m) / (s w + s eps) = m / (w + eps)``. Whatever
  follows the Adam (weight decay, update clipping, the learning rate) sees its ordinary, unscaled output.
* *Unscaled path* (amp's and jmp's): any other first transform (gradient clipping, SGD, momentum, Lion, Adafactor,
  ``optax.masked``, ``optax.multi_transform``, ``optax.MultiSteps``, ...) receives the true gradients, unscaled once
  in float32: ``g = float32(s g) / s``. Its state is in true units and the scaler never touches it.

**Skips.** Every step is either applied or skipped. A step is applied only if the scaled gradients are all
finite and, where that does not imply it, what the step produces is finite too: optax's Adam squares the gradient,
so its new state is checked; on the unscaled path anything may overflow, so the new state, the updates and
``params + updates`` (in the parameters' dtype) are checked. On the compound path with hAdam nothing more is
needed: hAdam's new moments and direction are finite for finite gradients (see :mod:`lpjax.optim.hadam`), and a
growth of the scale is allowed only when the moments times the growth factor still fit their dtype. The update is
then ``lr`` times a direction bounded by a constant of ``b1`` and ``b2``, which cannot carry a parameter past the
dtype's largest value unless it is already within that distance of it (``kahan_summation`` leaves such an element
unchanged rather than overflow it). A skipped step returns zero updates and keeps the inner state bit-identical,
so parameters and state are untouched.

**Scale dynamics**, identical to ``torch.amp.GradScaler`` (``init_scale``, ``growth_factor``, ``backoff_factor``,
``growth_interval``) except where the last column says:

=========================  ======================================  ==========================================
event                      ``torch.amp.GradScaler``                 lpjax
=========================  ======================================  ==========================================
non-finite gradients       skip ``optimizer.step()``;              skip (zero updates, state bit-identical);
                           ``s *= backoff``, tracker = 0            ``s *= backoff`` unless that would go below
                                                                    ``min_scale``, ``good_steps = 0``
finite step                step; tracker += 1                       update; ``good_steps += 1``
tracker reaches interval   ``s *= growth`` if finite; tracker = 0  same, and also refused when the moments
                                                                    times ``growth`` would overflow their dtype
scale arithmetic           float32 tensor                           float32, rounded once
where the check looks      the unscaled gradients                  the scaled gradients (and, where not
                                                                    implied, the new state and updates)
=========================  ======================================  ==========================================

With float32 parameters, no ``min_scale`` floor reached and no moment overflow, the scale trajectory and the set
of skipped steps are the same as torch's (tested against torch's own ``GradScaler``).

**Units, exactly.** On the compound path the inner state is kept in units of ``inner_scale``, the scale the
gradients of its last applied step carried. A change of scale is applied lazily, at the start of the next
update, as a multiplication by ``scale / inner_scale``. The ratio is a power of two whenever ``growth_factor``
and ``backoff_factor`` are, and the scale never leaves the lattice ``init_scale * 2^k`` (a back-off below
``min_scale`` is refused rather than clamped). So the change of unit is exact: for hAdam it happens inside its
update in float32, subnormal moments included (:mod:`lpjax.optim.hadam`); for optax's Adam ``m`` and ``v`` are
multiplied in float32 and rounded once, which is exact for normal values. A skipped step therefore leaves the
inner state bit-identical and changes only ``scale``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from lpjax.optim import _misuse, quantized_moments
from lpjax.optim._hyperparameters import concrete, require_wide
from lpjax.optim.hadam import ScaleByHAdamState

PYTORCH_AMP_DEFAULTS = dict(init_scale=2.0**16, growth_interval=2000, growth_factor=2.0, backoff_factor=0.5)
"""``torch.amp.GradScaler`` defaults, for ``compound_loss_scaling(inner, **PYTORCH_AMP_DEFAULTS)``."""


class CompoundLossScalingState(NamedTuple):
    """State of :func:`compound_loss_scaling`.

    Attributes:
      scale: float32 scalar, the loss scale ``s`` the next gradients must carry.
      inner_scale: float32 scalar, the unit the inner state is kept in (compound path); 1 on the unscaled path.
      good_steps: int32, consecutive applied steps since the scale last changed or a growth was refused.
      skipped_steps: int32, total number of skipped (non-finite) steps.
      inner_state: the wrapped optimizer's state.
    """

    scale: chex.Array
    inner_scale: chex.Array
    good_steps: chex.Array
    skipped_steps: chex.Array
    inner_state: Any


_INJECT_STATES = (optax.InjectHyperparamsState, optax.InjectStatefulHyperparamsState)


def _first_consumer(node, eps_injected: bool = False) -> str | None:
    """``"hadam"`` or ``"adam"`` when the transform that receives the gradients first is scale-invariant.

    optax's Adam counts only when an enclosing ``inject_hyperparams`` holds its ``eps``. The state of
    ``optax.chain`` is a plain tuple whose first element belongs to the first transform.
    """
    if isinstance(node, ScaleByHAdamState):
        return "hadam"
    if isinstance(node, optax.ScaleByAdamState):
        return "adam" if eps_injected else None
    if isinstance(node, _INJECT_STATES):
        return _first_consumer(node.inner_state, eps_injected or "eps" in node.hyperparams)
    if type(node) is tuple and node:
        return _first_consumer(node[0], eps_injected)
    return None


def _on_first_consumer(node, fn: Callable, on_inject: Callable = lambda inject: inject):
    """``node`` with ``fn`` applied to the first consumer's state and ``on_inject`` to each enclosing inject state."""
    if isinstance(node, (ScaleByHAdamState, optax.ScaleByAdamState)):
        return fn(node)
    if isinstance(node, _INJECT_STATES):
        return on_inject(node._replace(inner_state=_on_first_consumer(node.inner_state, fn, on_inject)))
    if type(node) is tuple and node:
        return (_on_first_consumer(node[0], fn, on_inject),) + node[1:]
    return node


def _first_node(node):
    """The first consumer's state (:class:`ScaleByHAdamState` or ``optax.ScaleByAdamState``)."""
    found = []
    _on_first_consumer(node, lambda n: found.append(n) or n)
    return found[0]


def _scale_in_float32(x, *factors):
    """``x * factor * ...`` computed in float32 (float64 for float64 ``x``) and rounded once to ``x``'s dtype."""
    dtype = jnp.promote_types(x.dtype, jnp.float32)
    y = x.astype(dtype)
    for factor in factors:
        y = y * factor.astype(dtype)
    return y.astype(x.dtype)


def rescale_moments(inner_state, factor: chex.Array):
    """Moves the scale-invariant optimizer that receives the gradients first to a loss scale ``factor`` times larger.

    hAdam: ``scale *= factor`` only; its next update moves the moments in float32 (see :mod:`lpjax.optim.hadam`).
    optax's Adam: ``m *= f`` and ``v *= f^2`` in float32, rounded once, and ``hyperparams['eps'] *= f`` in the
    enclosing ``inject_hyperparams`` state. Other states are returned unchanged.
    """
    factor = jnp.asarray(factor, jnp.float32)

    def rescale(node):
        if isinstance(node, ScaleByHAdamState):
            return node._replace(scale=node.scale * factor)
        return node._replace(
            mu=jax.tree.map(lambda m: _scale_in_float32(m, factor), node.mu),
            nu=jax.tree.map(lambda v: _scale_in_float32(v, factor, factor), node.nu),
        )

    def rescale_eps(inject):
        if "eps" not in inject.hyperparams or _first_consumer(inject.inner_state, True) != "adam":
            return inject
        eps = jnp.asarray(inject.hyperparams["eps"])
        return inject._replace(hyperparams={**inject.hyperparams, "eps": _scale_in_float32(eps, factor)})

    return _on_first_consumer(inner_state, rescale, rescale_eps)


def _moments_fit(inner_state, growth: chex.Array) -> chex.Array:
    """Whether the first consumer's moments, moved to a scale ``growth`` times larger, stay finite."""

    def fits(tree, power):
        def leaf_fits(x):
            if isinstance(x, quantized_moments.BlockQuantized):  # float32 scales hold the magnitudes
                largest, storage = quantized_moments.max_abs(x), jnp.float32
            else:
                largest, storage = jnp.max(jnp.abs(x)), x.dtype
            dtype = jnp.promote_types(storage, jnp.float32)
            moved = largest.astype(dtype) * growth.astype(dtype) ** power
            return moved <= jnp.asarray(jnp.finfo(storage).max, dtype)

        is_moment = lambda x: isinstance(x, quantized_moments.BlockQuantized)
        checks = [leaf_fits(x) for x in jax.tree.leaves(tree, is_leaf=is_moment) if x.size]
        return jnp.all(jnp.stack(checks)) if checks else jnp.asarray(True)

    node = _first_node(inner_state)
    if isinstance(node, ScaleByHAdamState):
        return fits(node.mu, 1) & fits(node.nu_sqrt, 1)
    return fits(node.mu, 1) & fits(node.nu, 2)


def _floating_leaves(tree) -> list:
    return [x for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]


def all_finite(tree) -> chex.Array:
    """True iff every floating-point element of ``tree`` is finite (a scalar bool; True for an empty tree).

    Counts the non-finite elements of each leaf as a float32 sum of 0s and 1s (``where(isfinite(x), 0, 1)``): a sum
    of non-negative values is 0 exactly when all of them are, in any order of summation and at any size, so the
    check is exact, and it is one floating-point reduction per leaf (one per dtype for
    :func:`lpjax.optim.fused`'s flat buffers), which XLA:CPU vectorizes where it splits a boolean reduction into
    several passes. ``max`` is avoided on purpose: a vectorised float32 ``max`` on XLA:CPU drops nans.
    """
    counts = [
        jnp.sum(jnp.where(jnp.isfinite(x), jnp.zeros([], jnp.float32), jnp.ones([], jnp.float32)))
        for x in _floating_leaves(tree)
    ]
    if not counts:
        return jnp.asarray(True)
    return sum(counts[1:], counts[0]) == 0


def _select(pred, new, old):
    """``new`` where ``pred`` else ``old``, leaf by leaf, in ``old``'s dtypes."""
    return jax.tree.map(lambda n, o: jnp.where(pred, jnp.asarray(n).astype(jnp.result_type(o)), o), new, old)


def _unscale(grads, scale):
    """The true gradients ``float32(s g) / s`` (float64 for float64 gradients)."""

    def unscale(g):
        if not jnp.issubdtype(jnp.result_type(g), jnp.inexact):
            return g
        dtype = jnp.promote_types(jnp.result_type(g), jnp.float32)
        return jnp.asarray(g).astype(dtype) / scale.astype(dtype)

    return jax.tree.map(unscale, grads)


def _check_hyperparameter(name: str, value, lower: float, upper: float = np.inf, closed: bool = False):
    """Raises ``ValueError`` for a concrete ``value`` outside ``(lower, upper)`` (``[lower, ...)`` if closed)."""
    require_wide("compound_loss_scaling", name, value)
    array = concrete(value)
    if array is None:
        return  # traced (optax.inject_hyperparams inside jit): checked in init, where it was concrete
    number = float(array)
    if not (np.isfinite(number) and (number >= lower if closed else number > lower) and number < upper):
        bounds = f"{'[' if closed else '('}{lower}, {upper})"
        raise ValueError(f"compound_loss_scaling: {name} must be in {bounds}, got {number}.")


def _check_injected_eps(inner_state) -> None:
    """Raises if the compound path's ``eps`` was stored by ``optax.inject_hyperparams`` in a dtype where it is 0."""

    def visit(node):
        if isinstance(node, _INJECT_STATES):
            if "eps" in node.hyperparams and _first_consumer(node.inner_state, True) is not None:
                require_wide("compound_loss_scaling", "the injected eps", node.hyperparams["eps"])
            visit(node.inner_state)
        elif type(node) is tuple and node:
            visit(node[0])

    visit(inner_state)


def _check_no_apply_if_finite(inner_state, params) -> None:
    """Raises for ``optax.apply_if_finite`` inside the scaler with parameters narrower than float32: the scaler
    hands the inner chain float32 gradients, and apply_if_finite's ``lax.cond`` fails on the dtype mismatch."""
    is_guard = lambda node: isinstance(node, optax.ApplyIfFiniteState)
    narrow = [x for x in _floating_leaves(params) if jnp.promote_types(jnp.result_type(x), jnp.float32) != x.dtype]
    if narrow and any(is_guard(node) for node in jax.tree.leaves(inner_state, is_leaf=is_guard)):
        raise ValueError(
            f"optax.apply_if_finite inside compound_loss_scaling cannot take {narrow[0].dtype} parameters, and is not "
            "needed: the scaler already skips non-finite steps. Remove apply_if_finite."
        )


def compound_loss_scaling(
    inner: optax.GradientTransformation,
    init_scale: float = 1e4,
    growth_interval: int = 10_000,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    min_scale: float = 1.0,
) -> optax.GradientTransformationExtraArgs:
    """Wraps any optax optimizer with dynamic loss scaling (see the module docstring for both paths).

    Gradients passed to ``update`` must come from ``loss * loss_scale(opt_state)``; the updates it returns are
    ordinary, unscaled updates. Put every transform that must see the gradients inside ``inner`` (clipping
    included): a transform before the scaler in a chain would see the scaled gradients, and :func:`loss_scale`
    refuses such a state.

    Args:
      inner: the optimizer to wrap, any ``optax.GradientTransformation``. It gets the paper's compound path when
        it starts with :func:`lpjax.optim.scale_by_hadam` (``hadam``, ``low_precision_adam``) or with an
        ``optax.inject_hyperparams``-built ``optax.adam``/``adamw``, else the true gradients.
      init_scale: initial loss scale (paper: 1e4; PyTorch amp: 2^16, see :data:`PYTORCH_AMP_DEFAULTS`).
      growth_interval: consecutive applied steps after which the scale grows (paper: 1e4; amp: 2000).
      growth_factor: multiplier applied on growth (> 1; a power of two keeps the rescaling exact).
      backoff_factor: multiplier applied on a skipped step (in (0, 1); a power of two keeps it exact).
      min_scale: a back-off that would take the scale below this is refused (the step is still skipped).

    Returns:
      An optax transformation with state :class:`CompoundLossScalingState`.
    """
    _check_hyperparameter("init_scale", init_scale, 0.0)
    _check_hyperparameter("min_scale", min_scale, 0.0)
    _check_hyperparameter("growth_factor", growth_factor, 1.0)
    _check_hyperparameter("backoff_factor", backoff_factor, 0.0, 1.0)
    _check_hyperparameter("growth_interval", growth_interval, 1.0, closed=True)
    if isinstance(init_scale, (int, float)) and isinstance(min_scale, (int, float)) and init_scale < min_scale:
        raise ValueError(f"Need min_scale <= init_scale, got min_scale={min_scale}, init_scale={init_scale}.")
    if isinstance(growth_interval, float) and not growth_interval.is_integer():
        raise ValueError(f"growth_interval must be a positive integer, got {growth_interval}.")
    inner = optax.with_extra_args_support(inner)
    reads = _misuse.watch_scale_reads()  # warns once if the gradients' loss was never multiplied by the scale

    def init_fn(params):
        inner_state = inner.init(params)
        _check_injected_eps(inner_state)
        _check_no_apply_if_finite(inner_state, params)
        return CompoundLossScalingState(
            scale=jnp.asarray(init_scale, jnp.float32),
            inner_scale=jnp.ones([], jnp.float32),
            good_steps=jnp.zeros([], jnp.int32),
            skipped_steps=jnp.zeros([], jnp.int32),
            inner_state=inner_state,
        )

    def update_fn(updates, state, params=None, **extra_args):
        _misuse.refuse_increments(updates, "compound_loss_scaling")
        _misuse.check_scale_was_read(state.scale, reads)
        scale = jnp.asarray(state.scale, jnp.float32)
        consumer = _first_consumer(state.inner_state)
        finite = all_finite(updates)
        if consumer is not None:
            # Compound path: move the inner state to this step's unit (exact), feed it the scaled gradients.
            inner_in = rescale_moments(state.inner_state, scale / state.inner_scale)
            if consumer == "hadam":  # hAdam skips by itself, so its direction reads the moments it stores
                inner_in = _on_first_consumer(inner_in, lambda node: node._replace(apply=finite))
            new_updates, new_inner = inner.update(updates, inner_in, params, **extra_args)
            new_inner = _select(True, new_inner, state.inner_state)  # optax's Adam promotes; keep the dtypes
            if consumer == "adam":  # v = g^2 may overflow its dtype
                finite = finite & all_finite(new_inner)
        else:
            new_updates, new_inner = inner.update(_unscale(updates, scale), state.inner_state, params, **extra_args)
            new_inner = _select(True, new_inner, state.inner_state)
            finite = finite & all_finite(new_inner) & all_finite(new_updates)
            if params is not None:  # an unbounded update (SGD on a huge gradient) may overflow the parameters
                finite = finite & all_finite(
                    jax.tree.map(lambda p, u: (jnp.asarray(p) + u).astype(jnp.result_type(p)), params, new_updates)
                )
        inner_state = _select(finite, new_inner, state.inner_state)
        if consumer == "hadam":  # hAdam selected its moments itself; its unit stays the scaler's inner_scale
            chosen, before = _first_node(new_inner), _first_node(state.inner_state)
            chosen = chosen._replace(scale=jnp.where(finite, chosen.scale, before.scale))
            inner_state = _on_first_consumer(inner_state, lambda _: chosen)
        new_updates = jax.tree.map(lambda u: jnp.where(finite, u, jnp.zeros_like(u)), new_updates)

        growth = jnp.asarray(growth_factor, jnp.float32)
        backoff = jnp.asarray(backoff_factor, jnp.float32)
        wants_growth = finite & (state.good_steps + 1 >= growth_interval)
        grown = scale * growth
        can_grow = wants_growth & jnp.isfinite(grown)
        if consumer is not None:
            can_grow = can_grow & jax.lax.cond(
                wants_growth, lambda s: _moments_fit(s, growth), lambda s: jnp.asarray(True), inner_state
            )
        backed = scale * backoff
        backed = jnp.where(backed >= jnp.asarray(min_scale, jnp.float32), backed, scale)
        new_scale = jnp.where(finite, jnp.where(can_grow, grown, scale), backed)
        inner_scale = jnp.where(finite, scale, state.inner_scale) if consumer is not None else state.inner_scale
        return new_updates, CompoundLossScalingState(
            scale=new_scale,
            inner_scale=inner_scale,
            good_steps=jnp.where(finite & ~wants_growth, state.good_steps + 1, 0).astype(jnp.int32),
            skipped_steps=state.skipped_steps + (~finite).astype(jnp.int32),
            inner_state=inner_state,
        )

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
