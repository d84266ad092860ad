"""The actor's int8 MLP policy on the CPU: lpjax's int8 weights on ONNX Runtime's int8 GEMMs (MLAS).

:class:`Int8MLP` takes lpjax's own int8 weights (:func:`lpjax.quant.quantize_int8_weight`: per-output-channel
symmetric codes ``c`` in [-127, 127], ``w_scale = amax / 127``) and puts them, bit for bit, into an ONNX graph of
``com.microsoft.DynamicQuantizeMatMul`` nodes (relu between them) run by an ONNX Runtime session
(:mod:`lpjax.inference.ort_int8`). XLA:CPU has no fast int8 GEMM, so the int8 maths of
:func:`kernels.int8_matmul` cannot run fast in JAX on the actor's CPU.

What each layer does to its activations: the float32 input ``x: (B, K)`` is quantized **per tensor** (one scale for
the whole batch, not per token), **asymmetrically to uint8** with a zero point, in float32::

    lo = min(min(x), 0),  hi = max(max(x), 0)                     (the range always contains 0)
    s  = (hi - lo) / 255                                          (s = 1 if x == 0)
    z  = rint(min(max(-lo / s, 0), 255))                          (the zero point)
    q  = clip(rint(x / s) + z, 0, 255)                            (uint8; |x - s (q - z)| <= s / 2)
    acc[b, n] = sum_k (q[b, k] - z) c[k, n]                       (int32, exact)
    y[b, n]   = float32(acc[b, n]) * (s * w_scale[n]) + bias[n]   (each float step rounded to float32)

then ``relu`` (hidden layers); the output activation (``tanh``) is NumPy's, applied to the last ``y``. ``rint``
rounds half to even and ``x / s`` is a true division. So the weights are lpjax's int8 maths bit for bit, and only
the activation quantizer differs from :func:`kernels.int8_matmul` (symmetric int8 per token, ``s = amax / 127``).
For a post-relu input (``lo = 0``, ``z = 0``) the step ``max / 255`` is half of lpjax's ``max / 127``: at batch 1
this runtime is *more* accurate than ``int8_matmul(impl="reference")``; at batch B > 1 the rows share the batch's
range, so a row with small activations is quantized more coarsely than per token would. :meth:`Int8MLP.reference`
is a NumPy model of exactly this arithmetic and matches :meth:`Int8MLP.__call__` bit for bit.

``gemm`` picks MLAS's kernel: ``"u8s8"`` multiplies ``q`` by the int8 codes, exact on CPUs with AVX-512 VNNI or
AVX-VNNI but saturating in int16 on other x86 CPUs; ``"u8u8"`` multiplies by ``c + 128`` with a zero point of 128,
the same ``acc`` without saturation, slower. ``"auto"`` (the default) probes once per process and picks ``"u8s8"``
where it is exact (:func:`lpjax.inference.ort_int8.u8s8_saturates`). Threads are per session
(``intra_op_num_threads``), nothing is process-global. onnxruntime and onnx (``pip install 'lpjax[int8]'``) are
imported when an :class:`Int8MLP` is built: ``import lpjax.inference`` imports neither.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from lpjax.inference import ort_int8
from lpjax.inference.mlp_params import check_chain, check_output_activation, mlp_layers, obs_batch
from lpjax.quant import quantize_int8_weight

GEMM_CHOICES = (*ort_int8.GEMM_KINDS, "auto")
"""Valid ``gemm`` values of :class:`Int8MLP`."""


class Int8MLP:
    """An int8 MLP policy (relu hidden layers, optional tanh output) on ONNX Runtime's int8 GEMMs.

    Maps NumPy observations ``(in_dim,)`` or ``(B, in_dim)`` to float32 actions ``(out_dim,)`` or ``(B, out_dim)``
    with the per-tensor uint8 activation quantization of the module docstring. Picklable: a copy rebuilds its
    session from :attr:`layers` (what an actor process receives).

    Attributes:
      layers: the quantized layers ``(codes (K, N) int8, scales (N,) float32, bias (N,) float32 or None)`` (read-only
        NumPy arrays; what :meth:`from_quantized` takes, and what pickling sends).
      output_activation: ``"none"`` or ``"tanh"``.
      gemm: ``"u8s8"`` or ``"u8u8"``, MLAS's kernel (resolved from ``"auto"`` at construction).
      threads: the session's ``intra_op_num_threads``, or ``None`` for ONNX Runtime's default.
      in_dim, out_dim: observation and action widths.
      nbytes: bytes of the int8 codes, float32 scales and float32 biases.
    """

    def __init__(
        self,
        layers: Sequence[ort_int8.Layer],
        output_activation: str = "tanh",
        *,
        threads: int | None = 1,
        gemm: str = "auto",
    ):
        """Prefer :meth:`from_params` / :meth:`from_quantized`; arguments as in :meth:`from_quantized`.

        Raises ``ImportError`` (one line, with the install command) if onnxruntime or onnx is not installed.
        """
        ort_int8.check_installed()
        self.output_activation = check_output_activation(output_activation)
        if gemm not in GEMM_CHOICES:
            raise ValueError(f"gemm must be one of {GEMM_CHOICES}, got {gemm!r}.")
        if threads is not None and (
            not isinstance(threads, (int, np.integer)) or isinstance(threads, bool) or threads < 1
        ):
            raise ValueError(f"threads must be a positive int or None, got {threads!r}.")
        self.layers = tuple(_check_layer(i, layer) for i, layer in enumerate(_as_layer_list(layers)))
        check_chain([codes.shape for codes, _, _ in self.layers])
        self.threads = None if threads is None else int(threads)
        self.gemm = ("u8u8" if ort_int8.u8s8_saturates() else "u8s8") if gemm == "auto" else gemm
        self._session = ort_int8.inference_session(ort_int8.int8_mlp_onnx(self.layers, self.gemm), self.threads)
        self.in_dim = int(self.layers[0][0].shape[0])
        self.out_dim = int(self.layers[-1][0].shape[1])
        self.nbytes = int(sum(c.nbytes + s.nbytes + (0 if b is None else b.nbytes) for c, s, b in self.layers))

    @classmethod
    def from_params(
        cls, params: Mapping[str, Any], output_activation: str = "tanh", *, threads: int | None = 1, gemm: str = "auto"
    ) -> Int8MLP:
        """Quantizes an :class:`lpjax.nn.MLP` parameter tree (see :func:`lpjax.inference.mlp_layers`).

        Each kernel goes through :func:`lpjax.quant.quantize_int8_weight` (any float dtype); biases become float32.

        Args:
          params: ``{"Dense_0": {"kernel": (K, N), "bias": (N,)}, ...}`` or ``{"params": {...}}``.
          output_activation: ``"none"`` or ``"tanh"`` after the last layer (hidden layers use relu).
          threads: the session's ``intra_op_num_threads`` (``None``: ONNX Runtime's default); actors use 1.
          gemm: ``"u8s8"``, ``"u8u8"`` or ``"auto"`` (``"u8s8"`` unless it saturates on this CPU).
        """
        layers = []
        for kernel, bias in mlp_layers(params):
            qw = quantize_int8_weight(jnp.asarray(kernel))
            layers.append(
                (np.asarray(qw.codes), np.asarray(qw.scales), None if bias is None else np.asarray(bias, np.float32))
            )
        return cls(layers, output_activation, threads=threads, gemm=gemm)

    @classmethod
    def from_quantized(
        cls,
        layers: Sequence[ort_int8.Layer],
        output_activation: str = "tanh",
        *,
        threads: int | None = 1,
        gemm: str = "auto",
    ) -> Int8MLP:
        """Builds the runtime from already-quantized layers, e.g. what an actor unpacks from a learner's broadcast.

        Args:
          layers: a sequence of ``(codes, scales, bias)``: ``(K, N)`` int8 codes, ``(N,)`` positive finite float32
            scales (``w ~= codes * scales``, as :class:`lpjax.quant.Int8Weight`) and an ``(N,)`` float bias or
            ``None``, consecutive layers chaining.
          output_activation, threads, gemm: as in :meth:`from_params`.
        """
        return cls(layers, output_activation, threads=threads, gemm=gemm)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Actions for ``obs`` ``(in_dim,)`` or ``(B, in_dim)`` (any float dtype, finite): float32 ``(out_dim,)`` or
        ``(B, out_dim)``. A batch shares one activation scale per layer (per-tensor quantization)."""
        x = self._checked_obs(obs)
        if x.shape[0] == 0:
            y = np.zeros((0, self.out_dim), np.float32)
        else:
            y = self._session.run([ort_int8.OUTPUT_NAME], {ort_int8.INPUT_NAME: x})[0]
        return self._finish(y, obs)

    def reference(self, obs: np.ndarray) -> np.ndarray:
        """What :meth:`__call__` computes, modelled in NumPy (:func:`lpjax.inference.ort_int8.int8_linear_reference`
        per layer): equal to it bit for bit.

        For tests and accuracy studies: slow (int64 matmuls), but it shows the exact activation quantization.
        """
        x = self._checked_obs(obs)
        for i, (codes, scales, bias) in enumerate(self.layers):
            x = ort_int8.int8_linear_reference(x, codes, scales, bias, relu=i < len(self.layers) - 1)
        return self._finish(x, obs)

    def _checked_obs(self, obs: Any) -> np.ndarray:
        x = obs_batch(obs, self.in_dim)
        if not np.isfinite(x).all():
            raise ValueError("obs must be finite (the activation scale is derived from its min and max).")
        return x

    def _finish(self, mean: np.ndarray, obs: Any) -> np.ndarray:
        y = np.tanh(mean) if self.output_activation == "tanh" else mean
        return y[0] if np.ndim(obs) == 1 else y

    def dequantized_layers(self) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """``(codes * scales, bias)`` per layer in float64: the weights this runtime multiplies by, exactly."""
        return [
            (c.astype(np.float64) * s.astype(np.float64)[None, :], None if b is None else b.astype(np.float64))
            for c, s, b in self.layers
        ]

    def __reduce__(self):
        # An ONNX Runtime session does not pickle; an actor process rebuilds it from the NumPy layers.
        return (_rebuild_int8_mlp, (self.layers, self.output_activation, self.threads, self.gemm))

    def __repr__(self) -> str:
        sizes = [self.in_dim] + [c.shape[1] for c, _, _ in self.layers]
        return (
            f"Int8MLP(sizes={sizes}, output_activation={self.output_activation!r}, gemm={self.gemm!r}, "
            f"threads={self.threads})"
        )


