"""Fused half-precision matmul + bias + activation with float32 accumulation, as Pallas kernels.

:func:`fp16_matmul` computes, for ``x: (..., K)`` and ``w: (K, N)`` both ``float16`` or both ``bfloat16``::

    z = sum_k f32(x[..., k]) * f32(w[k, :])       # products exact in f32, accumulated in f32
        + f32(b)                                   # optional bias (N,), any float dtype, added in f32
    y = out_dtype(act(z))                          # act in {none, relu, elu, tanh}, evaluated in f32

and is differentiable through a :func:`jax.custom_vjp` whose backward pass runs the same fused kernel (see
:func:`fp16_matmul` for the exact backward maths). ``impl="reference"`` is the same forward and backward maths in
plain ``jax.numpy``; it defines what the kernels are tested against. ``impl="triton"`` is the Pallas kernel
below (a grid of output tiles, each looping over K with ``jnp.dot``), ``impl="mosaic_gpu"`` the Hopper kernel of
:mod:`lpjax.kernels.fp16_matmul_mosaic_gpu` (TMA pipeline, ``wgmma``), and ``impl="pallas"`` picks between them by the
target GPU. Conventions (``impl``, ``interpret``, padding, power-of-two blocks) are those of
:mod:`lpjax.kernels._common`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from lpjax.kernels import fp16_matmul_mosaic_gpu
from lpjax.kernels._common import (
    check_block,
    check_dtype,
    check_matmul_shapes,
    check_out_dtype,
    compiler_params,
    fit_block,
    pad_to,
    resolve_interpret,
    round_up,
    select_backend,
)

ACTIVATIONS = ("none", "relu", "elu", "tanh")
"""Valid values of :func:`fp16_matmul`'s ``activation`` argument."""

INPUT_DTYPES = (jnp.float16, jnp.bfloat16)
"""Valid dtypes of ``x`` and ``w`` (both the same)."""

OUT_DTYPES = (jnp.float32, jnp.float16, jnp.bfloat16)
"""Valid values of ``out_dtype``."""

MIN_BLOCK = 16
"""Smallest block size: Triton's ``tl.dot`` needs every dimension of its operands to be at least 16."""

# ----------------------------------------------------------------------------------------------------------------
# Activations, in float32.


def _activation(z: jax.Array, activation: str, expm1: Callable[[jax.Array], jax.Array] = jnp.expm1) -> jax.Array:
    """``act(z)`` for a float32 ``z``; also the kernels' epilogue, so only Triton- and Mosaic-GPU-lowerable ops.

    ``expm1`` computes the ELU's ``exp(t) - 1`` for ``t <= 0``; Mosaic GPU, which lowers no ``expm1``, passes
    :func:`_exp_minus_one`.
    """
    if activation == "none":
        return z
    if activation == "relu":
        return jnp.maximum(z, 0.0)
    if activation == "elu":
        return jnp.where(z > 0.0, z, expm1(jnp.minimum(z, 0.0)))
    if activation == "tanh":
        return jnp.tanh(z)
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}.")


def _exp_minus_one(t: jax.Array) -> jax.Array:
    """``exp(t) - 1``, within ``2^-22`` of ``expm1(t)`` for ``t <= 0``.

    ``exp(t)`` lies in ``(0, 1]``, where an ``exp`` accurate to 2 ulps (CUDA's ``expf``; XLA's is tighter) errs by
    at most ``2 * 2^-24``; the subtraction is exact for ``exp(t) >= 1/2`` (Sterbenz) and rounds by at most
    ``2^-25`` below. The error is absolute: near ``t = 0`` it is large relative to ``expm1(t)`` itself.
    """
    return jnp.exp(t) - 1.0


def _activation_grad(z: jax.Array, activation: str) -> jax.Array:
    """``act'(z)`` for a float32 pre-activation ``z`` (relu'(0) = 0 and elu'(0) = 1, as ``jax.nn``'s)."""
    if activation == "relu":
        return (z > 0.0).astype(jnp.float32)
    if activation == "elu":
        return jnp.where(z > 0.0, 1.0, jnp.exp(jnp.minimum(z, 0.0)))
    if activation == "tanh":
        t = jnp.tanh(z)
        return 1.0 - t * t
    return jnp.ones_like(z)


