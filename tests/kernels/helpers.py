"""Shared helpers of the kernel tests: the Pallas backends each test runs, and CUDA lowering under an abstract GPU.

A backend is skipped only where the installed jax cannot run it on a CPU: Triton once jax no longer ships it,
and the Mosaic GPU interpreter of jax < 0.11.2 for 8-bit kernels (it cannot read the transposed SMEM operand of
an 8-bit ``wgmma``). Lowering needs no GPU and no skip on jax >= 0.10.2: it runs for an abstract GPU.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from lpjax.kernels._common import TRITON_AVAILABLE, describe_lowering, lower_for_cuda
from lpjax.kernels._mosaic_gpu import INTERPRETS_TRANSPOSED_OPERANDS

_SKIPS = {
    "triton": pytest.mark.skipif(not TRITON_AVAILABLE, reason="this jax no longer ships Pallas' Triton backend"),
    "mosaic_gpu_8bit": pytest.mark.skipif(
        not INTERPRETS_TRANSPOSED_OPERANDS,
        reason="the Mosaic GPU interpreter of jax < 0.11.2 cannot read an 8-bit wgmma's transposed SMEM operand",
    ),
}


def backend_params(impl: str, cases: Iterable[tuple] = ((),), *, eight_bit: bool = False) -> list[Any]:
    """``pytest.param(impl, *case)`` for each case, skipped where ``impl`` cannot run in interpret mode here
    (``eight_bit``: an 8-bit ``wgmma`` kernel)."""
    key = "mosaic_gpu_8bit" if impl == "mosaic_gpu" and eight_bit else impl
    marks = [_SKIPS[key]] if key in _SKIPS else []
    return [pytest.param(impl, *case, marks=marks) for case in cases]


def lowered(fn: Callable[..., Any], *args: Any, arch: str) -> dict[str, Any]:
    """:func:`lpjax.kernels._common.describe_lowering` of ``fn`` lowered for CUDA on ``arch``, failing on any
    ``DeprecationWarning`` that leaks out of :func:`~lpjax.kernels._common.lower_for_cuda` (which silences the Triton
    backend's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        return describe_lowering(lower_for_cuda(fn, *args, arch=arch))


def wgmma(m: int, n: int, k: int, acc: str, operand: str) -> str:
    """The PTX ``wgmma`` instruction of one warpgroup's ``(m, n, k)`` step, e.g. ``wgmma(64, 128, 32, "f32",
    "e4m3")``."""
    return f"wgmma.mma_async.sync.aligned.m{m}n{n}k{k}.{acc}.{operand}.{operand}"
