"""lpjax's matmul kernels at SAC and LLM sizes: their roofline model and CUDA lowering on any machine, and with
``--gpu`` their timings on a GPU.

**Model** (``kernels.json``): for ``fp16_matmul`` (in bf16), ``fp8_blockwise_matmul`` and ``int8_matmul`` at
:data:`SHAPES`, the FLOPs and the bytes moved from HBM, ``compulsory`` (every operand, scale and output once) and
``tiled`` (the grid's reads without L2 reuse), and the roofline ``time >= max(flops / peak, bytes / bandwidth)``
on an H100 and an H200 (:data:`GPUS`); whether each kernel lowers for CUDA (:func:`lpjax.kernels.lower_for_cuda`)
on every target of :data:`LOWERING_TARGETS`, with its ``wgmma``; the CPU latency of the XLA-compiled references
(emulation cost, not kernel speed).

**GPU** (``--gpu``, ``kernels_gpu.json``): GPU time from CUPTI (:func:`measure`) of the measured ceilings, every
Pallas backend the GPU runs against XLA's dots, each call on input sets beyond the L2 cache (:func:`num_sets`); the
block sweep at prefill (:data:`BLOCK_SWEEP`); one SAC update per :data:`SAC_SETTINGS`.
"""

from __future__ import annotations

import functools
import math
import platform
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import command_line, figure, finish, format_table, parser, random_transitions
from benchmarks.timing import interleaved
from lpjax import quant
from lpjax.kernels import fp8_blockwise_matmul, fp16_matmul, int8_matmul, lower_for_cuda
from lpjax.kernels._common import GPU_TARGETS, TRITON_AVAILABLE, TRITON_CUSTOM_CALL, is_hopper, target_device_kind
from lpjax.methods import PrecisionMethods

SHAPES = {"sac": (1024, 1024, 1024), "llm_prefill": (4096, 4096, 4096), "llm_decode": (16, 4096, 4096)}
GPUS = {
    "H100": {"bf16_tflops": 990.0, "fp8_tflops": 1980.0, "int8_tops": 1980.0, "hbm_tb_s": 3.35},
    "H200": {"bf16_tflops": 790.0, "fp8_tflops": 1580.0, "int8_tops": 1580.0, "hbm_tb_s": 4.8},
}
"""Dense peak throughput and HBM bandwidth, as the issue states them (fp8/int8 = 2x bf16)."""
FP8_BLOCK = 128
LOWERING_TARGETS = (("mosaic_gpu", "sm_90"), ("triton", "sm_90"), ("triton", "sm_89"), ("triton", "sm_80"))
GPU_TIMINGS = (
    "measured on a GPU by python -m benchmarks.kernels --gpu (benchmarks/results/kernels_gpu.json): CUPTI kernel "
    "times beside this model's rooflines; this model and the lowerings need no GPU."
)
LOWERING_NOTES = (
    "'lowers' means jax.export lowered the kernel for platforms=['cuda'] under an abstract GPU (no GPU, no CUDA "
    "plugin): Mosaic GPU kernels down to LLVM IR with their PTX (wgmma) inline, Triton kernels to Triton IR. "
    "PTX-to-SASS compilation and running need the GPU and are not proven here.",
    "Mosaic GPU kernels use wgmma, an sm_90a instruction: lpjax refuses them for any GPU but a Hopper one.",
    "Triton IR is the same for every architecture; jax >= 0.11 checks it against the abstract device's compute "
    "capability (e.g. fp8 casts need sm_89), jax 0.10 against sm_90 whatever the device. XLA compiles it for the "
    "GPU it runs on.",
    "fp8_blockwise_matmul on Triton for sm_80: the e4m3 dot lowers to Triton IR, but an A100 has no fp8 tensor "
    "cores; whether Triton compiles it there is not proven (sm_89 is the first fp8 target).",
)
MOSAIC_GPU_CUSTOM_CALL = "mosaic_gpu_v2"
"""Custom-call target of a Mosaic GPU Pallas kernel (on jax.export's list of stable targets)."""
WGMMA_INSTRUCTION = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m\d+n\d+k\d+(?:\.\w+){3}")
"""A Hopper ``wgmma`` PTX instruction with its shape and types, e.g. ``...m64n128k32.f32.e4m3.e4m3``."""


