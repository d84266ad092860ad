"""What ``matmul_impl="auto"`` means for a dense layer: XLA's dot or lpjax's Pallas kernel, per device, dtype and
shape, chosen from GPU measurements kept here with their source.

:func:`lpjax.nn.policy_dense` (and every module built on it) resolves ``matmul_impl="auto"`` with
:func:`resolve_matmul_impl` when it is traced, from the GEMM's shape ``(M, K, N)`` (``M`` the rows of the flattened
input), its matmul dtype and the device the program is built for (JAX's default device, or the abstract GPU of an
ahead-of-time lowering, :func:`lpjax.kernels._common.abstract_gpu`):

* not a GPU (CPU, TPU): ``"xla"``. lpjax's Pallas kernels target GPUs; elsewhere they only run interpreted.
* a float32/float64 matmul: ``"xla"``, the only implementation.
* a GPU with a :class:`MatmulTable` whose ``applies_to`` matches its ``device_kind``: among the table's
  measurements of that matmul dtype, the one at the shape nearest to ``(M, K, N)`` (Euclidean distance of
  ``log2 M, log2 K, log2 N``) decides: its fastest implementation. When measurements at the same distance
  disagree, ``"xla"``.
* any other GPU (no measurement): ``"xla"``, the behaviour before ``"auto"`` existed.

Both implementations compute the same maths: for a float16/bfloat16 matmul XLA's dot (``"xla"``) or
:func:`lpjax.kernels.fp16_matmul` (``"pallas"``); for an fp8 one the blockwise W8A8 GEMM's jnp reference run by
XLA (``"xla"``) or :func:`lpjax.kernels.fp8_blockwise_matmul` (``"pallas"``). So ``"auto"`` changes speed, not
results beyond the rounding the two already differ by (tests/nn/test_dense.py).

What the table says (:data:`HOPPER`: an H100, jax 0.11.2, CUPTI GPU time, ``benchmarks/results/kernels_gpu.json``):
XLA's bf16 dot beats the Mosaic GPU bf16 kernel at every measured shape (1.12x at 1024^3, 2.13x at the LLM
prefill 4096^3, 1.87x at a 16-row decode), so half-precision layers use XLA; the fp8 kernel beats the fp8 GEMM's
XLA reference (one SAC update at 1024 x 1024, batch 1024: 0.71 against 1.74 ms, 273 against 728 kernels),
so fp8 layers use the kernel. float16 has no measurement of its own: it runs the same kernels and tensor-core rate
as bfloat16, so the bfloat16 rows stand for it (:attr:`MatmulTable.same_as`).

``benchmarks/gpu_suite.py`` (part ``matmul``) re-measures every row on a lent GPU and prints the table it implies,
so a new measurement replaces a row here with its new source.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lpjax.kernels._common import HOPPER_DEVICE_KIND, target_device_kind

AUTO = "auto"
"""The ``matmul_impl`` value resolved by :func:`resolve_matmul_impl`."""

CHOICES = ("xla", "pallas")
"""What ``"auto"`` resolves to."""

_KERNEL_DTYPES = ("float16", "bfloat16", "float8_e4m3fn")
"""Matmul dtypes that have a Pallas kernel; every other one resolves to ``"xla"``."""


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One measured comparison of the implementations of a GEMM.

    Attributes:
      dtype: the matmul dtype's name (``"bfloat16"``, ``"float8_e4m3fn"``).
      shape: ``(M, K, N)`` of the GEMM.
      ms: GPU time per implementation (``"xla"``, ``"pallas"``), in milliseconds, of the same work.
      what: what was timed (per product, or per SAC update made of such GEMMs).
    """

    dtype: str
    shape: tuple[int, int, int]
    ms: Mapping[str, float]
    what: str

    @property
    def fastest(self) -> str:
        """The implementation with the least time."""
        return min(self.ms, key=self.ms.__getitem__)


@dataclasses.dataclass(frozen=True)
class MatmulTable:
    """Measurements of one kind of GPU, with their source.

    Attributes:
      device: the GPU measured (its ``device_kind``).
      applies_to: regular expression of the ``device_kind`` values the table is used for.
      jax: the jax version measured with.
      date: when.
      source: the benchmark and result file the numbers come from, and how they were timed.
      measurements: the :class:`Measurement` rows.
      same_as: matmul dtypes without rows of their own, mapped to the dtype whose rows stand for them.
    """

    device: str
    applies_to: str
    jax: str
    date: str
    source: str
    measurements: tuple[Measurement, ...]
    same_as: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def matches(self, device_kind: str) -> bool:
        """Whether this table is used for a GPU of this ``device_kind``."""
        return re.search(self.applies_to, device_kind) is not None

    def choose(self, dtype: str, shape: Sequence[int]) -> str | None:
        """The fastest implementation at the measured shape nearest to ``shape`` for ``dtype`` (``"xla"`` when
        equally near measurements disagree); ``None`` without a measurement of that dtype."""
        dtype = self.same_as.get(dtype, dtype)
        rows = [m for m in self.measurements if m.dtype == dtype]
        if not rows:
            return None
        distances = [shape_distance(shape, m.shape) for m in rows]
        nearest = min(distances)
        winners = {m.fastest for m, d in zip(rows, distances) if math.isclose(d, nearest, abs_tol=1e-9)}
        return winners.pop() if len(winners) == 1 else "xla"


