"""lpjax's kernels timed on a GPU, beside the roofline model of :mod:`benchmarks.kernels`, and in a SAC update.

Needs a CUDA GPU (it refuses to run without one). Every time is GPU time read by CUPTI
(:func:`jax.experimental.mosaic.gpu.profiler.measure`): the sum of the durations of the kernels one call launches,
so host dispatch and launch gaps are left out, and each kernel's share is recorded by name. A measurement is the
median over ``--iterations`` calls after a warm-up call.

* **Ceilings** measured once: a bf16 and an fp8 8192^3 ``jnp.dot`` (TFLOP/s) and an elementwise pass over 1 GiB
  (bytes read plus written per second). The roofline bounds are computed with these and with the datasheet peaks
  of :data:`benchmarks.kernels.GPUS`.
* **Kernels**, at :data:`benchmarks.kernels.SHAPES`: each Pallas backend the GPU runs (Mosaic GPU on a Hopper GPU,
  Triton while jax ships it) with the weight prepared as a layer holds it (bf16 for ``fp16_matmul``; fp8 blocks
  and int8 channels pre-quantized, the activations quantized per call, as in the learners), against XLA's dot in
  bf16 and, for the 8-bit kernels, XLA's dot on pre-quantized 8-bit operands with one scale per tensor. Each call
  runs on ``sets`` different input sets whose bytes exceed the L2 cache (50 MB on an H100; twice that where 16
  sets reach it), so the operands come from HBM as they would in a network; the time per set is reported.
* **Blocks**: each backend's block sizes swept at the LLM prefill shape (:data:`BLOCK_SWEEP`).
* **SAC update**: one jitted :func:`lpjax.agents.sac.update` at the paper's size (1024 x 1024 MLPs, batch 1024)
  for each precision setting of :data:`SAC_SETTINGS`, GPU time and wall-clock time per update.

Run ``python -m benchmarks.kernels_gpu`` on the GPU machine (writes ``benchmarks/results/kernels_gpu.{json,png}``).
"""

from __future__ import annotations

import argparse
import math
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import command_line, random_transitions, write_results
from benchmarks.kernels import GPUS, KERNELS, SHAPES, model_entry
from lpjax import quant
from lpjax.agents import sac
from lpjax.kernels._common import TRITON_AVAILABLE, is_hopper, target_device_kind
from lpjax.methods import PrecisionMethods

L2_BYTES = 50 * 2**20
"""An H100's L2 cache (50 MB); the input sets of one call hold twice this where :data:`MAX_SETS` allows."""

MAX_SETS = 16
"""At most this many products per call (each is its own kernel to compile)."""

