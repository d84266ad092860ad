"""hAdam: Adam that stores ``w = sqrt(v)`` and updates it with ``hypot`` (Björck et al., 2021, Sec. 4.1).

Adam's second moment ``v <- b2 v + (1 - b2) g^2`` squares the gradient: in float16 ``g^2`` overflows for
``|g| > 256`` and underflows to zero for ``|g| < 2.4e-4`` (and the smallest subnormal is 6e-8). hAdam keeps the
square root instead,

    m <- b1 m + (1 - b1) g
    w <- hypot(sqrt(b2) w, sqrt(1 - b2) g)                    (= sqrt(b2 w^2 + (1 - b2) g^2))
    u  = -lr * m_hat / (w_hat + eps),  m_hat = m / (1 - b1^t),  w_hat = w / sqrt(1 - b2^t)

and by induction ``w_t = sqrt(v_t)``, so the update is Adam's exactly in exact arithmetic, while every stored
quantity stays within a few binades of ``|g|``.

Arithmetic. Every value is computed in float32 (float64 for float64 moments or gradients) and rounded **once** to
its storage dtype: the coefficients ``b1``, ``1 - b1``, ``sqrt(b2)`` and the bias corrections are never rounded to
float16. The direction is evaluated as

    m_hat / (w_hat + eps) = (m / (w + eps c2)) * (c2 / c1),   c1 = 1 - b1^t,  c2 = sqrt(1 - b2^t),

which never forms ``m / c1`` or ``w / c2``: those overflow float16 (and, for bfloat16 moments, float32) for
gradients near the top of the range. Where ``w + eps c2`` is 0 (no gradient yet, ``eps = 0``) the direction is 0,
its exact-arithmetic value, instead of ``0 / 0``. Consequently, for finite gradients the new moments and the
direction are finite: ``|m'| <= max(|f m|, |g|)`` and ``w' <= max(f w, |g|)`` (convex combinations, ``f`` below),
and the ratio ``|m / (w + eps c2)|`` is bounded by a constant of ``b1`` and ``b2`` alone.

Units. The state carries two float32 scalars so that a loss scaler
(:func:`lpjax.optim.compound_loss_scaling`) can keep the moments in scaled units without ever rounding them
separately: ``scale`` is the unit of the incoming gradients and of ``eps`` (the update uses ``eps * scale``), and
``moment_scale`` is the unit the stored ``mu`` and ``nu_sqrt`` are in. An update first multiplies the stored
moments by ``f = scale / moment_scale`` in float32 and then sets ``moment_scale = scale``; changing ``scale``
(:func:`lpjax.optim.rescale_moments`) therefore leaves the stored moments bit-identical, and the change of unit is
exact whenever ``f`` is a power of two, subnormal moments included. Without a scaler both are 1.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from lpjax.optim import _misuse, quantized_moments
from lpjax.optim._hyperparameters import concrete, require_wide
from lpjax.optim._rounding import element_bits, fold_key


class ScaleByHAdamState(NamedTuple):
    """State of :func:`scale_by_hadam`.

    Attributes:
      count: int32 step counter ``t`` used for bias correction.
      mu: first moment ``m``, in the moment dtype (the parameters' dtype unless ``moment_dtype`` is given),
        in units of ``moment_scale``.
      nu_sqrt: ``w = sqrt(v)``, the square root of Adam's second moment, same dtype and units as ``mu``.
      scale: float32, the unit of the incoming gradients and the multiplier of ``eps``. 1 unless a loss scaler
        owns this state: :func:`lpjax.optim.compound_loss_scaling` keeps it equal to the loss scale.
      moment_scale: float32, the unit ``mu`` and ``nu_sqrt`` are stored in; the next update moves them to
        ``scale`` (see the module docstring).
      apply: bool, whether the next update is applied. A loss scaler that decides before the update sets it; when
        it is False the update returns a zero direction and leaves ``count``, ``mu`` and ``nu_sqrt`` bit-identical.
        Every update returns it True.
    """

    count: chex.Array
    mu: optax.Updates
    nu_sqrt: optax.Updates
    scale: chex.Array
    moment_scale: chex.Array
    apply: chex.Array


_QUANTIZATION_KEY = (0, 0)
"""8-bit moments are rounded stochastically with words drawn from this key folded with the step count (one key for
``m``, one for ``w``) and each element's identity (:func:`lpjax.optim._rounding.element_bits`): the rounding is a
function of the optimizer's state, with no key to store, and the same per leaf and in flat buffers."""


def _storage_dtype(m) -> np.dtype:
    """The dtype a moment's values are read in: its own, or float32 for 8-bit blockwise-quantized moments."""
    if isinstance(m, quantized_moments.BlockQuantized):
        return np.dtype(jnp.float32)
    return np.dtype(m.dtype)


def _squares_fit(storage, compute) -> bool:
    """Whether squares of every finite ``storage`` value stay normal and finite in ``compute``."""
    storage, compute = jnp.finfo(storage), jnp.finfo(compute)
    if storage.bits >= compute.bits:
        return False
    return float(storage.max) ** 2 < float(compute.max) and float(storage.smallest_subnormal) ** 2 > float(
        compute.smallest_normal
    )


def _compute_dtype(*dtypes) -> np.dtype:
    """float32, or float64 when one of ``dtypes`` is float64."""
    return np.dtype(jnp.promote_types(jnp.result_type(*dtypes), jnp.float32))


def _moment_storage(moment_dtype: Any, moment_block_size: Any) -> tuple[np.dtype | None, int]:
    """The moments' dtype (``None``: the parameters') and, for 8-bit moments, their block size as a Python int."""
    moment_dtype = None if moment_dtype is None else np.dtype(moment_dtype)
    quantized = quantized_moments.is_quantized_dtype(moment_dtype)
    if moment_dtype is not None and not quantized and not jnp.issubdtype(moment_dtype, jnp.floating):
        raise ValueError(f"moment_dtype must be a floating-point or 8-bit dtype, got {moment_dtype}.")
    if not quantized:
        return moment_dtype, moment_block_size
    block_size = concrete(moment_block_size)  # it shapes the state (optax.inject_hyperparams: a static argument)
    if block_size is None or block_size.shape or int(block_size) < 1:
        raise ValueError(
            f"scale_by_hadam: moment_block_size must be an int >= 1 for 8-bit moments, got {moment_block_size!r} "
            "(with optax.inject_hyperparams, pass static_args='moment_block_size')."
        )
    return moment_dtype, int(block_size)


def _load(m, dtype) -> jax.Array:
    """A moment (array or 8-bit :class:`~lpjax.optim.quantized_moments.BlockQuantized`) read in ``dtype``."""
    if isinstance(m, quantized_moments.BlockQuantized):
        return quantized_moments.dequantize(m, dtype)
    return m.astype(dtype)


def _store(x, like, bits, block_size, keep_nonzero=False):
    """``x`` stored as the moment ``like`` is: cast, or quantized stochastically with ``bits``."""
    if isinstance(like, quantized_moments.BlockQuantized):
        return quantized_moments.quantize(x, like.dtype, block_size, bits, keep_nonzero)
    return x.astype(like.dtype)


def _select(apply, new, old):
    return jax.tree.map(lambda n, o: jnp.where(apply, n, o), new, old)


def _new_moments(g, m, w, m_bits, w_bits, *, unit, apply, b1, b2, block_size):
    """One leaf's moments after gradient ``g``: ``m = b1 m + (1 - b1) g`` and ``w = hypot(sqrt(b2) w,
    sqrt(1 - b2) g)``, the old ones first brought to the current loss scale (``unit``); kept on a skipped step."""
    dtype = _compute_dtype(g.dtype, _storage_dtype(m))
    g_dtype = g.dtype
    g, f = g.astype(dtype), unit.astype(dtype)
    b1_, b2_ = jnp.asarray(b1, dtype), jnp.asarray(b2, dtype)
    new_m = b1_ * (f * _load(m, dtype)) + (1 - b1_) * g
    a = jnp.sqrt(b2_) * (f * _load(w, dtype))
    b = jnp.sqrt(1 - b2_) * g
    # 8-bit moments hold values of the gradients' range (in the loss scale's units): their squares fit when the
    # gradients' do.
    bound = g_dtype if isinstance(w, quantized_moments.BlockQuantized) else _storage_dtype(w)
    new_w = jnp.sqrt(a * a + b * b) if _squares_fit(bound, dtype) else jnp.hypot(a, b)
    return (
        _select(apply, _store(new_m, m, m_bits, block_size), m),
        _select(apply, _store(new_w, w, w_bits, block_size, keep_nonzero=True), w),
    )


def _direction(m, w, *, t, apply, scale, b1, b2, eps) -> jax.Array:
    """``m_hat / (w_hat + eps * scale)`` with the bias corrections of step ``t``; 0 on a skipped step or where
    the denominator is 0 (no moment yet)."""
    dtype = _compute_dtype(_storage_dtype(m))
    c1 = 1 - jnp.power(jnp.asarray(b1, dtype), t.astype(dtype))
    c2 = jnp.sqrt(1 - jnp.power(jnp.asarray(b2, dtype), t.astype(dtype)))
    denominator = _load(w, dtype) + jnp.asarray(eps, dtype) * scale.astype(dtype) * c2
    usable = apply & (denominator != 0)
    ratio = _load(m, dtype) / jnp.where(usable, denominator, jnp.ones_like(denominator))
    return jnp.where(usable, ratio * (c2 / c1), jnp.zeros_like(ratio)).astype(_storage_dtype(m))


def scale_by_hadam(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    moment_dtype: Any = None,
    moment_block_size: int = quantized_moments.DEFAULT_BLOCK_SIZE,
) -> optax.GradientTransformation:
    """Rescales updates by hAdam's ``m_hat / (w_hat + eps)`` (no learning rate, no sign flip).

    Args:
      b1: decay of the first moment.
      b2: decay of the second moment (``w`` decays with ``sqrt(b2)``).
      eps: term added to ``w_hat`` in the denominator, multiplied by ``state.scale``; added in float32, so it
        is never lost to a float16 rounding.
      moment_dtype: dtype of both moments, like ``optax.scale_by_adam``'s ``mu_dtype`` but for ``m`` and ``w``
        alike; ``None`` stores each in its parameter's dtype (the paper's pure-float16 setting). An 8-bit dtype
        of :data:`lpjax.optim.quantized_moments.QUANTIZED_MOMENT_DTYPES` (int8, float8_e4m3fn, float8_e5m2)
        stores both blockwise-quantized (:mod:`lpjax.optim.quantized_moments`), rounded stochastically with
        keys derived from the step count, ``w`` kept nonzero.
      moment_block_size: elements per quantization block of 8-bit moments (each block has a float32 scale).

    Returns:
      An ``optax.GradientTransformation`` with state :class:`ScaleByHAdamState`. Its updates have the moments'
      dtype (float32 for 8-bit moments).
    """
    for name, value in (("b1", b1), ("b2", b2), ("eps", eps)):
        require_wide("scale_by_hadam", name, value)
    moment_dtype, block_size = _moment_storage(moment_dtype, moment_block_size)
    quantized = quantized_moments.is_quantized_dtype(moment_dtype)

    def init_fn(params):
        def zeros(p):
            if quantized:
                return quantized_moments.zeros(jnp.shape(p), moment_dtype, block_size)
            return jnp.zeros(jnp.shape(p), moment_dtype or jnp.result_type(p))

        # Two separate trees: a state whose moments share buffers cannot be donated to a jitted step.
        return ScaleByHAdamState(
            count=jnp.zeros([], jnp.int32),
            mu=jax.tree.map(zeros, params),
            nu_sqrt=jax.tree.map(zeros, params),
            scale=jnp.ones([], jnp.float32),
            moment_scale=jnp.ones([], jnp.float32),
            apply=jnp.ones([], jnp.bool_),
        )

    def update_fn(updates, state, params=None):
        del params
        _misuse.refuse_increments(updates, "scale_by_hadam")  # e.g. chain(kahan_summation(), hadam(lr))
        apply = state.apply
        step = optax.safe_increment(state.count)
        t = step.astype(jnp.float32)  # also on a skipped step: no 0 / 0 in the (discarded) direction at t = 0
        unit = state.scale / state.moment_scale  # a power of two under compound_loss_scaling: exact

        # Flattened up to the gradients' leaves: an 8-bit moment is a subtree (codes and scales) of its own.
        grads, treedef = jax.tree.flatten(updates)
        if quantized:
            step_key = fold_key(jnp.asarray(_QUANTIZATION_KEY, jnp.uint32), step.astype(jnp.uint32))
            m_bits, w_bits = (jax.tree.leaves(element_bits(fold_key(step_key, i), updates)) for i in (0, 1))
        else:
            m_bits = w_bits = [None] * len(grads)
        old = zip(grads, treedef.flatten_up_to(state.mu), treedef.flatten_up_to(state.nu_sqrt), m_bits, w_bits)
        pairs = [_new_moments(*leaf, unit=unit, apply=apply, b1=b1, b2=b2, block_size=block_size) for leaf in old]
        mu, nu_sqrt = (jax.tree.unflatten(treedef, [pair[i] for pair in pairs]) for i in (0, 1))
        # The direction reads the moments as stored, after the select on `apply`: the state alone determines the
        # update, and a compiler reads them back from the state's buffers instead of recomputing them from the old
        # moments, which it would have to copy first to update them in place.
        new = zip(treedef.flatten_up_to(mu), treedef.flatten_up_to(nu_sqrt))
        directions = [_direction(m, w, t=t, apply=apply, scale=state.scale, b1=b1, b2=b2, eps=eps) for m, w in new]
        return jax.tree.unflatten(treedef, directions), ScaleByHAdamState(
            count=jnp.where(apply, step, state.count),
            mu=mu,
            nu_sqrt=nu_sqrt,
            scale=state.scale,
            moment_scale=jnp.where(apply, state.scale, state.moment_scale),
            apply=jnp.ones([], jnp.bool_),
        )

    return optax.GradientTransformation(init_fn, update_fn)


def descend(learning_rate: optax.ScalarOrSchedule) -> optax.GradientTransformation:
    """``-learning_rate * u`` multiplied in float32 (or wider) and rounded once to ``u``'s dtype.

    The same as ``optax.scale_by_learning_rate`` (same states: ``EmptyState`` for a number,
    ``ScaleByScheduleState`` for a schedule), except that a float16 update is not multiplied by a float16-rounded
    learning rate, and an injected float32 learning rate does not promote the updates to float32.
    """

    def step(u, lr):
        dtype = jnp.promote_types(u.dtype, jnp.result_type(lr, jnp.float32))
        return (-jnp.asarray(lr, dtype) * u.astype(dtype)).astype(u.dtype)

    if callable(learning_rate):

        def init_fn(params):
            del params
            return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

        def update_fn(updates, state, params=None):
            del params
            lr = learning_rate(state.count)
            return (
                jax.tree.map(lambda u: step(u, lr), updates),
                optax.ScaleByScheduleState(count=optax.safe_increment(state.count)),
            )

        return optax.GradientTransformation(init_fn, update_fn)
    return optax.GradientTransformation(
        lambda params: optax.EmptyState(),
        lambda updates, state, params=None: (jax.tree.map(lambda u: step(u, learning_rate), updates), state),
    )


def hadam(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    moment_dtype: Any = None,
    moment_block_size: int = quantized_moments.DEFAULT_BLOCK_SIZE,
) -> optax.GradientTransformation:
    """The hAdam optimizer: :func:`scale_by_hadam` followed by ``-learning_rate`` (a float or an optax schedule).

    A drop-in replacement for ``optax.adam(learning_rate, b1, b2, eps)``: identical updates in exact arithmetic.
    ``moment_dtype`` is the dtype of both moments (default: the parameters'; an 8-bit dtype stores them blockwise
    quantized in blocks of ``moment_block_size``). The learning rate multiplies the
    direction in float32 and the product is rounded once to the moments' dtype.
    """
    require_wide("hadam", "learning_rate", learning_rate)
    return optax.chain(
        scale_by_hadam(b1=b1, b2=b2, eps=eps, moment_dtype=moment_dtype, moment_block_size=moment_block_size),
        descend(learning_rate),
    )
