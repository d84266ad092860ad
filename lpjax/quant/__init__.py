"""Quantizers for low-precision inference and training: blockwise FP8 (E4M3), symmetric int8, the QuaRL/ActorQ
uniform PTQ and QAT, and packed parameters for broadcast.

:mod:`lpjax.quant.fp8` implements the DeepSeek-V3 / DeepGEMM "W8A8" blockwise scheme (128x128 weight blocks,
dynamic per-token 1x128 activation groups); :mod:`lpjax.quant.int8` implements symmetric absmax int8 with
per-tensor, per-channel and per-token scales; :mod:`lpjax.quant.uniform` the papers' post-training quantization
``delta = (|min(W, 0)| + |max(W, 0)|) / 2^n``, ``Q(W) = round(W / delta)`` for 2 to 16 bits, of single arrays and
whole parameter trees (fp32 / fp16 / int<n>, per tensor or per channel); :mod:`lpjax.quant.qat` its fake
quantization with a straight-through gradient and a quantization delay; :mod:`lpjax.quant.packing` the
self-describing fp32 / fp16 / int8 serialization of parameter trees for the learner-to-actor broadcast. Every
array function is pure and ``jax.jit``-compatible, and this package imports nothing else from lpjax.
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
from lpjax.quant.packing import pack_params, packed_nbytes, unpack_params
from lpjax.quant.qat import fake_quantize, fake_quantize_params
from lpjax.quant.uniform import (
    HalfPrecision,
    QuantSpec,
    UniformQuantized,
    code_dtype,
    dequantize_params,
    parse_spec,
    quantize_params,
    uniform_dequantize,
    uniform_quantize,
)

__all__ = [
    "E4M3_MAX",
    "INT8_MAX",
    "Fp8BlockwiseWeight",
    "HalfPrecision",
    "Int8Weight",
    "QuantSpec",
    "UniformQuantized",
    "code_dtype",
    "dequantize_fp8_blockwise",
    "dequantize_fp8_per_token_group",
    "dequantize_int8",
    "dequantize_params",
    "fake_quantize",
    "fake_quantize_params",
    "pack_params",
    "packed_nbytes",
    "parse_spec",
    "quantize_fp8_blockwise",
    "quantize_fp8_per_token_group",
    "quantize_int8",
    "quantize_int8_per_token",
    "quantize_int8_weight",
    "quantize_params",
    "uniform_dequantize",
    "uniform_quantize",
    "unpack_params",
]
