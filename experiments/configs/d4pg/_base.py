"""Shared defaults of the D4PG / ActorQ configs: an fp32 learner, actors running an int8 copy of the policy.

``config.agent`` holds the fields of :class:`lpjax.agents.d4pg.D4PGConfig` (ActorQ's networks: actor 3x2048,
critic 3x512, 51 atoms, 5-step returns), its methods nested in ``config.agent.methods``
(``--config.agent.methods.hadam=True``); the rest drives the actor-learner (:mod:`lpjax.distributed`).
"""

import dataclasses

import ml_collections
from ml_collections import config_dict

from experiments.devices import mesh_config_fields
from lpjax.agents.d4pg import D4PGConfig


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.env = "dmc:cartpole-balance"  # dmc:<domain>-<task>
    config.seed = 0
    config.total_env_steps = 200_000  # environment steps inserted by all actors together
    config.num_actors = 2
    config.max_sigma = 0.2  # actor i explores with sigma spread uniformly over [0, max_sigma]
    config.actor_runtime = (
        "int8"  # "int8": int8 broadcast, int8 actors on ONNX Runtime; "fp32": float32 broadcast and actors
    )
    config.pull_every = 1000  # actor steps between two pulls of the policy (K)
    config.chunk_steps = 100  # environment steps per actor job (how often actors hand data to the learner)
    config.publish_every = 100  # learner updates between two publishes of the quantized policy
    config.samples_per_insert = 16.0
    config.min_replay_size = 1000  # transitions before the first update
    config.rate_error_buffer = 0.0  # tolerance of the samples-per-insert ratio, in samples; 0: automatic
    config.replay_capacity = 1_000_000
    config.backend = "ray"  # "ray" (actor processes) or "inprocess" (same interface, no Ray)
    config.ray_address = ""  # "": start a local Ray cluster; "host:port": join an existing one
    config.eval_every = 10_000  # environment steps between evaluations of the learner's fp32 policy
    config.eval_episodes = 5
    config.log_every = 100  # learner updates between two training-metric rows
    config.checkpoint_every = 50_000  # environment steps
    config.replay_shards = config_dict.placeholder(int)  # replay strata; None: the mesh's device count
    config.save_replay = True
    mesh_config_fields(config)  # config.mesh.data/fsdp, config.distributed (experiments.devices)
    config.agent = ml_collections.ConfigDict(dataclasses.asdict(D4PGConfig()))
    # None, typed: config_flags refuses to override a None-valued field (--config.agent.methods.moment_dtype=bf16).
    config.agent.methods.moment_dtype = config_dict.placeholder(str)
    return config
