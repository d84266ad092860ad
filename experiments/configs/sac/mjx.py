"""SAC fp16 with all the paper's methods (as ``fp16.py``) on MJX cartpole-swingup, in the jitted loop.

``python -m experiments.sac --config=mjx``; another Playground DM Control Suite task with e.g.
``--config.env=mjx:walker-walk`` (:data:`lpjax.envs.MJX_TASKS`). One environment and one update per step, as the
dm_control host loop runs the paper's protocol, so learning curves over env steps compare with
``--config.env=dmc:cartpole-swingup``; ``--config.brax_num_envs=N`` steps N environments per iteration
(``updates_per_step`` counts updates per iteration, so it lowers the updates per env step N-fold).
"""

from experiments.configs.sac import fp16


def get_config():
    config = fp16.get_config()
    config.env = "mjx:cartpole-swingup"
    return config
