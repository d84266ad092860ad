"""Actor-side MLP policy runtimes: int8 on fbgemm (through PyTorch's quantized ops) and a jitted JAX fp32 baseline.

Why fbgemm: XLA:CPU has no fast int8 GEMM. A ``lax.dot_general(int8, int8, preferred_element_type=int32)`` of a
batch-1 24->2048->2048->2048->6 policy takes 15-40 ms here, 10-15x the fp32 forward; fbgemm's u8 x s8 -> s32
kernels (AVX2 / AVX-512 / AVX-512 VNNI) take ~0.15-0.2 ms (``benchmarks/actor_inference.py``). :class:`Int8MLP`
therefore feeds lpjax's own int8 weights (:func:`lpjax.quant.quantize_int8_weight`: per-output-channel symmetric
codes in [-127, 127], ``scale = amax / 127``) to ``torch.ops.quantized.linear_prepack`` as a per-channel ``qint8``
tensor with zero zero-points (the codes are passed through bit for bit) and runs every layer with
``quantized::linear_relu_dynamic`` (hidden layers, relu fused) or ``quantized::linear_dynamic`` (output layer).

What fbgemm does to the activations (``PackedLinearWeight::apply_dynamic_impl`` in PyTorch's
``aten/src/ATen/native/quantized/cpu/qlinear_dynamic.cpp`` and ``quant_utils::ChooseQuantizationParams``): every
layer's float32 input ``x: (B, K)`` is quantized **per tensor** (one scale for the whole batch, not per token),
**asymmetrically to uint8** with a zero point::

    lo = min(min(x), 0),  hi = max(max(x), 0)                      (the range always contains 0)
    s  = (hi - lo) / (q_max - 0),   q_max = 255, or 127 with reduce_range
         (s = 0.1 if s is 0;  s = 6.1e-5 if s < 6.1e-5: fp16's smallest normal, a floor on the resolution)
    z  = round(-lo / s)  (or 255 - hi / s, whichever is computed more accurately), clipped to [0, q_max]
    q  = clip(round(x / s) + z, 0, 255)                            (uint8; |x - s (q - z)| <= s / 2)
    y[b, n] = float32(sum_k q[b, k] c[k, n] - z sum_k c[k, n]) * s * w_scale[n] + bias[n]   (then relu if fused)

with the weight codes ``c`` and scales ``w_scale`` exactly lpjax's. So the weights are lpjax's int8 maths
bit for bit, and only the activation quantizer differs from :func:`kernels.int8_matmul` (symmetric int8 per token,
``s = amax / 127``). For a post-relu input (``lo = 0``) fbgemm's step ``max / 255`` is half lpjax's ``max / 127``:
at batch 1 this runtime is *more* accurate than ``int8_matmul(impl="reference")``; at batch B > 1 each row shares
the batch's range, so a row with small activations is quantized more coarsely than per token would.
:meth:`Int8MLP.reference` is a NumPy model of exactly this arithmetic.

``reduce_range`` (PyTorch's ``quantize_dynamic`` passes ``True``) quantizes activations to 7 bits (``q_max = 127``).
It exists because fbgemm's AVX2 / AVX-512 (non-VNNI) kernels multiply u8 x s8 pairs with ``vpmaddubsw``, whose int16
pair sums saturate when ``q`` reaches 255 (``2 * 255 * 127 > 32767``). On a CPU with AVX-512 VNNI (``vpdpbusd``
accumulates in int32) nothing saturates. ``reduce_range="auto"`` (the default) runs a tiny probe GEMM once per
process that would saturate and uses the full 8 bits only if its result is exact (:func:`fbgemm_saturates`).

Process-global state (PyTorch has no per-object setting for these):

* ``threads``: ``Int8MLP(..., threads=1)`` calls ``torch.set_num_threads(1)``, for the whole process; fbgemm splits
  each GEMM over ``torch.get_num_threads()`` tasks *at call time*. Actors are single-threaded by design (one per
  core), so that is the default; ``threads=None`` leaves the setting alone.
* The packing needs the ``fbgemm`` (or ``x86``, which packs linear layers with fbgemm too) quantized engine: if
  ``torch.backends.quantized.engine`` is something else it is switched to ``fbgemm`` for the packing and restored.
  The packed weights remember their backend, so later calls do not depend on the engine.

PyTorch deprecates quantized tensor creation (``torch.quantize_per_channel`` warns that it "will be removed in a
future PyTorch release", pytorch/pytorch#184982); the ``quantized::linear_*`` ops used here do not warn in torch
2.13. The packing silences that one warning.

torch is imported lazily, by :class:`Int8MLP` only: ``import lpjax.inference`` does not import it.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.quant import quantize_int8_weight

OUTPUT_ACTIVATIONS = ("none", "tanh")
"""Valid ``output_activation`` values (the hidden activation is always relu)."""

RUNTIMES = ("int8", "fp32")
"""Valid ``kind`` values of :func:`make_policy_runtime`."""

REDUCE_RANGE_CHOICES = (True, False, "auto")
"""Valid ``reduce_range`` values of :class:`Int8MLP`."""

FBGEMM_SMALL_SCALE = float(np.float32(6.1e-5))
"""fbgemm's smallest activation scale (``quant_utils::SMALL_SCALE_THRESHOLD``): inputs whose range is below
``255 * 6.1e-5 ~= 0.0156`` are quantized with this step, i.e. with fewer than 256 levels."""

_LAYER_NAME = re.compile(r"Dense_(\d+)")
_DEPRECATED_QTENSOR = r".*quantized tensor creation functions.*"

Layer = tuple[np.ndarray, np.ndarray, np.ndarray | None]
"""One quantized layer: ``(codes (K, N) int8, scales (N,) float32, bias (N,) float32 or None)``."""


# --------------------------------------------------------------------------------------------------- params trees


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
            raise ValueError(f"{index[i]}/kernel must be a floating (K, N) matrix, got {kernel.dtype} "
                             f"{kernel.shape}.")
        if bias is not None and (bias.shape != kernel.shape[1:] or not np.issubdtype(bias.dtype, np.floating)):
            raise ValueError(f"{index[i]}/bias must be floating with shape ({kernel.shape[1]},), got {bias.dtype} "
                             f"{bias.shape}.")
        layers.append((kernel, bias))
    _check_chain([k.shape for k, _ in layers])
    return layers


def _check_chain(shapes: Sequence[tuple[int, ...]]) -> None:
    for i, (a, b) in enumerate(itertools.pairwise(shapes)):
        if a[1] != b[0]:
            raise ValueError(f"Layer {i} outputs {a[1]} features but layer {i + 1} expects {b[0]} "
                             f"(shapes {tuple(a)} -> {tuple(b)}).")


def _check_output_activation(output_activation: str) -> str:
    if output_activation not in OUTPUT_ACTIVATIONS:
        raise ValueError(f"output_activation must be one of {OUTPUT_ACTIVATIONS}, got {output_activation!r}.")
    return output_activation


def _check_obs(obs: Any, in_dim: int) -> np.ndarray:
    """``obs`` as a fresh, writable, C-contiguous float32 ``(B, in_dim)`` array (a copy: torch wants it writable)."""
    x = np.array(obs, dtype=np.float32, copy=True, order="C")
    if x.ndim not in (1, 2) or x.shape[-1] != in_dim:
        raise ValueError(f"obs must have shape ({in_dim},) or (B, {in_dim}), got {x.shape}.")
    if not np.isfinite(x).all():
        raise ValueError("obs must be finite (fbgemm's dynamic quantization derives its scale from min/max).")
    return x.reshape(-1, in_dim)


# --------------------------------------------------------------------------------------------------------- fbgemm


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is in the [distributed] extra
        raise ImportError("Int8MLP runs on fbgemm through PyTorch's quantized ops: pip install 'lpjax[distributed]' "
                          "(torch).") from e
    if "fbgemm" not in torch.backends.quantized.supported_engines:  # pragma: no cover - x86 builds have it
        raise RuntimeError(f"This PyTorch build has no fbgemm quantized engine "
                           f"(supported: {torch.backends.quantized.supported_engines}).")
    return torch


@contextlib.contextmanager
def _fbgemm_engine():
    """Packs with fbgemm: switches ``torch.backends.quantized.engine`` to it unless it is fbgemm or x86."""
    torch = _torch()
    previous = torch.backends.quantized.engine
    if previous in ("fbgemm", "x86"):
        yield
        return
    torch.backends.quantized.engine = "fbgemm"
    try:
        yield
    finally:
        torch.backends.quantized.engine = previous


def _prepack(codes: np.ndarray, scales: np.ndarray, bias: np.ndarray | None):
    """fbgemm's packed ``(N, K)`` per-channel qint8 weight holding exactly ``codes.T`` (zero zero-points)."""
    torch = _torch()
    n = codes.shape[1]
    w_t = torch.tensor(np.array(codes.T, order="C"))  # (N, K), torch.nn.Linear's layout; copies
    deq = w_t.to(torch.float32) * torch.tensor(scales)[:, None]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_DEPRECATED_QTENSOR, category=UserWarning)
        q = torch.quantize_per_channel(deq, torch.tensor(scales, dtype=torch.float64),
                                       torch.zeros(n, dtype=torch.int64), 0, torch.qint8)
    if not torch.equal(q.int_repr(), w_t):  # code * scale / scale rounds back to code; checked, not assumed
        raise RuntimeError("torch.quantize_per_channel did not reproduce lpjax's int8 codes.")
    with _fbgemm_engine():
        return torch.ops.quantized.linear_prepack(q, None if bias is None else torch.tensor(bias))


