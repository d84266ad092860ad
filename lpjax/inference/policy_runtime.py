"""The actor's policy runtime by name: ``"int8"`` (:class:`lpjax.inference.Int8MLP`, ONNX Runtime) or ``"fp32"``
(:class:`lpjax.inference.Fp32MLP`, JAX)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lpjax.inference import ort_int8
from lpjax.inference.fp32_mlp import Fp32MLP
from lpjax.inference.int8_mlp import Int8MLP

RUNTIMES = ("int8", "fp32")
"""Valid ``kind`` values of :func:`make_policy_runtime`."""


def check_runtime(kind: str) -> str:
    """``kind`` if it names a runtime whose packages are installed.

    Raises ``ValueError`` for a name not in :data:`RUNTIMES` and a one-line ``ImportError`` with the install command
    for a missing package (``"int8"`` needs onnxruntime and onnx; ``"fp32"`` only jax). Imports nothing.
    """
    if kind not in RUNTIMES:
        raise ValueError(f"runtime must be one of {RUNTIMES}, got {kind!r}.")
    if kind == "int8":
        ort_int8.check_installed()
    return kind


def make_policy_runtime(
    params: Mapping[str, Any], kind: str = "int8", output_activation: str = "tanh", **kwargs: Any
) -> Int8MLP | Fp32MLP:
    """The actor's policy runtime by name: ``"int8"`` -> :meth:`Int8MLP.from_params`, ``"fp32"`` ->
    :meth:`Fp32MLP.from_params`. Extra keyword arguments (``threads``, ``gemm``) go to :class:`Int8MLP`.

    Both return a callable ``obs (D,) or (B, D) -> float32 actions``. Errors as :func:`check_runtime`.
    """
    if check_runtime(kind) == "int8":
        return Int8MLP.from_params(params, output_activation, **kwargs)
    if kwargs:
        raise ValueError(f"kind='fp32' takes no extra options, got {sorted(kwargs)}.")
    return Fp32MLP.from_params(params, output_activation)
