"""SAC from states with fp8 GEMMs on the hidden layers only: ``fp8.py`` with the first and last layer of every
MLP (the actor's and both critics') multiplying in bfloat16, as FP8 recipes keep the embedding and the output head
in high precision. With two hidden layers, the one hidden-to-hidden layer of each MLP is a blockwise W8A8 E4M3
GEMM; the layer that reads the observation (and action) and the layer that writes the Q-value or the action
distribution stay in bfloat16."""

from experiments.configs.sac import fp8


def get_config():
    config = fp8.get_config()
    config.agent.high_precision_ends = True
    return config