@functools.cache
def fbgemm_saturates() -> bool:
    """Whether fbgemm's u8 x s8 GEMM saturates on this CPU with full-range (8-bit, ``reduce_range=False``) inputs.

    Probes once per process: ``x = ones(1, 256)`` is quantized to ``q = 255`` (``s = 1/255``, ``z = 0``) and every
    weight code is +-127, so each adjacent pair of products sums to ``+-64770``, which ``vpmaddubsw``'s int16 (AVX2,
    AVX-512 without VNNI) saturates to ``+-32767``; VNNI's int32 ``vpdpbusd`` does not. Returns ``True`` if the
    result is not exact, in which case ``reduce_range="auto"`` picks 7-bit activations.
    """
    torch = _torch()
    k, n = 256, 16
    codes = np.full((k, n), 127, np.int8)
    codes[:, 1::2] = -127
    packed = _prepack(codes, np.full((n,), 1.0 / 127, np.float32), None)
    with torch.inference_mode():
        y = torch.ops.quantized.linear_dynamic(torch.ones(1, k), packed, False).numpy()
    exact = np.where(np.arange(n) % 2 == 0, float(k), -float(k))
    return not np.allclose(y[0], exact, rtol=1e-4, atol=0.0)


def _choose_qparams(lo: float, hi: float, reduce_range: bool) -> tuple[np.float32, int]:
    """``quant_utils::ChooseQuantizationParams(lo, hi, 0, 255, preserve_sparsity=False, reduce_range)``."""
    qmin, qmax = 0, 127 if reduce_range else 255
    lo, hi = min(np.float32(lo), np.float32(0.0)), max(np.float32(hi), np.float32(0.0))
    scale = (float(hi) - float(lo)) / (qmax - qmin)
    if np.float32(scale) == 0 or not np.isfinite(np.float32(1.0) / np.float32(scale)):
        scale = 0.1
    if scale < FBGEMM_SMALL_SCALE:
        amplifier = np.float32(FBGEMM_SMALL_SCALE / np.float32(scale))
        scale = FBGEMM_SMALL_SCALE
        if lo == 0:
            hi = np.float32(FBGEMM_SMALL_SCALE * (qmax - qmin))
        elif hi == 0:
            lo = np.float32(-FBGEMM_SMALL_SCALE * (qmax - qmin))
        else:
            lo, hi = lo * amplifier, hi * amplifier
    from_min, from_max = qmin - float(lo) / scale, qmax - float(hi) / scale
    err_min, err_max = abs(qmin) - abs(float(lo) / scale), abs(qmax) - abs(float(hi) / scale)
    zero = from_min if err_min < err_max else from_max
    zero_point = qmin if zero < qmin else qmax if zero > qmax else int(np.rint(zero))
    return np.float32(scale), zero_point


