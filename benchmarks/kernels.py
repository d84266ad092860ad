"""Roofline model of lpjax's matmul kernels at SAC and LLM sizes, GPU timings when a GPU is present.

For each kernel (``fp16_matmul`` in bf16, ``fp8_blockwise_matmul``, ``int8_matmul``) and each shape
``(M, K, N)``: SAC (batch 1024, 1024x1024 layer), LLM prefill (4096 tokens, 4096x4096) and LLM decode
(16 tokens, 4096x4096), it records

* ``flops = 2 M N K`` (the epilogue's ``O(M N)`` is left out);
* bytes moved from HBM, two ways: ``compulsory`` (each operand, scale and output read or written once) and
  ``tiled`` (what the kernel's grid reads without any L2 reuse: the x tile once per N block, the w tile once per
  M block), with the kernel's default blocks. The fp8 kernel's separate activation-quantization pass (read x
  in bf16, write codes and scales) is counted on its own line;
* the arithmetic intensity ``flops / bytes`` and, for an H100 and an H200 with the figures the issue gives
  (dense bf16 990 / 790 TFLOP/s, fp8 and int8 twice that; HBM 3.35 / 4.8 TB/s), the roofline bound
  ``time >= max(flops / peak, bytes / bandwidth)`` and whether the kernel is compute or memory bound there.

It also lowers each kernel for ``platforms=["cuda"]`` with :mod:`jax.export` at each shape, for every
(backend, architecture) pair of :data:`LOWERING_TARGETS` (Mosaic GPU for an abstract H100; Triton for an
abstract H100, L4 and A100), and records which (kernel, backend, architecture) triples lower, with the
``wgmma`` instructions of the Mosaic GPU kernels or the error. The kernels' GPU timings are
:mod:`benchmarks.kernels_gpu`'s, taken on a GPU; no CPU number says anything about a GPU (XLA:CPU emulates bf16
and fp8, and Pallas runs only in interpret mode there).
What a CPU does measure is recorded separately: the XLA-compiled reference implementations' latency next to an
fp32 ``jnp.dot`` at the SAC and decode shapes (emulation cost, not kernel speed).

Run ``python -m benchmarks.kernels`` (writes ``benchmarks/results/kernels.{json,png}``).
"""

from __future__ import annotations

import argparse
import functools
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import command_line, write_results
from lpjax.kernels import fp8_blockwise_matmul, fp16_matmul, int8_matmul
from lpjax.kernels._common import (
    GPU_TARGETS,
    describe_lowering,
    lower_for_cuda,
    round_up,
)

SHAPES = {"sac": (1024, 1024, 1024), "llm_prefill": (4096, 4096, 4096), "llm_decode": (16, 4096, 4096)}
"""(M, K, N) per workload."""

GPUS = {
    "H100": {"bf16_tflops": 990.0, "fp8_tflops": 1980.0, "int8_tops": 1980.0, "hbm_tb_s": 3.35},
    "H200": {"bf16_tflops": 790.0, "fp8_tflops": 1580.0, "int8_tops": 1580.0, "hbm_tb_s": 4.8},
}
"""Dense peak throughput and HBM bandwidth, as the issue states them (fp8/int8 = 2x bf16)."""

FP8_BLOCK = 128

LOWERING_TARGETS = (("mosaic_gpu", "sm_90"), ("triton", "sm_90"), ("triton", "sm_89"), ("triton", "sm_80"))
"""(backend, abstract GPU of :data:`lpjax.kernels._common.GPU_TARGETS`) pairs each kernel is lowered for."""

