"""Blockwise-FP8 GEMM on Hopper with DeepGEMM's fp32 promotion: the Mosaic GPU kernel of
:func:`lpjax.kernels.fp8_blockwise_matmul`.

Given E4M3 activation codes ``qa: (M, K)`` with per-token group scales ``s_a: (M, G)`` and weight codes
``qw: (K, N)`` with 128 x 128 block scales ``s_w: (G, N/128)`` (``G = K/128``), the CTA of output tile
``(i, j)`` (``block_m`` rows, the 128 columns of weight block column ``j``) computes::

    acc = 0                                                    # float32, registers
    for g in 0 .. G-1:                                         # one 128-wide K slice per step
        part = qa[rows, slice g] @ qw[slice g, cols]           # wgmma e4m3 x e4m3 -> float32, a fresh accumulator
        acc  = acc + part * s_a[rows, g] * s_w[g, j]           # promotion: scale, then add in float32
    y = out_dtype(acc + bias[cols])

which is :func:`lpjax.kernels.fp8_blockwise_matmul`'s reference formula, term for term and in the same order of
float32 operations; only the summation order inside one 128-slice (the tensor core's) can differ.

TMA streams ``(block_m, 128)`` code tiles of ``qa``, ``(128, 128)`` code tiles of the weight and the
``(1, block_m)`` row of ``s_a`` for each slice through a :data:`STAGES`-deep SMEM pipeline. Each step's
``wgmma`` accumulates into its own zeroed float32 accumulator and is waited for before the promotion, so the
tensor core never sums more than 128 products of one slice, as DeepSeek-V3 prescribes (its fp8 accumulation is
narrower than float32). The tile's weight scales ``s_w[:, j]`` and bias are copied to SMEM once, by TMA.

Layouts: an 8-bit ``wgmma`` needs both operands K-major, so the weight codes are passed as ``qw^T: (N, K)`` and
the kernel multiplies by the transposed SMEM view. ``s_a`` is passed as ``(G, M)`` so its per-slice block is a
row, and ``s_w`` as ``(N/128, G)`` padded to 4 columns (TMA copies whole 16-byte rows).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from lpjax.kernels._common import fit_block, pad_to
from lpjax.kernels._mosaic_gpu import (
    STAGES,
    WGMMA_M,
    broadcast_columns,
    broadcast_rows,
    launch,
    store_tile,
    swizzled,
    tile_slices,
)

BLOCK = 128
"""Weight block side, activation group width and the kernel's K step and N tile."""


def _kernel(*refs, has_bias: bool, block_m: int, num_slices: int) -> None:
    """One output tile. ``refs``: ``qa (Mp, Kp) e4m3, s_a^T (G, Mp), qw^T (Np, Kp) e4m3, s_w^T (Np/128, Gp),
    [bias (Np,)]`` in GMEM, the output ``(Mp, Np)`` in GMEM, then scratch ``s_w column (Gp,), [bias (128,)],
    barriers``."""
    qa_gmem, sa_gmem, qw_gmem, sw_gmem, *refs = refs
    b_gmem = refs.pop(0) if has_bias else None
    o_gmem, sw_smem, *refs = refs
    rows, cols = tile_slices(block_m, BLOCK)
    sw_barrier = refs.pop()
    plgpu.copy_gmem_to_smem(sw_gmem.at[jax.lax.axis_index("n")], sw_smem, sw_barrier)
    if has_bias:
        b_smem, b_barrier = refs
        plgpu.copy_gmem_to_smem(b_gmem.at[cols], b_smem, b_barrier)
    plgpu.barrier_wait(sw_barrier)

    def add_slice(step, qa_smem, qw_smem, sa_smem, acc):
        (g,) = step

        def multiply(part):
            plgpu.wgmma(part, qa_smem, qw_smem.transpose((1, 0)))
            return part[...]

        part = pl.run_scoped(multiply, plgpu.ACC((block_m, BLOCK), jnp.float32))
        return acc + part * broadcast_rows(sa_smem[0, :], part.shape) * sw_smem[g]

    codes = swizzled(qa_gmem.dtype, BLOCK)
    acc = plgpu.emit_pipeline(
        add_slice,
        grid=(num_slices,),
        max_concurrent_steps=STAGES,
        in_specs=[
            plgpu.BlockSpec((block_m, BLOCK), lambda g: (0, g), transforms=codes),
            plgpu.BlockSpec((BLOCK, BLOCK), lambda g: (0, g), transforms=codes),
            plgpu.BlockSpec((1, block_m), lambda g: (g, 0)),
        ],
        init_carry=jnp.zeros((block_m, BLOCK), jnp.float32),
    )(qa_gmem.at[rows, :], qw_gmem.at[cols, :], sa_gmem.at[:, rows])
    if has_bias:
        plgpu.barrier_wait(b_barrier)
        acc = acc + broadcast_columns(b_smem[...], acc.shape)
    store_tile(acc.astype(o_gmem.dtype), o_gmem.at[rows, cols])


def matmul(
    qa: jax.Array,
    sa: jax.Array,
    codes: jax.Array,
    scales: jax.Array,
    bias: jax.Array | None,
    out_dtype: jnp.dtype,
    interpret: bool,
    block_m: int,
) -> jax.Array:
    """``(M, N)`` result of the module docstring's formula for ``qa: (M, K)``, ``sa: (M, G)``, ``codes: (K, N)``,
    ``scales: (G, ceil(N/128))``. Pads with zero codes and zero activation scales (padding adds nothing),
    rearranges the operands as the kernel takes them, runs it and slices back."""
    m, n = qa.shape[0], codes.shape[1]
    bm = fit_block(max(block_m, WGMMA_M), m, WGMMA_M)
    qa = pad_to(qa, (bm, BLOCK))
    sa_t = pad_to(sa, (bm, 1)).T
    qw_t = pad_to(codes, (BLOCK, BLOCK)).T
    sw_t = pad_to(scales.T, (1, 4))
    (mp, kp), np_ = qa.shape, qw_t.shape[0]
    operands = [qa, sa_t, qw_t, sw_t]
    scratch = [plgpu.SMEM((sw_t.shape[1],), jnp.float32)]
    if bias is not None:
        operands.append(pad_to(bias.astype(jnp.float32), (BLOCK,)))
        scratch += [plgpu.SMEM((BLOCK,), jnp.float32), plgpu.Barrier()]
    scratch.append(plgpu.Barrier())
    body = functools.partial(_kernel, has_bias=bias is not None, block_m=bm, num_slices=kp // BLOCK)
    [out] = launch(
        body, operands, [out_dtype], scratch, (mp, np_), (bm, BLOCK), (m, n), interpret, transposed_operands=True
    )
    return out
