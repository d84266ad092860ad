"""D4PG's hyper-parameters and its low-precision methods (a nested :class:`lpjax.methods.PrecisionMethods`), as one
frozen (hashable) config."""

from __future__ import annotations

import dataclasses

from lpjax.agents.training import OffPolicyConfig


@dataclasses.dataclass(frozen=True)
class D4PGConfig(OffPolicyConfig):
    """Hyper-parameters of :mod:`lpjax.agents.d4pg`. Defaults: ActorQ (Krishnan, Lam et al.) on Acme's D4PG.

    Learning: ``gamma`` and ``n_step`` (read by the actors' :class:`lpjax.nstep.NStepAccumulator`, which folds
    them into each transition's ``reward`` and ``discount``; the learner itself never uses them), ``actor_lr``,
    ``critic_lr`` and Adam's ``b1``/``b2``/``adam_eps``; ``batch_size``.

    Targets: every ``target_update_period`` gradient steps, ``t <- t + tau (p - t)`` for the target actor and
    critic. The default is Polyak averaging every step with ``tau = 0.005`` (as lpjax's SAC, so Kahan-momentum
    applies); ``tau = 1.0, target_update_period = 100`` gives Acme's D4PG, a hard copy every 100 steps.

    Networks: ``actor_hidden`` (ActorQ: 3 x 2048) and ``critic_hidden`` (3 x 512) MLP widths; the critic's
    categorical distribution has ``num_atoms`` atoms evenly spaced on ``[v_min, v_max]`` (51 on [-150, 150], Acme's
    D4PG defaults for the control suite: with rewards in [0, 1] and gamma 0.99, discounted returns lie in [0, 100]).

    Precision: ``policy`` (a name or spec for :func:`lpjax.precision.get_policy`), ``matmul_impl`` (see
    :class:`lpjax.nn.Dense`) and ``methods``, a :class:`lpjax.methods.PrecisionMethods`. D4PG reads the
    optimizer's methods (``hadam``, ``loss_scaling``, ``kahan_gradients``, ``moment_dtype``) and the targets'
    (``kahan_momentum``); its deterministic actor has no log-density, so ``softplus_fix`` and ``normal_fix`` have
    no effect. An fp16 D4PG learner with lpjax's numerics is ``D4PGConfig(policy="fp16",
    methods=PrecisionMethods(hadam=True, loss_scaling=True, kahan_gradients=True, kahan_momentum=True))``.
    """

    n_step: int = 5
    target_update_period: int = 1
    batch_size: int = 256
    actor_hidden: tuple[int, ...] = (2048, 2048, 2048)
    critic_hidden: tuple[int, ...] = (512, 512, 512)
    num_atoms: int = 51
    v_min: float = -150.0
    v_max: float = 150.0

    def __post_init__(self):
        object.__setattr__(self, "actor_hidden", tuple(int(w) for w in self.actor_hidden))
        object.__setattr__(self, "critic_hidden", tuple(int(w) for w in self.critic_hidden))
        self.validate(
            [
                (0.0 < self.gamma <= 1.0, "gamma must be in (0, 1]"),
                (self.n_step >= 1, "n_step must be >= 1"),
                (min(self.actor_lr, self.critic_lr) > 0, "learning rates must be > 0"),
                (self.batch_size >= 1, "batch_size must be >= 1"),
                (
                    all(len(h) >= 1 and min(h) >= 1 for h in (self.actor_hidden, self.critic_hidden)),
                    "actor_hidden and critic_hidden must be positive widths",
                ),
                (self.num_atoms >= 2, "num_atoms must be >= 2"),
                (self.v_min < self.v_max, "v_min must be < v_max"),
            ]
        )
