"""``act(x @ w + b)`` with fp16/bf16 operands on Hopper: the Mosaic GPU kernel of :func:`lpjax.kernels.fp16_matmul`.

For ``x: (M, K)`` and ``w: (K, N)`` (both float16 or both bfloat16) and an optional float32 bias, the CTA of
output tile ``(i, j)`` computes, with ``rows = i*block_m ...`` and ``cols = j*block_n ...``::

    z = sum over K steps s of  x[rows, s] @ w[s, cols]      # wgmma: exact products, float32 accumulator
        + b[cols]                                           # float32, broadcast over the rows
    y = out_dtype(act(z))                                   # act in float32, one rounding

TMA streams the ``(block_m, block_k)`` tiles of ``x`` and the ``(block_k, block_n)`` tiles of ``w`` through a
pipelined K loop (:func:`lpjax.kernels._mosaic_gpu.accumulate`) whose ``wgmma`` steps accumulate into a float32
register tile. The bias is copied by TMA while the K loop runs. The epilogue stores ``y`` and, for the
backward pass, the float32 ``z``, each with a TMA store.

Only the float32 summation order differs from ``impl="reference"``, and the ELU: Mosaic GPU lowers no ``expm1``,
so :func:`lpjax.kernels.fp16_matmul.fp16_matmul` passes an ``act`` that evaluates ``exp(t) - 1`` for ``t <= 0``, whose
absolute error is below ``2^-22`` (:func:`lpjax.kernels.fp16_matmul._exp_minus_one`).

Blocks: ``block_m`` is a power of two >= 64 (a warpgroup's ``wgmma`` has 64 rows), ``block_n`` <= 256 (the
largest ``wgmma`` N); both shrink to the problem as in :func:`lpjax.kernels._common.fit_block`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

from lpjax.kernels._common import fit_block, pad_to
from lpjax.kernels._mosaic_gpu import (
    WGMMA_M,
    accumulate,
    broadcast_columns,
    check_block_n,
    launch,
    store_tile,
    tile_slices,
)

MIN_BLOCK = 16
"""Smallest ``block_n`` / ``block_k``: a 16-bit ``wgmma`` step has K = 16, and TMA rows are >= 16 bytes."""


def _kernel(
    *refs,
    has_bias: bool,
    save_preact: bool,
    act: Callable[[jax.Array], jax.Array],
    block_m: int,
    block_n: int,
    block_k: int,
) -> None:
    """One output tile. ``refs``: ``x (Mp, Kp), w (Kp, Np), [b (Np,) f32]`` in GMEM, outputs ``y (Mp, Np),
    [z (Mp, Np) f32]`` in GMEM, then scratch ``[b_smem (block_n,) f32, barrier]``."""
    x_gmem, w_gmem, *refs = refs
    b_gmem = refs.pop(0) if has_bias else None
    y_gmem = refs.pop(0)
    z_gmem = refs.pop(0) if save_preact else None
    rows, cols = tile_slices(block_m, block_n)
    if has_bias:
        b_smem, barrier = refs
        plgpu.copy_gmem_to_smem(b_gmem.at[cols], b_smem, barrier)

    z = accumulate(x_gmem.at[rows, :], w_gmem.at[:, cols], jnp.float32, block_k=block_k, b_k_major=False)
    if has_bias:
        plgpu.barrier_wait(barrier)
        z = z + broadcast_columns(b_smem[...], z.shape)
    store_tile(act(z).astype(y_gmem.dtype), y_gmem.at[rows, cols])
    if save_preact:
        store_tile(z, z_gmem.at[rows, cols])


def matmul(
    x: jax.Array,
    w: jax.Array,
    b: jax.Array | None,
    *,
    act: Callable[[jax.Array], jax.Array],
    out_dtype: jnp.dtype,
    blocks: tuple[int, int, int],
    interpret: bool,
    save_preact: bool,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """``y = out_dtype(act(x @ w + b))`` for non-empty matrices, and ``(y, z)`` with the float32 pre-activation
    ``z`` if ``save_preact``. Pads to the blocks (zeros add nothing to the sums), runs the kernel, slices back."""
    (m, k), n = x.shape, w.shape[1]
    block_m, block_n, block_k = blocks
    check_block_n(block_n)
    bm = fit_block(max(block_m, WGMMA_M), m, WGMMA_M)
    bn, bk = fit_block(block_n, n, MIN_BLOCK), fit_block(block_k, k, MIN_BLOCK)
    x_p, w_p = pad_to(x, (bm, bk)), pad_to(w, (bk, bn))
    mp, np_ = x_p.shape[0], w_p.shape[1]
    operands = [x_p, w_p]
    scratch = []
    if b is not None:
        operands.append(pad_to(b.astype(jnp.float32), (bn,)))
        scratch = [plgpu.SMEM((bn,), jnp.float32), plgpu.Barrier()]
    out_dtypes = [out_dtype, jnp.float32] if save_preact else [out_dtype]
    body = functools.partial(
        _kernel, has_bias=b is not None, save_preact=save_preact, act=act, block_m=bm, block_n=bn, block_k=bk
    )
    outs = launch(
        body, operands, out_dtypes, scratch, (mp, np_), (bm, bn), (m, n), interpret, transposed_operands=False
    )
    return tuple(outs) if save_preact else outs[0]
