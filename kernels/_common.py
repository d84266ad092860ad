"""Conventions shared by lpjax's Pallas kernels: backend choice, interpret mode, padding, blocks, GPU lowering.

Every kernel in :mod:`kernels` has one signature and four implementations, picked by its ``impl`` argument:

* ``"reference"``: the kernel's maths in plain ``jax.numpy``. It is the definition; every backend is tested
  against it.
* ``"triton"``: a Pallas kernel compiled through Pallas' Triton backend, for any CUDA GPU that backend supports.
  JAX 0.11 deprecated that backend; lpjax keeps it for as long as the installed jax ships
  :mod:`jax.experimental.pallas.triton` (:data:`TRITON_AVAILABLE`), and refuses ``"triton"`` with a
  ``ValueError`` once it does not.
* ``"mosaic_gpu"``: a Pallas kernel on the Mosaic GPU backend, written for Hopper (sm_90a): TMA copies into
  swizzled shared memory and ``wgmma`` tensor-core matmuls accumulating in float32 (int32 for int8) registers.
  Compiling it for a GPU that is not a Hopper one is refused with a ``ValueError``: ``wgmma`` exists only there.
* ``"pallas"`` (the default): the Pallas backend that suits the target GPU (:func:`select_backend`):
  ``"mosaic_gpu"`` when the target is a Hopper GPU, ``"triton"`` otherwise (Ampere, Ada, Blackwell, an unknown
  GPU, or no GPU at all), and ``"mosaic_gpu"`` everywhere once Triton is gone. The target is the abstract device
  set by :func:`jax.sharding.use_abstract_mesh` while lowering ahead of time (:func:`abstract_gpu`,
  :func:`lower_for_cuda`), and JAX's default device otherwise.

Compiled Pallas kernels need a GPU. On a CPU they run in interpret mode (``interpret=None`` picks it when JAX's
default backend is the CPU and no abstract GPU is the target), which is slow and meant for tests: Triton kernels
in Pallas' generic interpreter, Mosaic GPU kernels in Mosaic GPU's interpreter, which simulates the warpgroup,
shared memory, TMA copies, barriers and ``wgmma``. Interpret mode does not change the backend choice: on a plain
CPU ``"pallas"`` runs the Triton kernel, under an abstract Hopper GPU the Mosaic GPU one (compiled: lowering
for an abstract GPU is lowering for that GPU).

Operands whose shapes are not multiples of the block sizes are zero-padded by the wrappers (:func:`pad_to`) and
the result is sliced back, so a kernel never reads out of bounds on a GPU. Block sizes must be powers of two
(a requirement of Triton, checked by :func:`check_block`).

:func:`lower_for_cuda` lowers a kernel for ``platforms=["cuda"]`` with :mod:`jax.export` under an abstract GPU
(:data:`GPU_TARGETS`: sm_90 an H100, sm_89 an L4, sm_80 an A100), on a machine without one and without JAX's
CUDA plugin. It runs the Pallas-to-Triton and Pallas-to-Mosaic-GPU lowerings, so errors such as bad blocks or
unsupported operations surface there; Mosaic GPU lowers all the way to LLVM IR with the ``wgmma`` PTX inline,
while a Triton kernel stays Triton IR until XLA compiles it on the GPU. Compiling to SASS and running need the
GPU. jax 0.10 lowers Triton kernels for sm_90 whatever the abstract device (it reads none); later versions lower
for the abstract device's compute capability. Mosaic GPU lowers for sm_90 either way.
"""

from __future__ import annotations

import contextlib
import functools
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import export
from jax.experimental import pallas as pl

try:
    from jax.experimental.pallas import triton as pltriton
except ImportError:  # a jax that no longer ships Pallas' Triton backend
    pltriton = None

IMPLS = ("pallas", "triton", "mosaic_gpu", "reference")
"""Valid values of every kernel's ``impl`` argument."""

TRITON_AVAILABLE = pltriton is not None
"""Whether the installed jax still ships Pallas' Triton backend."""

TRITON_CUSTOM_CALL = "__gpu$xla.gpu.triton"
"""Custom-call target of a Triton-lowered Pallas kernel (it has no export-compatibility guarantee)."""

GPU_TARGETS = {
    "sm_90": ("NVIDIA H100 80GB HBM3", 132),
    "sm_89": ("NVIDIA L4", 58),
    "sm_80": ("NVIDIA A100-SXM4-80GB", 108),
}
"""Abstract GPUs to lower for, by compute capability: ``(device_kind, number of SMs)`` as JAX reports them.
sm_89 (Ada) is the oldest GPU with e4m3 tensor cores, which Triton's fp8 dot needs."""

