"""ActorQ: an fp32 D4PG learner; actors run an int8 copy of the policy (per-channel int8 weights broadcast 4x
smaller than fp32, int8 matmuls on ONNX Runtime's int8 GEMMs)."""

from experiments.configs.d4pg import _base as base


def get_config():
    return base.get_config()
