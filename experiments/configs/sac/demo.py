"""The README's main job (``make demo``): a short but real fp16 SAC run on dm_control, all methods on.

walker-walk from states, networks 256x256, batch 256, 30k agent steps with 2k random seed steps, evaluated
every 10k steps on 5 episodes: about 5 minutes on 2 CPU cores. It learns to stand and start walking, not the
paper's 1M-step result (see benchmarks/sac_reproduction.py).
"""

from experiments.configs.sac import _base as base


def get_config():
    config = base.get_config()
    config.env = "dmc:walker-walk"
    config.total_steps = 30_000
    config.seed_steps = 2000
    config.replay_capacity = 30_000
    config.eval_every = 10_000
    config.eval_episodes = 5
    config.checkpoint_every = 10_000
    config.agent.update(policy="fp16", hidden_dims=(256, 256), batch_size=256, **base.ALL_METHODS)
    return config