# ----------------------------------------------------------------------------------------------------------------
# The Triton kernel and the reference, on matrices, without autodiff.


@dataclasses.dataclass(frozen=True)
class _Config:
    """Static (non-differentiable) arguments of one call; hashable, so usable as a ``nondiff_argnums``.

    ``impl`` is the resolved backend: ``"triton"``, ``"mosaic_gpu"`` or ``"reference"``.
    """

    activation: str
    out_dtype: np.dtype
    impl: str
    interpret: bool
    block_m: int
    block_n: int
    block_k: int


def _matmul_kernel(*refs, has_bias: bool, save_preact: bool, activation: str, block_k: int, num_k: int):
    """One (block_m, block_n) tile of ``out = act(x @ w + b)``; loops over K in ``block_k`` chunks.

    ``refs`` are ``x_ref (bm, Kp), w_ref (Kp, bn), [b_ref (1, bn) f32], y_ref (bm, bn), [z_ref (bm, bn) f32]``.
    """
    x_ref, w_ref, *refs = refs
    b_ref = refs.pop(0) if has_bias else None
    y_ref, *refs = refs
    z_ref = refs.pop(0) if save_preact else None

    def body(k, acc):
        x_blk = x_ref[:, pl.ds(k * block_k, block_k)]
        w_blk = w_ref[pl.ds(k * block_k, block_k), :]
        return acc + jnp.dot(x_blk, w_blk, preferred_element_type=jnp.float32)

    z = jax.lax.fori_loop(0, num_k, body, jnp.zeros(y_ref.shape, jnp.float32))
    if b_ref is not None:
        z = z + b_ref[...]  # (1, bn) float32, broadcast over the rows
    if z_ref is not None:
        z_ref[...] = z
    y_ref[...] = _activation(z, activation).astype(y_ref.dtype)


def _triton_matmul(x, w, b, cfg: _Config, save_preact: bool):
    """The Triton path on matrices: pads to the blocks, runs the kernel, slices back. Returns ``y`` or ``(y, z)``."""
    m, k, n = x.shape[0], x.shape[1], w.shape[1]
    bm, bn, bk = (
        fit_block(cfg.block_m, m, MIN_BLOCK),
        fit_block(cfg.block_n, n, MIN_BLOCK),
        fit_block(cfg.block_k, k, MIN_BLOCK),
    )
    mp, np_, kp = round_up(m, bm), round_up(n, bn), round_up(k, bk)
    # Zero padding is exact: padded K columns/rows contribute 0 * 0 to every dot product, padded M rows and N
    # columns only produce outputs that are sliced off.
    x_p = pad_to(x, (bm, bk))
    w_p = pad_to(w, (bk, bn))
    operands = [x_p, w_p]
    in_specs = [
        pl.BlockSpec((bm, kp), lambda i, j: (i, 0)),
        pl.BlockSpec((kp, bn), lambda i, j: (0, j)),
    ]
    if b is not None:
        operands.append(pad_to(b.astype(jnp.float32).reshape(1, n), (1, bn)))
        in_specs.append(pl.BlockSpec((1, bn), lambda i, j: (0, j)))
    out_spec = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
    out_shape = [jax.ShapeDtypeStruct((mp, np_), cfg.out_dtype)]
    if save_preact:
        out_shape.append(jax.ShapeDtypeStruct((mp, np_), jnp.float32))
    kernel = functools.partial(
        _matmul_kernel,
        has_bias=b is not None,
        save_preact=save_preact,
        activation=cfg.activation,
        block_k=bk,
        num_k=kp // bk,
    )
    outs = pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=(mp // bm, np_ // bn),
        in_specs=in_specs,
        out_specs=[out_spec] * len(out_shape),
        interpret=cfg.interpret,
        compiler_params=compiler_params(cfg.interpret),
        name="fp16_matmul",
    )(*operands)
    outs = [o[:m, :n] for o in outs]
    return tuple(outs) if save_preact else outs[0]


def _reference_matmul(x, w, b, cfg: _Config, save_preact: bool):
    """The reference path on matrices: the kernel's maths in ``jax.numpy``. Returns ``y`` or ``(y, z)``."""
    z = jnp.dot(x, w, preferred_element_type=jnp.float32)
    if b is not None:
        z = z + b.astype(jnp.float32)
    y = _activation(z, cfg.activation).astype(cfg.out_dtype)
    return (y, z) if save_preact else y