def describe_lowering(exported: Any) -> dict[str, Any]:
    """What a module lowered by :func:`lpjax.kernels.lower_for_cuda` runs on the GPU: the number of its
    Triton and Mosaic GPU kernels (custom calls) and the ``wgmma`` instructions inside its Mosaic GPU kernels."""
    text = exported.mlir_module()
    return {
        "triton_calls": text.count(f"@{TRITON_CUSTOM_CALL}("),
        "mosaic_gpu_calls": text.count(f"@{MOSAIC_GPU_CUSTOM_CALL}("),
        "wgmma": sorted(set(WGMMA_INSTRUCTION.findall(text))),
    }


KERNELS: dict[str, dict[str, Any]] = {
    "fp16_matmul[bf16]": dict(fn=fp16_matmul, peak="bf16_tflops"),
    "fp8_blockwise_matmul": dict(fn=fp8_blockwise_matmul, peak="fp8_tflops"),
    "int8_matmul": dict(fn=int8_matmul, peak="int8_tops"),
}
"""Per kernel: its function and the peak of :data:`GPUS` it is held to."""


def kernel(name: str, impl: str, **kw: Any) -> Callable:
    """Kernel ``name`` by the backend ``impl`` (with options ``kw``) on bf16 operands, with a bf16 output."""
    return functools.partial(KERNELS[name]["fn"], out_dtype=jnp.bfloat16, impl=impl, **kw)


def roofline(flops: float, nbytes: float, peak_tflops: float, hbm_tb_s: float) -> dict[str, float | str]:
    """Lower bound on the time of a kernel moving ``nbytes`` and doing ``flops`` on a GPU with these peaks."""
    compute_s, memory_s = flops / (peak_tflops * 1e12), nbytes / (hbm_tb_s * 1e12)
    bound_s = max(compute_s, memory_s)
    return {
        "time_lower_bound_us": bound_s * 1e6,
        "attainable_tflops": flops / bound_s / 1e12,
        "bound": "compute" if compute_s >= memory_s else "memory",
        "ridge_intensity": peak_tflops / hbm_tb_s,
    }


def model_entry(name: str, shape: tuple[int, int, int]) -> dict[str, Any]:
    """FLOPs, bytes moved from HBM, intensity and H100/H200 rooflines of one kernel at one shape (no compute).
    x ``(M, K)``, w ``(K, N)``, an fp32 bias and a bf16 output: ``compulsory`` bytes move each once, ``tiled`` ones
    re-read x once per N block and w once per M block of ``64 x bn`` tiles (no L2 reuse). The operands are bf16, or
    8-bit codes with fp32 scales (int8: per token and per channel; fp8: x per token per 128 of K, w per 128x128
    block), which add the activation-quantization pass on its own line (bf16 in, codes and scales out)."""
    (m, k, n), peak, kinds = shape, KERNELS[name]["peak"], ("compulsory", "tiled")
    groups, n_groups = math.ceil(k / FP8_BLOCK), math.ceil(n / FP8_BLOCK)
    x_bytes, w_bytes, scales, bn = {
        "fp16_matmul[bf16]": (2 * m * k, 2 * k * n, None, 64),
        "fp8_blockwise_matmul": (m * k + 4 * m * groups, k * n + 4 * groups * n_groups, m * groups, FP8_BLOCK),
        "int8_matmul": (m * k + 4 * m, k * n + 4 * n, m, 64),
    }[name]
    flops, out = 2.0 * m * n * k, 2 * m * n + 4 * n
    tiled = x_bytes * math.ceil(n / bn) + w_bytes * math.ceil(m / 64) + out
    nbytes = {"compulsory": x_bytes + w_bytes + out, "tiled": tiled}
    if scales is not None:
        nbytes["activation_quantization_pass"] = 2 * m * k + m * k + 4 * scales
    roofs = {
        gpu: {kind: roofline(flops, nbytes[kind], peaks[peak], peaks["hbm_tb_s"]) for kind in kinds}
        for gpu, peaks in GPUS.items()
    }
    intensity = {f"intensity_{kind}": flops / nbytes[kind] for kind in kinds}
    return {"M": m, "K": k, "N": n, "flops": flops, "bytes": nbytes} | intensity | {"roofline": roofs}


