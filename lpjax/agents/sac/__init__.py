"""Soft Actor-Critic with the low-precision methods of Björck et al. (2021) as config switches.

state = lpjax.agents.sac.init(key, observation, action_dim, SACConfig(policy="fp16", ...))
state, metrics = lpjax.agents.sac.update(state, batch)      # jitted, state donated
actions = lpjax.agents.sac.act(state, observations, key, deterministic=True)

The losses (``critic_loss``, ``actor_loss``, ``temperature_loss``) and the networks (``networks``) are public, for
code that studies them (``benchmarks/sac_memory.py`` counts what their backward passes hold).
"""

from lpjax.agents.sac.config import SACConfig
from lpjax.agents.sac.learner import (
    SACCritic,
    SACState,
    act,
    actor_loss,
    actor_update,
    critic_loss,
    critic_update,
    init,
    networks,
    random_shift,
    temperature_loss,
    update,
)
from lpjax.agents.sac.squashed_gaussian import sample_and_log_prob

__all__ = [
    "SACConfig",
    "SACCritic",
    "SACState",
    "act",
    "actor_loss",
    "actor_update",
    "critic_loss",
    "critic_update",
    "init",
    "networks",
    "random_shift",
    "temperature_loss",
    "sample_and_log_prob",
    "update",
]
