"""The rollout engine of GRPO: sync the learner's weights into a (possibly low-precision) rollout model and
sample batched completions with each token's log-probability under the rollout policy.

A rollout model is a :class:`lpjax.nn.CausalLM` built with the rollout precision (e.g. the ``"fp8"`` policy:
blockwise W8A8 E4M3 GEMMs through :mod:`lpjax.quant` and the kernels' reference path, and/or an fp8 KV cache).
It shares the parameter tree of the training model, so :meth:`RolloutEngine.sync` takes the learner's latest
float32 parameters as they are: the fp8 GEMMs quantize the synced weights (128x128 blocks, ``amax / 448``) in
every forward pass, so every rollout runs the current weights, re-quantized, never stale ones; and ``sync``
recalibrates the fp8 KV-cache scales on calibration tokens (``amax / 448`` per layer and head).

:func:`sample` prefills the prompts through the KV cache, then decodes ``max_new_tokens`` tokens one at a time
in a ``lax.scan``. Token ``t`` is drawn from ``softmax(logits / temperature)`` restricted to the top-p nucleus,
and its log-probability under that sampling distribution is recorded (``logp_rollout``, the denominator of the
TIS weight). After a row emits ``eos_id`` its mask is 0 (the EOS itself counts).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """How completions are drawn: ``max_new_tokens``, ``temperature`` (> 0), ``top_p`` in (0, 1], ``eos_id``."""

    max_new_tokens: int
    eos_id: int
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}.")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")


def _sampling_logprobs(logits: jax.Array, settings: SamplingSettings) -> jax.Array:
    """log-probabilities of the sampling distribution: temperature, then the top-p nucleus (others -inf)."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / settings.temperature, axis=-1)
    if settings.top_p >= 1.0:
        return logp
    sorted_logp = jnp.sort(logp, axis=-1)[..., ::-1]
    cumulative = jnp.cumsum(jnp.exp(sorted_logp), axis=-1)
    # keep the smallest prefix whose mass reaches top_p: a token is kept if the mass before it is < top_p
    keep_sorted = (cumulative - jnp.exp(sorted_logp)) < settings.top_p
    threshold = jnp.min(jnp.where(keep_sorted, sorted_logp, jnp.inf), axis=-1, keepdims=True)
    kept = jnp.where(logp >= threshold, logp, -jnp.inf)
    return jax.nn.log_softmax(kept, axis=-1)


@functools.partial(jax.jit, static_argnames=("model", "settings"))
def sample(
    model: Any, params: Any, prompts: jax.Array, key: jax.Array, settings: SamplingSettings, kv_scales: Any = None
) -> dict[str, jax.Array]:
    """Samples one completion per prompt row.

    Args:
      model: a :class:`lpjax.nn.CausalLM` (static: build it once).
      params: its parameters.
      prompts: ``(B, P)`` int32 prompts, all of length ``P`` (the synthetic tasks' prompts have fixed length).
      key: PRNG key.
      settings: :class:`SamplingSettings`.
      kv_scales: the fp8 KV-cache scales from ``model.calibrate_kv`` (``None`` for an unquantized cache).

    Returns:
      ``{"completions": (B, N) int32, "logp": (B, N) float32, "mask": (B, N) float32}`` with ``N =
      max_new_tokens``; ``logp`` is each sampled token's log-probability under the rollout policy.
    """
    batch = prompts.shape[0]
    cache = model.init_cache(batch, kv_scales)
    logits, cache = model.apply(params, prompts, cache)

    def step(carry, step_key):
        last_logits, cache, alive = carry
        logp_all = _sampling_logprobs(last_logits, settings)
        token = jax.random.categorical(step_key, logp_all, axis=-1).astype(jnp.int32)
        logp = jnp.take_along_axis(logp_all, token[:, None], axis=-1)[:, 0]
        mask = alive.astype(jnp.float32)
        alive = alive & (token != settings.eos_id)
        next_logits, cache = model.apply(params, token[:, None], cache)
        return (next_logits[:, -1], cache, alive), (token, logp, mask)

    keys = jax.random.split(key, settings.max_new_tokens)
    carry = (logits[:, -1], cache, jnp.ones(batch, bool))
    _, (tokens, logp, mask) = jax.lax.scan(step, carry, keys)
    return {"completions": tokens.T, "logp": logp.T, "mask": mask.T}


class RolloutEngine:
    """Holds the rollout model, the synced weights and the KV scales; see the module docstring.

    Args:
      model: the rollout :class:`lpjax.nn.CausalLM` (its precision policy and KV-cache dtype are the rollout's).
      settings: :class:`SamplingSettings`.
    """

    def __init__(self, model: Any, settings: SamplingSettings):
        self.model, self.settings = model, settings
        self.params, self.kv_scales, self.version = None, None, -1

    def sync(self, params: Any, version: int, calibration_tokens: jax.Array) -> None:
        """Takes the learner's latest weights and recalibrates the KV-cache scales on ``calibration_tokens``."""
        self.params, self.version = params, version
        self.kv_scales = self.model.calibrate_kv(params, calibration_tokens)

    def restore(self, params: Any, version: int, kv_scales: Any) -> None:
        """Takes weights and the KV scales they were calibrated with, as saved (a resumed run continues with the
        scales an uninterrupted one would have: recalibrating on other tokens would change them)."""
        self.params, self.version, self.kv_scales = params, version, kv_scales

    def rollout(self, prompts: jax.Array, key: jax.Array) -> dict[str, jax.Array]:
        """Samples completions of ``prompts`` with the last synced weights (see :func:`sample`)."""
        if self.params is None:
            raise RuntimeError("RolloutEngine.rollout before the first sync: call sync(params, ...) first.")
        return sample(self.model, self.params, prompts, key, self.settings, self.kv_scales)
