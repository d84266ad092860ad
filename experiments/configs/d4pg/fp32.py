"""D4PG baseline: fp32 learner, fp32 broadcast and fp32 actors (the reference ActorQ compares against)."""

from experiments.configs.d4pg import _base as base


def get_config():
    config = base.get_config()
    config.actor_runtime = "fp32"
    return config
