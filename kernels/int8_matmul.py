"""Symmetric int8 matmul: int8 x int8 products accumulated exactly in int32, rescaled in a float32 epilogue.

``y = int8_matmul(x, w)`` approximates ``x @ w`` for ``x: (M, K)`` and ``w: (K, N)``:

* ``x`` is quantized per token, ``(q_x, s_x) = quantize_int8_per_token(x)`` with ``s_x: (M, 1)``, or passed
  pre-quantized as that tuple;
* ``w`` is quantized per output channel, ``quantize_int8_weight(w) = Int8Weight(q_w, s_w)`` with ``s_w: (N,)``,
  or passed pre-quantized;
* then::

      acc[m, n] = sum_k q_x[m, k] * q_w[k, n]                          (int32, exact)
      y[m, n]   = out_dtype( float32(acc[m, n]) * s_x[m] * s_w[n] + bias[n] )

  in that order of float32 operations. The int32 sum cannot overflow: ``|acc| <= 127^2 K``, and K is limited to
  :data:`MAX_K` = ``(2^31 - 1) // 127^2``.

``impl="reference"`` evaluates this with one ``jnp.dot(..., preferred_element_type=int32)``; it is the
definition. Two Pallas kernels compute it on a grid of ``(M / block_m, N / block_n)`` output tiles, each looping
over K in ``block_k`` slices into an int32 accumulator:

* ``impl="triton"``: ``lax.fori_loop`` and int8 ``jnp.dot`` (int8 tensor cores, sm_80+);
* ``impl="mosaic_gpu"``: the Hopper kernel of :mod:`lpjax.kernels.int8_matmul_mosaic_gpu` (TMA pipeline, s8 ``wgmma``).

``impl="pallas"`` picks between them by the target GPU (:mod:`lpjax.kernels._common`); on a CPU they run in interpret
mode. All give identical int32 accumulations (integer sums are exact in any order); the float32 epilogue may
differ by one rounding where XLA fuses the multiply and the bias add into an FMA in one of them.

This is an inference kernel: it has no gradient. Differentiating through it raises a ``TypeError``; train with
a float matmul or :func:`lpjax.kernels.fp8_blockwise_matmul.fp8_blockwise_matmul` (straight-through gradients).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from lpjax.kernels import int8_matmul_mosaic_gpu
from lpjax.kernels._common import (
    check_block,
    check_dtype,
    check_matmul_shapes,
    check_out_dtype,
    fit_block,
    pad_to,
    resolve_interpret,
    scaled_gemm_call,
    select_backend,
)
from lpjax.quant.int8 import Int8Weight, quantize_int8_per_token, quantize_int8_weight

INPUT_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
"""Allowed dtypes of a high-precision ``x`` or ``w`` and of ``bias``."""

OUT_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
"""Allowed ``out_dtype`` values."""

MAX_K = (2**31 - 1) // 127**2
"""Largest contraction size whose int32 accumulation cannot overflow (133143)."""

MIN_BLOCK = 16
"""Smallest block size: Triton's ``tl.dot`` needs every tile dimension >= 16."""

MIN_BLOCK_K = 32
"""Smallest K slice of an int8 kernel: the K step of an 8-bit tensor-core MMA (Triton's and ``wgmma``'s)."""


