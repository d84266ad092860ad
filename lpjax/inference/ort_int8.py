"""The engine of :class:`lpjax.inference.Int8MLP`: its ONNX graph, the ONNX Runtime session that runs it on MLAS
(ONNX Runtime's CPU kernels), and a NumPy model of that arithmetic.

Each layer is one ``com.microsoft.DynamicQuantizeMatMul`` node, with a ``Relu`` after each hidden layer. What it
computes (``GetQuantizationParameter``, ``MlasQuantizeLinear`` and ``MLAS_QGEMM_SCALE_BIAS_OUTPUT_PROCESSOR`` in
ONNX Runtime's sources) is the formula of :mod:`lpjax.inference.int8_mlp`'s docstring, and
:func:`int8_linear_reference` computes it step by step in float32, reproducing the runtime bit for bit.

GEMM kinds. MLAS multiplies ``q`` (u8) by signed int8 codes (``"u8s8"``) with ``vpdpbusd`` on CPUs with
AVX-512 VNNI or AVX-VNNI, which accumulates in int32; on other x86 CPUs (AVX2, AVX-512 without VNNI) with
``vpmaddubsw``, whose int16 sums of adjacent products saturate once ``q`` nears 255 (``2 * 255 * 127 > 32767``).
``"u8u8"`` stores the codes as ``c + 128`` (uint8) with a zero point of 128: the same ``acc``, on MLAS's u8 x u8
kernels, which widen both operands to 16 bits and accumulate pairs in int32, so they cannot saturate (and are
slower). :func:`u8s8_saturates` probes which case this CPU is in, once per process.

``onnxruntime`` and ``onnx`` are imported when a session is built, not when this module is imported.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from lpjax._optional import check, require

GEMM_KINDS = ("u8s8", "u8u8")
"""The MLAS GEMMs an int8 layer can run on: uint8 activations times int8 (``"u8s8"``) or uint8 (``"u8u8"``)
weights."""

INPUT_NAME, OUTPUT_NAME = "obs", "mean"
"""The ONNX graph's input ``(B, K_0)`` and output ``(B, N_{L-1})`` (before the output activation)."""

_ONNX_OPSET, _MS_OPSET, _IR_VERSION = 13, 1, 7
_U8U8_ZERO_POINT = 128

Layer = tuple[np.ndarray, np.ndarray, np.ndarray | None]
"""One quantized layer: ``(codes (K, N) int8, scales (N,) float32, bias (N,) float32 or None)``."""


REQUIRED_PACKAGES = ("onnxruntime", "onnx")
"""What building a session needs: ONNX Runtime, and onnx to write the graph (the ``int8`` extra)."""

EXTRA = "int8"
"""The extra of ``setup.cfg`` that installs :data:`REQUIRED_PACKAGES`: ``pip install 'lpjax[int8]'``."""


def check_installed() -> None:
    """Raises a one-line ``ModuleNotFoundError`` (an ``ImportError``) naming the first of
    :data:`REQUIRED_PACKAGES` that is not installed, and the extra that installs it.

    Finds the packages without importing them, so a process that only checks (a learner about to start int8
    actors) does not load ONNX Runtime.
    """
    for name in REQUIRED_PACKAGES:
        check(name, EXTRA)


# ------------------------------------------------------------------------------------------------ NumPy model


def dynamic_quantize_uint8(x: np.ndarray) -> tuple[np.ndarray, np.float32, int]:
    """ONNX Runtime's per-tensor uint8 quantization of a float32 array: ``(q, s, z)``.

    ``lo = min(x, 0)``, ``hi = max(x, 0)``, ``s = (hi - lo) / 255`` (1 if ``hi == lo``),
    ``z = rint(min(max(-lo / s, 0), 255))``, ``q = clip(rint(x / s) + z, 0, 255)``: float32, a true division,
    ``rint`` rounding half to even.
    """
    x = np.asarray(x, np.float32)
    zero = np.float32(0.0)
    lo, hi = x.min(initial=zero), x.max(initial=zero)
    scale = np.float32(1.0) if hi == lo else np.float32(hi - lo) / np.float32(255.0)
    with np.errstate(divide="ignore", invalid="ignore"):  # s is 0 only if 0 < hi - lo < 255 * 2^-150
        origin, steps = -lo / scale, x / scale
    # C++'s std::min(255, z) and std::max(0, .) send a NaN to 255; MLAS's clamp sends a NaN step to 0 - z.
    zero_point = 255 if not origin < 255 else int(np.rint(max(origin, zero)))
    steps = np.where(np.isnan(steps), -zero_point, np.rint(steps))
    q = np.clip(steps + np.float32(zero_point), 0, 255).astype(np.uint8)
    return q, scale, zero_point


