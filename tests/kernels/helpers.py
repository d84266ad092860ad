"""Shared helpers of the kernel tests: where the kernels run, the Pallas backends each test runs, and CUDA lowering
under an abstract GPU.

The kernels run compiled on a GPU and in interpret mode anywhere else (:data:`INTERPRET`), so the same tests
check the Pallas kernels in a CPU's interpreter and on a real GPU (``make test-gpu``).

A backend is skipped only where it cannot run here: Triton once jax no longer ships it; compiled Mosaic GPU on a
GPU that is not a Hopper one (``wgmma`` is sm_90a); and the Mosaic GPU interpreter of jax < 0.11.2 for 8-bit
kernels (it cannot read the transposed SMEM operand of an 8-bit ``wgmma``). Lowering needs no GPU and no skip on
jax >= 0.10.2: it runs for an abstract GPU.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

import jax
import pytest

from benchmarks.kernels import describe_lowering
from lpjax.kernels import lower_for_cuda
from lpjax.kernels._common import TRITON_AVAILABLE, is_hopper, target_device_kind
from lpjax.kernels._mosaic_gpu import INTERPRETS_TRANSPOSED_OPERANDS

ON_GPU = jax.default_backend() == "gpu"
"""Whether JAX's default backend is a GPU."""

INTERPRET = not ON_GPU
"""The ``interpret`` argument the tests pass: compiled kernels on a GPU, interpret mode elsewhere."""

_NOT_HOPPER = pytest.mark.skipif(
    ON_GPU and not is_hopper(target_device_kind()), reason="compiled Mosaic GPU kernels need a Hopper (sm_90a) GPU"
)
_SKIPS = {
    "triton": [pytest.mark.skipif(not TRITON_AVAILABLE, reason="this jax no longer ships Pallas' Triton backend")],
    "mosaic_gpu": [_NOT_HOPPER],
    "mosaic_gpu_8bit": [
        _NOT_HOPPER,
        pytest.mark.skipif(
            INTERPRET and not INTERPRETS_TRANSPOSED_OPERANDS,
            reason="the Mosaic GPU interpreter of jax < 0.11.2 cannot read an 8-bit wgmma's transposed SMEM operand",
        ),
    ],
}


def on_host(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` evaluated on the CPU: the tests' references. XLA:CPU multiplies 8-bit and 16-bit
    operands exactly and sums in float32, as the references' docstrings say; a GPU's XLA may instead run an 8-bit
    dot on tensor cores whose accumulator keeps fewer bits (see ``FP8_TENSOR_CORE_ERR``)."""
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        return fn(*jax.device_put(args, cpu), **kwargs)


FP8_TENSOR_CORE_ERR = 2.0**-11
"""Error allowed a compiled Mosaic GPU fp8 kernel, relative to each output's sum of ``|products|``. Hopper's fp8
``wgmma`` adds products into its accumulator with about 14 significant bits, not float32's 24 (DeepSeek-V3,
section 3.3.2, which is why the kernel promotes every 128-slice to float32): its slice sums differ from float32
sums by up to about ``2^-13`` of that magnitude (measured on an H100: 1.1e-4 to 1.7e-4). The bound allows 4x. The
interpreter and Triton's kernel, which accumulates in float32, are held to float32's bounds."""


def fp8_tensor_core_err(impl: str) -> float:
    """:data:`FP8_TENSOR_CORE_ERR` for a compiled Mosaic GPU kernel, 0 otherwise."""
    return FP8_TENSOR_CORE_ERR if impl == "mosaic_gpu" and not INTERPRET else 0.0


def backend_params(impl: str, cases: Iterable[tuple] = ((),), *, eight_bit: bool = False) -> list[Any]:
    """``pytest.param(impl, *case)`` for each case, skipped where ``impl`` cannot run here (``eight_bit``: an 8-bit
    ``wgmma`` kernel)."""
    key = "mosaic_gpu_8bit" if impl == "mosaic_gpu" and eight_bit else impl
    marks = _SKIPS.get(key, [])
    return [pytest.param(impl, *case, marks=marks) for case in cases]


def lowered(fn: Callable[..., Any], *args: Any, arch: str) -> dict[str, Any]:
    """:func:`benchmarks.kernels.describe_lowering` of ``fn`` lowered for CUDA on ``arch``, failing on any
    ``DeprecationWarning`` that leaks out of :func:`~lpjax.kernels.lower_for_cuda` (which silences the Triton
    backend's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        return describe_lowering(lower_for_cuda(fn, *args, arch=arch))


def wgmma(m: int, n: int, k: int, acc: str, operand: str) -> str:
    """The PTX ``wgmma`` instruction of one warpgroup's ``(m, n, k)`` step, e.g. ``wgmma(64, 128, 32, "f32",
    "e4m3")``."""
    return f"wgmma.mma_async.sync.aligned.m{m}n{n}k{k}.{acc}.{operand}.{operand}"
