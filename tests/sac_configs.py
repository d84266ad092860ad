"""Small SAC run configs shared by tests that train a real (tiny) run."""

from experiments.configs.sac import fp32


def tiny_cartpole(base=fp32, **overrides):
    """``base``'s config (a module of ``experiments/configs/sac``, default fp32) with 32x32 networks, batch 32,
    cartpole-swingup with 250-step episodes (action repeat 4), 300 agent steps of which ``seed_steps`` (default
    200) are random; one evaluation and one checkpoint, at the end."""
    config = base.get_config()
    config.unlock()
    config.update(
        env="dmc:cartpole-swingup",
        action_repeat=4,
        total_steps=300,
        seed_steps=200,
        replay_capacity=500,
        eval_every=300,
        eval_episodes=1,
        log_every=100,
        checkpoint_every=300,
    )
    config.update(overrides)
    config.agent.update(hidden_dims=(32, 32), batch_size=32)
    return config
