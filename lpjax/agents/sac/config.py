"""SAC's hyper-parameters and its low-precision methods (a nested :class:`lpjax.methods.PrecisionMethods`), as one
frozen (hashable) config."""

from __future__ import annotations

import dataclasses

from lpjax.agents.training import OffPolicyConfig


@dataclasses.dataclass(frozen=True)
class SACConfig(OffPolicyConfig):
    """Hyper-parameters of :mod:`lpjax.agents.sac`. Defaults: Björck et al. (2021), Tables 4 and 5 (states).

    Learning: ``gamma``, ``tau`` (target Polyak step), learning rates and Adam's ``b1``/``b2``/``adam_eps`` for
    actor and critic; the temperature uses Adam with the same betas and ``alpha_lr``; ``init_temperature``;
    ``target_entropy`` (``None``: ``-action_dim``); ``batch_size``; ``target_update_period`` and
    ``actor_update_period`` in gradient steps.

    Networks: ``hidden_dims`` of actor and critic MLPs, ``log_std_bounds``, ``sigma_eps`` (added to sigma; the
    paper uses 1e-4 from pixels), ``pixels`` (a :class:`lpjax.nn.PixelEncoder` owned by the critic; the actor
    sees its features without gradient), ``encoder_features``, ``augmentation_pad`` (random shift of pixels),
    ``rematerialize`` (the losses' differentiated forward passes run under ``jax.checkpoint``: the backward pass
    recomputes the networks' activations from their inputs instead of holding them, one more forward pass per
    gradient for the memory of the saved activations; the same values).

    Precision: ``policy`` (a name or spec for :func:`lpjax.precision.get_policy`), ``matmul_impl`` (the MLPs'
    matmul implementation, see :class:`lpjax.nn.Dense`: ``"xla"`` by default, ``"pallas"`` or ``"reference"`` to
    use lpjax's kernels, e.g. with the ``"fp8"`` policy) and ``methods``, a :class:`lpjax.methods.PrecisionMethods`
    whose switches make every ablation row of the paper a config: the optimizer's (``hadam``, ``loss_scaling``,
    ``kahan_gradients``, ``moment_dtype``), the targets' (``kahan_momentum``) and the policy distribution's
    (``softplus_fix``, ``normal_fix``, read by :func:`lpjax.agents.sac.sample_and_log_prob`). The pixel encoder's
    options are fields of this config: ``weight_standardization`` and ``encoder_clip``. The paper's fp16 agent is
    ``SACConfig(policy="fp16", methods=PrecisionMethods.paper())``.
    """

    alpha_lr: float = 1e-4
    init_temperature: float = 0.1
    target_entropy: float | None = None
    batch_size: int = 1024
    target_update_period: int = 2
    actor_update_period: int = 1
    hidden_dims: tuple[int, ...] = (1024, 1024)
    log_std_bounds: tuple[float, float] = (-5.0, 2.0)
    sigma_eps: float = 0.0
    pixels: bool = False
    encoder_features: int = 50
    augmentation_pad: int = 4
    weight_standardization: bool = False
    encoder_clip: float | None = None
    rematerialize: bool = False

    def __post_init__(self):
        object.__setattr__(self, "hidden_dims", tuple(int(w) for w in self.hidden_dims))
        object.__setattr__(self, "log_std_bounds", tuple(float(b) for b in self.log_std_bounds))
        self.validate(
            [
                (0.0 < self.gamma <= 1.0, "gamma must be in (0, 1]"),
                (min(self.actor_lr, self.critic_lr, self.alpha_lr) > 0, "learning rates must be > 0"),
                (self.init_temperature > 0, "init_temperature must be > 0"),
                (self.batch_size >= 1, "batch_size must be >= 1"),
                (self.actor_update_period >= 1, "actor_update_period must be >= 1"),
                (len(self.hidden_dims) >= 1 and min(self.hidden_dims) >= 1, "hidden_dims must be positive widths"),
                (
                    len(self.log_std_bounds) == 2 and self.log_std_bounds[0] < self.log_std_bounds[1],
                    "log_std_bounds must be (lo, hi) with lo < hi",
                ),
                (self.sigma_eps >= 0, "sigma_eps must be >= 0"),
                (self.augmentation_pad >= 0, "augmentation_pad must be >= 0"),
            ]
        )
