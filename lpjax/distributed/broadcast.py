"""The parameter quantizer of ActorQ: the learner packs its policy (int8 or fp32) and actors rebuild it.

* :func:`encode_policy` (learner): the actor network's MLP weights -> bytes with
  :func:`lpjax.quant.pack_params`; ``"int8"`` stores per-output-channel symmetric int8 codes plus float32
  scales (biases stay float32), about 4x fewer bytes than ``"fp32"``.
* :func:`decode_policy` (actor, "deserialize"): bytes -> the int8 codes and scales (or floats), no dequantization.
* :func:`build_policy` (actor, "load"): -> a callable ``obs -> action``: :class:`lpjax.inference.Int8MLP` (ONNX
  Runtime int8 matmuls on the actor's CPU) or :class:`lpjax.inference.Fp32MLP`, with the deterministic actor's
  ``tanh``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from lpjax.inference import RUNTIMES, Fp32MLP, Int8MLP
from lpjax.quant import Int8Weight, pack_params, unpack_params


def policy_mlp_params(actor_params: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``{"Dense_0": ..., "Dense_1": ...}`` subtree of an actor's Flax variables (the one MLP in it)."""
    node = actor_params
    while isinstance(node, Mapping) and "Dense_0" not in node:
        children = [v for v in node.values() if isinstance(v, Mapping)]
        if len(children) != 1:
            raise ValueError(
                "Expected the actor's parameters to hold exactly one MLP (layers Dense_0, Dense_1, ...), "
                f"found entries {sorted(node)}."
            )
        node = children[0]
    if not isinstance(node, Mapping):
        raise ValueError("No MLP (Dense_0, Dense_1, ...) found in the actor's parameters.")
    return node


def _check_scheme(runtime: str) -> str:
    # The learner packs without running the policy, so only the name is checked (not the runtime's packages).
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}.")
    return runtime


def encode_policy(actor_params: Mapping[str, Any], runtime: str) -> bytes:
    """Packs the actor's MLP for broadcast: ``runtime`` ``"int8"`` or ``"fp32"`` is the packing scheme."""
    mlp = policy_mlp_params(actor_params)
    return pack_params({name: dict(layer) for name, layer in mlp.items()}, _check_scheme(runtime))


def decode_policy(blob: bytes) -> tuple[dict, dict]:
    """Unpacks a broadcast without dequantizing: ``(layers tree, info)`` (see :func:`lpjax.quant.unpack_params`)."""
    return unpack_params(blob)


def build_policy(decoded: tuple[dict, dict], runtime: str) -> Callable[[np.ndarray], np.ndarray]:
    """The actor's inference runtime for a decoded broadcast; ``runtime`` must match the broadcast's scheme.

    ``"int8"`` raises a one-line ``ImportError`` with the install command if onnxruntime or onnx is missing.
    """
    tree, info = decoded
    if info["scheme"] != _check_scheme(runtime):
        raise ValueError(f"The broadcast is packed as {info['scheme']!r} but this actor runs {runtime!r}.")
    names = sorted(tree, key=lambda name: int(name.removeprefix("Dense_")))
    if runtime == "int8":
        layers = []
        for name in names:
            weight = tree[name]["kernel"]
            if not isinstance(weight, Int8Weight):
                raise ValueError(f"{name}/kernel of an int8 broadcast is not int8 codes and scales.")
            layers.append((weight.codes.reshape(-1, weight.scales.shape[0]), weight.scales, tree[name].get("bias")))
        return Int8MLP.from_quantized(layers, "tanh")
    return Fp32MLP([(tree[name]["kernel"], tree[name].get("bias")) for name in names], "tanh")