def _matmul(x, w, b, cfg: _Config, save_preact: bool = False):
    """``cfg.impl``'s path on matrices. Empty operands launch no kernel (Pallas cannot take empty blocks): the
    reference gives ``act(b)`` or an empty result."""
    if cfg.impl == "reference" or 0 in (*x.shape, w.shape[1]):
        return _reference_matmul(x, w, b, cfg, save_preact)
    if cfg.impl == "triton":
        return _triton_matmul(x, w, b, cfg, save_preact)
    return fp16_matmul_mosaic_gpu.matmul(
        x,
        w,
        b,
        act=functools.partial(_activation, activation=cfg.activation, expm1=_exp_minus_one),
        out_dtype=cfg.out_dtype,
        blocks=(cfg.block_m, cfg.block_n, cfg.block_k),
        interpret=cfg.interpret,
        save_preact=save_preact,
    )


# ----------------------------------------------------------------------------------------------------------------
# Autodiff.


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _fused(x, w, b, cfg: _Config):
    return _matmul(x, w, b, cfg)


def _fused_fwd(x, w, b, cfg: _Config):
    if cfg.activation == "none":
        return _matmul(x, w, b, cfg), (x, w, b, None)  # act' = 1: no pre-activation needed
    y, z = _matmul(x, w, b, cfg, save_preact=True)
    return y, (x, w, b, z)


def _fused_bwd(cfg: _Config, res, dy):
    x, w, b, z = res
    dz = dy.astype(jnp.float32)
    if z is not None:
        dz = dz * _activation_grad(z, cfg.activation)
    dz_lp = dz.astype(x.dtype)  # the backward matmuls take half-precision operands, like the forward one
    # dx = dz @ w^T and dw = x^T @ dz through the same kernel (no activation, no bias), f32 accumulation, each
    # rounded once to its primal dtype. The transposes are materialized here, outside the kernel.
    dx = _matmul(dz_lp, w.T, None, dataclasses.replace(cfg, activation="none", out_dtype=np.dtype(x.dtype)))
    dw = _matmul(x.T, dz_lp, None, dataclasses.replace(cfg, activation="none", out_dtype=np.dtype(w.dtype)))
    db = None if b is None else jnp.sum(dz, axis=0).astype(b.dtype)
    return dx, dw, db


_fused.defvjp(_fused_fwd, _fused_bwd)


# ----------------------------------------------------------------------------------------------------------------
# Public API.