def per_kernel_and_shape(fn: Callable[[str, tuple[int, int, int]], Any]) -> dict[str, dict[str, Any]]:
    """``fn(name, shape)`` for every kernel and shape (:data:`KERNELS`, :data:`SHAPES`), by kernel and shape name."""
    return {name: {s: fn(name, shape) for s, shape in SHAPES.items()} for name in KERNELS}


def lowers_for_cuda(name: str, shape: tuple[int, int, int], backend: str, arch: str) -> dict[str, Any]:
    """Whether kernel ``name`` by ``backend`` lowers for CUDA on the abstract GPU ``arch``, and what it runs."""
    m, k, n = shape
    x, w = jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct((k, n), jnp.bfloat16)
    try:
        exported = lower_for_cuda(kernel(name, backend, interpret=False), x, w, arch=arch)
    except Exception as error:  # recorded, not raised: the json says which kernel fails to lower and why
        return {"ok": False, "error": f"{type(error).__name__}: {error}"[:500]}
    return {"ok": True, **describe_lowering(exported), "mlir_chars": len(exported.mlir_module())}


def lowering_triples(lowered: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per (kernel, backend, architecture) of ``lowered`` (kernel -> shape -> ``backend@arch`` -> result):
    whether it lowers at every shape, the ``wgmma`` instructions seen and the first error. Mosaic GPU's
    architecture is named ``sm_90a``, the feature set its ``wgmma`` needs."""
    rows = []
    for name, shapes in lowered.items():
        for backend, arch in LOWERING_TARGETS:
            results = {s: by_target[f"{backend}@{arch}"] for s, by_target in shapes.items()}
            errors = [r["error"] for r in results.values() if not r["ok"]]
            rows.append(
                {
                    "kernel": name,
                    "backend": backend,
                    "arch": (arch + "a") if backend == "mosaic_gpu" else arch,
                    "device_kind": GPU_TARGETS[arch][0],
                    "lowers": not errors,
                    "shapes": [s for s, r in results.items() if r["ok"]],
                    "wgmma": sorted({i for r in results.values() for i in r.get("wgmma", [])}),
                    "error": errors[0] if errors else None,
                }
            )
    return rows


def _operands(key: jax.Array, m: int, k: int, n: int) -> tuple[jax.Array, jax.Array]:
    """bf16 ``x (M, K)`` of unit variance and ``w (K, N)`` of variance ``1 / K``."""
    kx, kw = jax.random.split(key)
    w = jax.random.normal(kw, (k, n), jnp.float32) * (1 / math.sqrt(k))
    return jax.random.normal(kx, (m, k), jnp.float32).astype(jnp.bfloat16), w.astype(jnp.bfloat16)


def cpu_reference_latency(shape: tuple[int, int, int], repeats: int) -> dict[str, float]:
    """Milliseconds per call on this CPU of the XLA-compiled references and ``jnp.dot`` (interleaved rounds)."""
    x, w = (a.astype(jnp.float32) for a in _operands(jax.random.key(0), *shape))
    cast = lambda f, dtype: jax.jit(lambda x, w: f(x.astype(dtype), w.astype(dtype)))
    calls = {
        "jnp_dot_fp32": jax.jit(jnp.dot),
        "jnp_dot_bf16": cast(functools.partial(jnp.dot, preferred_element_type=jnp.float32), jnp.bfloat16),
    }
    for name in KERNELS:
        dtype = jnp.bfloat16 if name.startswith("fp16") else jnp.float32
        calls[f"{name}[reference]"] = cast(kernel(name, "reference"), dtype)
    timing = interleaved({label: functools.partial(f, x, w) for label, f in calls.items()}, repeats)
    return {label: 1e3 * timing[label]["median_s"] for label in calls}


def model_result(args: Any, argv: Sequence[str] | None) -> tuple[dict, str]:
    """The model, the lowerings and the CPU latencies (``kernels.json``), and their table."""
    result: dict[str, Any] = {
        "command": command_line("benchmarks.kernels", argv),
        "platform": platform.platform(),
        "device": str(jax.devices()[0]),
        "jax": jax.__version__,
        "gpus_modelled": GPUS,
        "shapes": SHAPES,
        "model": per_kernel_and_shape(model_entry),
    }
    if not args.no_export:
        targets = lambda name, shape: {f"{b}@{a}": lowers_for_cuda(name, shape, b, a) for b, a in LOWERING_TARGETS}
        result["lowers_for_cuda"] = per_kernel_and_shape(targets)
        result["lowering_triples"] = lowering_triples(result["lowers_for_cuda"])
        result["lowering_notes"] = list(LOWERING_NOTES)
    result["gpu_timings"] = GPU_TIMINGS
    if not args.no_cpu_latency:
        latency = {s: cpu_reference_latency(SHAPES[s], args.repeats) for s in ("sac", "llm_decode")}
        result["cpu_reference_latency_ms"] = latency
    rows = []
    for name, shapes in result["model"].items():
        for s, entry in shapes.items():
            roof, targets = entry["roofline"]["H100"], result.get("lowers_for_cuda", {}).get(name, {}).get(s, {})
            bounds = [(entry[f"intensity_{k}"], roof[k]["bound"], roof[k]["time_lower_bound_us"]) for k in roof]
            lowered = f"{sum(r['ok'] for r in targets.values())}/{len(targets)}" if targets else "-"
            rows.append([name, s, entry["flops"] / 1e9, *bounds[0], *bounds[1], lowered])
    header = ["kernel", "shape", "GFLOP", "AI compuls.", "bound", "us", "AI tiled", "bound", "us", "lowers"]
    formats = ["<24", "<12", "8.1f", "11.1f", ">8", "7.1f", "9.1f", ">8", "7.1f", ">6"]
    lines = ["H100 roofline per kernel; 'compulsory' = every operand moved once, 'tiled' = no L2 reuse across tiles"]
    lines += format_table(header, rows, formats)
    for row in result.get("lowering_triples", []):
        lines.append(
            f"lowers for CUDA: {row['kernel']:22s} {row['backend']:10s} {row['arch']:6s} {row['lowers']!s:5s} "
            + (" ".join(row["wgmma"]) or (row["error"] or ""))
        )
    lines.append(f"GPU timings: {GPU_TIMINGS}")
    for s, latencies in result.get("cpu_reference_latency_ms", {}).items():
        lines.append(f"CPU latency at {s}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in latencies.items()))
    return result, "\n".join(lines)


def plot_model(result: dict, path: Path) -> None:
    """Roofline chart (H100): each kernel/shape at its intensity and attainable TFLOP/s, filled markers for the
    tiled byte count, hollow ones for the compulsory byte count."""
    peaks, intensity = GPUS["H100"], np.logspace(0, 4, 200)
    markers = dict(zip(result["shapes"], "os^Dv"))
    with figure(path, figsize=(7.5, 5)) as (_, ax):
        for peak, style in (("bf16_tflops", "-"), ("fp8_tflops", "--")):
            roof = np.minimum(peaks[peak], intensity * peaks["hbm_tb_s"])
            ax.plot(intensity, roof, "k" + style, lw=1, label=f"H100 roof ({peak.split('_')[0]})")
        for color, (name, shapes) in zip(("C0", "C1", "C2"), result["model"].items()):
            for shape, entry in shapes.items():
                for kind, fill in (("tiled", color), ("compulsory", "none")):
                    point = entry[f"intensity_{kind}"], entry["roofline"]["H100"][kind]["attainable_tflops"]
                    label = f"{name} {shape}" if kind == "tiled" else None
                    ax.scatter(*point, facecolors=fill, edgecolors=color, marker=markers[shape], s=50, label=label)
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="arithmetic intensity, FLOP/byte (filled: tiled, no L2 reuse; hollow: compulsory bytes)",
            ylabel="attainable TFLOP/s (model)",
            title="lpjax kernels on an H100 roofline (model, not measured)",
        )
        ax.legend(fontsize=7, loc="lower right")


L2_BYTES = 50 * 2**20
"""An H100's L2 cache (50 MB); the input sets of one call hold twice this where :data:`MAX_SETS` allows."""
MAX_SETS = 16
"""At most this many products per call (each is its own kernel to compile)."""
_MNK = ("block_m", "block_n", "block_k")
BLOCK_SWEEP: dict[str, list[dict[str, int]]] = {
    "fp16_matmul[bf16]": [dict(zip(_MNK, b)) for b in ((64, 64, 64), (128, 128, 64), (128, 256, 64), (256, 128, 64))],
    "fp8_blockwise_matmul": [{"block_m": 64}, {"block_m": 128}, {"block_m": 256}],
    "int8_matmul": [dict(zip(_MNK, b)) for b in ((64, 64, 64), (128, 128, 128), (128, 256, 128), (256, 128, 128))],
}
"""Block sizes tried per kernel at the LLM prefill shape (the first entry is each kernel's default)."""
SAC_SETTINGS: dict[str, dict[str, Any]] = {
    "fp32": dict(policy="fp32", methods=PrecisionMethods(), matmul_impl="xla"),
    "bf16": dict(policy="bf16", methods=PrecisionMethods(), matmul_impl="xla"),
    "fp16 (paper methods)": dict(policy="fp16", methods=PrecisionMethods.paper(), matmul_impl="xla"),
    "fp16 (paper methods), Pallas": dict(policy="fp16", methods=PrecisionMethods.paper(), matmul_impl="pallas"),
    "fp8 W8A8, XLA reference": dict(policy="fp8", methods=PrecisionMethods(), matmul_impl="xla"),
    "fp8 W8A8, Pallas": dict(policy="fp8", methods=PrecisionMethods(), matmul_impl="pallas"),
}
"""The SAC configs timed: the experiment configs' precision settings (``experiments/configs/sac``)."""
XLA_DOTS: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "bf16": lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32).astype(jnp.bfloat16),
    "fp8": lambda x, w: (jnp.dot(x, w, preferred_element_type=jnp.float32) * 0.5).astype(jnp.bfloat16),
    "int8": lambda x, w: (jnp.dot(x, w, preferred_element_type=jnp.int32).astype(jnp.float32) * 0.5).astype(
        jnp.bfloat16
    ),
}
"""XLA's dots: bf16, and 8-bit operands with one float32 scale per product (cuBLASLt's scaled GEMMs)."""
XLA_BASELINES = {
    "fp16_matmul[bf16]": ["bf16"],
    "fp8_blockwise_matmul": ["bf16", "fp8"],
    "int8_matmul": ["bf16", "int8"],
}


