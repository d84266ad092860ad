"""Actor-side policy runtimes for CPU inference: int8 on ONNX Runtime (:class:`Int8MLP`) and a JAX fp32 baseline
(:class:`Fp32MLP`).

:func:`make_policy_runtime` picks one by name (``"int8"`` or ``"fp32"``) from an :class:`lpjax.nn.MLP` parameter
tree; both map NumPy observations ``(D,)`` / ``(B, D)`` to float32 actions. The int8 runtime multiplies by lpjax's
own int8 weights (:func:`lpjax.quant.quantize_int8_weight`) on ONNX Runtime's int8 GEMMs; onnxruntime and onnx
(``pip install 'lpjax[int8]'``) are imported only when an :class:`Int8MLP` is built, so ``import lpjax.inference``
imports neither; :func:`check_runtime` says whether a runtime's packages are installed without importing them.
Modules: :mod:`~lpjax.inference.mlp_params` (parameter trees and checks), :mod:`~lpjax.inference.ort_int8` (the
ONNX graph, session and NumPy model), :mod:`~lpjax.inference.int8_mlp`, :mod:`~lpjax.inference.fp32_mlp` and
:mod:`~lpjax.inference.policy_runtime`. This package imports nothing from lpjax but :mod:`lpjax.quant`.
"""

from lpjax.inference.fp32_mlp import Fp32MLP
from lpjax.inference.int8_mlp import GEMM_CHOICES, Int8MLP
from lpjax.inference.mlp_params import OUTPUT_ACTIVATIONS, mlp_layers
from lpjax.inference.ort_int8 import GEMM_KINDS, int8_linear_reference, u8s8_saturates
from lpjax.inference.policy_runtime import RUNTIMES, check_runtime, make_policy_runtime

__all__ = [
    "GEMM_CHOICES",
    "GEMM_KINDS",
    "OUTPUT_ACTIVATIONS",
    "RUNTIMES",
    "Fp32MLP",
    "Int8MLP",
    "check_runtime",
    "int8_linear_reference",
    "make_policy_runtime",
    "mlp_layers",
    "u8s8_saturates",
]
