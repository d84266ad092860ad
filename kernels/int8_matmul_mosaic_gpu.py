"""Int8 GEMM with per-token and per-channel scales on Hopper: the Mosaic GPU kernel of
:func:`lpjax.kernels.int8_matmul`.

For int8 codes ``q_x: (M, K)``, ``q_w: (K, N)`` with float32 scales ``s_x: (M,)``, ``s_w: (N,)`` and an optional
float32 bias, the CTA of output tile ``(i, j)`` computes::

    acc = sum over K steps s of  q_x[rows, s] @ q_w[s, cols]     # wgmma s8 x s8 -> int32, exact
    y   = out_dtype( epilogue(acc, s_x[rows], s_w[cols], bias[cols]) )

with ``epilogue`` the float32 ``float32(acc) * s_x * s_w + bias`` of :func:`lpjax.kernels.int8_matmul` (passed in, so
both implementations share it). Integer sums are exact in any order, so the int32 accumulator equals the
reference's; the float32 epilogue may differ by one rounding where XLA fuses its multiply and add.

The K loop is :func:`lpjax.kernels._mosaic_gpu.accumulate` with ``block_k`` >= 32 (an 8-bit ``wgmma`` step has K = 32
bytes). An 8-bit ``wgmma`` needs both operands K-major, so the weight codes are passed as ``q_w^T: (N, K)``. The
tile's scales and bias are copied to SMEM by TMA while the K loop runs.
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
    broadcast_rows,
    check_block_n,
    launch,
    store_tile,
    tile_slices,
)

MIN_BLOCK_N = 16
"""Smallest ``block_n``: ``wgmma`` N is a multiple of 8 and TMA rows of the float32 scales are >= 16 bytes."""

MIN_BLOCK_K = 32
"""Smallest ``block_k``: an 8-bit ``wgmma`` step has K = 32."""


def _kernel(
    *refs, has_bias: bool, epilogue: Callable[..., jax.Array], block_m: int, block_n: int, block_k: int
) -> None:
    """One output tile. ``refs``: ``q_x (Mp, Kp), s_x (Mp,), q_w^T (Np, Kp), s_w (Np,), [bias (Np,)]`` in GMEM, the
    output ``(Mp, Np)`` in GMEM, then scratch: an SMEM vector and a barrier per vector operand."""
    qx_gmem, sx_gmem, qw_gmem, sw_gmem, *refs = refs
    vectors = [sx_gmem, sw_gmem] + ([refs.pop(0)] if has_bias else [])
    o_gmem, *refs = refs
    smems, barriers = refs[: len(vectors)], refs[len(vectors) :]
    rows, cols = tile_slices(block_m, block_n)
    for src, index, smem, barrier in zip(vectors, (rows, cols, cols), smems, barriers):
        plgpu.copy_gmem_to_smem(src.at[index], smem, barrier)
    acc = accumulate(qx_gmem.at[rows, :], qw_gmem.at[cols, :], jnp.int32, block_k=block_k, b_k_major=True)
    for barrier in barriers:
        plgpu.barrier_wait(barrier)
    sx = broadcast_rows(smems[0][...], acc.shape)
    sw = broadcast_columns(smems[1][...], acc.shape)
    bias = broadcast_columns(smems[2][...], acc.shape) if has_bias else None
    store_tile(epilogue(acc, sx, sw, bias).astype(o_gmem.dtype), o_gmem.at[rows, cols])


def matmul(
    qx: jax.Array,
    sx: jax.Array,
    qw: jax.Array,
    sw: jax.Array,
    bias: jax.Array | None,
    *,
    epilogue: Callable[..., jax.Array],
    out_dtype: jnp.dtype,
    blocks: tuple[int, int, int],
    interpret: bool,
) -> jax.Array:
    """``(M, N)`` result for ``qx: (M, K)`` int8, ``sx: (M, 1)``, ``qw: (K, N)`` int8, ``sw: (N,)``. Pads with zero
    codes (they add nothing to the sums), rearranges the weight K-major, runs the kernel and slices back."""
    (m, k), n = qx.shape, qw.shape[1]
    block_m, block_n, block_k = blocks
    check_block_n(block_n)
    bm = fit_block(max(block_m, WGMMA_M), m, WGMMA_M)
    bn, bk = fit_block(block_n, n, MIN_BLOCK_N), fit_block(max(block_k, MIN_BLOCK_K), k, MIN_BLOCK_K)
    qx = pad_to(qx, (bm, bk))
    qw_t = pad_to(qw, (bk, bn)).T
    operands = [qx, pad_to(sx.reshape(m), (bm,)), qw_t, pad_to(sw, (bn,))]
    if bias is not None:
        operands.append(pad_to(bias.astype(jnp.float32), (bn,)))
    sizes = [bm, bn] + ([bn] if bias is not None else [])
    scratch = [plgpu.SMEM((size,), jnp.float32) for size in sizes] + [plgpu.Barrier() for _ in sizes]
    mp, np_ = qx.shape[0], qw_t.shape[0]
    body = functools.partial(_kernel, has_bias=bias is not None, epilogue=epilogue, block_m=bm, block_n=bn, block_k=bk)
    [out] = launch(
        body, operands, [out_dtype], scratch, (mp, np_), (bm, bn), (m, n), interpret, transposed_operands=True
    )
    return out
