"""A trainable network (parameters + optimizer state) and one loss-scaled gradient step, shared by learners."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax

from lpjax.optim import loss_scale_or_one


class Trainable(NamedTuple):
    """Parameters of one network and the state of its optimizer.

    Attributes:
      params: the network's parameters.
      opt_state: its optimizer's state (may hold a loss scaler, see :func:`gradient_step`).
    """

    params: Any
    opt_state: Any


def trainable_init(params: Any, tx: optax.GradientTransformation) -> Trainable:
    """A :class:`Trainable` with a freshly initialised optimizer state."""
    return Trainable(params, tx.init(params))


def gradient_step(trainable: Trainable, tx: optax.GradientTransformation,
                  loss_fn: Callable[..., tuple[chex.Array, Any]], *args) -> tuple[Trainable, chex.Array, Any]:
    """One optimizer step on ``loss_fn(params, *args) -> (loss, aux)``; returns ``(trainable, loss, aux)``.

    The loss is multiplied by the optimizer's loss scale (1 without a scaler) in float32 before
    differentiation, so the backward pass runs in the network's dtype on scaled cotangents; the scaled
    gradients go to ``tx`` as they are (compound loss scaling never unscales them).
    """
    scale = loss_scale_or_one(trainable.opt_state)

    def scaled(params):
        loss, aux = loss_fn(params, *args)
        return loss.astype(jnp.float32) * scale, (loss, aux)

    grads, (loss, aux) = jax.grad(scaled, has_aux=True)(trainable.params)
    updates, opt_state = tx.update(grads, trainable.opt_state, trainable.params)
    return Trainable(optax.apply_updates(trainable.params, updates), opt_state), loss, aux
