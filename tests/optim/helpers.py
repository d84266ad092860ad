"""Shared helpers of the optimizer tests: random parameter/gradient pytrees and step loops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax


def random_tree(seed: int, dtype=jnp.float32, scale: float = 1.0, shapes=((3, 4), (4,), (2, 2, 3))):
    """A dict pytree of normal arrays of ``dtype`` with standard deviation ``scale`` (values drawn in float64)."""
    rng = np.random.default_rng(seed)
    return {f"w{i}": jnp.asarray(rng.normal(0.0, scale, size=shape), dtype) for i, shape in enumerate(shapes)}


def any_bit_patterns(dtype, n: int, seed: int, finite: bool = False) -> jax.Array:
    """``n`` values of a 16-bit float dtype drawn uniformly over its bit patterns: subnormals, near-max values,
    both zeros and (unless ``finite``) infinities and nans."""
    values = np.random.default_rng(seed).integers(0, 2**16, size=4 * n, dtype=np.uint16).view(np.dtype(dtype))
    if finite:
        values = values[np.isfinite(values.astype(np.float32))]
    return jnp.asarray(values[:n])


def run_steps(tx: optax.GradientTransformation, params, grads_seq, loss_scale_fn=None):
    """Applies ``tx`` to each gradient tree of ``grads_seq``; returns ``(params, opt_state, updates_list)``.

    ``loss_scale_fn(opt_state)``, when given, multiplies each gradient (as a loss-scaled backward pass would).
    """
    state = tx.init(params)
    update = jax.jit(tx.update)
    updates_list = []
    for grads in grads_seq:
        if loss_scale_fn is not None:
            scale = loss_scale_fn(state)
            grads = jax.tree.map(lambda g: g * scale.astype(g.dtype), grads)
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
        updates_list.append(updates)
    return params, state, updates_list


def max_relative_error(a, b) -> float:
    """max over leaves of max |a - b| / max(|b|, tiny)."""
    errs = jax.tree.map(lambda x, y: float(jnp.max(jnp.abs(x - y) / jnp.maximum(jnp.abs(y), 1e-300))), a, b)
    return max(jax.tree.leaves(errs))
