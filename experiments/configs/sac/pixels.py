"""SAC from pixels, pure fp16 with all methods: paper appendix G and Table 9 (after DrQ).

84x84 RGB, frame stack 3, random shift (pad 4), 512 augmented + 512 original images for the critic, tau 0.01,
lr 1e-3, 1000 seed steps, actor update every 2 steps, log-sigma in [-10, 2] with 1e-4 added to sigma, weight
standardization and a cap at 10 before the encoder's LayerNorm, Kahan-momentum scale 1e2. Action repeat per
task (Table 8). Use ``--config.agent.policy=fp32 --config.agent.methods.hadam=False ...`` or ``pixels_fp32.py`` for
the reference.
"""

import dataclasses

from experiments.configs.sac import _base as base
from lpjax.methods import PrecisionMethods


def get_config():
    config = base.get_config()
    config.pixels = True
    config.seed_steps = 1000
    config.replay_capacity = 100_000
    config.agent.update(
        pixels=True,
        tau=0.01,
        actor_lr=1e-3,
        critic_lr=1e-3,
        alpha_lr=1e-3,
        batch_size=512,
        actor_update_period=2,
        log_std_bounds=(-10.0, 2.0),
        sigma_eps=1e-4,
        policy="fp16",
        weight_standardization=True,
        encoder_clip=10.0,
    )
    config.agent.methods.update(dataclasses.asdict(PrecisionMethods.paper()))
    config.agent.methods.kahan_momentum_scale = 1e2
    return config
