"""ActorQ with a pure-fp16 D4PG learner using lpjax's numerics (hAdam, compound loss scaling, Kahan-gradients,
Kahan-momentum) and int8 actors."""

from experiments.configs.d4pg import _base as base


def get_config():
    config = base.get_config()
    config.agent.policy = "fp16"
    config.agent.methods.update(hadam=True, loss_scaling=True, kahan_gradients=True, kahan_momentum=True)
    return config
