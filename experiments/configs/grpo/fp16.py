"""GRPO trained in pure float16 (fp16 dense layers) with hAdam, loss scaling and Kahan-compensated updates, and
float16 rollouts (fp16 GEMMs and KV cache), TIS on."""

from experiments.configs.grpo import _base as base


def get_config():
    config = base.get_config()
    config.agent.policy = "fp16"
    config.agent.methods.update(hadam=True, loss_scaling=True, kahan_gradients=True)
    config.agent.rollout.update(policy="fp16", kv_cache_dtype="fp16")
    return config
