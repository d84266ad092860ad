"""Compound (dynamic) loss scaling for Adam-family optimizers (Björck et al., 2021, Sec. 4.2).

The user multiplies the loss by the current scale ``s`` (read it with :func:`loss_scale`), so gradients arrive
as ``s g`` and are **never unscaled**: the inner optimizer's moments live in scaled units (``s m``, ``s w`` or
``s^2 v``) and its ``eps`` is multiplied by ``s`` too, so the update is unchanged in exact arithmetic:

    (s m) / (s w + s eps) = m / (w + eps).

Dynamics, after PyTorch amp's ``GradScaler``:

* A step whose gradients (or whose inner updates) are not all finite is skipped: the update is zero, the inner
  state is the one before the step, and ``s <- max(s * backoff_factor, min_scale)``.
* A step is finite when the gradients are (and, for optax's Adam, whose ``g^2`` can overflow, its new state).
* Each finite step increments ``good_steps``. On the ``growth_interval``-th consecutive finite step, that step's
  update is applied (it was computed at the old scale) and then ``s <- s * growth_factor``, ``good_steps <- 0``.
  So a state that started at ``s0`` reports ``s0 * growth_factor`` after exactly ``growth_interval`` finite
  updates. A growth that would overflow the rescaled moments is refused (scale kept, ``good_steps`` reset).
* Whenever ``s`` changes by ``f = s_new / s_old``, the inner state is rescaled so it stays in the new units:
  ``m *= f`` and ``w *= f`` (hAdam), ``v *= f^2`` (Adam), ``eps *= f``. With the default power-of-two factors
  these multiplications are exact, so a skipped step leaves ``m / s`` and ``w / s`` bit-identical.

Which inner transforms can be rescaled: states :class:`lpjax.optim.ScaleByHAdamState` (hAdam carries its own
``eps_scale``) and ``optax.ScaleByAdamState`` (``optax.adam``, ``adamw``, ...). optax's Adam keeps ``eps`` in a
closure, so it must be built with ``optax.inject_hyperparams`` to expose ``eps`` in its state, with float32
hyperparameters (optax otherwise stores them in the params' dtype, where ``1e-8`` is 0), e.g.
``compound_loss_scaling(optax.inject_hyperparams(optax.adam, hyperparam_dtype=jnp.float32)(learning_rate=1e-4))``.
Anything else raises a ``ValueError`` at ``init``.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax

from lpjax.optim.hadam import EpsUnderflowWarning, ScaleByHAdamState

PYTORCH_AMP_DEFAULTS = dict(init_scale=2.0 ** 16, growth_interval=2000, growth_factor=2.0, backoff_factor=0.5)
"""``torch.cuda.amp.GradScaler`` defaults, for ``compound_loss_scaling(inner, **PYTORCH_AMP_DEFAULTS)``."""


class CompoundLossScalingState(NamedTuple):
    """State of :func:`compound_loss_scaling`.

    Attributes:
      scale: float32 scalar, the current loss scale ``s``.
      good_steps: int32, consecutive finite steps since the scale last changed.
      skipped_steps: int32, total number of skipped (non-finite) steps.
      grad_bound: float32, the largest ``|gradient|`` of the finite steps so far, in units of the current scale.
        hAdam's moments never exceed it (``|m'| <= max(|m|, |g|)``, ``w' <= max(w, |g|)``), so the scale grows
        only when ``grad_bound * growth_factor`` fits the moments' dtype, without reading the moments.
      inner_state: the wrapped optimizer's state, kept in units scaled by ``scale``.
    """

    scale: chex.Array
    good_steps: chex.Array
    skipped_steps: chex.Array
    grad_bound: chex.Array
    inner_state: Any


_INJECT_STATES = (optax.InjectHyperparamsState, optax.InjectStatefulHyperparamsState)
_MOMENT_STATES = (ScaleByHAdamState, optax.ScaleByAdamState) + _INJECT_STATES


def _is_moment_state(node) -> bool:
    return isinstance(node, _MOMENT_STATES)


def _has_adam_state(tree) -> bool:
    leaves = jax.tree.leaves(tree, is_leaf=lambda n: isinstance(n, (optax.ScaleByAdamState, ScaleByHAdamState)))
    return any(isinstance(n, optax.ScaleByAdamState) for n in leaves)


def _validate(inner_state) -> None:
    """Raises ``ValueError`` unless every Adam moment in ``inner_state`` has a reachable ``eps``."""
    found = []

    def visit(node, eps_injected: bool):
        if isinstance(node, ScaleByHAdamState):
            found.append(node)
        elif isinstance(node, optax.ScaleByAdamState):
            if not eps_injected:
                raise ValueError(
                    "compound_loss_scaling must scale the inner Adam's eps with the loss scale, but optax.adam "
                    "keeps eps in a closure. Build it with optax.inject_hyperparams, e.g. "
                    "optax.inject_hyperparams(optax.adam, hyperparam_dtype=jnp.float32)(learning_rate=1e-4), or use "
                    "lpjax.optim.hadam.")
            found.append(node)
        elif isinstance(node, _INJECT_STATES):
            eps = node.hyperparams.get("eps")
            if eps is not None and _has_adam_state(node.inner_state):
                eps = jnp.asarray(eps)
                concrete = not isinstance(eps, jax.core.Tracer)  # init may be traced under jit: skip the check.
                if concrete and eps == 0 and jnp.finfo(eps.dtype).bits < 32:
                    raise ValueError(
                        f"The injected Adam eps is 0 in {eps.dtype}: optax.inject_hyperparams stores "
                        "hyperparameters in the params' dtype, where eps=1e-8 underflows. Build it with "
                        "optax.inject_hyperparams(optax.adam, hyperparam_dtype=jnp.float32)(...).")
            visit(node.inner_state, eps_injected or eps is not None)
        elif isinstance(node, (tuple, list)):
            for child in node:
                visit(child, eps_injected)
        elif isinstance(node, dict):
            for child in node.values():
                visit(child, eps_injected)

    visit(inner_state, False)
    if not found:
        raise ValueError(
            "compound_loss_scaling wraps an Adam-family optimizer (lpjax.optim.hadam, or optax.adam/adamw built "
            "with optax.inject_hyperparams); found no ScaleByHAdamState or ScaleByAdamState in the inner state "
            f"{type(inner_state).__name__}.")


def _scale_leaves(tree, factor):
    return jax.tree.map(lambda x: x * factor.astype(x.dtype), tree)


def rescale_moments(inner_state, factor: chex.Array):
    """Returns ``inner_state`` with Adam-family moments and ``eps`` moved to a loss scale ``factor`` times larger.

    ``m *= f``, ``w *= f`` and ``eps_scale *= f`` for hAdam; ``m *= f``, ``v *= f^2`` for ``optax.ScaleByAdamState``
    and ``hyperparams['eps'] *= f`` of an enclosing ``optax.inject_hyperparams`` state. Other leaves are kept.
    """
    factor = jnp.asarray(factor, jnp.float32)

    def rescale(node):
        if isinstance(node, ScaleByHAdamState):
            return node._replace(mu=_scale_leaves(node.mu, factor), nu_sqrt=_scale_leaves(node.nu_sqrt, factor),
                                 eps_scale=node.eps_scale * factor)
        if isinstance(node, optax.ScaleByAdamState):
            # v *= f^2 as two multiplications: f^2 = 1e8 (the initial scale squared) is inf in float16.
            return node._replace(mu=_scale_leaves(node.mu, factor),
                                 nu=_scale_leaves(_scale_leaves(node.nu, factor), factor))
        if isinstance(node, _INJECT_STATES):
            hyperparams = dict(node.hyperparams)
            if "eps" in hyperparams and _has_adam_state(node.inner_state):
                eps = hyperparams["eps"]
                hyperparams["eps"] = (eps * factor).astype(jnp.asarray(eps).dtype)
            return node._replace(hyperparams=hyperparams, inner_state=rescale_moments(node.inner_state, factor))
        return node

    return jax.tree.map(rescale, inner_state, is_leaf=_is_moment_state)


def _all_finite(tree) -> chex.Array:
    """True iff every floating-point element of ``tree`` is finite.

    ``all(isfinite(x))`` on purpose: cheaper-looking reductions are wrong or fragile on XLA:CPU (``max(|x|)``
    drops nans in its vectorised loop; ``sum(x * 0)`` is rewritten when ``x`` is itself a product by a constant).
    """
    flags = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(flags)) if flags else jnp.asarray(True)


def _finite_max_abs(tree) -> tuple[chex.Array, chex.Array]:
    """``(all elements finite, max |x|)`` of the floating-point leaves of ``tree`` in one pass per leaf.

    Non-finite elements are mapped to ``inf`` before the max: a vectorised max on XLA:CPU drops nans, not infs.
    """
    maxima = [jnp.max(jnp.where(jnp.isfinite(x), jnp.abs(x), jnp.inf), initial=0).astype(jnp.float32)
              for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    largest = jnp.max(jnp.stack(maxima)) if maxima else jnp.float32(0)
    return jnp.isfinite(largest), largest


def _largest_finite(tree) -> float:
    """The smallest ``finfo(dtype).max`` over the floating-point leaves of ``tree``, less one ulp of rounding."""
    dtypes = {x.dtype for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)}
    return min(float(jnp.finfo(d).max) * (1 - 2.0 ** -jnp.finfo(d).nmant) for d in dtypes)


def compound_loss_scaling(inner: optax.GradientTransformation, init_scale: float = 1e4,
                          growth_interval: int = 10_000, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                          min_scale: float = 1.0) -> optax.GradientTransformationExtraArgs:
    """Wraps an Adam-family optimizer with compound loss scaling (see the module docstring for the maths).

    Gradients passed to ``update`` must come from ``loss * loss_scale(opt_state)``. They go to ``inner`` as they
    are (scaled), and ``inner``'s output is an ordinary, unscaled update.

    Args:
      inner: the optimizer to wrap: :func:`lpjax.optim.hadam`, or an ``optax.inject_hyperparams``-built
        ``optax.adam``/``adamw`` (any chain containing one).
      init_scale: initial loss scale (paper: 1e4; PyTorch amp: 2^16, see :data:`PYTORCH_AMP_DEFAULTS`).
      growth_interval: number of consecutive finite steps after which the scale grows (paper: 1e4; amp: 2000).
      growth_factor: multiplier applied on growth (> 1).
      backoff_factor: multiplier applied on a non-finite step (in (0, 1)).
      min_scale: the scale never goes below this.

    Returns:
      An optax transformation with state :class:`CompoundLossScalingState`.
    """
    if not init_scale > 0 or not min_scale > 0 or init_scale < min_scale:
        raise ValueError(f"Need 0 < min_scale <= init_scale, got min_scale={min_scale}, init_scale={init_scale}.")
    if not growth_factor > 1.0:
        raise ValueError(f"growth_factor must be > 1, got {growth_factor}.")
    if not 0.0 < backoff_factor < 1.0:
        raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor}.")
    if int(growth_interval) != growth_interval or growth_interval < 1:
        raise ValueError(f"growth_interval must be a positive integer, got {growth_interval}.")
    inner = optax.with_extra_args_support(inner)

    def init_fn(params):
        with warnings.catch_warnings():  # eps is about to be multiplied by init_scale.
            warnings.simplefilter("ignore", EpsUnderflowWarning)
            inner_state = inner.init(params)
        _validate(inner_state)
        return CompoundLossScalingState(
            scale=jnp.asarray(init_scale, jnp.float32), good_steps=jnp.zeros([], jnp.int32),
            skipped_steps=jnp.zeros([], jnp.int32), grad_bound=jnp.zeros([], jnp.float32),
            inner_state=rescale_moments(inner_state, jnp.asarray(init_scale, jnp.float32)))

    growth = jnp.float32(growth_factor)

    def grown_state_fits(new_inner):
        """optax's Adam (``v' <= max(v, g^2)``): are the new moments finite after ``*= growth_factor``?"""
        return _all_finite(rescale_moments(new_inner, growth))

    def update_fn(updates, state, params=None, **extra_args):
        # The step's fate is decided by one pass over the gradients, before the inner update, so the selects and
        # the rescale below are elementwise with a scalar predicate and hAdam's moments are never re-read. hAdam's
        # state and update are finite whenever its gradients are; optax's Adam squares the gradients, so for it
        # the new state is checked too (a second pass over the moments).
        finite, grad_max = _finite_max_abs(updates)
        new_updates, new_inner = inner.update(updates, state.inner_state, params, **extra_args)
        adam = _has_adam_state(state.inner_state)
        if adam:
            finite = jnp.logical_and(finite, _all_finite(new_inner))
        # Cast back: optax's Adam promotes float16 moments to the dtype of injected float32 hyperparameters,
        # and the wrapper's state keeps its dtypes so it can be a scan carry or a donated buffer.
        inner_state = jax.tree.map(lambda new, old: jnp.where(finite, new.astype(old.dtype), old), new_inner,
                                   state.inner_state)
        new_updates = jax.tree.map(lambda u: jnp.where(finite, u, jnp.zeros_like(u)), new_updates)

        # Growth is refused if the rescaled moments would overflow their dtype.
        wants_growth = jnp.logical_and(finite, state.good_steps + 1 >= growth_interval)
        grad_bound = jnp.where(finite, jnp.maximum(state.grad_bound, grad_max), state.grad_bound)
        if adam:
            fits = jax.lax.cond(wants_growth, grown_state_fits, lambda _: jnp.asarray(True), inner_state)
        else:
            fits = grad_bound * growth <= _largest_finite(state.inner_state)
        grow = jnp.logical_and(wants_growth, fits)
        scale = jnp.where(finite, jnp.where(grow, state.scale * growth_factor, state.scale),
                          jnp.maximum(state.scale * backoff_factor, jnp.float32(min_scale))).astype(jnp.float32)
        factor = scale / state.scale
        inner_state = rescale_moments(inner_state, factor)  # factor 1 on most steps: exact
        good_steps = jnp.where(finite & ~wants_growth, state.good_steps + 1, 0).astype(jnp.int32)
        return new_updates, CompoundLossScalingState(
            scale=scale, good_steps=good_steps, skipped_steps=state.skipped_steps + (~finite).astype(jnp.int32),
            grad_bound=grad_bound * factor, inner_state=inner_state)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def loss_scale(opt_state) -> chex.Array:
    """Returns the current loss scale (float32) held by the :class:`CompoundLossScalingState` in ``opt_state``.

    ``opt_state`` may be the wrapper's own state or any optax state containing exactly one of them (a chain,
    ``MultiSteps``, ``inject_hyperparams``, a ``TrainState.opt_state``). Multiply the loss by it before
    differentiating.
    """
    found = [node for node in jax.tree.leaves(opt_state, is_leaf=lambda n: isinstance(n, CompoundLossScalingState))
             if isinstance(node, CompoundLossScalingState)]
    if len(found) != 1:
        raise ValueError(f"loss_scale expects exactly one CompoundLossScalingState in opt_state, found {len(found)}.")
    return found[0].scale


def loss_scale_or_one(opt_state) -> chex.Array:
    """:func:`loss_scale` if ``opt_state`` holds a loss scaler, else float32 1: code that may or may not be
    loss-scaled (an ablation switch) multiplies its loss by this."""
    found = [node for node in jax.tree.leaves(opt_state, is_leaf=lambda n: isinstance(n, CompoundLossScalingState))
             if isinstance(node, CompoundLossScalingState)]
    return loss_scale(opt_state) if found else jnp.ones([], jnp.float32)
