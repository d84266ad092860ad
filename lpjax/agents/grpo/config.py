"""GRPO's hyper-parameters (:class:`GRPOConfig`) and the rollout engine's precision (:class:`RolloutConfig`).

Two engines run the same parameters (FP8-RL): the *training* engine computes ``logp_old`` and ``logp_new`` and
the gradient in the precision ``GRPOConfig.policy``; the *rollout* engine samples completions in the precision of
``GRPOConfig.rollout``: its matmul policy and the dtype of its KV cache. The named rollout precisions are the
presets of :data:`ROLLOUT_PRESETS`:

==========  =================================================================  ==============  ========
preset      GEMMs (``RolloutConfig.policy``)                                   policy          KV cache
==========  =================================================================  ==============  ========
``fp32``    float32                                                            ``fp32``        fp32
``bf16``    bf16 activations and GEMMs, float32 weights                        ``mixed_bf16``  bf16
``fp8``     blockwise W8A8 E4M3 GEMMs, bf16 activations, float32 weights       ``fp8``         bf16
``fp8_kv``  float32 (only the KV cache is fp8)                                 ``fp32``        fp8
==========  =================================================================  ==============  ========

Any other pair is a :class:`RolloutConfig` of its own, e.g. FP8-RL's full fp8 rollout
``RolloutConfig(policy="fp8", kv_cache_dtype="fp8")`` or a float16 one ``RolloutConfig("fp16", "fp16")``.
Embeddings, norms, the attention core and the lm_head of :class:`lpjax.nn.TransformerLM` are float32 in every
policy. An fp8 KV cache stores E4M3 codes with per-layer, per-head scales recalibrated at every weight sync.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from lpjax.agents.grpo.algorithm import CLIP_HIGHER_EPS, LOSS_NORMALIZATIONS, ROLLOUT_CORRECTIONS
from lpjax.agents.training import LearnerConfig
from lpjax.nn.transformer import kv_cache_dtype_of
from lpjax.precision import Policy, get_policy


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """The rollout engine's precision (frozen, hashable); see the module docstring for the presets.

    Attributes:
      policy: the precision policy of the rollout model's dense layers, a name or spec for
        :func:`lpjax.precision.get_policy` (``"fp32"``, ``"mixed_bf16"``, ``"fp8"``, ``"fp16"``, ...).
      kv_cache_dtype: the KV cache's storage, a name of :data:`lpjax.precision.DTYPE_NAMES` for one of
        :data:`lpjax.nn.transformer.KV_CACHE_DTYPES` (``"fp32"``, ``"bf16"``, ``"fp16"``, ``"fp8"``, ...), stored as
        that dtype's canonical name (``"bfloat16"``, ``"float8_e4m3fn"``, ...).
    """

    policy: str = "mixed_bf16"
    kv_cache_dtype: str = "bf16"

    def __post_init__(self):
        try:
            self.precision  # noqa: B018 -- parses the policy once
            object.__setattr__(self, "kv_cache_dtype", kv_cache_dtype_of(self.kv_cache_dtype).name)
        except (TypeError, ValueError) as error:
            raise ValueError(f"RolloutConfig: {error}") from error

    @functools.cached_property
    def precision(self) -> Policy:
        """The :class:`lpjax.precision.Policy` of the rollout model, parsed once."""
        return get_policy(self.policy)

    @classmethod
    def preset(cls, name: str, **changes: Any) -> RolloutConfig:
        """The preset ``name`` of :data:`ROLLOUT_PRESETS` (with ``changes``); ``ValueError`` names the presets."""
        if name not in ROLLOUT_PRESETS:
            raise ValueError(f"Unknown rollout preset {name!r}; presets: {', '.join(ROLLOUT_PRESETS)}.")
        return dataclasses.replace(ROLLOUT_PRESETS[name], **changes)

    @classmethod
    def from_value(cls, value: RolloutConfig | Mapping[str, Any] | str) -> RolloutConfig:
        """A :class:`RolloutConfig` from an instance (returned as is), a preset name, or a mapping of its fields
        (a dict or ``ml_collections.ConfigDict``; unknown keys raise ``ValueError``)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls.preset(value)
        values = dict(value)
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"Unknown rollout config keys {unknown}; valid keys: {', '.join(known)}.")
        return cls(**values)


