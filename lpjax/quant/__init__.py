"""Quantizers for low-precision inference and training: blockwise FP8 (E4M3) and symmetric int8.

:mod:`lpjax.quant.fp8` implements the DeepSeek-V3 / DeepGEMM "W8A8" blockwise scheme (128x128 weight blocks,
dynamic per-token 1x128 activation groups); :mod:`lpjax.quant.int8` implements symmetric absmax int8 with
per-tensor, per-channel and per-token scales. Every function is pure and ``jax.jit``-compatible, and this
package imports nothing else from lpjax.
"""

from lpjax.quant.fp8 import (
    E4M3_MAX,
    Fp8BlockwiseWeight,
    dequantize_fp8_blockwise,
    dequantize_fp8_per_token_group,
    quantize_fp8_blockwise,
    quantize_fp8_per_token_group,
)
from lpjax.quant.int8 import (
    INT8_MAX,
    Int8Weight,
    dequantize_int8,
    quantize_int8,
    quantize_int8_per_token,
    quantize_int8_weight,
)

__all__ = [
    "E4M3_MAX",
    "INT8_MAX",
    "Fp8BlockwiseWeight",
    "Int8Weight",
    "dequantize_fp8_blockwise",
    "dequantize_fp8_per_token_group",
    "dequantize_int8",
    "quantize_fp8_blockwise",
    "quantize_fp8_per_token_group",
    "quantize_int8",
    "quantize_int8_per_token",
    "quantize_int8_weight",
]
