"""Soft Actor-Critic with the low-precision methods of Björck et al. (2021) as config switches.

state = lpjax.agents.sac.init(key, observation, action_dim, SACConfig(policy="fp16", ...))
state, metrics = lpjax.agents.sac.update(state, batch)      # jitted, state donated
actions = lpjax.agents.sac.act(state, observations, key, deterministic=True)
"""

from lpjax.agents.sac.config import SACConfig
from lpjax.agents.sac.learner import SACCritic, SACState, act, actor_update, critic_update, init, random_shift, update
from lpjax.agents.sac.squashed_gaussian import sample_and_log_prob

__all__ = [
    "SACConfig",
    "SACCritic",
    "SACState",
    "act",
    "actor_update",
    "critic_update",
    "init",
    "random_shift",
    "sample_and_log_prob",
    "update",
]