def gpu_backends() -> list[str]:
    """The Pallas backends that run on this machine's GPU: Mosaic GPU on a Hopper one, Triton while jax ships it."""
    return (["mosaic_gpu"] if is_hopper(target_device_kind()) else []) + (["triton"] if TRITON_AVAILABLE else [])


def num_sets(bytes_per_set: int) -> int:
    """Input sets per call so that one call's inputs hold twice the L2 cache: ``ceil(2 L2 / bytes)``, 2 to 16."""
    return int(min(MAX_SETS, max(2, math.ceil(2 * L2_BYTES / bytes_per_set))))


def measure(fn: Callable[..., Any], args: Sequence[Any], iterations: int) -> dict[str, Any]:
    """GPU time of ``jax.jit(fn)(*args)``: the median over ``iterations`` calls of the summed kernel durations
    (CUPTI), in ms, with the median of each kernel's (by name, in launch order), and the wall-clock median.
    A call that fails (a kernel that does not compile, say) is recorded as ``{"error": ...}``."""
    from jax.experimental.mosaic.gpu import profiler

    try:
        jitted = jax.jit(fn)
        _, per_call = profiler.measure(jitted, aggregate=False, iterations=iterations)(*args)
        per_call = per_call if iterations > 1 else [per_call]
        kernels = {
            f"{i}:{name[:80]}": float(np.median([call[i][1] for call in per_call]))
            for i, (name, _) in enumerate(per_call[0])
        }
        wall = interleaved({"call": functools.partial(jitted, *args)}, iterations, warmup=0, per_call=True)
        totals = [sum(ms for _, ms in kernels) for kernels in per_call]
        return {"gpu_ms": float(np.median(totals)), "wall_ms": 1e3 * wall["call"]["median_s"], "kernels": kernels}
    except Exception as error:  # recorded, not raised: the json says what failed and why
        return {"error": f"{type(error).__name__}: {error}"[:400]}


