"""QuaRL / ActorQ post-training quantization (PTQ): uniform quantization with a range-based step.

For a slice ``W`` of a tensor that shares one step (the whole tensor, or one output channel), the papers
(Krishnamoorthi 2018, as used by QuaRL and ActorQ) define, for ``n`` bits::

    delta = (|min(W, 0)| + |max(W, 0)|) / 2^n
    Q(W)  = round(W / delta)                       (integer codes, round half to even)
    D(Wq) = delta * Wq

There is no zero point: zero is always exactly representable and the grid is symmetric around it. Since
``|W| <= |min(W, 0)| + |max(W, 0)| = 2^n delta``, no value is ever clipped and

    |W - D(Q(W))| <= delta / 2     element-wise,

up to float32 rounding: the product ``delta * Wq`` is rounded to float32, which adds up to ``2^-24 |W|`` (at most
``2^(n-24) delta``, noticeable from ~12 bits on).

**Code range and dtype.** The step spans the *whole* range ``[min(W, 0), max(W, 0)]`` with ``2^n`` steps, but
the codes are centred on zero, so they lie in ``[-2^n, 2^n]``: a symmetric ``W`` uses ``[-2^(n-1), 2^(n-1)]``
and an all-positive one ``[0, 2^n]`` (its maximum maps to exactly ``2^n``). Holding ``2^(n+1) + 1`` values
takes ``n + 2`` signed bits, so the codes are stored in the smallest integer dtype that always holds them
(:func:`code_dtype`): int8 for ``n <= 6``, int16 for ``7 <= n <= 14`` and int32 for ``n = 15, 16``. In
particular **int8 does not hold 8-bit codes** (an all-positive weight gives code 256, a symmetric one 128).
The step of this "n-bit" quantizer is that of a symmetric n-bit absmax code (``amax / 2^(n-1)``) for a
symmetric range, and up to twice finer for a one-signed tensor, whose codes use only half of ``[-2^n, 2^n]``.

**Edge cases.** An all-zero slice has ``delta = 0``: its codes are 0 and it dequantizes to 0 (no 0/0). A
nonzero ``delta`` below float32's smallest normal (only for slices with every ``|W| < 2^n * 1.2e-38``) is
raised to it, so its reciprocal is finite; the bound ``|W - D(Q(W))| <= delta / 2`` still holds with that
``delta`` (subnormal inputs themselves may be flushed to zero, as XLA:CPU does). As in :mod:`lpjax.quant.int8`,
the division is computed as a multiplication by the correctly rounded float32 reciprocal ``W * f32(1 / delta)``
(XLA rewrites division by a broadcast scale this way anyway), so the codes, ties included, are bit-identical on
every backend and in NumPy; they differ from the exact
``round(W / delta)`` by at most one, and only where ``W / delta`` is within a few float32 ulps of a
half-integer.

**Whole parameter trees.** :func:`quantize_params` applies a PTQ spec (``"fp32"``, ``"fp16"``, ``"int<n>"``,
``"int<n>_per_channel"`` or a dict) to a Flax params pytree and :func:`dequantize_params` undoes it, giving the
"quantize then dequantize to simulate quantization error" policies of QuaRL's Table 1. Following the papers,
weights are quantized (every floating leaf with ``ndim >= 2``: Dense kernels ``(K, N)``, convolution kernels)
and biases and other vectors are kept as they are unless the spec asks for them (``vectors=True``).
Per-channel means one step per *output* channel, the last axis (``N`` of a Dense kernel, ``C_out`` of a
convolution kernel ``(H, W, C_in, C_out)``); vectors are always quantized per tensor.

All functions compute in float32, accept any floating input dtype and are ``jax.jit``-compatible (``bits`` and
``axis`` are static). Inputs must be finite.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

MIN_BITS = 2
MAX_BITS = 16
_TINY = float(np.finfo(np.float32).tiny)


def _check_bits(bits: int) -> int:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(f"bits must be an integer in [{MIN_BITS}, {MAX_BITS}], got {bits!r}.")
    return int(bits)


def code_dtype(bits: int) -> np.dtype:
    """The smallest signed integer dtype holding every code of ``bits``-bit quantization, ``[-2^n, 2^n]``.

    int8 for ``n <= 6``, int16 for ``7 <= n <= 14``, int32 for ``n in (15, 16)`` (see the module docstring:
    ``n``-bit codes need ``n + 2`` signed bits).
    """
    bits = _check_bits(bits)
    for dtype in (np.int8, np.int16, np.int32):
        if 2**bits <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise AssertionError("unreachable: 2^16 fits int32")


def _check_float(name: str, x: jax.Array) -> jax.Array:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name} must have a floating dtype, got {x.dtype}.")
    return x


def _reduce_axes(shape: tuple[int, ...], axis: int | Sequence[int] | None) -> tuple[int, ...]:
    """The axes a step is shared over: all of them (``axis=None``) or all but the kept ``axis``."""
    ndim = len(shape)
    if axis is None:
        return tuple(range(ndim))
    kept = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    for a in kept:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)) or not -ndim <= a < ndim:
            raise ValueError(f"axis {a!r} is out of range for an array of shape {shape}.")
    kept = {int(a) % ndim for a in kept}
    return tuple(a for a in range(ndim) if a not in kept)


def uniform_quantize(x: jax.Array, bits: int, axis: int | Sequence[int] | None = None) -> tuple[jax.Array, jax.Array]:
    """The papers' PTQ: ``delta = (|min(x, 0)| + |max(x, 0)|) / 2^bits``, ``codes = round(x / delta)``.

    ``axis`` names the axes that *keep* their own step (the channel axes, as in
    :func:`lpjax.quant.quantize_int8`); the min and max are taken over all the others. E.g. for a Dense kernel
    ``w: (K, N)``, ``axis=-1`` gives one step per output channel, ``delta`` of shape ``(1, N)``.

    Args:
      x: array of any floating dtype, finite.
      bits: ``n``, an integer in [2, 16].
      axis: ``None`` for a single step, else an axis or a sequence of axes (negative allowed).

    Returns:
      ``(codes, delta)``: integer codes of ``x``'s shape in ``[-2^n, 2^n]`` with dtype :func:`code_dtype`
      ``(bits)`` (int8 only up to 6 bits), and float32 steps of shape ``()`` (per tensor) or ``x``'s shape with
      every axis not in ``axis`` set to 1, so ``codes * delta`` broadcasts. All-zero slices have
      ``delta = 0`` and zero codes.
    """
    x = _check_float("x", x)
    bits = _check_bits(bits)
    return _quantize(x, bits, _reduce_axes(x.shape, axis), axis is not None)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _quantize(x: jax.Array, bits: int, reduce_axes: tuple[int, ...], keepdims: bool) -> tuple[jax.Array, jax.Array]:
    x = x.astype(jnp.float32)
    hi = jnp.max(x, axis=reduce_axes, keepdims=keepdims, initial=0.0)  # max(W, 0)
    lo = jnp.min(x, axis=reduce_axes, keepdims=keepdims, initial=0.0)  # min(W, 0)
    span = hi - lo  # |min(W, 0)| + |max(W, 0)|
    # Multiplying by 2^-n is exact; nonzero steps are at least the smallest normal (finite reciprocal).
    delta = jnp.where(span > 0, jnp.maximum(span * np.float32(2.0**-bits), _TINY), 0.0).astype(jnp.float32)
    inv = jnp.where(delta > 0, 1.0 / jnp.where(delta > 0, delta, 1.0), 0.0)
    limit = float(2**bits)
    codes = jnp.clip(jnp.round(x * inv), -limit, limit).astype(code_dtype(bits))
    return codes, delta


def uniform_dequantize(codes: jax.Array, delta: jax.Array) -> jax.Array:
    """``D(Wq) = delta * Wq`` in float32; ``delta`` broadcasts against ``codes`` (as returned by
    :func:`uniform_quantize`)."""
    codes = jnp.asarray(codes)
    if not jnp.issubdtype(codes.dtype, jnp.integer):
        raise ValueError(f"codes must have an integer dtype, got {codes.dtype}.")
    return codes.astype(jnp.float32) * jnp.asarray(delta, jnp.float32)


# ------------------------------------------------------------------------------------------ parameter trees


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class UniformQuantized:
    """One parameter quantized with :func:`uniform_quantize` (a pytree: ``codes`` and ``delta`` are its leaves).

    Attributes:
      codes: integer codes of the parameter's shape, in ``[-2^bits, 2^bits]``, dtype ``code_dtype(bits)``.
      delta: float32 steps, ``()`` per tensor or ``(1, ..., 1, N)`` per output channel.
      bits: ``n`` (static).
      dtype: name of the original parameter's dtype (static), restored by :meth:`dequantize`.

    ``param ~= dequantize()``, with ``|param - dequantize()| <= delta / 2`` element-wise (plus float32 rounding).
    """

    codes: jax.Array
    delta: jax.Array
    bits: int = dataclasses.field(metadata=dict(static=True))
    dtype: str = dataclasses.field(default="float32", metadata=dict(static=True))

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the quantized parameter."""
        return tuple(self.codes.shape)

    def dequantize(self) -> jax.Array:
        """``delta * codes`` computed in float32, cast to the original dtype."""
        return uniform_dequantize(self.codes, self.delta).astype(self.dtype)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class HalfPrecision:
    """One parameter rounded to float16 (fp16 PTQ; a pytree with one leaf, ``values``).

    Attributes:
      values: the parameter rounded to nearest float16 (finite values above 65504 become inf, as a plain cast).
      dtype: name of the original parameter's dtype (static), restored by :meth:`dequantize`.
    """

    values: jax.Array
    dtype: str = dataclasses.field(default="float32", metadata=dict(static=True))

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the quantized parameter."""
        return tuple(self.values.shape)

    def dequantize(self) -> jax.Array:
        """The float16 values cast back to the original dtype (exactly: float16 is a subset of it)."""
        return self.values.astype(self.dtype)


class QuantSpec(NamedTuple):
    """A normalized PTQ spec (see :func:`parse_spec`).

    Attributes:
      format: ``"fp32"`` (no change), ``"fp16"`` (round to float16) or ``"int"`` (:func:`uniform_quantize`).
      bits: ``n`` for ``"int"``, else ``None``.
      per_channel: ``"int"`` only: one step per output channel (last axis) of each weight instead of per tensor.
      vectors: also quantize floating leaves with ``ndim < 2`` (biases, scalars; always per tensor).
    """

    format: str
    bits: int | None = None
    per_channel: bool = False
    vectors: bool = False

    @property
    def name(self) -> str:
        """A short label, e.g. ``"fp16"``, ``"int8"``, ``"int4_per_channel"`` (``+vectors`` if biases too)."""
        name = self.format if self.format != "int" else f"int{self.bits}" + ("_per_channel" * self.per_channel)
        return name + ("+vectors" if self.vectors and self.format != "fp32" else "")


_SPEC_RE = re.compile(r"^int(\d+)(_per_channel)?$")
_SPEC_KEYS = ("format", "bits", "per_channel", "vectors")


def parse_spec(spec: str | Mapping[str, Any] | QuantSpec) -> QuantSpec:
    """Normalizes a PTQ spec.

    Accepted forms:

    * ``"fp32"`` (identity), ``"fp16"``, ``"int<n>"`` (per tensor, e.g. ``"int8"``, ``"int4"``) and
      ``"int<n>_per_channel"``, with ``n`` in [2, 16]; weights only.
    * a dict with keys ``bits`` (``n``; implies ``format="int"``), ``format`` (``"int"``, ``"fp16"`` or
      ``"fp32"``), ``per_channel`` (bool, default False) and ``vectors`` (bool, default False: biases kept as
      they are), e.g. ``{"bits": 4, "per_channel": True}``;
    * a :class:`QuantSpec`.

    Raises:
      ValueError: for an unknown name or key, or bad bits, naming the valid forms.
      TypeError: for a spec that is not a str, dict or QuantSpec, or a non-bool flag.
    """
    valid = f"'fp32', 'fp16', 'int<n>', 'int<n>_per_channel' (n in [2, 16]) or a dict with keys {', '.join(_SPEC_KEYS)}"
    if isinstance(spec, QuantSpec):
        spec = spec._asdict()
    if isinstance(spec, str):
        text = spec.strip().lower()
        if text in ("fp32", "fp16"):
            return QuantSpec(text)
        match = _SPEC_RE.match(text)
        if not match:
            raise ValueError(f"Unknown quantization spec {spec!r}; valid: {valid}.")
        return QuantSpec("int", _check_bits(int(match.group(1))), bool(match.group(2)))
    if not isinstance(spec, Mapping):
        raise TypeError(f"A quantization spec must be a str or dict, got {type(spec).__name__}; valid: {valid}.")
    unknown = sorted(set(spec) - set(_SPEC_KEYS))
    if unknown:
        raise ValueError(f"Unknown quantization spec keys {unknown}; valid keys: {', '.join(_SPEC_KEYS)}.")
    fmt = spec.get("format", "int" if spec.get("bits") is not None else None)
    if fmt not in ("fp32", "fp16", "int"):
        raise ValueError(f"Quantization spec {dict(spec)!r} needs format 'fp32', 'fp16' or 'int' (or bits).")
    per_channel, vectors = spec.get("per_channel", False), spec.get("vectors", False)
    for key, value in (("per_channel", per_channel), ("vectors", vectors)):
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"Quantization spec key {key!r} must be a bool, got {value!r}.")
    if fmt == "int":
        return QuantSpec("int", _check_bits(spec.get("bits")), bool(per_channel), bool(vectors))
    if spec.get("bits") is not None or per_channel:
        raise ValueError(f"'bits' and 'per_channel' only apply to format 'int', got {dict(spec)!r}.")
    return QuantSpec(fmt, None, False, bool(vectors))


def _is_quantized(x: Any) -> bool:
    return isinstance(x, (UniformQuantized, HalfPrecision))


def _quantize_leaf(path, leaf, spec: QuantSpec):
    if not isinstance(leaf, (jax.Array, np.ndarray, np.generic, float, int)) or isinstance(leaf, bool):
        raise TypeError(f"params{jax.tree_util.keystr(path)}: expected an array leaf, got {type(leaf).__name__}.")
    x = jnp.asarray(leaf)
    if spec.format == "fp32" or not jnp.issubdtype(x.dtype, jnp.floating) or (x.ndim < 2 and not spec.vectors):
        return leaf
    dtype = np.dtype(x.dtype).name
    if spec.format == "fp16":
        return HalfPrecision(x.astype(jnp.float16), dtype)
    axis = -1 if spec.per_channel and x.ndim >= 2 else None
    codes, delta = uniform_quantize(x, spec.bits, axis)
    return UniformQuantized(codes, delta, spec.bits, dtype)


def quantize_params(params: Any, spec: str | Mapping[str, Any] | QuantSpec) -> Any:
    """Post-training quantization of a parameter pytree (e.g. Flax ``params``) according to ``spec``.

    Each floating leaf with ``ndim >= 2`` (and, with ``vectors=True``, every other floating leaf) is replaced by
    a :class:`UniformQuantized` (``"int<n>"``: :func:`uniform_quantize`, per tensor, or per output channel =
    last axis) or a :class:`HalfPrecision` (``"fp16"``); ``"fp32"`` returns the tree unchanged. Non-floating
    leaves and, by default, biases are kept as they are. See :func:`parse_spec` for ``spec``.

    Returns:
      A pytree of the same structure where quantized leaves are :class:`UniformQuantized` /
      :class:`HalfPrecision` nodes; :func:`dequantize_params` turns it back into parameters.

    Raises:
      ValueError, TypeError: for a bad spec (see :func:`parse_spec`).
      TypeError: for a leaf that is not an array or number (e.g. a string), naming its path.
    """
    spec = parse_spec(spec)
    return jax.tree_util.tree_map_with_path(lambda p, x: _quantize_leaf(p, x, spec), params)


def dequantize_params(qparams: Any) -> Any:
    """Inverse of :func:`quantize_params`: every :class:`UniformQuantized` / :class:`HalfPrecision` node becomes
    its dequantized array, in the original leaf's dtype; all other leaves are returned as they are. The result
    has the structure and dtypes of the original params."""
    return jax.tree.map(lambda x: x.dequantize() if _is_quantized(x) else x, qparams, is_leaf=_is_quantized)