BLOCK_SWEEP: dict[str, list[dict[str, int]]] = {
    "fp16_matmul[bf16]": [
        {"block_m": 64, "block_n": 64, "block_k": 64},
        {"block_m": 128, "block_n": 128, "block_k": 64},
        {"block_m": 128, "block_n": 256, "block_k": 64},
        {"block_m": 256, "block_n": 128, "block_k": 64},
    ],
    "fp8_blockwise_matmul": [{"block_m": 64}, {"block_m": 128}, {"block_m": 256}],
    "int8_matmul": [
        {"block_m": 64, "block_n": 64, "block_k": 64},
        {"block_m": 128, "block_n": 128, "block_k": 128},
        {"block_m": 128, "block_n": 256, "block_k": 128},
        {"block_m": 256, "block_n": 128, "block_k": 128},
    ],
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
        return _measure(profiler, jax.jit(fn), args, iterations)
    except Exception as error:  # recorded, not raised: the json says what failed and why
        return {"error": f"{type(error).__name__}: {error}"[:400]}


def _measure(profiler: Any, jitted: Callable[..., Any], args: Sequence[Any], iterations: int) -> dict[str, Any]:
    _, per_call = profiler.measure(jitted, aggregate=False, iterations=iterations)(*args)
    per_call = per_call if iterations > 1 else [per_call]
    totals = [sum(ms for _, ms in kernels) for kernels in per_call]
    names = [name for name, _ in per_call[0]]
    kernels: dict[str, float] = {}
    for i, name in enumerate(names):
        kernels[f"{i}:{name[:80]}"] = float(np.median([call[i][1] for call in per_call]))
    walls = []
    for _ in range(iterations):
        start = time.perf_counter()
        jax.block_until_ready(jitted(*args))
        walls.append(time.perf_counter() - start)
    return {"gpu_ms": float(np.median(totals)), "wall_ms": 1e3 * float(np.median(walls)), "kernels": kernels}


def _per_set(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` applied to each of a list of input sets: one call, ``len(sets)`` independent products."""
    return lambda sets: [fn(*s) for s in sets]


def _random(key: jax.Array, shape: tuple[int, ...], scale: float = 1.0) -> jax.Array:
    return (jax.random.normal(key, shape, jnp.float32) * scale).astype(jnp.bfloat16)


def _inputs(name: str, m: int, k: int, n: int, count: int, seed: int = 0) -> list[tuple[Any, ...]]:
    """``count`` input sets ``(x, w)`` for kernel ``name``: bf16 activations and the weight as a layer holds it."""
    prepare = {
        "fp16_matmul[bf16]": lambda w: w,
        "fp8_blockwise_matmul": quant.quantize_fp8_blockwise,
        "int8_matmul": lambda w: quant.quantize_int8_weight(w.astype(jnp.float32)),
    }[name]
    sets = []
    for key in jax.random.split(jax.random.key(seed), count):
        kx, kw = jax.random.split(key)
        sets.append((_random(kx, (m, k)), prepare(_random(kw, (k, n), 1 / math.sqrt(k)))))
    return jax.block_until_ready(sets)


def _xla_inputs(kind: str, m: int, k: int, n: int, count: int) -> list[tuple[Any, ...]]:
    """Input sets of XLA's dot baselines: bf16 operands, or pre-quantized 8-bit codes with one scale per tensor."""
    sets = []
    for key in jax.random.split(jax.random.key(1), count):
        kx, kw = jax.random.split(key)
        x, w = _random(kx, (m, k)), _random(kw, (k, n), 1 / math.sqrt(k))
        if kind == "fp8":
            x, w = x.astype(jnp.float8_e4m3fn), (w * 64).astype(jnp.float8_e4m3fn)
        elif kind == "int8":
            x = jnp.clip(jnp.round(x.astype(jnp.float32) * 32), -127, 127).astype(jnp.int8)
            w = jnp.clip(jnp.round(w.astype(jnp.float32) * 2048), -127, 127).astype(jnp.int8)
        sets.append((x, w))
    return jax.block_until_ready(sets)


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


def efficiency(flops: float, nbytes: float, seconds: float, tflops: float, tb_s: float) -> dict[str, float]:
    """The roofline bound ``max(flops / peak, bytes / bandwidth)`` for these ceilings, and the fraction of it a
    measured time reaches (1 = at the roof)."""
    bound = max(flops / (tflops * 1e12), nbytes / (tb_s * 1e12))
    return {"bound_us": bound * 1e6, "fraction_of_roofline": bound / seconds}


def ceilings(iterations: int) -> dict[str, float]:
    """This GPU's measured bf16 and fp8 matmul rates (8192^3) and its HBM bandwidth (a 1 GiB elementwise pass)."""
    size = 8192
    kx, kw = jax.random.split(jax.random.key(2))
    x, w = _random(kx, (size, size)), _random(kw, (size, size), 1 / math.sqrt(size))
    flops = 2.0 * size**3
    bf16 = measure(XLA_DOTS["bf16"], (x, w), iterations)["gpu_ms"]
    fp8 = measure(XLA_DOTS["fp8"], (x.astype(jnp.float8_e4m3fn), w.astype(jnp.float8_e4m3fn)), iterations)["gpu_ms"]
    big = jnp.ones((2**28,), jnp.float32)  # 1 GiB
    copy = measure(lambda a: a * 2.0, (big,), iterations)["gpu_ms"]
    return {
        "bf16_tflops": flops / bf16 / 1e9,
        "fp8_tflops": flops / fp8 / 1e9,
        "hbm_tb_s": 2 * big.nbytes / copy / 1e9,
    }


def kernel_timings(name: str, shape: tuple[int, int, int], iterations: int, measured: dict[str, float]) -> dict:
    """Every Pallas backend and XLA baseline of kernel ``name`` at ``shape``: GPU ms per product and TFLOP/s,
    the kernels each launches, and the fraction of the roofline reached (datasheet H100 and measured ceilings)."""
    m, k, n = shape
    model = model_entry(name, shape)
    flops = model["flops"]
    bf16_bytes = model_entry("fp16_matmul[bf16]", shape)["bytes"]["compulsory"]
    sets = num_sets(2 * (m * k + k * n))
    result: dict[str, Any] = {"sets_per_call": sets}
    inputs = _inputs(name, m, k, n, sets)
    peak = KERNELS[name]["peak"]
    for backend in gpu_backends():
        fn = _per_set(KERNELS[name]["fn"](backend))
        result[f"kernel[{backend}]"] = measure(fn, (inputs,), iterations)
    for kind in XLA_BASELINES[name]:
        result[f"xla_dot[{kind}]"] = measure(_per_set(XLA_DOTS[kind]), (_xla_inputs(kind, m, k, n, sets),), iterations)
    for label, timing in result.items():
        if not isinstance(timing, dict) or "error" in timing:
            continue
        seconds = timing["gpu_ms"] / sets / 1e3
        timing["ms_per_product"] = seconds * 1e3
        timing["tflops"] = flops / seconds / 1e12
        in_bf16 = peak == "bf16_tflops" or label == "xla_dot[bf16]"
        nbytes = bf16_bytes if in_bf16 else model["bytes"]["compulsory"]
        datasheet = GPUS["H100"]["bf16_tflops" if in_bf16 else peak]
        timing["roofline_h100_datasheet"] = efficiency(flops, nbytes, seconds, datasheet, GPUS["H100"]["hbm_tb_s"])
        rate = measured["bf16_tflops" if in_bf16 else "fp8_tflops"]
        timing["roofline_measured"] = efficiency(flops, nbytes, seconds, rate, measured["hbm_tb_s"])
    return result


def block_sweep(name: str, iterations: int) -> dict[str, dict[str, Any]]:
    """GPU ms per product at the LLM prefill shape for each block setting of :data:`BLOCK_SWEEP` and backend;
    a setting that fails to compile is recorded with its error."""
    m, k, n = SHAPES["llm_prefill"]
    sets = num_sets(2 * (m * k + k * n))
    inputs = _inputs(name, m, k, n, sets, seed=3)
    out: dict[str, dict[str, Any]] = {}
    for backend in gpu_backends():
        for blocks in BLOCK_SWEEP[name]:
            label = f"{backend} " + " ".join(f"{key}={value}" for key, value in blocks.items())
            timing = measure(_per_set(KERNELS[name]["fn"](backend, **blocks)), (inputs,), iterations)
            if "error" in timing:
                out[label] = timing
                continue
            seconds = timing["gpu_ms"] / sets / 1e3
            out[label] = {"ms_per_product": seconds * 1e3, "tflops": 2.0 * m * n * k / seconds / 1e12}
    return out


def sac_update_timings(iterations: int) -> dict[str, dict[str, float]]:
    """GPU and wall-clock ms of one jitted SAC update at the paper's size for each of :data:`SAC_SETTINGS`."""
    obs_dim, action_dim, batch_size = 24, 6, 1024
    batch = jax.device_put(random_transitions(np.random.default_rng(0), batch_size, obs_dim, action_dim))
    out = {}
    for label, setting in SAC_SETTINGS.items():
        config = sac.SACConfig(batch_size=batch_size, **setting)
        agent = sac.init(jax.random.key(0), jnp.zeros((obs_dim,)), action_dim, config)
        timing = measure(sac.update, (agent, batch), iterations)
        out[label] = (
            timing
            if "error" in timing
            else {"gpu_ms": timing["gpu_ms"], "wall_ms": timing["wall_ms"], "kernels": len(timing["kernels"])}
        )
    for timing in out.values():
        if "gpu_ms" in timing and "gpu_ms" in out["fp32"]:
            timing["speedup_vs_fp32"] = out["fp32"]["gpu_ms"] / timing["gpu_ms"]
    return out


def plot(result: dict, path: Path) -> None:
    """Measured TFLOP/s of each kernel and XLA baseline per shape, with the measured roofline bound as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["kernels"])
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        shapes = list(result["kernels"][name])
        labels = [label for label, t in result["kernels"][name][shapes[0]].items() if isinstance(t, dict)]
        width = 0.8 / len(labels)
        for i, label in enumerate(labels):
            values = [result["kernels"][name][s][label].get("tflops", 0.0) for s in shapes]
            ax.bar(np.arange(len(shapes)) + i * width, values, width, label=label)
        for j, s in enumerate(shapes):
            timed = [t for t in result["kernels"][name][s].values() if isinstance(t, dict) and "tflops" in t]
            if timed:  # the kernels' own roof (the first timing is a kernel's, or an XLA dot in its precision)
                bound_us = timed[0]["roofline_measured"]["bound_us"]
                attainable = 2.0 * math.prod(SHAPES[s]) / (bound_us * 1e-6) / 1e12
                ax.hlines(attainable, j - 0.1, j + 0.9, colors="k", linestyles="--", lw=1)
        ax.set_xticks(np.arange(len(shapes)) + 0.4 - width / 2, shapes)
        ax.set(yscale="log", ylabel="TFLOP/s (GPU time, CUPTI)", title=name)
        ax.legend(fontsize=7)
    fig.suptitle(f"{result['device']}: measured (bars) vs roofline at measured ceilings (dashed)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kernels_gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=20, help="timed calls per measurement (median)")
    parser.add_argument("--no_sweep", action="store_true", help="skip the block-size sweep")
    parser.add_argument("--no_sac", action="store_true", help="skip the SAC update timings")
    parser.add_argument("--out_dir", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--name", default="kernels_gpu", help="basename of the json/png")
    args = parser.parse_args(argv)
    if jax.default_backend() != "gpu":
        parser.error(f"needs a CUDA GPU; JAX's default backend is {jax.default_backend()!r}")
    measured = ceilings(args.iterations)
    result: dict[str, Any] = {
        "command": command_line("benchmarks.kernels_gpu", argv),
        "platform": platform.platform(),
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "backends": gpu_backends(),
        "timing": "GPU time from CUPTI (summed kernel durations), median of --iterations calls; wall_ms includes "
        "dispatch. Each call runs sets_per_call products on distinct inputs (> 4x L2); ms_per_product divides.",
        "measured_ceilings": measured,
        "datasheet": GPUS,
        "kernels": {
            name: {s: kernel_timings(name, shape, args.iterations, measured) for s, shape in SHAPES.items()}
            for name in KERNELS
        },
    }
    if not args.no_sweep:
        result["block_sweep_llm_prefill"] = {name: block_sweep(name, args.iterations) for name in KERNELS}
    if not args.no_sac:
        result["sac_update"] = sac_update_timings(args.iterations)
    lines = [
        f"{result['device']}, jax {jax.__version__}: bf16 {measured['bf16_tflops']:.0f} TFLOP/s, fp8 "
        f"{measured['fp8_tflops']:.0f} TFLOP/s, HBM {measured['hbm_tb_s']:.2f} TB/s (measured)",
        f"{'kernel':22s} {'shape':12s} {'implementation':22s} {'ms':>9s} {'TFLOP/s':>8s} {'of roof':>8s}",
    ]
    for name, shapes in result["kernels"].items():
        for s, timings in shapes.items():
            for label, t in timings.items():
                if isinstance(t, dict) and "error" in t:
                    lines.append(f"{name:22s} {s:12s} {label:22s} {t['error'][:120]}")
                elif isinstance(t, dict):
                    lines.append(
                        f"{name:22s} {s:12s} {label:22s} {t['ms_per_product']:9.4f} {t['tflops']:8.1f} "
                        f"{t['roofline_measured']['fraction_of_roofline']:8.2f}"
                    )
    for name, sweep in result.get("block_sweep_llm_prefill", {}).items():
        for label, t in sweep.items():
            lines.append(
                f"sweep {name:22s} {label:48s} " + (f"{t['tflops']:8.1f} TFLOP/s" if "tflops" in t else t["error"])
            )
    for label, t in result.get("sac_update", {}).items():
        lines.append(
            f"SAC update {label:32s} "
            + (
                f"GPU {t['gpu_ms']:7.3f} ms  wall {t['wall_ms']:7.3f} ms  "
                f"{t.get('speedup_vs_fp32', float('nan')):.2f}x fp32"
                if "gpu_ms" in t
                else t["error"][:120]
            )
        )
    write_results(result, "\n".join(lines), args.out_dir, args.name, plot)
    return result


if __name__ == "__main__":
    main()