def fp16_matmul(
    x: jax.Array,
    w: jax.Array,
    b: jax.Array | None = None,
    *,
    activation: str = "none",
    out_dtype: Any = None,
    impl: str = "pallas",
    interpret: bool | None = None,
    block_m: int = 64,
    block_n: int = 64,
    block_k: int = 64,
) -> jax.Array:
    """``act(x @ w + b)`` with half-precision operands, float32 accumulation and a fused epilogue.

    Forward maths (``f32(.)`` is an exact conversion to float32)::

        z[m, n] = sum_k f32(x[m, k]) * f32(w[k, n]) + f32(b[n])      # float32 accumulation
        y[m, n] = out_dtype(act(z[m, n]))                             # act evaluated in float32

    with ``act`` one of ``"none"`` (identity), ``"relu"`` (``max(z, 0)``), ``"elu"`` (``z`` if ``z > 0`` else
    ``exp(z) - 1``) or ``"tanh"``. ``y`` is rounded once, at the end. Both Pallas kernels run over a grid of
    ``(M / block_m, N / block_n)`` output tiles; each tile loops over K in ``block_k`` chunks, accumulating
    exact products in a float32 tile (Triton: ``jnp.dot(..., preferred_element_type=float32)``; Mosaic GPU:
    ``wgmma``), so only the summation order differs from ``impl="reference"`` (and, for Mosaic GPU's ELU,
    ``exp(z) - 1`` in place of ``expm1(z)``: see :mod:`lpjax.kernels.fp16_matmul_mosaic_gpu`).

    Backward (a :func:`jax.custom_vjp`; the same for every ``impl``), with ``dy`` the cotangent of ``y``::

        dz = f32(dy) * act'(z)                   # float32; relu' = [z > 0], elu' = 1 if z > 0 else exp(z),
                                                 # tanh' = 1 - tanh(z)^2
        dx = x.dtype(dz_h @ w^T)                 # dz_h = x.dtype(dz); the same backend, f32 accumulation
        dw = w.dtype(x^T @ dz_h)
        db = b.dtype(sum_m dz[m, :])             # float32 sum

    The forward pass saves ``x``, ``w``, ``b`` and, unless ``activation="none"``, the float32 pre-activation
    ``z``, written by the forward kernel as a second output (no recomputation). ``act'`` could be written from
    ``y`` instead (``1 - y^2`` etc.) at half the memory when ``out_dtype`` is 16-bit, but ``y`` is rounded to
    ``out_dtype``: ``tanh'`` near saturation loses all its digits to cancellation (a bf16 ``y`` rounds to 1 for
    ``z > ~3``, giving ``tanh' = 0`` instead of ``~1e-2``), and a relu/elu output that underflows to 0 zeroes
    the gradient. One float32 (M, N) buffer per layer is cheap next to the matmuls' operands.
    ``dz`` is rounded to the input dtype before the backward matmuls (so they run on half-precision tensor
    cores): in float16 a ``|dz| < 2^-24`` flushes to 0 and ``|dz| > 65504`` overflows, so float16 training
    still needs loss scaling; bfloat16 has float32's range.

    Args:
      x: ``(..., K)``, float16 or bfloat16. Leading axes are flattened into M and restored in the output
        (``(K,)`` gives ``(N,)``).
      w: ``(K, N)``, the same dtype as ``x``.
      b: optional bias ``(N,)`` of any float dtype; added in float32. Its cotangent has its dtype.
      activation: ``"none"``, ``"relu"``, ``"elu"`` or ``"tanh"``.
      out_dtype: dtype of ``y``: float32, float16 or bfloat16; ``None`` means ``x.dtype``.
      impl: ``"pallas"`` (the Pallas backend for the target GPU), ``"triton"``, ``"mosaic_gpu"`` or
        ``"reference"`` (``jax.numpy``); see :mod:`lpjax.kernels._common`.
      interpret: Pallas interpret mode; ``None`` = interpret iff JAX's default backend is the CPU.
      block_m, block_n, block_k: tile sizes, powers of two >= 16 (Triton's ``tl.dot`` minimum). Each is an
        upper bound: a dimension smaller than its block gets the smallest power of two >= it (and >= 16)
        instead. M, N and K are zero-padded to multiples of the blocks and the output sliced back. Mosaic GPU
        raises ``block_m`` to at least 64 (a warpgroup's ``wgmma``) and needs ``block_n <= 256``.

    Returns:
      ``y: (..., N)`` of dtype ``out_dtype``.
    """
    interpret = resolve_interpret(interpret)
    impl = select_backend(impl, kernel="fp16_matmul", interpret=interpret)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}.")
    for name, size in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        check_block(name, size)
        if size < MIN_BLOCK:
            raise ValueError(f"{name} must be >= {MIN_BLOCK} (Triton's dot minimum), got {size}.")
    x, w = jnp.asarray(x), jnp.asarray(w)
    check_dtype("x", x, INPUT_DTYPES)
    check_dtype("w", w, INPUT_DTYPES)
    if x.dtype != w.dtype:
        raise ValueError(f"x and w must have the same dtype, got {x.dtype} and {w.dtype}.")
    if x.ndim < 1:
        raise ValueError("x must have shape (..., K), got a scalar.")
    batch_shape = x.shape[:-1]
    x2 = x.reshape(math.prod(batch_shape), x.shape[-1])
    _, _, n = check_matmul_shapes(x2, w.shape)
    if b is not None:
        b = jnp.asarray(b)
        if not jnp.issubdtype(b.dtype, jnp.floating):
            raise ValueError(f"b must have a float dtype, got {b.dtype}.")
        if b.shape != (n,):
            raise ValueError(f"b must have shape (N,) = ({n},), got {b.shape}.")
    out_dtype = check_out_dtype(x.dtype if out_dtype is None else out_dtype, OUT_DTYPES)
    cfg = _Config(activation, out_dtype, impl, interpret, block_m, block_n, block_k)
    y = _fused(x2, w, b, cfg)
    return y.reshape(*batch_shape, n)