def _inputs(name: str, shape: tuple[int, int, int], seed: int = 0, xla: str | None = None) -> list:
    """:func:`num_sets` input sets ``(x, w)`` of bf16 operands (2 bytes each): for kernel ``name`` bf16 activations
    and the weight as a layer holds it; for XLA's dot ``xla``, bf16 operands or 8-bit codes with one scale each."""
    prepare = {
        "fp16_matmul[bf16]": lambda x, w: (x, w),
        "fp8_blockwise_matmul": lambda x, w: (x, quant.quantize_fp8_blockwise(w)),
        "int8_matmul": lambda x, w: (x, quant.quantize_int8_weight(w.astype(jnp.float32))),
        "bf16": lambda x, w: (x, w),
        "fp8": lambda x, w: (x.astype(jnp.float8_e4m3fn), (w * 64).astype(jnp.float8_e4m3fn)),
        "int8": lambda x, w: tuple(
            jnp.clip(jnp.round(a.astype(jnp.float32) * s), -127, 127).astype(jnp.int8) for a, s in ((x, 32), (w, 2048))
        ),
    }[xla or name]
    m, k, n = shape
    keys = jax.random.split(jax.random.key(1 if xla else seed), num_sets(2 * (m * k + k * n)))
    return jax.block_until_ready([prepare(*_operands(key, m, k, n)) for key in keys])


