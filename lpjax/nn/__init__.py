"""Flax modules whose dtypes follow a :class:`lpjax.precision.Policy`: Dense, MLP, SAC and D4PG heads, encoder."""

from lpjax.nn.causal_lm import CausalLM, recomputing_causal_lm, transformer_causal_lm
from lpjax.nn.dense import Dense, policy_dense
from lpjax.nn.encoder import PixelEncoder, StandardizedDense
from lpjax.nn.heads import (
    CategoricalCritic,
    DeterministicActor,
    DoubleCritic,
    TanhGaussianActor,
)
from lpjax.nn.mlp import MLP
from lpjax.nn.transformer import KVCache, KVScales, TransformerLM, calibrate_kv_scales

__all__ = [
    "Dense",
    "MLP",
    "DoubleCritic",
    "PixelEncoder",
    "StandardizedDense",
    "TanhGaussianActor",
    "policy_dense",
    "DeterministicActor",
    "CategoricalCritic",
    "TransformerLM",
    "KVCache",
    "KVScales",
    "calibrate_kv_scales",
    "CausalLM",
    "transformer_causal_lm",
    "recomputing_causal_lm",
]