GPU_TIMINGS = (
    "measured on a GPU by benchmarks/kernels_gpu.py (benchmarks/results/kernels_gpu.json): CUPTI kernel times "
    "beside this model's rooflines; this model and the lowerings need no GPU."
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


def _bytes_fp16(m: int, k: int, n: int, bm: int = 64, bn: int = 64) -> dict[str, float]:
    """bf16 x (M,K) and w (K,N), fp32 bias, bf16 output."""
    out = 2 * m * n + 4 * n
    return {
        "compulsory": 2 * m * k + 2 * k * n + out,
        "tiled": 2 * m * k * (round_up(n, bn) // bn) + 2 * k * n * (round_up(m, bm) // bm) + out,
    }


def _bytes_fp8(m: int, k: int, n: int, bm: int = 64, bn: int = FP8_BLOCK) -> dict[str, float]:
    """fp8 codes of x and w, fp32 scales (x: one per token per 128 of K; w: one per 128x128 block), bf16 out."""
    groups = round_up(k, FP8_BLOCK) // FP8_BLOCK
    x_bytes, w_bytes = m * k + 4 * m * groups, k * n + 4 * groups * (round_up(n, FP8_BLOCK) // FP8_BLOCK)
    out = 2 * m * n + 4 * n
    return {
        "compulsory": x_bytes + w_bytes + out,
        "tiled": x_bytes * (round_up(n, bn) // bn) + w_bytes * (round_up(m, bm) // bm) + out,
        "activation_quantization_pass": 2 * m * k + m * k + 4 * m * groups,
    }


def _bytes_int8(m: int, k: int, n: int, bm: int = 64, bn: int = 64) -> dict[str, float]:
    """int8 codes of x and w, fp32 per-token and per-channel scales, bf16 out."""
    x_bytes, w_bytes, out = m * k + 4 * m, k * n + 4 * n, 2 * m * n + 4 * n
    return {
        "compulsory": x_bytes + w_bytes + out,
        "tiled": x_bytes * (round_up(n, bn) // bn) + w_bytes * (round_up(m, bm) // bm) + out,
        "activation_quantization_pass": 2 * m * k + m * k + 4 * m,
    }


KERNELS: dict[str, dict[str, Any]] = {
    "fp16_matmul[bf16]": dict(
        bytes=_bytes_fp16,
        peak="bf16_tflops",
        dtype=jnp.bfloat16,
        fn=lambda impl, **kw: functools.partial(fp16_matmul, out_dtype=jnp.bfloat16, impl=impl, **kw),
    ),
    "fp8_blockwise_matmul": dict(
        bytes=_bytes_fp8,
        peak="fp8_tflops",
        dtype=jnp.bfloat16,
        fn=lambda impl, **kw: functools.partial(fp8_blockwise_matmul, out_dtype=jnp.bfloat16, impl=impl, **kw),
    ),
    "int8_matmul": dict(
        bytes=_bytes_int8,
        peak="int8_tops",
        dtype=jnp.bfloat16,
        fn=lambda impl, **kw: functools.partial(int8_matmul, out_dtype=jnp.bfloat16, impl=impl, **kw),
    ),
}


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


def _time(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds per call of a compiled, warmed-up ``fn``."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _operands(m: int, k: int, n: int, dtype: Any) -> tuple[jax.Array, jax.Array]:
    kx, kw = jax.random.split(jax.random.key(0))
    return (
        jax.random.normal(kx, (m, k), jnp.float32).astype(dtype),
        (jax.random.normal(kw, (k, n), jnp.float32) / np.sqrt(k)).astype(dtype),
    )


def model_entry(name: str, shape: tuple[int, int, int]) -> dict[str, Any]:
    """FLOPs, bytes, intensity and H100/H200 rooflines of one kernel at one shape (no compute)."""
    spec, (m, k, n) = KERNELS[name], shape
    flops = 2.0 * m * n * k
    nbytes = spec["bytes"](m, k, n)
    entry: dict[str, Any] = {
        "M": m,
        "K": k,
        "N": n,
        "flops": flops,
        "bytes": nbytes,
        "intensity_compulsory": flops / nbytes["compulsory"],
        "intensity_tiled": flops / nbytes["tiled"],
        "roofline": {},
    }
    for gpu, peaks in GPUS.items():
        entry["roofline"][gpu] = {
            kind: roofline(flops, nbytes[kind], peaks[spec["peak"]], peaks["hbm_tb_s"])
            for kind in ("compulsory", "tiled")
        }
    return entry


def lowers_for_cuda(name: str, shape: tuple[int, int, int], backend: str, arch: str) -> dict[str, Any]:
    """Whether the kernel's ``backend`` lowers for CUDA on the abstract GPU ``arch`` at this shape, with jax.export
    on this machine, and what the lowered module runs (:func:`lpjax.kernels._common.describe_lowering`)."""
    m, k, n = shape
    x = jax.ShapeDtypeStruct((m, k), KERNELS[name]["dtype"])
    w = jax.ShapeDtypeStruct((k, n), KERNELS[name]["dtype"])
    try:
        exported = lower_for_cuda(KERNELS[name]["fn"](backend, interpret=False), x, w, arch=arch)
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


def cpu_reference_latency(shape: tuple[int, int, int], repeats: int) -> dict[str, float]:
    """Milliseconds per call on this CPU of the XLA-compiled references next to an fp32 ``jnp.dot``."""
    m, k, n = shape
    x, w = _operands(m, k, n, jnp.float32)
    calls = {
        "jnp_dot_fp32": jax.jit(jnp.dot),
        "jnp_dot_bf16": jax.jit(
            lambda x, w: jnp.dot(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
        ),
    }
    for name, spec in KERNELS.items():
        cast = spec["dtype"] if name.startswith("fp16") else jnp.float32
        calls[f"{name}[reference]"] = jax.jit(
            lambda x, w, f=spec["fn"]("reference"), c=cast: f(x.astype(c), w.astype(c))  # noqa: B008
        )
    return {label: 1e3 * _time(lambda f=f: f(x, w), repeats) for label, f in calls.items()}


def plot(result: dict, path: Path) -> None:
    """Roofline chart (H100): each kernel/shape at its intensity and attainable TFLOP/s, filled markers for the
    tiled byte count, hollow ones for the compulsory byte count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    peaks = GPUS["H100"]
    intensity = np.logspace(0, 4, 200)
    for peak_key, style in (("bf16_tflops", "-"), ("fp8_tflops", "--")):
        ax.plot(
            intensity,
            np.minimum(peaks[peak_key], intensity * peaks["hbm_tb_s"]),
            "k" + style,
            lw=1,
            label=f"H100 roof ({peak_key.split('_')[0]})",
        )
    markers = dict(zip(result["shapes"], "os^Dv"))
    for color, (name, shapes) in zip(("C0", "C1", "C2"), result["model"].items()):
        for shape_name, entry in shapes.items():
            ax.scatter(
                entry["intensity_tiled"],
                entry["roofline"]["H100"]["tiled"]["attainable_tflops"],
                color=color,
                marker=markers[shape_name],
                s=50,
                label=f"{name} {shape_name}",
            )
            ax.scatter(
                entry["intensity_compulsory"],
                entry["roofline"]["H100"]["compulsory"]["attainable_tflops"],
                facecolors="none",
                edgecolors=color,
                marker=markers[shape_name],
                s=50,
            )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity, FLOP/byte (filled: tiled, no L2 reuse; hollow: compulsory bytes)",
        ylabel="attainable TFLOP/s (model)",
        title="lpjax kernels on an H100 roofline (model, not measured)",
    )
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kernels", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per measurement (median)")
    parser.add_argument("--no_export", action="store_true", help="skip the CUDA lowering checks")
    parser.add_argument("--no_cpu_latency", action="store_true", help="skip the CPU reference latencies")
    parser.add_argument("--out_dir", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--name", default="kernels", help="basename of the json/png")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {
        "command": command_line("benchmarks.kernels", argv),
        "platform": platform.platform(),
        "device": str(jax.devices()[0]),
        "jax": jax.__version__,
        "gpus_modelled": GPUS,
        "shapes": SHAPES,
        "model": {name: {s: model_entry(name, shape) for s, shape in SHAPES.items()} for name in KERNELS},
    }
    if not args.no_export:
        result["lowers_for_cuda"] = {
            name: {
                s: {
                    f"{backend}@{arch}": lowers_for_cuda(name, shape, backend, arch)
                    for backend, arch in LOWERING_TARGETS
                }
                for s, shape in SHAPES.items()
            }
            for name in KERNELS
        }
        result["lowering_triples"] = lowering_triples(result["lowers_for_cuda"])
        result["lowering_notes"] = list(LOWERING_NOTES)
    result["gpu_timings"] = GPU_TIMINGS
    if not args.no_cpu_latency:
        result["cpu_reference_latency_ms"] = {
            s: cpu_reference_latency(SHAPES[s], args.repeats) for s in ("sac", "llm_decode")
        }
    lines = [
        "H100 roofline per kernel; 'compulsory' = every operand moved once, 'tiled' = no L2 reuse across tiles",
        f"{'kernel':24s} {'shape':12s} {'GFLOP':>8s} {'AI compuls.':>11s} {'bound':>8s} {'us':>7s} "
        f"{'AI tiled':>9s} {'bound':>8s} {'us':>7s} {'lowers':>6s}",
    ]
    for name, shapes in result["model"].items():
        for s, entry in shapes.items():
            once, tiled = entry["roofline"]["H100"]["compulsory"], entry["roofline"]["H100"]["tiled"]
            targets = result.get("lowers_for_cuda", {}).get(name, {}).get(s, {})
            lowered = f"{sum(r['ok'] for r in targets.values())}/{len(targets)}" if targets else "-"
            lines.append(
                f"{name:24s} {s:12s} {entry['flops'] / 1e9:8.1f} {entry['intensity_compulsory']:11.1f} "
                f"{once['bound']:>8s} {once['time_lower_bound_us']:7.1f} {entry['intensity_tiled']:9.1f} "
                f"{tiled['bound']:>8s} {tiled['time_lower_bound_us']:7.1f} {lowered:>6s}"
            )
    for row in result.get("lowering_triples", []):
        lines.append(
            f"lowers for CUDA: {row['kernel']:22s} {row['backend']:10s} {row['arch']:6s} {row['lowers']!s:5s} "
            + (" ".join(row["wgmma"]) or (row["error"] or ""))
        )
    lines.append(f"GPU timings: {GPU_TIMINGS}")
    for s, latencies in result.get("cpu_reference_latency_ms", {}).items():
        lines.append(f"CPU latency at {s}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in latencies.items()))
    write_results(result, "\n".join(lines), args.out_dir, args.name, plot)
    return result


if __name__ == "__main__":
    main()
