"""The categorical (C51) projection of a shifted return distribution back onto a fixed support.

A categorical distribution puts probability ``p_j`` on atom ``z_j``. The distributional Bellman target of D4PG
(Barth-Maron et al., 2018) moves every atom of the next state's distribution to ``r + D z_j`` (``D``: the n-step
bootstrap multiplier), which no longer lies on the support ``z_1 < ... < z_A``.
:func:`categorical_l2_project` maps it back (Bellemare et al., 2017, Algorithm 1; Acme's ``l2_project``, rlax's
``categorical_l2_project``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def categorical_l2_project(values: jax.Array, probs: jax.Array, atoms: jax.Array) -> jax.Array:
    """Projects the distribution ``sum_j probs_j delta(values_j)`` onto the support ``atoms``.

    With ``x_j = clip(values_j, z_1, z_A)`` (mass outside ``[v_min, v_max]`` goes to the end atoms), each
    ``probs_j`` is split between the two atoms around ``x_j`` in proportion to their proximity:

        out_i = sum_j probs_j * clip(1 - |x_j - z_i| / dz_i(x_j), 0, 1)

    where ``dz_i(x) = z_{i+1} - z_i`` if ``x >= z_i`` and ``z_i - z_{i-1}`` otherwise (a missing neighbour,
    ``z_0`` or ``z_{A+1}``, only meets ``x = z_i``: weight 1). For ``z_i <= x_j <= z_{i+1}`` atom ``i`` gets
    ``probs_j (z_{i+1} - x_j) / (z_{i+1} - z_i)`` and atom ``i+1`` gets the rest, so the mass is preserved, the
    mean is preserved whenever no value is clipped, and a value on an atom goes to that atom alone
    (``values == atoms`` is the identity). Among distributions on ``atoms`` this is the orthogonal projection
    for the Cramér distance (the L2 distance between CDFs; Rowland et al., 2018), hence the name.

    The support need not be evenly spaced, but must increase strictly. Weights are divisions, not
    multiplications by reciprocal spacings, so a value equal to an atom gets weight exactly 1 (and 0 next to it).

    Args:
      values: ``(..., A_p)`` positions of the source atoms, e.g. ``r[:, None] + D[:, None] * atoms``.
      probs: ``(..., A_p)`` their probabilities (each row summing to 1).
      atoms: ``(A_q,)`` the target support ``z_1 < ... < z_{A_q}`` (``A_q >= 2``).

    Returns:
      ``(..., A_q)`` probabilities on ``atoms``, in the dtype of ``values``, ``probs`` and ``atoms`` promoted.
    """
    values, probs, atoms = jnp.asarray(values), jnp.asarray(probs), jnp.asarray(atoms)
    if atoms.ndim != 1 or atoms.shape[0] < 2:
        raise ValueError(f"atoms must be a vector of at least 2 values, got shape {atoms.shape}.")
    if values.shape != probs.shape:
        raise ValueError(f"values and probs must have the same shape, got {values.shape} and {probs.shape}.")
    dtype = jnp.result_type(values, probs, atoms)
    values, probs, atoms = values.astype(dtype), probs.astype(dtype), atoms.astype(dtype)
    gaps = atoms[1:] - atoms[:-1]
    zero = jnp.zeros((1,), dtype)
    above = jnp.concatenate([gaps, zero])  # z_{i+1} - z_i; 0 for the last atom
    below = jnp.concatenate([zero, gaps])  # z_i - z_{i-1}; 0 for the first atom
    x = jnp.clip(values, atoms[0], atoms[-1])[..., :, None]  # (..., A_p, 1)
    delta = x - atoms  # (..., A_p, A_q): x_j - z_i
    gap = jnp.where(delta >= 0, above, below)
    distance = jnp.where(gap > 0, jnp.abs(delta) / jnp.where(gap > 0, gap, 1), 0)
    weights = jnp.clip(1 - distance, 0, 1)
    return jnp.sum(weights * probs[..., :, None], axis=-2)


def expected_value(logits: jax.Array, atoms: jax.Array) -> jax.Array:
    """``Q = sum_i softmax(logits)_i z_i``: the mean of a categorical distribution given by its logits."""
    return jnp.sum(jax.nn.softmax(logits, axis=-1) * atoms, axis=-1)
