"""Kahan-compensated parameter updates and target-network (Polyak) averaging (Björck et al., 2021, Sec. 4.3).

float16 keeps 11 significant bits: ``1.0 + 1e-4 == 1.0``, so an optimizer making many small steps to a float16
parameter makes none at all. Kahan summation carries what each rounding lost in a compensation buffer ``c`` and
adds it back on the next step:

    y = u + c                  (the update plus what previous steps failed to apply)
    t = fl(p + y)              (the new parameter, rounded to the parameter's dtype)
    d = t - p                  (what was actually applied; exact by Sterbenz' lemma when p/2 <= t <= 2p)
    c = y - d                  (what was not)

In exact arithmetic ``d = y`` and ``c = 0``, so this is plain summation. The compensation only works if the
rounding of ``t`` really happens. XLA may skip intermediate roundings of low-precision values when
``xla_allow_excess_precision`` is on (its default; GPU fusions use it), which would make ``t - p == y`` and turn
the compensation off. ``t`` is therefore pinned to its dtype with :func:`lpjax.optim._rounding.round_to_nearest`
(arithmetic that flag may not remove, subnormals included). Compilers may also contract ``a * b + c`` into one
fused multiply-add, skipping the rounding of the product; the Kahan sum has no products, and the Polyak update
makes all of its products exact (see :func:`kahan_polyak`). The tests compare ``jit`` against eager.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lpjax.optim import _misuse
from lpjax.optim._rounding import round_to_nearest


def _round_to(x: jax.Array, dtype) -> jax.Array:
    """Rounds ``x`` to ``dtype`` and keeps that rounding through XLA's fusion (see the module docstring)."""
    return round_to_nearest(x, dtype).astype(dtype)


def _map_pair(fn: Callable, tree: Any, *rest: Any) -> tuple[Any, Any]:
    """Maps ``fn`` returning a pair over matching trees; returns the pair of trees."""
    pairs = jax.tree.map(fn, tree, *rest)
    return jax.tree.transpose(jax.tree.structure(tree), jax.tree.structure((0, 0)), pairs)


