"""GRPO's hyper-parameters, the rollout precision (FP8-RL) and TIS, as one frozen (hashable) config."""

from __future__ import annotations

import dataclasses
from typing import Any

from lpjax.agents.grpo.algorithm import CLIP_HIGHER_EPS
from lpjax.agents.training import LearnerConfig

ROLLOUT_PRECISIONS = ("fp32", "bf16", "fp8", "fp8_kv")
"""Rollout engines: ``fp32``; ``bf16`` (the paper's baseline); ``fp8``: W8A8 blockwise fp8 linear layers (bf16
activations elsewhere, embeddings/norms/lm_head high precision); ``fp8_kv``: ``fp8`` plus an fp8 KV cache."""

KV_CACHE_DTYPES = ("fp32", "bf16", "fp8")
"""KV-cache storage of the rollout engine (``fp8``: float8_e4m3fn with scales recalibrated after each update)."""


@dataclasses.dataclass(frozen=True)
class GRPOConfig(LearnerConfig):
    """Hyper-parameters of GRPO with FP8-RL's rollout precision and token-level TIS (:mod:`lpjax.agents.grpo`).

    Batch: each step samples ``group_size`` (G) responses of at most ``max_new_tokens`` tokens to each of
    ``num_prompts`` prompts (``batch_size = num_prompts * group_size`` sequences), at ``temperature`` with
    nucleus ``top_p``; advantages are normalised within each group. The batch is used for ``ppo_epochs`` passes
    of ``num_minibatches`` updates each (the default, 1 x 1, is one on-policy update per rollout as FP8-RL).

    Loss (:func:`lpjax.agents.grpo.grpo_loss`, arguments from :meth:`loss_kwargs`): PPO clip range
    ``[1 - eps_low, 1 + eps_high]``; ``eps_high=None`` means ``eps_low``, or DAPO's 0.28 with
    ``clip_higher=True`` (see :attr:`effective_eps_high`); ``tis`` switches token-level truncated importance
    sampling with cap ``tis_cap`` (FP8-RL: C = 2); ``beta`` is the k3 KL coefficient to the reference policy
    (0: no reference model is needed).

    Optimiser: AdamW (``learning_rate``, ``b1``, ``b2``, ``adam_eps``, ``weight_decay``) after global-norm
    clipping at ``max_grad_norm`` (``None``: none).

    Precision: ``policy`` is the training engine's policy (a name or spec for
    :func:`lpjax.precision.get_policy`); ``rollout_precision`` the rollout engine (one of
    :data:`ROLLOUT_PRECISIONS`); ``kv_cache_dtype`` its KV cache (one of :data:`KV_CACHE_DTYPES`; ``None``
    follows ``rollout_precision``: fp8 for ``fp8_kv``, else its activation dtype; see
    :attr:`effective_kv_cache_dtype`). ``rollout_precision="bf16", kv_cache_dtype="fp8"`` is the paper's
    KV-only fp8 row. ``seed`` seeds initialisation and sampling.
    """

    group_size: int = 8
    num_prompts: int = 8
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    eps_low: float = 0.2
    eps_high: float | None = None
    clip_higher: bool = False
    tis: bool = True
    tis_cap: float = 2.0
    beta: float = 0.0
    ppo_epochs: int = 1
    num_minibatches: int = 1
    learning_rate: float = 1e-5
    b1: float = 0.9
    b2: float = 0.999
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0
    policy: str = "fp32"
    rollout_precision: str = "bf16"
    kv_cache_dtype: str | None = None
    seed: int = 0

    def __post_init__(self):
        self.validate([
            (_is_int(self.group_size) and self.group_size >= 2,
             "group_size must be an int >= 2 (advantages are relative within a group)"),
            (_is_int(self.num_prompts) and self.num_prompts >= 1, "num_prompts must be an int >= 1"),
            (_is_int(self.max_new_tokens) and self.max_new_tokens >= 1, "max_new_tokens must be an int >= 1"),
            (self.temperature > 0, "temperature must be > 0"),
            (0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]"),
            (0.0 < self.eps_low < 1.0, "eps_low must be in (0, 1)"),
            (self.eps_high is None or self.eps_high > 0, "eps_high must be > 0 (or None)"),
            (not self.clip_higher or self.eps_high is None or self.eps_high > self.eps_low,
             "clip_higher needs eps_high > eps_low (or eps_high=None for DAPO's 0.28)"),
            (not self.tis or self.tis_cap > 0, "tis_cap must be > 0 (or tis=False)"),
            (self.beta >= 0, "beta must be >= 0"),
            (_is_int(self.ppo_epochs) and self.ppo_epochs >= 1, "ppo_epochs must be an int >= 1"),
            (_is_int(self.num_minibatches) and self.num_minibatches >= 1
             and (self.batch_size % self.num_minibatches == 0),
             "num_minibatches must be an int >= 1 dividing num_prompts * group_size"),
            (self.learning_rate > 0, "learning_rate must be > 0"),
            (0.0 <= self.b1 < 1.0 and 0.0 <= self.b2 < 1.0, "b1 and b2 must be in [0, 1)"),
            (self.adam_eps >= 0, "adam_eps must be >= 0"),
            (self.weight_decay >= 0, "weight_decay must be >= 0"),
            (self.max_grad_norm is None or self.max_grad_norm > 0, "max_grad_norm must be > 0 (or None)"),
            (self.rollout_precision in ROLLOUT_PRECISIONS,
             f"rollout_precision must be one of {ROLLOUT_PRECISIONS}, got {self.rollout_precision!r}"),
            (self.kv_cache_dtype is None or self.kv_cache_dtype in KV_CACHE_DTYPES,
             f"kv_cache_dtype must be None or one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}"),
            (self.rollout_precision != "fp8_kv" or self.kv_cache_dtype in (None, "fp8"),
             "rollout_precision='fp8_kv' has an fp8 KV cache; kv_cache_dtype must be None or 'fp8'"),
            (_is_int(self.seed), "seed must be an int"),
        ])

    @property
    def batch_size(self) -> int:
        """Sequences per rollout batch: ``num_prompts * group_size``."""
        return self.num_prompts * self.group_size

    @property
    def effective_eps_high(self) -> float:
        """The upper clip range used: ``eps_high`` if set, else 0.28 with ``clip_higher``, else ``eps_low``."""
        if self.eps_high is not None:
            return float(self.eps_high)
        return CLIP_HIGHER_EPS if self.clip_higher else float(self.eps_low)

    @property
    def effective_kv_cache_dtype(self) -> str:
        """The rollout's KV-cache dtype name (one of :data:`KV_CACHE_DTYPES`)."""
        if self.kv_cache_dtype is not None:
            return self.kv_cache_dtype
        return {"fp32": "fp32", "bf16": "bf16", "fp8": "bf16", "fp8_kv": "fp8"}[self.rollout_precision]

    def loss_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`lpjax.agents.grpo.grpo_loss` for this config."""
        return dict(eps_low=float(self.eps_low), eps_high=self.effective_eps_high,
                    tis_cap=float(self.tis_cap) if self.tis else None, beta=float(self.beta))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
