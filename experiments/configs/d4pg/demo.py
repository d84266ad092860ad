"""A short in-process ActorQ run (no Ray): small networks, a few thousand steps; for notebooks and smoke tests."""

from experiments.configs.d4pg import _base as base


def get_config():
    config = base.get_config()
    config.update(backend="inprocess", total_env_steps=5000, min_replay_size=500, samples_per_insert=8.0)
    config.update(eval_every=2500, eval_episodes=2, pull_every=250, publish_every=20, log_every=20)
    config.agent.update(actor_hidden=(256, 256, 256), critic_hidden=(256, 256, 256), batch_size=64)
    return config