def _kahan_step(p: jax.Array, u: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One compensated addition ``p + u``: returns the increment ``d`` to add to ``p`` and the new compensation.

    ``y`` and ``c`` are computed in the compensation dtype, ``t`` in the parameter dtype. The increment is taken
    from the new compensation, ``d = y - c'`` (which is ``t - p`` whenever that is exact), so the parameter's
    update reads ``y`` and ``c'`` but not the old ``c``: a compiler without multi-output fusion (XLA:CPU) can then
    write ``c'`` and ``p + d`` in place with ``y`` as the only temporary.

    Where ``p + y`` overflows the parameter's dtype, the element's compensation is reset and ``d = 0``: the
    parameter stays finite. Where ``y == c`` (a zero update, or one too small to change ``c``) nothing is added:
    ``c`` is kept and ``d = 0``, even when ``c`` is more than half an ulp of ``p`` (possible after a jump by more
    than a factor 2).
    """
    y = u.astype(c.dtype) + c
    t = _round_to(p.astype(jnp.promote_types(p.dtype, c.dtype)) + y, p.dtype)
    new_c = jnp.where(jnp.isfinite(t), y - _round_to(t - p, p.dtype).astype(c.dtype), jnp.zeros_like(c))
    new_c = jnp.where(y == c, c, new_c)  # nothing to add (u = 0, or absorbed by c): keep c, and so d = 0
    d = (y - new_c).astype(p.dtype)
    return jnp.where(jnp.isfinite(_round_to(p + d, p.dtype)), d, jnp.zeros_like(d)), new_c


class KahanSummationState(NamedTuple):
    """State of :func:`kahan_summation`.

    Attributes:
      compensation: per-parameter buffer ``c`` of what earlier updates failed to apply.
    """

    compensation: optax.Updates


def kahan_summation(compensation_dtype: Any = None) -> optax.GradientTransformation:
    """Kahan-gradients: makes the updates of an optax chain sum exactly into low-precision parameters.

    Put it **last** in the chain and apply its output with ``optax.apply_updates`` (parameters and updates in the
    parameters' dtype, as this transform returns them). It needs ``params`` in ``update``. It returns the
    increment ``d = fl(p + u + c) - p``, which is exactly representable for every update small against its
    parameter (the case Kahan summation is for), so ``p + d`` equals ``fl(p + u + c)`` bit for bit and the
    compensation ``c = u + c - d`` is exact. When a parameter jumps by more than a factor 2 or changes sign, ``d``
    is rounded once and the compensation is approximate, as for any floating-point sum. Where ``p + u + c``
    overflows the parameter's dtype, ``d = 0`` and that element's compensation is reset: a parameter is never made
    non-finite. An all-zero update (a step skipped by :func:`lpjax.optim.compound_loss_scaling`) leaves the
    parameters and the compensation bit-identical.

    A transform after it would receive increments instead of gradients (``chain(kahan_summation(), hadam(lr))``
    never moves float16 parameters): lpjax's transforms refuse its output at trace time, and
    :func:`lpjax.optim.loss_scale` and :func:`lpjax.optim.scaled_value_and_grad` refuse a state where it is not
    last (see :mod:`lpjax.optim._misuse`).

    Args:
      compensation_dtype: dtype of the compensation buffer; ``None`` uses each parameter's dtype (the paper's
        setting: float16 parameters with a float16 buffer). A float32 buffer compensates more finely.

    Returns:
      An ``optax.GradientTransformation`` with state :class:`KahanSummationState`.
    """

    def init_fn(params):
        dtype_of = (lambda p: p.dtype) if compensation_dtype is None else (lambda p: compensation_dtype)
        return KahanSummationState(jax.tree.map(lambda p: jnp.zeros(p.shape, dtype_of(p)), params))

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("kahan_summation needs the parameters: call update(updates, state, params).")
        _misuse.refuse_increments(updates, "kahan_summation")
        increments, compensation = _map_pair(_kahan_step, params, updates, state.compensation)
        return _misuse.mark_increments(increments, "kahan_summation"), KahanSummationState(compensation)

    return optax.GradientTransformation(init_fn, update_fn)


class KahanPolyakState(NamedTuple):
    """State of :func:`kahan_polyak`.

    Attributes:
      compensation: ``scale * c``, the Kahan compensation of each target parameter, stored scaled so that
        residuals far below the target's ulp (and far below float16's smallest subnormal) are kept.
    """

    compensation: optax.Updates


class KahanPolyak(NamedTuple):
    """Pure ``init``/``update`` pair returned by :func:`kahan_polyak`.

    Attributes:
      init: ``init(target_params) -> KahanPolyakState``.
      update: ``update(online_params, target_params, state) -> (new_target_params, state)``.
    """

    init: Callable[[optax.Params], KahanPolyakState]
    update: Callable[[optax.Params, optax.Params, KahanPolyakState], tuple[optax.Params, KahanPolyakState]]


def kahan_polyak(tau: float, scale: float = 1e4) -> KahanPolyak:
    """Kahan-momentum: the target update ``t <- t + tau (p - t)`` summed with a scaled Kahan compensation.

    With ``C = scale * c`` (the scaled compensation buffer) each step is

        Y = scale * tau * (p - t) + C            (scaled increment: tau (p - t) cannot underflow)
        t' = fl(t + Y / scale),  d = t' - t      (what the target's dtype can absorb)
        C  = Y - scale * d                       (the rest, kept scaled)

    which is ``t <- t + tau (p - t)`` in exact arithmetic. The paper stores the whole target scaled, so at
    scale 1e4 a float16 weight above 6.55 overflows; here only the increment and the residual are scaled, and
    the target itself stays in its own dtype. Range guard: an element whose scaled increment ``Y`` or
    ``scale * d`` is not finite (``|p - t| > max / (scale tau)``, 1310 for float16 at the defaults) takes the plain
    Polyak step instead and its compensation is reset, so the update never produces inf or nan from finite
    inputs (``p - t`` beyond the dtype's range included). Use ``scale = 1e2`` for pixel encoders (paper, Table 9).

    Each operation is computed in float32 (or the target's dtype if wider) and rounded to the target's dtype
    explicitly, with ``scale tau``, ``1 / scale``, ``scale`` and ``tau`` taken as values of that dtype. For float16,
    bfloat16 and narrower targets every product is then of two values of at most 12 significant bits, exact in
    float32, so a compiler that contracts ``a * b + c`` into a fused multiply-add (XLA:GPU, and XLA:CPU since
    jax 0.12.0.1) computes the same bits as one that does not: ``jit`` and eager agree bit for bit, on any backend.
    For float32 targets a contraction may change the last bit of a step; the compensation still accounts for
    whatever the step applied.

    Args:
      tau: Polyak step size in (0, 1].
      scale: power of ten or two by which increments and residuals are scaled (> 0).

    Returns:
      A :class:`KahanPolyak` ``(init, update)`` pair of pure, jittable functions.
    """
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"kahan_polyak needs 0 < tau <= 1, got {tau}.")
    if not (np.isfinite(scale) and scale > 0):
        raise ValueError(f"kahan_polyak needs a finite scale > 0, got {scale}.")

    def init(target_params):
        return KahanPolyakState(jax.tree.map(jnp.zeros_like, target_params))

    def step(p, t, comp):
        dtype = t.dtype
        wide = jnp.promote_types(dtype, jnp.float32)

        def times(constant, x):
            return jnp.asarray(constant, dtype).astype(wide) * x

        def rounded(x):  # stays in `wide`, holding a value of `dtype`: one conversion per output, at the end
            return round_to_nearest(x, dtype)

        p, t, comp = p.astype(dtype).astype(wide), t.astype(wide), comp.astype(wide)
        diff = rounded(p - t)
        scaled = rounded(times(scale * tau, diff) + comp)
        new_t = rounded(t + times(1.0 / scale, scaled))
        applied = rounded(times(scale, rounded(new_t - t)))
        new_comp = rounded(scaled - applied)
        ok = jnp.isfinite(scaled) & jnp.isfinite(applied) & jnp.isfinite(new_comp)
        # |p - t| beyond the dtype's range means |p|, |t| >= 16 (float16): halving them is exact, their gap is not.
        half_diff = rounded(times(0.5, p) - times(0.5, t))
        plain = rounded(jnp.where(jnp.isfinite(diff), t + times(tau, diff), t + times(2 * tau, half_diff)))
        new_t = jnp.where(ok, new_t, plain).astype(dtype)
        return new_t, jnp.where(ok, new_comp, jnp.zeros_like(new_comp)).astype(dtype)

    def update(online_params, target_params, state):
        new_target, compensation = _map_pair(step, online_params, target_params, state.compensation)
        return new_target, KahanPolyakState(compensation)

    return KahanPolyak(init, update)