ROLLOUT_PRESETS: dict[str, RolloutConfig] = {
    "fp32": RolloutConfig("fp32", "fp32"),
    "bf16": RolloutConfig("mixed_bf16", "bf16"),
    "fp8": RolloutConfig("fp8", "bf16"),
    "fp8_kv": RolloutConfig("fp32", "fp8"),
}
"""The named rollout precisions (see the module docstring's table)."""


@dataclasses.dataclass(frozen=True)
class GRPOConfig(LearnerConfig):
    """Hyper-parameters of GRPO with FP8-RL's rollout precision and a rollout-mismatch correction (token-level TIS
    by default) (:mod:`lpjax.agents.grpo`).

    Batch: each iteration samples ``group_size`` (G) responses of at most ``max_new_tokens`` tokens to each of
    ``num_prompts`` prompts (``batch_size = num_prompts * group_size`` sequences), at ``temperature`` with
    nucleus ``top_p``; advantages are normalised within each group.

    Updates (:func:`lpjax.agents.grpo.train_step`): ``ppo_epochs`` passes over the batch, each shuffled into
    ``num_minibatches`` minibatches of ``batch_size / num_minibatches`` sequences, one gradient step per
    minibatch. The default, 1 x 1, is one on-policy update per rollout (FP8-RL).

    Loss (:func:`lpjax.agents.grpo.grpo_loss`, arguments from :meth:`loss_kwargs`): PPO clip range
    ``[1 - eps_low, 1 + eps_high]``; ``eps_high=None`` means ``eps_low``, or DAPO's 0.28 with
    ``clip_higher=True`` (see :attr:`effective_eps_high`); ``beta`` is the k3 KL coefficient to the reference
    policy (0: no reference model is needed).

    Rollout correction (the per-token weight of the objective, :data:`lpjax.agents.grpo.algorithm.ROLLOUT_CORRECTIONS`):
    ``rollout_correction`` is ``"tis"`` (token-level truncated importance sampling with cap ``tis_cap``, FP8-RL's
    C = 2), ``"none"``, ``"mis"`` (sequence-level masked importance sampling: sequences whose ratio exceeds
    ``mis_cap`` are dropped) or ``"geo_reject"`` (sequences whose geometric-mean ratio leaves
    ``[1 / geo_threshold, geo_threshold]``, or with a token ratio below ``geo_veto``, are dropped). Each threshold
    is checked only when its correction is chosen. ``loss_normalization`` (:data:`LOSS_NORMALIZATIONS`) is what the
    token mean counts: ``"all_tokens"`` (every response token, a rejected one with weight 0) or ``"kept_tokens"``
    (verl's: the tokens the correction keeps).

    Optimizer (:func:`lpjax.agents.training.network_optimizer`): Adam (``b1``, ``b2``, ``adam_eps``) with the
    ``methods`` (hAdam, loss scaling, Kahan gradients, ...), AdamW's decoupled ``weight_decay`` and global-norm
    clipping at ``max_grad_norm`` (``None``: none), at ``learning_rate``.

    Precision: ``policy`` is the training model's (a name or spec for :func:`lpjax.precision.get_policy`: an
    fp16 trainer is ``policy="fp16"`` with ``methods=PrecisionMethods(hadam=True, loss_scaling=True,
    kahan_gradients=True)``); ``rollout`` the rollout engine's (:class:`RolloutConfig`; a mapping of its fields
    or a preset name of :data:`ROLLOUT_PRESETS` is converted). Log-probabilities are float32 in both engines.
    """

    group_size: int = 8
    num_prompts: int = 8
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    eps_low: float = 0.2
    eps_high: float | None = None
    clip_higher: bool = False
    tis_cap: float = 2.0
    rollout_correction: str = "tis"
    mis_cap: float = 2.0
    geo_threshold: float = 1.5
    geo_veto: float = 1e-4
    loss_normalization: str = "all_tokens"
    beta: float = 0.0
    ppo_epochs: int = 1
    num_minibatches: int = 1
    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0
    rollout: RolloutConfig = RolloutConfig()
    fused_optimizer: bool = False  # a language model's few large leaves gain nothing from one more copy of them

    def __post_init__(self):
        object.__setattr__(self, "rollout", RolloutConfig.from_value(self.rollout))
        correction = self.rollout_correction
        self.validate(
            [
                (
                    _is_int(self.group_size) and self.group_size >= 2,
                    "group_size must be an int >= 2 (advantages are relative within a group)",
                ),
                (_is_int(self.num_prompts) and self.num_prompts >= 1, "num_prompts must be an int >= 1"),
                (_is_int(self.max_new_tokens) and self.max_new_tokens >= 1, "max_new_tokens must be an int >= 1"),
                (self.temperature > 0, "temperature must be > 0"),
                (0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]"),
                (0.0 < self.eps_low < 1.0, "eps_low must be in (0, 1)"),
                (self.eps_high is None or self.eps_high > 0, "eps_high must be > 0 (or None)"),
                (
                    not self.clip_higher or self.eps_high is None or self.eps_high > self.eps_low,
                    "clip_higher needs eps_high > eps_low (or eps_high=None for DAPO's 0.28)",
                ),
                (
                    correction in ROLLOUT_CORRECTIONS,
                    f"rollout_correction must be one of {', '.join(ROLLOUT_CORRECTIONS)}, got {correction!r}",
                ),
                (correction != "tis" or self.tis_cap > 0, "tis_cap must be > 0"),
                (correction != "mis" or self.mis_cap > 0, "mis_cap must be > 0"),
                (correction != "geo_reject" or self.geo_threshold > 1, "geo_threshold must be > 1"),
                (correction != "geo_reject" or 0 <= self.geo_veto < 1, "geo_veto must be in [0, 1) (0: no veto)"),
                (
                    self.loss_normalization in LOSS_NORMALIZATIONS,
                    f"loss_normalization must be one of {', '.join(LOSS_NORMALIZATIONS)}, "
                    f"got {self.loss_normalization!r}",
                ),
                (self.beta >= 0, "beta must be >= 0"),
                (_is_int(self.ppo_epochs) and self.ppo_epochs >= 1, "ppo_epochs must be an int >= 1"),
                (
                    _is_int(self.num_minibatches)
                    and self.num_minibatches >= 1
                    and (self.batch_size % self.num_minibatches == 0),
                    "num_minibatches must be an int >= 1 dividing num_prompts * group_size",
                ),
                (self.learning_rate > 0, "learning_rate must be > 0"),
                (self.weight_decay >= 0, "weight_decay must be >= 0"),
                (self.max_grad_norm is None or self.max_grad_norm > 0, "max_grad_norm must be > 0 (or None)"),
            ]
        )

    @property
    def batch_size(self) -> int:
        """Sequences per rollout batch: ``num_prompts * group_size``."""
        return self.num_prompts * self.group_size

    @property
    def minibatch_size(self) -> int:
        """Sequences per gradient step: ``batch_size // num_minibatches``."""
        return self.batch_size // self.num_minibatches

    @property
    def effective_eps_high(self) -> float:
        """The upper clip range used: ``eps_high`` if set, else 0.28 with ``clip_higher``, else ``eps_low``."""
        if self.eps_high is not None:
            return float(self.eps_high)
        return CLIP_HIGHER_EPS if self.clip_higher else float(self.eps_low)

    def loss_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`lpjax.agents.grpo.grpo_loss` for this config: the clip range, the correction
        with its own thresholds, ``beta`` and the loss normalization."""
        thresholds = {
            "none": {},
            "tis": dict(tis_cap=float(self.tis_cap)),
            "mis": dict(mis_cap=float(self.mis_cap)),
            "geo_reject": dict(geo_threshold=float(self.geo_threshold), geo_veto=float(self.geo_veto)),
        }[self.rollout_correction]
        return dict(
            eps_low=float(self.eps_low),
            eps_high=self.effective_eps_high,
            correction=self.rollout_correction,
            **thresholds,
            beta=float(self.beta),
            loss_normalization=self.loss_normalization,
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
