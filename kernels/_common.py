"""Conventions shared by lpjax's Pallas kernels: implementation choice, interpret mode, padding, blocks.

Every kernel in :mod:`kernels` has two implementations with one signature:

* ``impl="pallas"``: a Pallas kernel. It is compiled for GPUs through Triton; on a CPU it can only run in
  Pallas' interpret mode (``interpret=None`` picks interpret mode when JAX's default backend is the CPU), which
  is slow and meant for tests;
* ``impl="reference"``: the same maths in plain ``jax.numpy``, the definition the kernel is tested against.

Operands whose shapes are not multiples of the block sizes are zero-padded by the wrappers (:func:`pad_to`) and
the result is sliced back, so a kernel never reads out of bounds on a GPU. Block sizes must be powers of two
(a requirement of Triton, checked by :func:`check_block`).

:func:`lower_for_cuda` lowers a kernel for ``platforms=["cuda"]`` with :mod:`jax.export`. It runs on a machine
without a GPU and catches Triton lowering errors (non-power-of-two blocks, unsupported casts) there.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import export
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

IMPLS = ("pallas", "reference")
"""Valid values of every kernel's ``impl`` argument."""

TRITON_CUSTOM_CALL = "__gpu$xla.gpu.triton"
"""Custom-call target of a Triton-lowered Pallas kernel (it has no export-compatibility guarantee)."""


def check_impl(impl: str) -> str:
    """Returns ``impl`` if it is one of :data:`IMPLS`, else raises a ``ValueError`` naming the valid ones."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}.")
    return impl


def resolve_interpret(interpret: bool | None) -> bool:
    """``interpret=None`` means: interpret mode when JAX's default backend is the CPU, compiled otherwise."""
    if interpret is None:
        return jax.default_backend() == "cpu"
    return bool(interpret)


def compiler_params(interpret: bool, *, num_warps: int = 4, num_stages: int = 3) -> Any:
    """Triton compiler parameters for a compiled kernel, ``None`` in interpret mode.

    Passing Triton parameters also selects Pallas' Triton backend for GPUs (rather than Mosaic GPU).
    """
    if interpret:
        return None
    return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def check_block(name: str, size: int) -> int:
    """Returns ``size`` if it is a positive power of two, else raises a ``ValueError``."""
    if not isinstance(size, (int, np.integer)) or size <= 0 or size & (size - 1):
        raise ValueError(f"{name} must be a positive power of two, got {size!r}.")
    return int(size)


def check_dtype(name: str, x: jax.Array, allowed: Sequence[Any]) -> None:
    """Raises a ``ValueError`` unless ``x.dtype`` is one of ``allowed``."""
    allowed = [np.dtype(d) for d in allowed]
    if np.dtype(x.dtype) not in allowed:
        raise ValueError(f"{name} must have dtype in {[d.name for d in allowed]}, got {np.dtype(x.dtype).name}.")


def check_out_dtype(out_dtype: Any, allowed: Sequence[Any]) -> np.dtype:
    """Returns ``out_dtype`` as a numpy dtype if it is one of ``allowed``, else raises a ``ValueError``."""
    try:
        dtype = np.dtype(out_dtype)
    except TypeError:
        dtype = None
    if dtype not in [np.dtype(d) for d in allowed]:
        raise ValueError(f"out_dtype must be one of {[np.dtype(d).name for d in allowed]}, got {out_dtype!r}.")
    return dtype


def check_matmul_shapes(x: jax.Array, w_shape: Sequence[int]) -> tuple[int, int, int]:
    """Checks ``x: (M, K)`` against a weight of shape ``(K, N)`` and returns ``(M, K, N)``."""
    if x.ndim != 2:
        raise ValueError(f"x must be a matrix (M, K), got shape {x.shape}; flatten leading axes first.")
    if len(w_shape) != 2:
        raise ValueError(f"w must be a matrix (K, N), got shape {tuple(w_shape)}.")
    if x.shape[1] != w_shape[0]:
        raise ValueError(f"Contraction sizes differ: x is {x.shape}, w is {tuple(w_shape)}.")
    return x.shape[0], x.shape[1], w_shape[1]


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is >= ``n``."""
    return -(-n // multiple) * multiple


def pad_to(x: jax.Array, multiples: Sequence[int]) -> jax.Array:
    """Zero-pads each axis of ``x`` at its end up to a multiple of ``multiples[axis]`` (1 = no padding)."""
    widths = [(0, round_up(size, m) - size) for size, m in zip(x.shape, multiples)]
    if all(hi == 0 for _, hi in widths):
        return x
    return jnp.pad(x, widths)


def bias_operand(bias: jax.Array, n: int, block_n: int) -> tuple[jax.Array, pl.BlockSpec]:
    """A bias ``(N,)`` as a float32 row ``(1, Np)`` zero-padded to ``block_n``, and the BlockSpec that gives
    output tile ``(i, j)`` its ``block_n`` columns."""
    row = pad_to(bias.astype(jnp.float32).reshape(1, n), (1, block_n))
    return row, pl.BlockSpec((1, block_n), lambda i, j: (0, j))


def output_tiled_call(kernel: Callable[..., None], operands: Sequence[jax.Array], in_specs: Sequence[pl.BlockSpec],
                      *, out_shape: tuple[int, int], out_dtype: Any, block_m: int, block_n: int, interpret: bool,
                      name: str) -> jax.Array:
    """``pallas_call`` over a grid of ``(block_m, block_n)`` output tiles of a padded ``out_shape`` matrix.

    Each program ``(i, j)`` writes output tile ``(i, j)`` and loops over K itself: Triton programs run in
    parallel, so a reduction cannot be spread over grid steps.
    """
    rows, cols = out_shape
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((rows, cols), out_dtype),
        grid=(rows // block_m, cols // block_n),
        in_specs=list(in_specs),
        out_specs=pl.BlockSpec((block_m, block_n), lambda i, j: (i, j)),
        interpret=interpret,
        compiler_params=compiler_params(interpret),
        name=name,
    )(*operands)


def lower_for_cuda(fn: Callable[..., Any], *args: Any) -> export.Exported:
    """Lowers ``jax.jit(fn)`` for ``platforms=["cuda"]`` with :mod:`jax.export`, on any machine.

    ``args`` are arrays or ``jax.ShapeDtypeStruct``. The Triton custom call of Pallas has no compatibility
    guarantee, so that single safety check is disabled. Lowering runs the Pallas-to-Triton lowering, so errors
    such as non-power-of-two blocks surface here; compiling and running need a GPU.
    """
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    return export.export(
        jax.jit(fn), platforms=["cuda"],
        disabled_checks=[export.DisabledSafetyCheck.custom_call(TRITON_CUSTOM_CALL)])(*shapes)