def fbgemm_linear_reference(x: np.ndarray, codes: np.ndarray, scales: np.ndarray, bias: np.ndarray | None,
                            reduce_range: bool, relu: bool) -> np.ndarray:
    """NumPy model of ``quantized::linear[_relu]_dynamic`` on lpjax int8 weights (the module docstring's formula).

    ``x: (B, K)`` float32; returns ``(B, N)`` float32. The quantization is done in float32 as fbgemm does (multiply
    by ``1/s``, round half to even, add ``z``); the int32 sum exactly; the epilogue in float64, then rounded to
    float32. Agrees with fbgemm up to float32 rounding and, rarely, a tie ``x / s`` rounded the other way.
    """
    x = np.asarray(x, np.float32)
    scale, zero = _choose_qparams(float(x.min()), float(x.max()), reduce_range)
    q = np.clip(np.rint(x * (np.float32(1.0) / scale)) + np.float32(zero), 0, 255).astype(np.int64)
    c = codes.astype(np.int64)
    acc = q @ c - zero * c.sum(axis=0)[None, :]
    y = acc.astype(np.float64) * float(scale) * scales.astype(np.float64)[None, :]
    if bias is not None:
        y = y + bias.astype(np.float64)[None, :]
    if relu:
        y = np.maximum(y, 0.0)
    return y.astype(np.float32)


