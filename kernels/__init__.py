"""lpjax's Pallas kernels, each with a pure-``jnp`` reference (``impl="reference"``) that defines it.

They live in the repository's top-level ``kernels/`` folder and install as ``lpjax.kernels`` (a package-dir mapping
in ``setup.cfg``): ``from lpjax.kernels import fp16_matmul``.

* :func:`fp16_matmul`: ``act(x @ w + b)`` with fp16/bf16 operands, fp32 accumulation, fused bias and activation,
  and a custom VJP whose backward matmuls use the same kernel.
* :func:`fp8_blockwise_matmul`: W8A8 E4M3 GEMM with DeepSeek-V3 / DeepGEMM blockwise scales (128x128 weight
  blocks, 1x128 activation groups) and fp32 promotion of every 128-K slice; straight-through gradients.
* :func:`int8_matmul`: int8 x int8 -> int32 with per-token and per-channel scales in the epilogue (inference).

Each has two Pallas backends: Mosaic GPU (``wgmma``, the default on Hopper) and Triton (other GPUs, for as long as
jax ships it). On a CPU the Pallas kernels run only in interpret mode (tests); :func:`lower_for_cuda` lowers any of
them (or a model that calls them) for an abstract H100, L4 or A100 without a GPU, to check what a GPU would compile.
Conventions shared by all kernels, the backend choice included, are in :mod:`lpjax.kernels._common`.
"""

from lpjax.kernels._common import lower_for_cuda
from lpjax.kernels.fp8_blockwise_matmul import fp8_blockwise_matmul
from lpjax.kernels.fp16_matmul import fp16_matmul
from lpjax.kernels.int8_matmul import int8_matmul

__all__ = ["fp16_matmul", "fp8_blockwise_matmul", "int8_matmul", "lower_for_cuda"]
