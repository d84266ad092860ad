"""SAC from states, pure fp16 with stochastic rounding instead of the Kahan buffers.

The paper's agent (``fp16.py``) with Kahan-gradients and Kahan-momentum replaced by stochastically rounded
parameter and target updates (:func:`lpjax.optim.stochastic_rounding`): hAdam, compound loss scaling,
softplus-fix and normal-fix stay on. The training state holds no float32 compensation buffers, and the replay
buffer stores its floats in float16 (the networks cast their inputs to float16 first, so the learner computes
the same values, in half the replay memory).
"""

from experiments.configs.sac import fp16


def get_config():
    config = fp16.get_config()
    config.agent.methods.kahan_gradients = False
    config.agent.methods.kahan_momentum = False
    config.agent.methods.stochastic_rounding = True
    config.replay_dtype = "fp16"  # the networks read float16 observations: store them so
    return config
