"""Plumbing shared by lpjax's Mosaic GPU (Hopper) kernels: launch, interpret mode, swizzled SMEM, TMA copies.

Every Mosaic GPU kernel in :mod:`kernels` has the same shape: one CTA of one warpgroup (128 threads) per
``(block_m, block_n)`` output tile, on a grid named ``("m", "n")`` (:func:`launch`). Operands stay in global
memory (GMEM); the kernel streams tiles into shared memory (SMEM) with TMA, multiplies them with ``wgmma`` into a
float32 (or int32) accumulator held in registers, and writes its output tile back through SMEM with a TMA store
(:func:`store_tile`).

``wgmma`` reads SMEM tiles in the swizzled layout TMA writes: rows of ``minor`` elements split into 8-row tiles
of the widest swizzle (32, 64 or 128 bytes) that divides a row (:func:`swizzled`). Its M is 64 rows per
warpgroup, its N a multiple of 8 up to 256, its K 32 bytes per instruction. 16-bit operands may be stored either
way round; 8-bit ones (fp8, int8) must be K-major, so the kernels take the 8-bit weight as ``(N, K)`` and hand
``wgmma`` its transpose, a view.

SMEM holds :data:`STAGES` copies of both operand tiles of a K step, then the output tile: for 16-bit operands
``STAGES * 2 * (block_m * block_k + block_k * block_n)`` bytes and more. Blocks that exceed a Hopper CTA's
227 KiB (e.g. ``block_n = 256`` with ``block_k = 128``) are refused by Mosaic GPU when the kernel is lowered.

The kernels use Mosaic GPU's warpgroup lowering semantics: register layouts are inferred, so an epilogue can
broadcast a row or column vector loaded from SMEM across the accumulator without naming layouts.

Interpret mode runs a kernel in Mosaic GPU's interpreter on the CPU (:func:`interpret_params`). The interpreter
of jax < 0.11.2 cannot read a transposed SMEM view, which every 8-bit ``wgmma`` needs; those kernels refuse
interpret mode there (:data:`INTERPRETS_TRANSPOSED_OPERANDS`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from lpjax.kernels._common import kernel_name

try:
    from jax.experimental.pallas.mosaic_gpu import InterpretGPUParams
except ImportError:  # jax < 0.11.1 has Mosaic GPU's interpreter but does not export its parameters
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

INTERPRETS_TRANSPOSED_OPERANDS = jax.__version_info__ >= (0, 11, 2)
"""Whether Mosaic GPU's interpreter in the installed jax reads transposed SMEM views (``ref.transpose``)."""

WGMMA_M = 64
"""Rows of one warpgroup's ``wgmma``: a kernel's ``block_m`` is a multiple of it."""

WGMMA_MAX_N = 256
"""Largest N of one ``wgmma``: a kernel's ``block_n`` is at most this."""

STAGES = 3
"""SMEM pipeline depth: TMA copies in flight for upcoming K steps."""