def time_products(fn: Callable[..., Any], inputs: list, iterations: int, flops: float) -> dict[str, Any]:
    """:func:`measure` of ``fn`` on each input set in one call, with ``ms_per_product`` and ``tflops`` if it ran."""
    timing = measure(lambda sets: [fn(*s) for s in sets], (inputs,), iterations)
    if "error" not in timing:
        seconds = timing["gpu_ms"] / len(inputs) / 1e3
        timing.update(ms_per_product=seconds * 1e3, tflops=flops / seconds / 1e12)
    return timing


def efficiency(flops: float, nbytes: float, seconds: float, tflops: float, tb_s: float) -> dict[str, float]:
    """The roofline bound ``max(flops / peak, bytes / bandwidth)`` for these ceilings, and the fraction of it a
    measured time reaches (1 = at the roof)."""
    bound = max(flops / (tflops * 1e12), nbytes / (tb_s * 1e12))
    return {"bound_us": bound * 1e6, "fraction_of_roofline": bound / seconds}


def ceilings(iterations: int) -> dict[str, float]:
    """This GPU's measured bf16 and fp8 matmul rates (8192^3) and its HBM bandwidth (a 1 GiB elementwise pass)."""
    size = 8192
    x, w = _operands(jax.random.key(2), size, size, size)
    flops = 2.0 * size**3
    bf16 = measure(XLA_DOTS["bf16"], (x, w), iterations)["gpu_ms"]
    fp8 = measure(XLA_DOTS["fp8"], (x.astype(jnp.float8_e4m3fn), w.astype(jnp.float8_e4m3fn)), iterations)["gpu_ms"]
    big = jnp.ones((2**28,), jnp.float32)  # 1 GiB
    copy = measure(lambda a: a * 2.0, (big,), iterations)["gpu_ms"]
    return {"bf16_tflops": flops / bf16 / 1e9, "fp8_tflops": flops / fp8 / 1e9, "hbm_tb_s": 2 * big.nbytes / copy / 1e9}


def kernel_timings(name: str, shape: tuple[int, int, int], iterations: int, measured: dict[str, float]) -> dict:
    """Every Pallas backend and XLA baseline of kernel ``name`` at ``shape`` (:func:`time_products`), with the
    fraction of the roofline reached at the H100's datasheet and at the measured ceilings. A kernel in bf16, and
    XLA's bf16 dot, are held to the bf16 peak and bytes; the 8-bit ones to the kernel's peak (measured: fp8's)."""
    model, bf16, peak = model_entry(name, shape), model_entry("fp16_matmul[bf16]", shape), KERNELS[name]["peak"]
    flops, inputs = model["flops"], _inputs(name, shape)
    result: dict[str, Any] = {"sets_per_call": len(inputs)}
    for backend in gpu_backends():
        result[f"kernel[{backend}]"] = time_products(kernel(name, backend), inputs, iterations, flops)
    for kind in XLA_BASELINES[name]:
        result[f"xla_dot[{kind}]"] = time_products(XLA_DOTS[kind], _inputs(name, shape, xla=kind), iterations, flops)
    for label, timing in result.items():
        if not isinstance(timing, dict) or "error" in timing:
            continue
        seconds = timing["gpu_ms"] / len(inputs) / 1e3
        in_bf16 = peak == "bf16_tflops" or label == "xla_dot[bf16]"
        nbytes = (bf16 if in_bf16 else model)["bytes"]["compulsory"]
        datasheet = GPUS["H100"]["bf16_tflops" if in_bf16 else peak]
        timing["roofline_h100_datasheet"] = efficiency(flops, nbytes, seconds, datasheet, GPUS["H100"]["hbm_tb_s"])
        rate = measured["bf16_tflops" if in_bf16 else "fp8_tflops"]
        timing["roofline_measured"] = efficiency(flops, nbytes, seconds, rate, measured["hbm_tb_s"])
    return result


