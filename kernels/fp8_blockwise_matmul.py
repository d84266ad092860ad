"""Blockwise FP8 (E4M3) matmul, W8A8 with DeepSeek-V3 / DeepGEMM scales and "fp32 promotion".

``y = fp8_blockwise_matmul(x, w)`` approximates ``x @ w`` for ``x: (M, K)`` and ``w: (K, N)``:

* ``w`` is quantized in 128 x 128 tiles, ``(qw, s_w) = quantize_fp8_blockwise(w)`` (or passed pre-quantized as
  an :class:`~lpjax.quant.Fp8BlockwiseWeight`), with ``s_w: (ceil(K/128), ceil(N/128))``;
* ``x`` is quantized dynamically per token per group of 128 columns,
  ``(qa, s_a) = quantize_fp8_per_token_group(x)`` with ``s_a: (M, ceil(K/128))``;
* each 128-wide slice ``g`` of K is multiplied in fp8 and accumulated in float32, then scaled, and the scaled
  slices are summed in float32 (the "fp32 promotion" of DeepSeek-V3, Sec. 3.3.2)::

      C[m, n] = sum_g  s_a[m, g] * s_w[g, n // 128] * ( sum_{k in slice g} qa[m, k] * qw[k, n] )
      y[m, n] = out_dtype( C[m, n] + bias[n] )

  Each inner sum has 128 exact products (e4m3 x e4m3 fits float32), and slices are added in increasing ``g``.

``impl="reference"`` evaluates this in plain ``jax.numpy`` (one fp8 x fp8 -> float32 matmul per slice, in a
``lax.scan``); it is the definition. Two Pallas kernels compute it on a grid of ``(M / block_m, N / 128)``
output tiles, each looping over K in 128-slices:

* ``impl="triton"``: in the style of DeepSeek-V3's ``fp8_gemm_kernel``, with ``lax.fori_loop`` and
  ``jnp.dot(fp8, fp8, preferred_element_type=float32)``; Triton's fp8 dot needs an sm_89+ GPU (Ada, Hopper);
* ``impl="mosaic_gpu"``: the Hopper kernel of :mod:`lpjax.kernels.fp8_blockwise_matmul_mosaic_gpu`, in the style of
  DeepGEMM: TMA pipeline, one fp8 ``wgmma`` per slice into a fresh float32 accumulator, promoted in registers.

``impl="pallas"`` picks between them by the target GPU (:mod:`lpjax.kernels._common`). On a CPU the kernels run in
interpret mode (slow, for tests).

Gradients (straight-through): for a high-precision ``w`` both quantizers count as the identity in the backward
pass (``dx`` uses the fp8 weight of the forward pass), so an fp8 Dense layer can be trained::

    dx = g @ dequantize(qw)^T        dw = x^T @ g        dbias = sum_m g[m]

computed in float32 (at JAX's default matmul precision) and cast to the primal dtypes. For a pre-quantized
:class:`~lpjax.quant.Fp8BlockwiseWeight` the weight is a constant: ``dx`` is as above and the weight's
cotangent is zero (codes and scales); pass the high-precision weight to train it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from lpjax.kernels import fp8_blockwise_matmul_mosaic_gpu
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
from lpjax.quant.fp8 import (
    FP8_DTYPE,
    Fp8BlockwiseWeight,
    dequantize_fp8_blockwise,
    quantize_fp8_blockwise,
    quantize_fp8_per_token_group,
)

BLOCK = 128
"""Weight tile side and activation group width (fixed: the kernel's N tile and K slice)."""

INPUT_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
"""Allowed dtypes of ``x``, of a high-precision ``w`` and of ``bias``."""

OUT_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
"""Allowed ``out_dtype`` values."""

MIN_BLOCK_M = 16
"""Smallest ``block_m``: Triton's ``tl.dot`` needs every tile dimension >= 16."""


def fp8_blockwise_matmul(
    x: jax.Array,
    w: jax.Array | Fp8BlockwiseWeight,
    *,
    bias: jax.Array | None = None,
    out_dtype=jnp.float32,
    impl: str = "pallas",
    interpret: bool | None = None,
    block_m: int = 64,
) -> jax.Array:
    """W8A8 blockwise-FP8 ``x @ w + bias`` (see the module docstring for the exact formula and gradients).

    Args:
      x: ``(M, K)`` activations, float32 / bfloat16 / float16; quantized per token per 128-group of K.
      w: ``(K, N)`` high-precision weight of one of those dtypes (quantized here in 128 x 128 tiles, and
        differentiable straight-through), or a pre-quantized :class:`~lpjax.quant.Fp8BlockwiseWeight` (128 x 128
        tiles; its cotangent is zero).
      bias: optional ``(N,)`` bias, added in float32 before the cast to ``out_dtype``.
      out_dtype: float32, bfloat16 or float16.
      impl: ``"pallas"`` (the Pallas backend for the target GPU), ``"triton"``, ``"mosaic_gpu"`` or
        ``"reference"``; see :mod:`lpjax.kernels._common`.
      interpret: Pallas interpret mode; ``None`` picks it on a CPU backend. Ignored by the reference.
      block_m: rows of ``x`` per kernel tile, a power of two >= 16. It is reduced to the smallest power of two
        >= max(M, 16) when M is small, so a single token is not padded to 64 rows. Mosaic GPU raises it to at
        least 64 (a warpgroup's ``wgmma``).

    Returns:
      ``(M, N)`` array of ``out_dtype``.
    """
    interpret = resolve_interpret(interpret)
    impl = select_backend(impl, kernel="fp8_blockwise_matmul", interpret=interpret)
    check_block("block_m", block_m)
    if block_m < MIN_BLOCK_M:
        raise ValueError(f"block_m must be >= {MIN_BLOCK_M} (Triton dot tiles), got {block_m}.")
    x = jnp.asarray(x)
    check_dtype("x", x, INPUT_DTYPES)
    out_dtype = check_out_dtype(out_dtype, OUT_DTYPES)
    if isinstance(w, Fp8BlockwiseWeight):
        _check_quantized_weight(w)
    else:
        w = jnp.asarray(w)
        if w.ndim == 2:
            check_dtype("w", w, INPUT_DTYPES)
    _, _, n = check_matmul_shapes(x, w.shape)
    if bias is not None:
        bias = jnp.asarray(bias)
        check_dtype("bias", bias, INPUT_DTYPES)
        if bias.shape != (n,):
            raise ValueError(f"bias must have shape ({n},), got {bias.shape}.")
    return _fp8_matmul(x, w, bias, out_dtype, impl, interpret, int(block_m))


def _check_quantized_weight(w: Fp8BlockwiseWeight) -> None:
    codes, scales = w
    if codes.ndim != 2:
        raise ValueError(f"w.codes must be a matrix (K, N), got shape {codes.shape}.")
    check_dtype("w.codes", codes, [FP8_DTYPE])
    check_dtype("w.scales", scales, [jnp.float32])
    expected = (-(-codes.shape[0] // BLOCK), -(-codes.shape[1] // BLOCK))
    if tuple(scales.shape) != expected:
        raise ValueError(
            f"w.scales must have shape {expected} (128 x 128 tiles of codes {codes.shape}), got {scales.shape}."
        )


def _forward(x, qw, bias, out_dtype, impl, interpret, block_m):
    qa, sa = quantize_fp8_per_token_group(x, BLOCK)
    if impl == "reference":
        return _reference(qa, sa, qw, bias, out_dtype)
    if impl == "triton":
        return _triton(qa, sa, qw, bias, out_dtype, interpret, block_m)
    return fp8_blockwise_matmul_mosaic_gpu.matmul(qa, sa, qw.codes, qw.scales, bias, out_dtype, interpret, block_m)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _fp8_matmul(x, w, bias, out_dtype, impl, interpret, block_m):
    qw = w if isinstance(w, Fp8BlockwiseWeight) else quantize_fp8_blockwise(w, BLOCK)
    return _forward(x, qw, bias, out_dtype, impl, interpret, block_m)


def _fp8_matmul_fwd(x, w, bias, out_dtype, impl, interpret, block_m):
    qw = w if isinstance(w, Fp8BlockwiseWeight) else quantize_fp8_blockwise(w, BLOCK)
    out = _forward(x, qw, bias, out_dtype, impl, interpret, block_m)
    return out, (x, w, qw, bias)


def _fp8_matmul_bwd(out_dtype, impl, interpret, block_m, residuals, g):
    del out_dtype, impl, interpret, block_m
    x, w, qw, bias = residuals
    g = g.astype(jnp.float32)
    dx = jnp.dot(g, dequantize_fp8_blockwise(qw, BLOCK).T, preferred_element_type=jnp.float32)
    if isinstance(w, Fp8BlockwiseWeight):
        dw = jax.tree.map(jnp.zeros_like, w)
    else:
        dw = jnp.dot(x.astype(jnp.float32).T, g, preferred_element_type=jnp.float32).astype(w.dtype)
    dbias = None if bias is None else jnp.sum(g, axis=0).astype(bias.dtype)
    return dx.astype(x.dtype), dw, dbias


_fp8_matmul.defvjp(_fp8_matmul_fwd, _fp8_matmul_bwd)


def _reference(qa, sa, qw, bias, out_dtype):
    """The module docstring's formula in jnp: per-slice float32 matmuls, scaled, summed over slices in order."""
    m, k = qa.shape
    n = qw.codes.shape[1]
    groups = -(-k // BLOCK)
    a = pad_to(qa, (1, BLOCK)).reshape(m, groups, BLOCK).transpose(1, 0, 2)  # (G, M, 128) fp8
    b = pad_to(qw.codes, (BLOCK, BLOCK))
    b = b.reshape(groups, BLOCK, b.shape[1])  # (G, 128, Np) fp8
    s_w = jnp.repeat(qw.scales, BLOCK, axis=1)  # (G, Np)

    def add_slice(acc, slice_g):
        a_g, b_g, s_a_g, s_w_g = slice_g
        # fp8 operands, float32 accumulation: XLA may use a native fp8 GEMM (e.g. on Hopper) or upcast. Products of
        # e4m3 values are exact in float32, and e4m3 values are exact in bfloat16 and TF32 too, so every
        # matmul precision setting gives exact products.
        part = jnp.dot(a_g, b_g, preferred_element_type=jnp.float32)
        return acc + part * s_a_g[:, None] * s_w_g[None, :], None

    acc = jnp.zeros((m, b.shape[2]), jnp.float32)
    acc, _ = jax.lax.scan(add_slice, acc, (a, b, sa.T, s_w))
    acc = acc[:, :n]
    if bias is not None:
        acc = acc + bias.astype(jnp.float32)
    return acc.astype(out_dtype)


def _kernel(qa_ref, sa_ref, qw_ref, sw_ref, *rest, num_slices, has_bias):
    """One (block_m, 128) output tile; the refs hold the tile's rows / column over the whole padded K."""
    bias_ref, o_ref = rest if has_bias else (None, rest[0])

    def add_slice(g, acc):
        k = pl.multiple_of(g * BLOCK, BLOCK)
        part = jnp.dot(
            qa_ref[:, pl.ds(k, BLOCK)], qw_ref[pl.ds(k, BLOCK), :], preferred_element_type=jnp.float32
        )  # (block_m, 128), fp8 x fp8 -> f32
        return acc + part * sa_ref[:, pl.ds(g, 1)] * sw_ref[pl.ds(g, 1), :]  # (block_m, 1) and (1, 1) scales

    acc = jax.lax.fori_loop(0, num_slices, add_slice, jnp.zeros(o_ref.shape, jnp.float32))
    if has_bias:
        acc = acc + bias_ref[...]
    o_ref[...] = acc.astype(o_ref.dtype)


def _triton(qa, sa, qw, bias, out_dtype, interpret, block_m):
    m = qa.shape[0]
    n = qw.codes.shape[1]
    block_m = fit_block(block_m, m, MIN_BLOCK_M)
    # Zero codes in the padding contribute nothing whatever their scales; padded scales are 0 (activations, rows
    # that are sliced off) and the weight's own scales already cover the padded K and N.
    qa = pad_to(qa, (block_m, BLOCK))
    sa = pad_to(sa, (block_m, 1))
    codes = pad_to(qw.codes, (BLOCK, BLOCK))
    kernel = functools.partial(_kernel, num_slices=qa.shape[1] // BLOCK)
    out = jax.ShapeDtypeStruct((m, n), out_dtype)
    return scaled_gemm_call(kernel, (qa, sa), (codes, qw.scales), bias, out, (block_m, BLOCK), interpret)


__all__ = ["BLOCK", "INPUT_DTYPES", "OUT_DTYPES", "fp8_blockwise_matmul"]
