"""The tanh-squashed Gaussian policy distribution of SAC, with the paper's fp16 fixes as switches.

A sample is ``a = tanh(u)``, ``u = mu + sigma * e``, ``e ~ N(0, 1)``, and

    log pi(a) = sum_i [ log N(u_i; mu_i, sigma_i) - log(1 - tanh(u_i)^2) ].

* ``normal_fix``: ``log N`` via ``((u - mu) / sigma)^2`` (:func:`lpjax.numerics.normal_log_prob`); without it,
  the textbook ``(u - mu)^2 / sigma^2``, whose ``sigma^2`` underflows float16.
* ``softplus_fix``: ``log(1 - tanh^2)`` in lpjax's overflow-free form (:func:`lpjax.numerics.tanh_log_det_jacobian`);
  without it, PyTorch's ``2 (log 2 - u - softplus(-2u))`` with PyTorch's softplus threshold 20, whose
  ``exp(-2u)`` overflows float16 for ``u < -5.55``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from lpjax import numerics


def _textbook_normal_log_prob(x, loc, scale):
    return -jnp.square(x - loc) / (2 * jnp.square(scale)) - jnp.log(scale) - 0.5 * math.log(2 * math.pi)


def _torch_tanh_log_det_jacobian(u):
    x = -2.0 * u
    softplus = jnp.where(x > 20.0, x, jnp.log1p(jnp.exp(x)))  # torch.nn.functional.softplus, threshold 20
    return 2.0 * (math.log(2.0) - u - softplus)


def sample_and_log_prob(
    key: jax.Array,
    mean: jax.Array,
    log_std: jax.Array,
    *,
    normal_fix: bool = True,
    softplus_fix: bool = True,
    sigma_eps: float = 0.0,
) -> tuple[jax.Array, jax.Array]:
    """Reparameterised sample ``a = tanh(mu + sigma e)`` and its log-probability summed over the last axis.

    ``sigma = exp(log_std) + sigma_eps`` (the paper adds 1e-4 for pixels, whose log-std reaches -10). Everything
    is computed in the dtype of ``mean``; the log-probability has shape ``mean.shape[:-1]``.
    """
    dtype = mean.dtype
    std = jnp.exp(log_std)
    if sigma_eps:  # no "+ 0": lpjax.inspect flags additions of a literal 0 (what an underflowed eps looks like)
        std = std + jnp.asarray(sigma_eps, dtype)
    u = mean + std * jax.random.normal(key, mean.shape, dtype)
    log_normal = numerics.normal_log_prob(u, mean, std) if normal_fix else _textbook_normal_log_prob(u, mean, std)
    log_det = numerics.tanh_log_det_jacobian(u) if softplus_fix else _torch_tanh_log_det_jacobian(u)
    return jnp.tanh(u), jnp.sum(log_normal - log_det, axis=-1)