TRITON_DEPRECATION = "The Pallas Triton backend is deprecated"
"""Start of the ``DeprecationWarning`` jax >= 0.11.2 emits when it lowers a Triton kernel."""

HOPPER_DEVICE_KIND = re.compile(r"\bG?H(100|200|800|20)\b")
"""Device kinds of Hopper GPUs (sm_90): H100, H200, GH200, H800, H20."""


def check_impl(impl: str) -> str:
    """Returns ``impl`` if it is one of :data:`IMPLS`, else raises a ``ValueError`` naming the valid ones."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}.")
    return impl


def target_device_kind() -> str | None:
    """``device_kind`` of the GPU JAX lowers for: the abstract device of the current abstract mesh if one is set,
    else JAX's default device; ``None`` when that device is not a GPU."""
    device = jax.sharding.get_abstract_mesh().abstract_device or jax.devices()[0]
    return device.device_kind if device.platform in ("gpu", "cuda") else None


def is_hopper(device_kind: str | None) -> bool:
    """Whether ``device_kind`` (e.g. :func:`target_device_kind`'s) names a Hopper GPU (sm_90)."""
    return device_kind is not None and HOPPER_DEVICE_KIND.search(device_kind) is not None


def select_backend(impl: str, *, kernel: str, interpret: bool) -> str:
    """The implementation ``impl`` means for ``kernel`` on the target GPU: ``"reference"``, ``"triton"`` or
    ``"mosaic_gpu"`` (``"pallas"`` resolved as the module docstring says).

    Raises a ``ValueError`` for an unknown ``impl``, for ``"triton"`` without Triton, and for a compiled (not
    ``interpret``) ``"mosaic_gpu"`` kernel whose target is a GPU other than a Hopper one.
    """
    check_impl(impl)
    kind = target_device_kind()
    if impl == "pallas":
        impl = "mosaic_gpu" if is_hopper(kind) or not TRITON_AVAILABLE else "triton"
    if impl == "triton" and not TRITON_AVAILABLE:
        raise ValueError(
            f"jax {jax.__version__} no longer ships Pallas' Triton backend; use impl='mosaic_gpu' "
            "(Hopper) or impl='reference'."
        )
    if impl == "mosaic_gpu" and not interpret and kind is not None and not is_hopper(kind):
        raise ValueError(
            f"{kernel}'s Mosaic GPU kernel uses Hopper's wgmma and needs an sm_90 GPU; the target is "
            f"{kind!r}. Use impl='triton'."
        )
    return impl


def resolve_interpret(interpret: bool | None) -> bool:
    """``interpret=None`` means: compiled when the target is a GPU (:func:`target_device_kind`: the abstract GPU
    of an ahead-of-time lowering such as :func:`lower_for_cuda`, or JAX's default device), else interpret mode when
    JAX's default backend is the CPU, compiled otherwise. So a model that calls the kernels with their default
    ``interpret`` (:class:`lpjax.nn.Dense`) lowers for an abstract GPU as it would compile on one."""
    if interpret is None:
        return target_device_kind() is None and jax.default_backend() == "cpu"
    return bool(interpret)