def _rebuild_int8_mlp(layers, output_activation, threads, gemm):
    return Int8MLP(layers, output_activation, threads=threads, gemm=gemm)


def _as_layer_list(layers: Any) -> list:
    if isinstance(layers, (str, bytes, Mapping)) or not isinstance(layers, Sequence):
        raise TypeError(
            f"layers must be a sequence of (codes, scales, bias) tuples, got {type(layers).__name__}; "
            "use Int8MLP.from_params for a Flax parameter tree."
        )
    if not layers:
        raise ValueError("layers is empty; an MLP needs at least one layer.")
    return list(layers)


def _check_layer(i: int, layer: Any) -> ort_int8.Layer:
    if not isinstance(layer, Sequence) or len(layer) != 3:
        raise ValueError(f"layers[{i}] must be a (codes, scales, bias) tuple, got {layer!r:.80}.")
    codes, scales, bias = np.asarray(layer[0]), np.asarray(layer[1]), layer[2]
    if codes.dtype != np.int8 or codes.ndim != 2:
        raise ValueError(f"layers[{i}] codes must be an int8 (K, N) matrix, got {codes.dtype} {codes.shape}.")
    n = codes.shape[1]
    if scales.dtype != np.float32 or scales.shape != (n,):
        raise ValueError(f"layers[{i}] scales must be float32 with shape ({n},), got {scales.dtype} {scales.shape}.")
    if not (np.isfinite(scales).all() and (scales > 0).all()):
        raise ValueError(f"layers[{i}] scales must be positive and finite.")
    if bias is not None:
        bias = np.asarray(bias)
        if bias.shape != (n,) or not np.issubdtype(bias.dtype, np.floating):
            raise ValueError(
                f"layers[{i}] bias must be floating with shape ({n},) or None, got {bias.dtype} {bias.shape}."
            )
        bias = np.asarray(bias, np.float32)
        if not np.isfinite(bias).all():
            raise ValueError(f"layers[{i}] bias must be finite.")
    out = (np.array(codes, copy=True), np.array(scales, copy=True), None if bias is None else np.array(bias))
    for a in out:
        if a is not None:
            a.setflags(write=False)
    return out
