"""What every policy runtime checks: an :class:`lpjax.nn.MLP` parameter tree, its layer chain, the output
activation and the observations.

An MLP of ``L`` layers is ``h_0 = obs``, ``h_{i+1} = relu(h_i @ kernel_i + bias_i)`` for ``i < L - 1`` and
``mean = h_{L-1} @ kernel_{L-1} + bias_{L-1}``, followed by the output activation (``"none"`` or ``"tanh"``).
Layer ``i`` is named ``Dense_i`` and consecutive layers chain: ``kernel_i: (K_i, N_i)`` with ``N_i = K_{i+1}``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

OUTPUT_ACTIVATIONS = ("none", "tanh")
"""Valid ``output_activation`` values (the hidden activation is always relu)."""

_LAYER_NAME = re.compile(r"Dense_(\d+)")


def mlp_layers(params: Mapping[str, Any]) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """The ``(kernel (K, N), bias (N,) or None)`` NumPy arrays of an :class:`lpjax.nn.MLP` parameter tree, in order.

    Accepts ``{"Dense_0": {"kernel", "bias"}, "Dense_1": ..., ...}`` or Flax's ``{"params": {...}}`` wrapper (dicts
    or ``FrozenDict``). Layer ``i`` must be named ``Dense_i`` for ``i = 0 .. L-1`` and consecutive layers must
    chain (``N_i = K_{i+1}``). Raises ``ValueError`` naming the problem otherwise (``TypeError`` for a non-mapping).
    """
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping of Dense_i layers, got {type(params).__name__}.")
    if set(params) == {"params"}:
        params = params["params"]
        if not isinstance(params, Mapping):
            raise ValueError(f"params['params'] must be a mapping of Dense_i layers, got {type(params).__name__}.")
    if not params:
        raise ValueError("params has no layers; expected {'Dense_0': {'kernel', 'bias'}, ...}.")
    index = {}
    for name in params:
        match = _LAYER_NAME.fullmatch(str(name))
        if match is None:
            raise ValueError(f"Unexpected entry {name!r} in params: an MLP's layers are named Dense_0, Dense_1, ...")
        index[int(match.group(1))] = name
    if sorted(index) != list(range(len(index))):
        raise ValueError(f"Layers must be Dense_0 .. Dense_{len(index) - 1}, got {sorted(params)}.")
    layers = []
    for i in range(len(index)):
        layer = params[index[i]]
        if not isinstance(layer, Mapping) or "kernel" not in layer:
            raise ValueError(f"{index[i]} must be a mapping with a 'kernel' (and a 'bias'), got {layer!r:.80}.")
        extra = set(layer) - {"kernel", "bias"}
        if extra:
            raise ValueError(f"{index[i]} has unexpected entries {sorted(extra)}; expected 'kernel' and 'bias'.")
        kernel = np.asarray(layer["kernel"])
        bias = None if layer.get("bias") is None else np.asarray(layer["bias"])
        if kernel.ndim != 2 or not np.issubdtype(kernel.dtype, np.floating):
            raise ValueError(f"{index[i]}/kernel must be a floating (K, N) matrix, got {kernel.dtype} {kernel.shape}.")
        if bias is not None and (bias.shape != kernel.shape[1:] or not np.issubdtype(bias.dtype, np.floating)):
            raise ValueError(
                f"{index[i]}/bias must be floating with shape ({kernel.shape[1]},), got {bias.dtype} {bias.shape}."
            )
        layers.append((kernel, bias))
    check_chain([k.shape for k, _ in layers])
    return layers


def check_chain(shapes: Sequence[tuple[int, ...]]) -> None:
    """Raises ``ValueError`` unless each ``(K_i, N_i)`` feeds the next: ``N_i = K_{i+1}``."""
    for i, (a, b) in enumerate(itertools.pairwise(shapes)):
        if a[1] != b[0]:
            raise ValueError(
                f"Layer {i} outputs {a[1]} features but layer {i + 1} expects {b[0]} (shapes {tuple(a)} -> {tuple(b)})."
            )


def check_output_activation(output_activation: str) -> str:
    """``output_activation`` if it is one of :data:`OUTPUT_ACTIVATIONS`, else ``ValueError``."""
    if output_activation not in OUTPUT_ACTIVATIONS:
        raise ValueError(f"output_activation must be one of {OUTPUT_ACTIVATIONS}, got {output_activation!r}.")
    return output_activation


def obs_batch(obs: Any, in_dim: int) -> np.ndarray:
    """``obs`` ``(in_dim,)`` or ``(B, in_dim)`` (any real dtype) as a C-contiguous float32 ``(B, in_dim)`` array.

    A view of ``obs`` where no conversion is needed. Raises ``ValueError`` for any other shape.
    """
    x = np.asarray(obs, dtype=np.float32, order="C")
    if x.ndim not in (1, 2) or x.shape[-1] != in_dim:
        raise ValueError(f"obs must have shape ({in_dim},) or (B, {in_dim}), got {x.shape}.")
    return x.reshape(-1, in_dim)