def compiler_params(interpret: bool, *, num_warps: int = 4, num_stages: int = 3) -> Any:
    """Triton compiler parameters for a compiled kernel, ``None`` in interpret mode.

    Passing Triton parameters also selects Pallas' Triton backend for a ``pallas_call`` on a GPU.
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


def fit_block(block: int, size: int, minimum: int) -> int:
    """``block`` shrunk to the smallest power of two >= ``size`` (and >= ``minimum``): a 3-row input gets a 16-row
    block rather than a 64-row one, with less padding and the same result."""
    return min(block, max(minimum, 1 << max(size - 1, 0).bit_length()))


def kernel_name(body: functools.partial) -> str:
    """The name a kernel is launched under, as profilers show it: the module of ``body`` (a ``functools.partial``
    of a kernel body), e.g. ``int8_matmul`` for ``kernels/int8_matmul.py`` and for its Mosaic GPU twin
    ``kernels/int8_matmul_mosaic_gpu.py``."""
    return body.func.__module__.rsplit(".", 1)[-1].removesuffix("_mosaic_gpu")


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


def scaled_gemm_call(
    kernel: Callable[..., None],
    a: tuple[jax.Array, jax.Array],
    w: tuple[jax.Array, jax.Array],
    bias: jax.Array | None,
    out: jax.ShapeDtypeStruct,
    blocks: tuple[int, int],
    interpret: bool,
) -> jax.Array:
    """The ``pallas_call`` of an 8-bit GEMM ``a @ w`` of ``(codes, scales)`` pairs over a grid of ``blocks = (block_m,
    block_n)`` output tiles, cut back to ``out`` (the unpadded ``(m, n)`` shape and the output dtype).

    ``a``'s codes ``(Mp, Kp)`` and ``w``'s ``(Kp, Np)`` are padded; ``a``'s scales have one row per row of its codes
    and ``w``'s scale columns spread evenly over its codes'. Program ``(i, j)`` gets row tile ``i`` of ``a`` and its
    scales, column tile ``j`` of ``w`` and its scales (and of a ``bias`` ``(n,)``, the last operand:
    :func:`bias_operand`; ``kernel`` is called with ``has_bias``), writes output tile ``(i, j)`` and loops over K
    itself: Triton programs run in parallel, so a reduction cannot be spread over grid steps. The call is named
    by :func:`kernel_name`.
    """
    (a, a_scales), (w, w_scales), (block_m, block_n) = a, w, blocks
    (rows, k), cols = a.shape, w.shape[1]
    w_scale_block = (w_scales.shape[0], w_scales.shape[1] * block_n // cols)
    operands = [a, a_scales, w, w_scales]
    in_specs = [
        pl.BlockSpec((block_m, k), lambda i, j: (i, 0)),
        pl.BlockSpec((block_m, a_scales.shape[1]), lambda i, j: (i, 0)),
        pl.BlockSpec((k, block_n), lambda i, j: (0, j)),
        pl.BlockSpec(w_scale_block, lambda i, j: (0, j)),
    ]
    if bias is not None:
        row, spec = bias_operand(bias, out.shape[1], block_n)
        operands.append(row)
        in_specs.append(spec)
    return pl.pallas_call(
        functools.partial(kernel, has_bias=bias is not None),
        out_shape=jax.ShapeDtypeStruct((rows, cols), out.dtype),
        grid=(rows // block_m, cols // block_n),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((block_m, block_n), lambda i, j: (i, j)),
        interpret=interpret,
        compiler_params=compiler_params(interpret),
        name=kernel_name(kernel),
    )(*operands)[: out.shape[0], : out.shape[1]]


def abstract_gpu(arch: str) -> contextlib.AbstractContextManager[Any]:
    """A context manager in which JAX traces and lowers for an abstract GPU of compute capability ``arch``
    (a key of :data:`GPU_TARGETS`), e.g. ``with abstract_gpu("sm_90"): jax.jit(f).trace(x).lower(...)``."""
    if arch not in GPU_TARGETS:
        raise ValueError(f"arch must be one of {tuple(GPU_TARGETS)}, got {arch!r}.")
    kind, num_sms = GPU_TARGETS[arch]
    device = jax.sharding.AbstractDevice(device_kind=kind, num_cores=num_sms, platform="gpu")
    return jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), (), abstract_device=device))


def lower_for_cuda(fn: Callable[..., Any], *args: Any, arch: str = "sm_90") -> export.Exported:
    """Lowers ``jax.jit(fn)`` for ``platforms=["cuda"]`` with :mod:`jax.export` under :func:`abstract_gpu`.

    ``args`` are arrays or ``jax.ShapeDtypeStruct``. Under the abstract GPU, ``impl="pallas"`` resolves as on that
    GPU (Mosaic GPU for sm_90, Triton otherwise). The Triton custom call of Pallas has no compatibility guarantee,
    so that single safety check is disabled, and jax's deprecation warning for the Triton backend, which lpjax
    uses deliberately where it is the right backend, is silenced here. Lowering runs the Pallas-to-Triton /
    Pallas-to-Mosaic-GPU lowering, so errors such as non-power-of-two blocks surface here; compiling and running
    need a GPU.
    """
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    with abstract_gpu(arch), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=TRITON_DEPRECATION, category=DeprecationWarning)
        return export.export(
            jax.jit(fn),
            platforms=["cuda"],
            disabled_checks=[export.DisabledSafetyCheck.custom_call(TRITON_CUSTOM_CALL)],
        )(*shapes)
