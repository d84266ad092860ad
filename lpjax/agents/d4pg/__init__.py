"""D4PG (distributional DDPG, ActorQ's learner) with the low-precision methods of Björck et al. (2021) as switches.

    state = lpjax.agents.d4pg.init(key, observation, action_dim, D4PGConfig(policy="fp16", ...))
    state, metrics = lpjax.agents.d4pg.update(state, batch)     # jitted, state donated
    actions = lpjax.agents.d4pg.act(state.actor.params, observations, key, sigma, state.config, state.action_dim)

Batches hold n-step transitions from :class:`lpjax.nstep.NStepAccumulator`.
"""

from lpjax.agents.d4pg.config import D4PGConfig
from lpjax.agents.d4pg.distributional import categorical_l2_project, expected_value
from lpjax.agents.d4pg.learner import (
    D4PGState,
    act,
    actor_network,
    atoms,
    critic_network,
    init,
    update,
)

__all__ = [
    "D4PGConfig",
    "D4PGState",
    "act",
    "actor_network",
    "atoms",
    "categorical_l2_project",
    "critic_network",
    "expected_value",
    "init",
    "update",
]