def block_sweep(name: str, iterations: int) -> dict[str, dict[str, Any]]:
    """GPU ms per product and TFLOP/s at the LLM prefill shape for each block setting of :data:`BLOCK_SWEEP` and
    backend; a setting that fails to compile is recorded with its error."""
    inputs, flops = _inputs(name, SHAPES["llm_prefill"], seed=3), 2.0 * math.prod(SHAPES["llm_prefill"])
    out: dict[str, dict[str, Any]] = {}
    for backend in gpu_backends():
        for blocks in BLOCK_SWEEP[name]:
            label = f"{backend} " + " ".join(f"{key}={value}" for key, value in blocks.items())
            timing = time_products(kernel(name, backend, **blocks), inputs, iterations, flops)
            out[label] = timing if "error" in timing else {key: timing[key] for key in ("ms_per_product", "tflops")}
    return out


def sac_update_timings(iterations: int) -> dict[str, dict[str, float]]:
    """GPU and wall-clock ms of one jitted SAC update at the paper's size for each of :data:`SAC_SETTINGS`."""
    from lpjax.agents import sac

    obs_dim, action_dim, batch_size = 24, 6, 1024
    batch = jax.device_put(random_transitions(np.random.default_rng(0), batch_size, obs_dim, action_dim))
    out = {}
    for label, setting in SAC_SETTINGS.items():
        config = sac.SACConfig(batch_size=batch_size, **setting)
        agent = sac.init(jax.random.key(0), jnp.zeros((obs_dim,)), action_dim, config)
        timing = measure(sac.update, (agent, batch), iterations)
        if "error" not in timing:
            timing["kernels"] = len(timing["kernels"])
        out[label] = timing
    for timing in out.values():
        if "gpu_ms" in timing and "gpu_ms" in out["fp32"]:
            timing["speedup_vs_fp32"] = out["fp32"]["gpu_ms"] / timing["gpu_ms"]
    return out


def gpu_result(args: Any, argv: Sequence[str] | None) -> tuple[dict, str]:
    """The GPU timings (``kernels_gpu.json``) and their table."""
    measured = ceilings(args.iterations)
    result: dict[str, Any] = {
        "command": command_line("benchmarks.kernels", argv),
        "platform": platform.platform(),
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "backends": gpu_backends(),
        "timing": "GPU time from CUPTI (summed kernel durations), median of --iterations calls; wall_ms includes "
        "dispatch. Each call runs sets_per_call products on distinct inputs (> 4x L2); ms_per_product divides.",
        "measured_ceilings": measured,
        "datasheet": GPUS,
        "kernels": per_kernel_and_shape(lambda name, shape: kernel_timings(name, shape, args.iterations, measured)),
    }
    if not args.no_sweep:
        result["block_sweep_llm_prefill"] = {name: block_sweep(name, args.iterations) for name in KERNELS}
    if not args.no_sac:
        result["sac_update"] = sac_update_timings(args.iterations)
    rows = []
    for name, shapes in result["kernels"].items():
        for s, timings in shapes.items():
            for label, t in ((label, t) for label, t in timings.items() if isinstance(t, dict)):
                roof = t.get("roofline_measured", {}).get("fraction_of_roofline")
                timed = [t["error"][:120]] if roof is None else [t["ms_per_product"], t["tflops"], roof]
                rows.append([name, s, label, *timed])
    lines = [
        f"{result['device']}, jax {jax.__version__}: bf16 {measured['bf16_tflops']:.0f} TFLOP/s, fp8 "
        f"{measured['fp8_tflops']:.0f} TFLOP/s, HBM {measured['hbm_tb_s']:.2f} TB/s (measured)"
    ]
    header = ["kernel", "shape", "implementation", "ms", "TFLOP/s", "of roof"]
    lines += format_table(header, rows, ["<22", "<12", "<22", "9.4f", "8.1f", "8.2f"])
    sweeps = result.get("block_sweep_llm_prefill", {}).items()
    rows = [[name, label, t.get("tflops", t.get("error"))] for name, sweep in sweeps for label, t in sweep.items()]
    lines += format_table(["block sweep", "blocks", "TFLOP/s"], rows, ["<22", "<48", "8.1f"])
    sac = result.get("sac_update", {}).items()
    rows = [
        [k, *(t.get(c, "-") for c in ("gpu_ms", "wall_ms", "speedup_vs_fp32"))] if "gpu_ms" in t else [k, t["error"]]
        for k, t in sac
    ]
    lines += format_table(["SAC update", "GPU ms", "wall ms", "x fp32"], rows, ["<32", "7.3f", "7.3f", "6.2f"])
    return result, "\n".join(lines)


