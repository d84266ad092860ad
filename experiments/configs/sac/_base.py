"""Shared defaults of the SAC configs: paper Table 4/5 hyper-parameters (states), no low-precision methods.

Every other config starts from :func:`get_config` and changes only what differs. ``config.agent`` holds the
fields of :class:`lpjax.agents.sac.SACConfig`, its methods nested in ``config.agent.methods`` (the fields of
:class:`lpjax.methods.PrecisionMethods`: ``--config.agent.methods.hadam=True``); the rest drives the training loop.
"""

import dataclasses

import ml_collections
from ml_collections import config_dict

from experiments.devices import mesh_config_fields
from lpjax.agents.sac import SACConfig


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.env = "dmc:cheetah-run"  # dmc:<domain>-<task> (host loop), mjx:<domain>-<task> or brax:<name> (jitted)
    config.seed = 0
    config.total_steps = 500_000  # agent steps (environment steps after action repeat)
    config.seed_steps = 5000  # uniformly random actions before learning starts
    config.updates_per_step = 1
    config.replay_capacity = 1_000_000
    config.pixels = False
    config.action_repeat = 0  # 0: the task's default (1 from states; paper Table 8 from pixels)
    config.frame_stack = 3
    config.eval_every = 10_000
    config.eval_episodes = 10
    config.log_every = 1000
    config.checkpoint_every = 50_000  # at the first episode end (dm_control) or chunk end (brax) after each multiple
    config.replay_dtype = config_dict.placeholder(str)  # None: float32; "fp16": floats stored in float16 (host loop)
    config.replay_shards = config_dict.placeholder(int)  # replay strata; None: the mesh's device count
    config.save_replay = True  # checkpoints hold the replay buffer, so a resumed run is bit-identical
    config.brax_backend = "spring"
    config.brax_num_envs = 1
    mesh_config_fields(config)  # config.mesh.data/fsdp, config.distributed (experiments.devices)
    config.agent = ml_collections.ConfigDict(dataclasses.asdict(SACConfig()))
    # None, typed: config_flags refuses to override a None-valued field (--config.agent.methods.moment_dtype=bf16).
    config.agent.methods.moment_dtype = config_dict.placeholder(str)
    config.agent.target_entropy = config_dict.placeholder(float)
    config.agent.encoder_clip = config_dict.placeholder(float)
    return config