def shape_distance(a: Sequence[int], b: Sequence[int]) -> float:
    """Euclidean distance between two GEMM shapes ``(M, K, N)`` in ``log2`` of each size."""
    if len(a) != 3 or len(b) != 3 or min(*a, *b) < 1:
        raise ValueError(f"GEMM shapes are three positive sizes (M, K, N), got {tuple(a)} and {tuple(b)}.")
    return math.sqrt(sum((math.log2(x) - math.log2(y)) ** 2 for x, y in zip(a, b)))


HOPPER = MatmulTable(
    device="NVIDIA H100 80GB HBM3",
    applies_to=HOPPER_DEVICE_KIND.pattern,  # every Hopper GPU: the same SMs, tensor cores and kernels
    jax="0.11.2",
    date="2026-11-24",
    source=(
        "python -m benchmarks.kernels --gpu, benchmarks/results/kernels_gpu.json: CUPTI GPU time (summed kernel "
        "durations), median of 20 calls. GEMMs: each call multiplies distinct operand sets larger than the L2 "
        "cache, bf16 operands; 'pallas' is the Mosaic GPU kernel with its default blocks (what 'pallas' means on "
        "Hopper). fp8: one jitted lpjax.agents.sac.update (1024 x 1024 MLPs, batch 1024, the 'fp8' policy) with "
        "matmul_impl 'xla' (the GEMM's jnp reference) or 'pallas'."
    ),
    measurements=(
        Measurement("bfloat16", (1024, 1024, 1024), {"xla": 0.007769, "pallas": 0.008737}, "GPU ms per product"),
        Measurement("bfloat16", (4096, 4096, 4096), {"xla": 0.186115, "pallas": 0.396247}, "GPU ms per product"),
        Measurement("bfloat16", (16, 4096, 4096), {"xla": 0.015389, "pallas": 0.028793}, "GPU ms per product"),
        Measurement(
            "float8_e4m3fn",
            (1024, 1024, 1024),
            {"xla": 1.735875, "pallas": 0.709401},
            "GPU ms per SAC update (1024 x 1024 MLPs, batch 1024): 728 kernels with 'xla', 273 with 'pallas'",
        ),
    ),
    same_as={"float16": "bfloat16"},
)
"""Hopper: measured on an H100 (see the module docstring)."""

TABLES: tuple[MatmulTable, ...] = (HOPPER,)
"""The measured tables, first match wins."""


def table_for(device_kind: str | None) -> MatmulTable | None:
    """The table used for a GPU of this ``device_kind`` (``None`` for no GPU, or a GPU nobody measured)."""
    if device_kind is None:
        return None
    return next((table for table in TABLES if table.matches(device_kind)), None)


def resolve_matmul_impl(
    matmul_impl: str,
    matmul_dtype: Any,
    shape: Sequence[int],
    *,
    platform: str | None = None,
    device_kind: str | None = None,
) -> str:
    """``matmul_impl`` itself unless it is ``"auto"``; then ``"xla"`` or ``"pallas"`` as the module docstring says.

    Args:
      matmul_impl: a dense layer's ``matmul_impl``.
      matmul_dtype: the policy's matmul dtype (a dtype or its name).
      shape: ``(M, K, N)`` of the GEMM.
      platform: the target's platform (``"cpu"``, ``"tpu"``, ``"gpu"``/``"cuda"``/``"rocm"``); with
        ``device_kind``, ``None`` for the device JAX builds for now (its default device, or the abstract GPU of
        an ahead-of-time lowering).
      device_kind: the target GPU's ``device_kind`` (e.g. ``"NVIDIA H100 80GB HBM3"``); may be given alone.
    """
    if matmul_impl != AUTO:
        return matmul_impl
    if platform is None and device_kind is None:
        device_kind = target_device_kind()
    elif platform is not None and platform not in ("gpu", "cuda", "rocm"):
        device_kind = None
    elif device_kind is None:
        device_kind = ""  # a GPU nobody named: no table matches it
    dtype = np.dtype(matmul_dtype).name
    if device_kind is None or dtype not in _KERNEL_DTYPES:
        return "xla"
    table = table_for(device_kind)
    choice = None if table is None else table.choose(dtype, shape)
    return choice or "xla"
