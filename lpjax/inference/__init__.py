"""Actor-side policy runtimes for CPU inference: int8 on fbgemm (:class:`Int8MLP`) and a JAX fp32 baseline.

:func:`make_policy_runtime` picks one by name (``"int8"`` or ``"fp32"``) from an :class:`lpjax.nn.MLP` parameter
tree; both map NumPy observations ``(D,)`` / ``(B, D)`` to float32 actions. The int8 runtime uses lpjax's own
int8 weights (:func:`lpjax.quant.quantize_int8_weight`) and PyTorch's quantized ops, imported only when an
:class:`Int8MLP` is built, so ``import lpjax.inference`` does not import torch. This package imports nothing from
lpjax but :mod:`lpjax.quant`.
"""

from lpjax.inference.int8_mlp import (
    FBGEMM_SMALL_SCALE,
    OUTPUT_ACTIVATIONS,
    REDUCE_RANGE_CHOICES,
    RUNTIMES,
    Fp32MLP,
    Int8MLP,
    fbgemm_linear_reference,
    fbgemm_saturates,
    make_policy_runtime,
    mlp_layers,
)

__all__ = [
    "FBGEMM_SMALL_SCALE",
    "OUTPUT_ACTIVATIONS",
    "REDUCE_RANGE_CHOICES",
    "RUNTIMES",
    "Fp32MLP",
    "Int8MLP",
    "fbgemm_linear_reference",
    "fbgemm_saturates",
    "make_policy_runtime",
    "mlp_layers",
]