def int8_matmul(
    x: jax.Array | tuple[jax.Array, jax.Array],
    w: jax.Array | Int8Weight,
    *,
    bias: jax.Array | None = None,
    out_dtype=jnp.float32,
    impl: str = "pallas",
    interpret: bool | None = None,
    block_m: int = 64,
    block_n: int = 64,
    block_k: int = 64,
) -> jax.Array:
    """Int8 ``x @ w + bias`` with per-token and per-output-channel scales (module docstring: exact formula).

    Args:
      x: ``(M, K)`` float32 / bfloat16 / float16 activations (quantized per token here), or a pre-quantized
        tuple ``(codes, scales)``: ``(M, K)`` int8 and ``(M, 1)`` (or ``(M,)``) float32.
      w: ``(K, N)`` weight of one of those float dtypes (quantized per output channel here), or an
        :class:`~lpjax.quant.Int8Weight`.
      bias: optional ``(N,)`` bias, added in float32 before the cast to ``out_dtype``.
      out_dtype: float32, bfloat16 or float16.
      impl: ``"pallas"`` (the Pallas backend for the target GPU), ``"triton"``, ``"mosaic_gpu"`` or
        ``"reference"``; see :mod:`lpjax.kernels._common`.
      interpret: Pallas interpret mode; ``None`` picks it on a CPU backend. Ignored by the reference.
      block_m, block_n, block_k: kernel tile sizes, powers of two >= 16. ``block_m`` is reduced to the smallest
        power of two >= max(M, 16) when M is small. ``block_k`` is raised to at least 32, the K step of an 8-bit
        tensor-core MMA. Mosaic GPU raises ``block_m`` to at least 64 (a warpgroup's ``wgmma``) and needs
        ``block_n <= 256``.

    Returns:
      ``(M, N)`` array of ``out_dtype``. Not differentiable (inference only).
    """
    interpret = resolve_interpret(interpret)
    impl = select_backend(impl, kernel="int8_matmul", interpret=interpret)
    for name, size in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        check_block(name, size)
        if size < MIN_BLOCK:
            raise ValueError(f"{name} must be >= {MIN_BLOCK} (Triton dot tiles), got {size}.")
    out_dtype = check_out_dtype(out_dtype, OUT_DTYPES)

    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise ValueError("A pre-quantized x must be a tuple (codes, scales).")
        qx, sx = jnp.asarray(x[0]), jnp.asarray(x[1])
        check_dtype("x codes", qx, [jnp.int8])
        check_dtype("x scales", sx, [jnp.float32])
        if qx.ndim != 2:
            raise ValueError(f"x codes must be a matrix (M, K), got shape {qx.shape}.")
        if sx.shape not in ((qx.shape[0], 1), (qx.shape[0],)):
            raise ValueError(f"x scales must have shape ({qx.shape[0]}, 1), got {sx.shape}.")
        sx = sx.reshape(qx.shape[0], 1)
    else:
        x = jnp.asarray(x)
        check_dtype("x", x, INPUT_DTYPES)
        if x.ndim != 2:
            raise ValueError(f"x must be a matrix (M, K), got shape {x.shape}; flatten leading axes first.")
        qx, sx = quantize_int8_per_token(x)

    if isinstance(w, Int8Weight):
        qw, sw = jnp.asarray(w.codes), jnp.asarray(w.scales)
        check_dtype("w.codes", qw, [jnp.int8])
        check_dtype("w.scales", sw, [jnp.float32])
        if qw.ndim != 2 or sw.shape != (qw.shape[-1],):
            raise ValueError(f"w must have (K, N) codes and (N,) scales, got {qw.shape} and {sw.shape}.")
    else:
        w = jnp.asarray(w)
        check_dtype("w", w, INPUT_DTYPES)
        if w.ndim != 2:
            raise ValueError(f"w must be a matrix (K, N), got shape {w.shape}.")
        qw, sw = quantize_int8_weight(w)

    _, k, n = check_matmul_shapes(qx, qw.shape)
    if k > MAX_K:
        raise ValueError(f"K = {k} > {MAX_K} could overflow the int32 accumulator.")
    if bias is not None:
        bias = jnp.asarray(bias)
        check_dtype("bias", bias, INPUT_DTYPES)
        if bias.shape != (n,):
            raise ValueError(f"bias must have shape ({n},), got {bias.shape}.")
    return _int8_matmul(qx, sx, qw, sw, bias, out_dtype, impl, interpret, (int(block_m), int(block_n), int(block_k)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _int8_matmul(qx, sx, qw, sw, bias, out_dtype, impl, interpret, blocks):
    if impl == "reference":
        return _reference(qx, sx, qw, sw, bias, out_dtype)
    if impl == "triton":
        return _triton(qx, sx, qw, sw, bias, out_dtype, interpret, blocks)
    return int8_matmul_mosaic_gpu.matmul(
        qx, sx, qw, sw, bias, epilogue=_epilogue, out_dtype=out_dtype, blocks=blocks, interpret=interpret
    )


def _int8_matmul_fwd(*args):
    return _int8_matmul(*args), None


def _int8_matmul_bwd(*_):
    raise TypeError(
        "int8_matmul is an inference kernel and has no gradient; train with a float matmul or "
        "lpjax.kernels.fp8_blockwise_matmul (straight-through gradients)."
    )


_int8_matmul.defvjp(_int8_matmul_fwd, _int8_matmul_bwd)


def _epilogue(acc, sx, sw, bias):
    """``float32(acc) * s_x * s_w + bias`` in float32, the epilogue of both implementations."""
    y = acc.astype(jnp.float32) * sx * sw
    return y if bias is None else y + bias


def _reference(qx, sx, qw, sw, bias, out_dtype):
    acc = jnp.dot(qx, qw, preferred_element_type=jnp.int32)
    bias = None if bias is None else bias.astype(jnp.float32)[None, :]
    return _epilogue(acc, sx, sw[None, :], bias).astype(out_dtype)


def _kernel(qx_ref, sx_ref, qw_ref, sw_ref, *rest, block_k, num_slices, has_bias):
    """One (block_m, block_n) output tile; the code refs hold the tile's rows / columns over the padded K."""
    bias_ref, o_ref = rest if has_bias else (None, rest[0])

    def add_slice(i, acc):
        k = pl.multiple_of(i * block_k, block_k)
        return acc + jnp.dot(
            qx_ref[:, pl.ds(k, block_k)], qw_ref[pl.ds(k, block_k), :], preferred_element_type=jnp.int32
        )

    acc = jax.lax.fori_loop(0, num_slices, add_slice, jnp.zeros(o_ref.shape, jnp.int32))
    y = _epilogue(acc, sx_ref[...], sw_ref[...], bias_ref[...] if has_bias else None)
    o_ref[...] = y.astype(o_ref.dtype)


def _triton(qx, sx, qw, sw, bias, out_dtype, interpret, blocks):
    block_m, block_n, block_k = blocks
    m = qx.shape[0]
    n = qw.shape[1]
    block_m = fit_block(block_m, m, MIN_BLOCK)
    # An 8-bit MMA step has K = 32: a 16-wide K slice is counted twice on a GPU (the interpreter cannot tell).
    block_k = max(block_k, MIN_BLOCK_K)
    # Zero codes in the padding add nothing to the int32 sums; padded rows / columns are sliced off.
    qx = pad_to(qx, (block_m, block_k))
    sx = pad_to(sx, (block_m, 1))
    qw = pad_to(qw, (block_k, block_n))
    sw = pad_to(sw.reshape(1, n), (1, block_n))
    kernel = functools.partial(_kernel, block_k=block_k, num_slices=qx.shape[1] // block_k)
    out = jax.ShapeDtypeStruct((m, n), out_dtype)
    return scaled_gemm_call(kernel, (qx, sx), (qw, sw), bias, out, (block_m, block_n), interpret)


__all__ = ["INPUT_DTYPES", "MAX_K", "OUT_DTYPES", "int8_matmul"]
