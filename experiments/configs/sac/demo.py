"""The README's main job (``make demo``, ``python -m experiments.demo``): fp16 SAC with all methods on a task
that visibly learns in a few minutes on a CPU.

cartpole-swingup from states with an action repeat of 8 (as in PlaNet and DrQ from pixels; each agent step is 8
physics steps, so an episode is 125 agent steps), networks 256x256, batch 256, 20k agent steps after 1k random
seed steps, evaluated every 2k steps on 5 episodes. ``experiments.demo`` trains it beside fp32 and naive fp16;
``python -m experiments.sac --config=demo.py`` trains the fp16 run alone.
"""

import dataclasses

from experiments.configs.sac import _base as base
from lpjax.methods import PrecisionMethods


def get_config():
    config = base.get_config()
    config.env = "dmc:cartpole-swingup"
    config.action_repeat = 8
    config.total_steps = 20_000
    config.seed_steps = 1000
    config.replay_capacity = 20_000
    config.eval_every = 2000
    config.eval_episodes = 5
    config.log_every = 500
    config.checkpoint_every = 5000
    config.agent.update(policy="fp16", hidden_dims=(256, 256), batch_size=256)
    config.agent.methods.update(dataclasses.asdict(PrecisionMethods.paper()))
    return config
