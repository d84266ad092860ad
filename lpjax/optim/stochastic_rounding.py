"""Stochastically rounded parameter and target (Polyak) updates: an alternative to the Kahan buffers.

float16 keeps 11 significant bits, so ``1.0 + 1e-4`` rounds to nearest back to ``1.0``: an optimizer making many
small steps to a float16 parameter makes none (round-to-nearest "stalls"). Kahan summation
(:mod:`lpjax.optim.kahan`) carries the lost part in a buffer as large as the parameters. Stochastic rounding
carries it in expectation instead, and needs no buffer: the exact sum ``x = p + u`` (computed in float32) is
rounded to one of its two neighbours in the parameter's dtype,

    lo <= x <= hi   (adjacent values of the dtype),   SR(x) = hi with probability (x - lo) / (hi - lo), else lo,

so ``E[SR(x)] = lo + (x - lo) = x``: every rounding is unbiased and the errors of successive steps are independent
with mean 0. A parameter that receives ``n`` updates of ``1e-4`` therefore drifts by ``n * 1e-4`` in expectation,
with a random-walk error of about ``sqrt(n) * ulp / 2``. A value the dtype represents exactly is its own
rounding (``lo = hi = x``), so an all-zero update (a step skipped by the loss scaler) changes nothing.

Range. The neighbours are found with ``nextafter`` in the storage dtype, so subnormals round stochastically like
normal values. Where ``x`` is beyond the dtype's largest finite value, or not finite (a nan or inf update), the
parameter is left unchanged: a parameter is never made non-finite by an update.

bfloat16 shares float32's exponent range: below ``2^-119`` its ulp is a float32 subnormal, which XLA:CPU flushes to
zero in float32 arithmetic, and such tiny values round down (toward the smaller neighbour) instead.

Precision of the sum. ``x`` is computed in float32, which is exact for the sum of two float16 values of similar
magnitude, and the rounding probabilities are float32 ratios: the result is unbiased to within float32's
rounding of ``x``, far below the 16-bit dtype's ulp. Parameters wider than 16 bits (float32, float64) are
updated by plain addition: their rounding is not the bottleneck.

Compilation. The nearest rounding that decides between the neighbours is one XLA keeps
(:func:`lpjax.optim._rounding.round_to_nearest`, subnormals included); a cast pair that XLA's
``xla_allow_excess_precision`` removed would make ``x`` look representable and round it to nearest at the end,
silently turning the method off.

Randomness. The transforms hold a PRNG key in their state (raw ``uint32[2]`` key data, checkpointed with the
rest of the state); each update splits it (:func:`lpjax.optim._rounding.split_key`), and every element draws
its own word from the step's key and its identity, ``(leaf index, index within the leaf)``
(:func:`lpjax.optim._rounding.element_bits`). The sequence of roundings is therefore a pure function of the seed
and the updates (a resumed run rounds exactly as the uninterrupted one), and it is the same per leaf and inside
:func:`lpjax.optim.fused`'s flat buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from lpjax.optim import _misuse
from lpjax.optim._rounding import choose_far, element_bits, round_to_nearest, split_key

ROUNDED_DTYPES = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))
"""The dtypes whose parameters are rounded stochastically; wider ones are updated by plain addition."""


def stochastic_round(x: jax.Array, dtype: Any, key: jax.Array) -> jax.Array:
    """Rounds ``x`` (float32 or wider) to ``dtype`` stochastically: up with probability ``(x - lo) / (hi - lo)``.

    Args:
      x: the values to round, in a dtype wider than ``dtype``.
      dtype: float16 or bfloat16.
      key: a PRNG key (typed or raw): each element draws a word from it and its index
        (:func:`lpjax.optim._rounding.element_bits`).

    Returns:
      ``dtype`` values with ``E[result] = x`` for every finite ``x`` within ``dtype``'s range; ``x`` exactly
      where ``dtype`` represents it; ``+-inf`` where ``|x|`` exceeds ``dtype``'s largest finite value; ``nan``
      for ``nan``. Callers that must stay finite check the result, as :func:`stochastic_rounding` does.
    """
    dtype = np.dtype(dtype)
    if dtype not in ROUNDED_DTYPES:
        raise ValueError(f"stochastic_round rounds to float16 or bfloat16, got {dtype}.")
    x = jnp.asarray(x)
    if jnp.finfo(x.dtype).bits <= jnp.finfo(dtype).bits:
        raise ValueError(f"stochastic_round needs x wider than {dtype}, got {x.dtype}.")
    return _round_with_bits(x, dtype, element_bits(_raw_key(key), x))


def _round_with_bits(x: jax.Array, dtype: np.dtype, bits: jax.Array) -> jax.Array:
    """:func:`stochastic_round` with the random words given (uint32, ``x``'s shape)."""
    nearest = round_to_nearest(x, dtype)
    toward = jnp.where(nearest > x, -jnp.inf, jnp.inf).astype(dtype)
    other = jnp.nextafter(nearest.astype(dtype), toward).astype(x.dtype)
    lo, hi = jnp.minimum(nearest, other), jnp.maximum(nearest, other)
    # hi - lo is exact (adjacent values of a narrower dtype); x - lo is exact by Sterbenz' lemma. They are not a
    # finite distance apart only at inf (x not finite, or beyond the range: handled below).
    rounded = jnp.where(nearest == x, x, jnp.where(choose_far(x, lo, hi, bits), hi, lo))
    beyond = jnp.abs(x) > jnp.finfo(dtype).max  # inf, or past the largest finite value: no neighbour above
    return jnp.where(beyond, jnp.copysign(jnp.inf, x), rounded).astype(dtype)


def _raw_key(seed: int | jax.Array) -> jax.Array:
    if isinstance(seed, (int, np.integer)):
        return jax.random.PRNGKey(seed)
    if jnp.issubdtype(jnp.asarray(seed).dtype, jax.dtypes.prng_key):
        return jax.random.key_data(seed)
    return jnp.asarray(seed, jnp.uint32)


def _rounded_sum(p: jax.Array, u: jax.Array, bits: jax.Array) -> jax.Array:
    """``SR(p + u)`` in ``p``'s dtype, or ``p`` where the sum is not finite in that dtype."""
    if p.dtype not in ROUNDED_DTYPES:
        new = (p + u.astype(p.dtype)).astype(p.dtype)
    else:
        new = _round_with_bits(p.astype(jnp.float32) + u.astype(jnp.float32), np.dtype(p.dtype), bits)
    return jnp.where(jnp.isfinite(new), new, p)


class StochasticRoundingState(NamedTuple):
    """State of :func:`stochastic_rounding` and :func:`stochastic_rounding_polyak`.

    Attributes:
      key: raw ``uint32[2]`` PRNG key data; split at every update (:func:`lpjax.optim._rounding.split_key`).
    """

    key: chex.Array


def stochastic_rounding(seed: int | jax.Array = 0) -> optax.GradientTransformation:
    """Makes the updates of an optax chain land on float16/bfloat16 parameters with stochastic rounding.

    Put it **last** in the chain (where :func:`lpjax.optim.kahan_summation` would go; lpjax refuses it elsewhere,
    see :mod:`lpjax.optim._misuse`) and apply its output with ``optax.apply_updates``. It needs ``params`` in
    ``update``. It returns the increment ``d = SR(p + u) - p`` in the parameters' dtype, which is exact for every
    update small against its parameter, so ``p + d`` is ``SR(p + u)`` bit for bit (for jumps by more than a factor
    2, ``d`` is rounded once). Where ``p + u`` is not finite in the parameter's dtype, ``d = 0``. An all-zero update
    leaves the parameters bit-identical; the key advances regardless, so that the roundings depend only on the step
    count and the seed.

    Unlike Kahan summation it keeps no per-parameter state: the state is one key.

    Args:
      seed: an int, or a PRNG key (typed or raw).

    Returns:
      An ``optax.GradientTransformation`` with state :class:`StochasticRoundingState`.
    """

    def init_fn(params):
        del params
        return StochasticRoundingState(_raw_key(seed))

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("stochastic_rounding needs the parameters: call update(updates, state, params).")
        _misuse.refuse_increments(updates, "stochastic_rounding")
        key, step_key = split_key(state.key)
        new = jax.tree.map(_rounded_sum, params, updates, element_bits(step_key, params))
        increments = jax.tree.map(lambda n, p: (n - p).astype(p.dtype), new, params)
        return _misuse.mark_increments(increments, "stochastic_rounding"), StochasticRoundingState(key)

    return optax.GradientTransformation(init_fn, update_fn)


class StochasticRoundingPolyak(NamedTuple):
    """Pure ``init``/``update`` pair returned by :func:`stochastic_rounding_polyak`.

    Attributes:
      init: ``init(target_params) -> StochasticRoundingState``.
      update: ``update(online_params, target_params, state) -> (new_target_params, state)``.
    """

    init: Callable[[optax.Params], StochasticRoundingState]
    update: Callable[
        [optax.Params, optax.Params, StochasticRoundingState], tuple[optax.Params, StochasticRoundingState]
    ]


def stochastic_rounding_polyak(tau: float, seed: int | jax.Array = 0) -> StochasticRoundingPolyak:
    """The target update ``t <- SR(t + tau (p - t))``, computed in float32 and rounded stochastically.

    In float16 ``tau (p - t)`` with ``tau = 0.005`` is below half an ulp of ``t`` whenever ``|p - t|`` is below
    ``0.1 |t|`` or so, and round-to-nearest would freeze the target. Stochastic rounding moves it by the right
    amount in expectation, without the compensation buffer of :func:`lpjax.optim.kahan_polyak`. Targets wider
    than 16 bits take the plain step; an element whose new value is not finite keeps its old value.

    Args:
      tau: Polyak step size in (0, 1].
      seed: an int, or a PRNG key (typed or raw).

    Returns:
      A :class:`StochasticRoundingPolyak` ``(init, update)`` pair of pure, jittable functions.
    """
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"stochastic_rounding_polyak needs 0 < tau <= 1, got {tau}.")

    def init(target_params):
        del target_params
        return StochasticRoundingState(_raw_key(seed))

    def step(p, t, bits):
        wide = jnp.promote_types(t.dtype, jnp.float32)
        increment = jnp.asarray(tau, wide) * (p.astype(wide) - t.astype(wide))
        return _rounded_sum(t, increment, bits)

    def update(online_params, target_params, state):
        key, step_key = split_key(state.key)
        new_target = jax.tree.map(step, online_params, target_params, element_bits(step_key, target_params))
        return new_target, StochasticRoundingState(key)

    return StochasticRoundingPolyak(init, update)