def swizzled(dtype: Any, minor: int) -> tuple[Any, ...]:
    """SMEM transforms for a tile whose rows hold ``minor`` elements of ``dtype``: 8-row tiles with the widest
    swizzle (32, 64 or 128 bytes) that divides a row, the layout TMA writes and ``wgmma`` reads."""
    itemsize = jnp.dtype(dtype).itemsize
    swizzle = plgpu.find_swizzle(minor * itemsize * 8)
    return plgpu.TilingTransform((8, swizzle // itemsize)), plgpu.SwizzleTransform(swizzle)


def interpret_params(interpret: bool, *, kernel: str, transposed_operands: bool) -> Any:
    """``plgpu.kernel``'s ``interpret`` argument: Mosaic GPU's interpreter, or ``None`` to compile.

    Raises a ``ValueError`` for a kernel with ``transposed_operands`` (every 8-bit ``wgmma``) in interpret mode
    on a jax whose interpreter cannot run it.
    """
    if not interpret:
        return None
    if transposed_operands and not INTERPRETS_TRANSPOSED_OPERANDS:
        raise ValueError(
            f"{kernel}'s Mosaic GPU kernel cannot run in interpret mode on jax {jax.__version__}: its "
            "interpreter cannot read the transposed operand of an 8-bit wgmma (jax >= 0.11.2 can). "
            "Use impl='triton' or 'reference' on a CPU."
        )
    return InterpretGPUParams()


def launch(
    body: Callable[..., None],
    operands: Sequence[jax.Array],
    out_dtypes: Sequence[Any],
    scratch_types: Sequence[Any],
    padded: tuple[int, int],
    blocks: tuple[int, int],
    size: tuple[int, int],
    interpret: bool,
    *,
    transposed_operands: bool,
) -> list[jax.Array]:
    """Runs ``body(*operand_refs, *out_refs, *scratch_refs)`` once per ``blocks = (block_m, block_n)`` tile of the
    ``padded = (Mp, Np)`` outputs (one per ``out_dtypes``), on a grid named ``("m", "n")``, one warpgroup per tile,
    with warpgroup lowering semantics, and returns the outputs cut back to ``size = (m, n)``.

    ``body`` is a ``functools.partial`` of a kernel body, named by :func:`kernel_name`. ``interpret`` runs Mosaic
    GPU's interpreter (:func:`interpret_params`, which refuses ``transposed_operands`` where that interpreter cannot
    read them).
    """
    name = kernel_name(body)
    kernel = plgpu.kernel(
        body,
        out_type=tuple(jax.ShapeDtypeStruct(padded, dtype) for dtype in out_dtypes),
        scratch_types=tuple(scratch_types),
        grid=(padded[0] // blocks[0], padded[1] // blocks[1]),
        grid_names=("m", "n"),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=interpret_params(interpret, kernel=name, transposed_operands=transposed_operands),
        kernel_name=name,
    )
    return [out[: size[0], : size[1]] for out in kernel(*operands)]


def tile_slices(block_m: int, block_n: int) -> tuple[pl.Slice, pl.Slice]:
    """The rows and columns of the output tile of the current program: ``(m * block_m, n * block_n)`` onward."""
    return (pl.ds(jax.lax.axis_index("m") * block_m, block_m), pl.ds(jax.lax.axis_index("n") * block_n, block_n))


def check_block_n(block_n: int) -> None:
    """Raises a ``ValueError`` unless ``block_n`` fits one ``wgmma`` (<= :data:`WGMMA_MAX_N`)."""
    if block_n > WGMMA_MAX_N:
        raise ValueError(
            f"block_n must be <= {WGMMA_MAX_N} (the largest wgmma N) for impl='mosaic_gpu', got {block_n}."
        )


def accumulate(a_gmem: Any, b_gmem: Any, acc_dtype: Any, *, block_k: int, b_k_major: bool) -> jax.Array:
    """The ``(block_m, block_n)`` tile ``a @ b`` summed over all of K in ``acc_dtype`` by ``wgmma``.

    ``a_gmem`` is the tile's ``(block_m, K)`` row band; ``b_gmem`` its ``(K, block_n)`` column band, or
    ``(block_n, K)`` if ``b_k_major`` (8-bit operands), multiplied through its transposed SMEM view. TMA streams
    ``block_k``-wide slices through a :data:`STAGES`-deep pipeline; each step issues an asynchronous ``wgmma``
    and waits for the previous one, so a matmul overlaps the next copies, and a stage is refilled only once the
    ``wgmma`` that read it has finished (``delay_release=1``).
    """
    (block_m, k), block_n = a_gmem.shape, b_gmem.shape[0 if b_k_major else 1]
    # wgmma reads both operands with one swizzle: that of the narrower minor dimension (both are powers of two).
    transforms = swizzled(a_gmem.dtype, block_k if b_k_major else min(block_k, block_n))
    a_spec = plgpu.BlockSpec((block_m, block_k), lambda s: (0, s), transforms=transforms, delay_release=1)
    if b_k_major:
        b_spec = plgpu.BlockSpec((block_n, block_k), lambda s: (0, s), transforms=transforms, delay_release=1)
    else:
        b_spec = plgpu.BlockSpec((block_k, block_n), lambda s: (s, 0), transforms=transforms, delay_release=1)

    def run(acc):
        def step(_, a_smem, b_smem):
            plgpu.wgmma(acc, a_smem, b_smem.transpose((1, 0)) if b_k_major else b_smem)
            plgpu.wgmma_wait(1)

        plgpu.emit_pipeline(step, grid=(k // block_k,), max_concurrent_steps=STAGES, in_specs=[a_spec, b_spec])(
            a_gmem, b_gmem
        )
        return acc[...]

    return pl.run_scoped(run, plgpu.ACC((block_m, block_n), acc_dtype))


def store_tile(value: jax.Array, dst: Any) -> None:
    """Writes the register tile ``value`` to the GMEM ref ``dst`` through swizzled SMEM with a TMA store, and waits
    until SMEM has been read."""

    def store(smem):
        smem[...] = value
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem, dst)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    pl.run_scoped(store, plgpu.SMEM(value.shape, value.dtype, transforms=swizzled(value.dtype, value.shape[1])))


def broadcast_rows(column: jax.Array, shape: tuple[int, int]) -> jax.Array:
    """``column[:, None]`` broadcast to ``shape``: one value per row of a tile."""
    return jax.lax.broadcast_in_dim(column, shape, [0])


def broadcast_columns(row: jax.Array, shape: tuple[int, int]) -> jax.Array:
    """``row[None, :]`` broadcast to ``shape``: one value per column of a tile."""
    return jax.lax.broadcast_in_dim(row, shape, [1])