def int8_linear_reference(
    x: np.ndarray, codes: np.ndarray, scales: np.ndarray, bias: np.ndarray | None, relu: bool
) -> np.ndarray:
    """NumPy model of one ``DynamicQuantizeMatMul`` (+ relu) layer: ``x (B, K)`` float32 -> ``(B, N)`` float32.

    ``y = float32(sum_k (q - z) c) * (s * scales) + bias`` (then relu) with ``(q, s, z)`` from
    :func:`dynamic_quantize_uint8`, the sum exact, every float step rounded to float32.
    """
    q, scale, zero_point = dynamic_quantize_uint8(x)
    acc = (q.astype(np.int64) - zero_point) @ codes.astype(np.int64)
    y = acc.astype(np.float32) * (scale * scales.astype(np.float32))
    if bias is not None:
        y = y + bias.astype(np.float32)
    return np.maximum(y, np.float32(0.0)) if relu else y


# ------------------------------------------------------------------------------------------------ ONNX Runtime


def int8_mlp_onnx(layers: Sequence[Layer], gemm: str) -> bytes:
    """A serialized ONNX model of the MLP: ``DynamicQuantizeMatMul`` per layer, ``Relu`` between them.

    ``layers`` are validated ``(codes, scales, bias)`` triples; the codes go into the model unchanged for
    ``gemm="u8s8"`` and as ``codes + 128`` (uint8, zero point 128) for ``"u8u8"``. Input :data:`INPUT_NAME`
    ``(B, K_0)`` float32, output :data:`OUTPUT_NAME` ``(B, N_{L-1})`` float32.
    """
    if gemm not in GEMM_KINDS:
        raise ValueError(f"gemm must be one of {GEMM_KINDS}, got {gemm!r}.")
    TensorProto = require("onnx", EXTRA).TensorProto
    helper, numpy_helper = require("onnx.helper", EXTRA), require("onnx.numpy_helper", EXTRA)

    nodes, weights = [], []
    x = INPUT_NAME
    for i, (codes, scales, bias) in enumerate(layers):
        inputs = [x, f"codes_{i}", f"scales_{i}", "", ""]
        if gemm == "u8u8":
            weights.append(
                numpy_helper.from_array((codes.astype(np.int16) + _U8U8_ZERO_POINT).astype(np.uint8), inputs[1])
            )
            weights.append(numpy_helper.from_array(np.array(_U8U8_ZERO_POINT, np.uint8), f"zero_point_{i}"))
            inputs[3] = f"zero_point_{i}"
        else:
            weights.append(numpy_helper.from_array(codes, inputs[1]))
        weights.append(numpy_helper.from_array(scales, inputs[2]))
        if bias is not None:
            weights.append(numpy_helper.from_array(bias, f"bias_{i}"))
            inputs[4] = f"bias_{i}"
        while not inputs[-1]:
            inputs.pop()
        last = i == len(layers) - 1
        y = OUTPUT_NAME if last else f"linear_{i}"
        nodes.append(helper.make_node("DynamicQuantizeMatMul", inputs, [y], name=f"layer_{i}", domain="com.microsoft"))
        if not last:
            x = f"relu_{i}"
            nodes.append(helper.make_node("Relu", [y], [x], name=f"relu_{i}"))
    graph = helper.make_graph(
        nodes,
        "int8_mlp",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["B", int(layers[0][0].shape[0])])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["B", int(layers[-1][0].shape[1])])],
        weights,
    )
    model = helper.make_model(
        graph,
        ir_version=_IR_VERSION,
        producer_name="lpjax",
        opset_imports=[helper.make_opsetid("", _ONNX_OPSET), helper.make_opsetid("com.microsoft", _MS_OPSET)],
    )
    return model.SerializeToString()


def inference_session(model: bytes, threads: int | None) -> Any:
    """An ``onnxruntime.InferenceSession`` of ``model`` on the CPU, run exactly as built (graph optimizations off).

    ``threads`` sets this session's ``intra_op_num_threads`` (``None``: ONNX Runtime's default, one per physical
    core); nodes run one after another. The weights are prepacked for MLAS when the session is created.
    """
    ort = require("onnxruntime", EXTRA)

    options = ort.SessionOptions()
    options.intra_op_num_threads = 0 if threads is None else threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


@functools.cache
def u8s8_saturates() -> bool:
    """Whether MLAS's u8 x s8 GEMM saturates on this CPU (see the module docstring). Probed once per process.

    ``x = ones(1, 256)`` quantizes to ``q = 255`` (``s = 1/255``, ``z = 0``) and every weight code is +-127, the
    sign alternating by column: each adjacent pair of products sums to ``+-64770``, which ``vpmaddubsw`` saturates
    to ``+-32767`` and ``vpdpbusd`` does not. Returns ``True`` if the result is not the exact one.
    """
    k, n = 256, 16
    codes = np.full((k, n), 127, np.int8)
    codes[:, 1::2] = -127
    layer = (codes, np.full((n,), 1.0 / 127, np.float32), None)
    x = np.ones((1, k), np.float32)
    y = inference_session(int8_mlp_onnx([layer], "u8s8"), threads=1).run([OUTPUT_NAME], {INPUT_NAME: x})[0]
    return not np.allclose(y, int8_linear_reference(x, *layer, relu=False), rtol=1e-4, atol=0.0)
