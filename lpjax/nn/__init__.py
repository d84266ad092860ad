"""Flax modules whose dtypes follow a :class:`lpjax.precision.Policy`: Dense, MLP, SAC and D4PG heads, encoder."""

from lpjax.nn.dense import Dense, policy_dense
from lpjax.nn.encoder import PixelEncoder, StandardizedDense
from lpjax.nn.heads import (
    CategoricalCritic,
    DeterministicActor,
    DoubleCritic,
    TanhGaussianActor,
)
from lpjax.nn.mlp import MLP

__all__ = ["Dense", "MLP", "DoubleCritic", "PixelEncoder", "StandardizedDense", "TanhGaussianActor", "policy_dense",
           "DeterministicActor", "CategoricalCritic"]
