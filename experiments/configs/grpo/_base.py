"""Shared defaults of the GRPO configs: a small transformer warm-started on 2-digit addition, then GRPO.

``config.agent`` holds the fields of :class:`lpjax.agents.grpo.GRPOConfig` (``max_new_tokens`` is set from the
task), with ``agent.methods`` (:class:`lpjax.methods.PrecisionMethods`) and ``agent.rollout``
(:class:`lpjax.agents.grpo.RolloutConfig`: the rollout's matmul policy and KV-cache dtype) nested; the rest
chooses the task, the model and the loop. The default trains and rolls out in float32.
"""

import dataclasses

import ml_collections

from experiments.devices import mesh_config_fields
from lpjax.agents.grpo import GRPOConfig, RolloutConfig


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.env = "task:addition"  # task:<addition|copy|sort>
    config.num_digits = 2
    config.seed = 0
    config.iterations = 800  # GRPO iterations (rollout -> update -> sync)
    config.warm_start_steps = 1000
    config.warm_start_target = 0.3  # stop the supervised warm start at this accuracy (RL has room to improve)
    config.model = ml_collections.ConfigDict(dict(num_layers=2, num_heads=4, d_model=64, d_ff=256))
    config.eval_every = 100
    config.eval_prompts = 512
    config.log_every = 10
    config.checkpoint_every = 200
    mesh_config_fields(config)  # config.mesh.data/fsdp, config.distributed (experiments.devices)
    agent = dataclasses.asdict(GRPOConfig(learning_rate=3e-4, rollout=RolloutConfig.preset("fp32")))
    config.agent = ml_collections.ConfigDict(agent)
    return config