def plot_gpu(result: dict, path: Path) -> None:
    """Measured TFLOP/s of each kernel and XLA baseline per shape, with the measured roofline bound as a line."""
    count = len(result["kernels"])
    with figure(path, 1, count, figsize=(5 * count, 4.2), squeeze=False) as (fig, axes):
        for ax, (name, by_shape) in zip(axes[0], result["kernels"].items()):
            shapes = list(by_shape)
            labels = [label for label, t in by_shape[shapes[0]].items() if isinstance(t, dict)]
            width = 0.8 / len(labels)
            for i, label in enumerate(labels):
                values = [by_shape[s][label].get("tflops", 0.0) for s in shapes]
                ax.bar(np.arange(len(shapes)) + i * width, values, width, label=label)
            for j, s in enumerate(shapes):
                timed = [t for t in by_shape[s].values() if isinstance(t, dict) and "tflops" in t]
                if timed:  # the kernels' own roof (the first timing is a kernel's, or an XLA dot in its precision)
                    bound_us = timed[0]["roofline_measured"]["bound_us"]
                    attainable = 2.0 * math.prod(SHAPES[s]) / (bound_us * 1e-6) / 1e12
                    ax.hlines(attainable, j - 0.1, j + 0.9, colors="k", linestyles="--", lw=1)
            ax.set_xticks(np.arange(len(shapes)) + 0.4 - width / 2, shapes)
            ax.set(yscale="log", ylabel="TFLOP/s (GPU time, CUPTI)", title=name)
            ax.legend(fontsize=7)
        fig.suptitle(f"{result['device']}: measured (bars) vs roofline at measured ceilings (dashed)", fontsize=9)


def main(argv: Sequence[str] | None = None) -> dict:
    cli = parser("kernels", __doc__)
    cli.add_argument("--gpu", action="store_true", help="time the kernels on this CUDA GPU (kernels_gpu.json)")
    cli.add_argument("--repeats", type=int, default=5, help="interleaved rounds of the CPU latencies (median)")
    cli.add_argument("--no_export", action="store_true", help="skip the CUDA lowering checks")
    cli.add_argument("--no_cpu_latency", action="store_true", help="skip the CPU reference latencies")
    cli.add_argument("--iterations", type=int, default=20, help="--gpu: timed calls per measurement (median)")
    cli.add_argument("--no_sweep", action="store_true", help="--gpu: skip the block-size sweep")
    cli.add_argument("--no_sac", action="store_true", help="--gpu: skip the SAC update timings")
    args = cli.parse_args(argv)
    if not args.gpu:
        return finish(args, *model_result(args, argv), plot_model)
    if jax.default_backend() != "gpu":
        cli.error(f"--gpu needs a CUDA GPU; JAX's default backend is {jax.default_backend()!r}")
    args.name = "kernels_gpu" if args.name == "kernels" else args.name
    return finish(args, *gpu_result(args, argv), plot_gpu)


if __name__ == "__main__":
    main()
