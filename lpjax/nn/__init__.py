"""Flax modules whose dtypes follow a :class:`lpjax.precision.Policy`: MLP, SAC heads, pixel encoder."""

from lpjax.nn.encoder import PixelEncoder, StandardizedDense
from lpjax.nn.heads import DoubleCritic, TanhGaussianActor
from lpjax.nn.mlp import MLP

__all__ = ["MLP", "DoubleCritic", "PixelEncoder", "StandardizedDense", "TanhGaussianActor"]