# --------------------------------------------------------------------------------------------------------- Int8MLP


class Int8MLP:
    """An int8 MLP policy (``relu`` hidden layers, ``"none"``/``"tanh"`` output) on fbgemm: the fast CPU actor runtime.

    Build it with :meth:`from_params` (a float :class:`lpjax.nn.MLP` tree, quantized here with
    :func:`lpjax.quant.quantize_int8_weight`) or :meth:`from_quantized` (layers already quantized, e.g. unpacked
    from a learner's broadcast). Weights are lpjax's per-output-channel symmetric int8 codes, used bit for bit;
    activations are quantized by fbgemm, dynamically, per tensor, to uint8 (module docstring). Calls take NumPy
    observations and return NumPy float32 actions, under ``torch.inference_mode()``.

    Attributes:
      layers: the quantized layers ``(codes (K, N) int8, scales (N,) float32, bias (N,) float32 or None)`` (read-only
        NumPy arrays; what :meth:`from_quantized` takes, and what pickling sends).
      output_activation: ``"none"`` or ``"tanh"``.
      reduce_range: whether activations use 7 bits (resolved from ``"auto"`` at construction).
      threads: the ``torch.set_num_threads`` value set at construction, or ``None`` (left alone).
      in_dim, out_dim: observation and action widths.
      nbytes: bytes of the int8 codes, float32 scales and float32 biases.
    """

    def __init__(self, layers: Sequence[Layer], output_activation: str = "tanh", *, threads: int | None = 1,
                 reduce_range: bool | str = "auto"):
        """Prefer :meth:`from_params` / :meth:`from_quantized`; arguments as in :meth:`from_quantized`."""
        self.output_activation = _check_output_activation(output_activation)
        if not (isinstance(reduce_range, bool) or isinstance(reduce_range, str) and reduce_range == "auto"):
            raise ValueError(f"reduce_range must be one of {REDUCE_RANGE_CHOICES}, got {reduce_range!r}.")
        if threads is not None and (not isinstance(threads, (int, np.integer)) or isinstance(threads, bool)
                                    or threads < 1):
            raise ValueError(f"threads must be a positive int or None, got {threads!r}.")
        self.layers = tuple(_check_layer(i, layer) for i, layer in enumerate(_as_layer_list(layers)))
        _check_chain([codes.shape for codes, _, _ in self.layers])
        torch = _torch()
        self.threads = None if threads is None else int(threads)
        if self.threads is not None:
            torch.set_num_threads(self.threads)  # process-global (module docstring)
        self.reduce_range = fbgemm_saturates() if reduce_range == "auto" else bool(reduce_range)
        self._packed = [_prepack(*layer) for layer in self.layers]
        self._linear = torch.ops.quantized.linear_dynamic
        self._linear_relu = getattr(torch.ops.quantized, "linear_relu_dynamic", None)
        self._torch = torch
        self.in_dim = int(self.layers[0][0].shape[0])
        self.out_dim = int(self.layers[-1][0].shape[1])
        self.nbytes = int(sum(c.nbytes + s.nbytes + (0 if b is None else b.nbytes) for c, s, b in self.layers))

    @classmethod
    def from_params(cls, params: Mapping[str, Any], output_activation: str = "tanh", *, threads: int | None = 1,
                    reduce_range: bool | str = "auto") -> Int8MLP:
        """Quantizes an :class:`lpjax.nn.MLP` parameter tree (see :func:`mlp_layers`) and packs it for fbgemm.

        Each kernel goes through :func:`lpjax.quant.quantize_int8_weight` (any float dtype); biases become float32.

        Args:
          params: ``{"Dense_0": {"kernel": (K, N), "bias": (N,)}, ...}`` or ``{"params": {...}}``.
          output_activation: ``"none"`` or ``"tanh"`` after the last layer (hidden layers use relu).
          threads: ``torch.set_num_threads(threads)`` for the whole process (``None``: leave it).
          reduce_range: ``True`` (7-bit activations), ``False`` (8-bit) or ``"auto"`` (8-bit unless
            :func:`fbgemm_saturates`).
        """
        layers = []
        for kernel, bias in mlp_layers(params):
            qw = quantize_int8_weight(jnp.asarray(kernel))
            layers.append((np.asarray(qw.codes), np.asarray(qw.scales),
                           None if bias is None else np.asarray(bias, np.float32)))
        return cls(layers, output_activation, threads=threads, reduce_range=reduce_range)

    @classmethod
    def from_quantized(cls, layers: Sequence[Layer], output_activation: str = "tanh", *,
                       threads: int | None = 1, reduce_range: bool | str = "auto") -> Int8MLP:
        """Packs already-quantized layers, e.g. what an actor unpacks from a learner's broadcast.

        Args:
          layers: a sequence of ``(codes, scales, bias)``: ``(K, N)`` int8 codes, ``(N,)`` positive finite float32
            scales (``w ~= codes * scales``, as :class:`lpjax.quant.Int8Weight`) and an ``(N,)`` float bias or
            ``None``, consecutive layers chaining.
          output_activation, threads, reduce_range: as in :meth:`from_params`.
        """
        return cls(layers, output_activation, threads=threads, reduce_range=reduce_range)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Actions for ``obs`` ``(in_dim,)`` or ``(B, in_dim)`` (any float dtype, finite): float32 ``(out_dim,)`` or
        ``(B, out_dim)``. A batch shares one activation scale per layer (fbgemm quantizes per tensor)."""
        x = _check_obs(obs, self.in_dim)
        single = np.ndim(obs) == 1
        if x.shape[0] == 0:
            return np.zeros((0, self.out_dim), np.float32)
        torch, rr = self._torch, self.reduce_range
        with torch.inference_mode():
            h = torch.from_numpy(x)
            for packed in self._packed[:-1]:
                if self._linear_relu is not None:
                    h = self._linear_relu(h, packed, rr)
                else:  # pragma: no cover - torch 2.13 has the fused op
                    h = torch.relu_(self._linear(h, packed, rr))
            h = self._linear(h, self._packed[-1], rr)
            if self.output_activation == "tanh":
                h = torch.tanh_(h)
            y = h.numpy()
        return y[0] if single else y

    def reference(self, obs: np.ndarray) -> np.ndarray:
        """What :meth:`__call__` computes, modelled in NumPy (:func:`fbgemm_linear_reference` per layer).

        For tests and accuracy studies: slow (int64 matmuls), but it shows the exact activation quantization.
        """
        x = _check_obs(obs, self.in_dim)
        for i, (codes, scales, bias) in enumerate(self.layers):
            x = fbgemm_linear_reference(x, codes, scales, bias, self.reduce_range, relu=i < len(self.layers) - 1)
        if self.output_activation == "tanh":
            x = np.tanh(x.astype(np.float64)).astype(np.float32)
        return x[0] if np.ndim(obs) == 1 else x

    def dequantized_layers(self) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """``(codes * scales, bias)`` per layer in float64: the weights this runtime multiplies by, exactly."""
        return [(c.astype(np.float64) * s.astype(np.float64)[None, :], None if b is None else b.astype(np.float64))
                for c, s, b in self.layers]

    def __reduce__(self):
        # The packed fbgemm weights are TorchScript objects; an actor process rebuilds them from the NumPy layers.
        return (_rebuild_int8_mlp, (self.layers, self.output_activation, self.threads, self.reduce_range))

    def __repr__(self) -> str:
        sizes = [self.in_dim] + [c.shape[1] for c, _, _ in self.layers]
        return (f"Int8MLP(sizes={sizes}, output_activation={self.output_activation!r}, "
                f"reduce_range={self.reduce_range}, threads={self.threads})")


def _rebuild_int8_mlp(layers, output_activation, threads, reduce_range):
    return Int8MLP(layers, output_activation, threads=threads, reduce_range=reduce_range)


def _as_layer_list(layers: Any) -> list:
    if isinstance(layers, (str, bytes, Mapping)) or not isinstance(layers, Sequence):
        raise TypeError(f"layers must be a sequence of (codes, scales, bias) tuples, got {type(layers).__name__}; "
                        "use Int8MLP.from_params for a Flax parameter tree.")
    if not layers:
        raise ValueError("layers is empty; an MLP needs at least one layer.")
    return list(layers)


def _check_layer(i: int, layer: Any) -> Layer:
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
            raise ValueError(f"layers[{i}] bias must be floating with shape ({n},) or None, got {bias.dtype} "
                             f"{bias.shape}.")
        bias = np.asarray(bias, np.float32)
        if not np.isfinite(bias).all():
            raise ValueError(f"layers[{i}] bias must be finite.")
    out = (np.array(codes, copy=True), np.array(scales, copy=True), None if bias is None else np.array(bias))
    for a in out:
        if a is not None:
            a.setflags(write=False)
    return out


# --------------------------------------------------------------------------------------------------------- Fp32MLP


@functools.partial(jax.jit, static_argnums=(2,))
def _fp32_forward(layers, x, output_activation):
    for i, (kernel, bias) in enumerate(layers):
        x = jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))
        if bias is not None:
            x = x + bias
        if i < len(layers) - 1:
            x = jax.nn.relu(x)
    return jnp.tanh(x) if output_activation == "tanh" else x


class Fp32MLP:
    """The float32 baseline with :class:`Int8MLP`'s interface: one ``jax.jit``-compiled forward on the default device.

    Computes what :class:`lpjax.nn.MLP` (fp32 policy, relu) computes, followed by ``output_activation``. JAX's
    threading is fixed when jax is imported (``XLA_FLAGS``), so unlike :class:`Int8MLP` there is no ``threads``
    argument: for single-threaded actors start the process with
    ``XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"``.

    Attributes:
      output_activation, in_dim, out_dim: as in :class:`Int8MLP`.
      nbytes: bytes of the float32 kernels and biases.
    """

    def __init__(self, layers: Sequence[tuple[Any, Any]], output_activation: str = "tanh"):
        """Prefer :meth:`from_params`; ``layers`` is a sequence of ``(kernel (K, N), bias (N,) or None)``."""
        self.output_activation = _check_output_activation(output_activation)
        layers = [(np.asarray(k), None if b is None else np.asarray(b)) for k, b in layers]
        if not layers:
            raise ValueError("layers is empty; an MLP needs at least one layer.")
        _check_chain([k.shape for k, _ in layers])
        self._layers = tuple((jnp.asarray(k, jnp.float32), None if b is None else jnp.asarray(b, jnp.float32))
                             for k, b in layers)
        self.in_dim = int(layers[0][0].shape[0])
        self.out_dim = int(layers[-1][0].shape[1])
        self.nbytes = int(sum(k.nbytes + (0 if b is None else b.nbytes) for k, b in self._layers))

    @classmethod
    def from_params(cls, params: Mapping[str, Any], output_activation: str = "tanh") -> Fp32MLP:
        """From an :class:`lpjax.nn.MLP` parameter tree (see :func:`mlp_layers`), cast to float32."""
        return cls(mlp_layers(params), output_activation)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Actions for ``obs`` ``(in_dim,)`` or ``(B, in_dim)``: float32 ``(out_dim,)`` or ``(B, out_dim)``."""
        x = np.asarray(obs, np.float32)
        if x.ndim not in (1, 2) or x.shape[-1] != self.in_dim:
            raise ValueError(f"obs must have shape ({self.in_dim},) or (B, {self.in_dim}), got {x.shape}.")
        return np.asarray(_fp32_forward(self._layers, x, self.output_activation))

    def __repr__(self) -> str:
        sizes = [self.in_dim] + [k.shape[1] for k, _ in self._layers]
        return f"Fp32MLP(sizes={sizes}, output_activation={self.output_activation!r})"


def make_policy_runtime(params: Mapping[str, Any], kind: str = "int8", output_activation: str = "tanh",
                        **kwargs: Any) -> Int8MLP | Fp32MLP:
    """The actor's policy runtime by name: ``"int8"`` -> :meth:`Int8MLP.from_params`, ``"fp32"`` ->
    :meth:`Fp32MLP.from_params`. Extra keyword arguments (``threads``, ``reduce_range``) go to :class:`Int8MLP`.

    Both return a callable ``obs (D,) or (B, D) -> float32 actions``.
    """
    if kind not in RUNTIMES:
        raise ValueError(f"kind must be one of {RUNTIMES}, got {kind!r}.")
    if kind == "int8":
        return Int8MLP.from_params(params, output_activation, **kwargs)
    if kwargs:
        raise ValueError(f"kind='fp32' takes no extra options, got {sorted(kwargs)}.")
    return Fp32MLP.from_params(params, output_activation)


__all__ = ["FBGEMM_SMALL_SCALE", "OUTPUT_ACTIVATIONS", "REDUCE_RANGE_CHOICES", "RUNTIMES", "Fp32MLP", "Int8MLP",
           "fbgemm_linear_reference", "fbgemm_saturates", "make_policy_runtime", "mlp_layers"]
