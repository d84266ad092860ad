"""SAC from states with fp8 GEMMs: float32 parameters and optimizer, bfloat16 activations, and every MLP layer's
matmul as a blockwise W8A8 E4M3 GEMM (lpjax's ``"fp8"`` policy; DeepSeek-V3 128x128 weight blocks and 1x128
activation groups). Gradients flow straight through the quantizers. ``agent.matmul_impl="xla"`` runs the GEMM's
jnp reference through XLA (the CPU default); ``"pallas"`` uses the Triton kernel on a GPU."""

from experiments.configs.sac import _base as base


def get_config():
    config = base.get_config()
    config.agent.policy = "fp8"
    config.agent.methods.kahan_momentum = False
    return config
