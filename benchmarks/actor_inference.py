"""Batch-1 latency of an actor's policy on one CPU core: JAX fp32, JAX int8, lpjax's fbgemm Int8MLP and PyTorch.

The policy is an :class:`lpjax.nn.MLP` ``obs_dim -> 2048 -> 2048 -> 2048 -> act_dim`` (relu, tanh output; walker:
obs 24, actions 6), initialized by Flax. Variants, each called as an actor would (a NumPy observation ``(24,)`` in,
a NumPy action out, host-device copies included):

* ``jax_fp32``: :class:`lpjax.inference.Fp32MLP`, one ``jax.jit``-compiled fp32 forward.
* ``jax_int8_dot_general``: lpjax's int8 maths in XLA, jitted: per-token symmetric int8 activations and
  ``kernels.int8_matmul(impl="reference")`` (``lax.dot_general(int8, int8, preferred_element_type=int32)``) per
  layer. For the record: XLA:CPU has no fast int8 GEMM, so it is the slowest by far (fewer calls are timed).
* ``lpjax_int8_fbgemm``: :class:`lpjax.inference.Int8MLP`, lpjax's int8 weights (the same codes and scales)
  on fbgemm (``quantized::linear_relu_dynamic`` / ``linear_dynamic``), activations quantized by fbgemm (per
  tensor, uint8, zero point; ``reduce_range="auto"``).
* ``torch_fp32``: the same weights in a ``torch.nn.Sequential`` of ``Linear``/``ReLU``/``Tanh``.
* ``torch_int8_quantize_dynamic``: ``torch.ao.quantization.quantize_dynamic`` of that model (default qconfig:
  per-tensor symmetric weights, ``reduce_range=True`` 7-bit activations).

Timing: single-threaded (``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1`` set
before jax is imported when run as ``python -m benchmarks.actor_inference``, and ``torch.set_num_threads(1)``);
every variant is warmed up, then ``--rounds`` rounds each time ``--calls`` consecutive calls of every variant,
one ``perf_counter`` per call, the order of the variants rotated each round, garbage collection off. Each call
gets the next observation of a fixed pool. Reported per variant: median, p90, mean and min over all timed calls
and the median of each round. Targets: ``lpjax_int8_fbgemm`` at least ``TARGET_SPEEDUP_VS_JAX_FP32`` (2x) faster
than ``jax_fp32`` and no slower than ``torch_int8_quantize_dynamic`` within ``TOLERANCE_VS_TORCH_INT8`` (10%),
both judged on the medians.

Accuracy (untimed): the same policy with the output activation removed (the pre-tanh mean), ``--accuracy_obs``
observations at batch 1 and as batches of 8, compared with float64 NumPy forwards of (a) the dequantized int8
weights (``codes * scales``: only the activation quantization differs) and (b) the original fp32 weights.
Reported: relative RMS error and max abs error of the mean, and max abs error of ``tanh(mean)`` (the action).
The network is randomly initialized, not trained; a trained policy's activation ranges differ.

Weight bytes: the arrays each variant multiplies by (int8 codes, float32 scales and zero points, float32 biases;
fbgemm's packed copies and padding are not counted).

Run ``python -m benchmarks.actor_inference`` (writes ``benchmarks/results/actor_inference.{json,png}``);
``--quick`` is a tiny smoke run.
"""

from __future__ import annotations

import os
import sys

SINGLE_THREAD_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
if __name__ == "__main__" and "jax" not in sys.modules:  # must precede the first `import jax`
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + SINGLE_THREAD_XLA_FLAGS).strip()

import argparse
import gc
import platform
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import command_line, write_results
from kernels import int8_matmul
from lpjax.inference import Fp32MLP, Int8MLP, fbgemm_saturates
from lpjax.nn import MLP
from lpjax.quant import Int8Weight

RESULT_NAME = "actor_inference"
DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "results"
OURS = "lpjax_int8_fbgemm"
JAX_FP32 = "jax_fp32"
TORCH_INT8 = "torch_int8_quantize_dynamic"
NAIVE_INT8 = "jax_int8_dot_general"
TARGET_SPEEDUP_VS_JAX_FP32 = 2.0
TOLERANCE_VS_TORCH_INT8 = 0.10
NAIVE_CALL_FRACTION = 20  # the naive int8 variant (~20 ms per call) is timed on calls // 20 calls per round

FBGEMM_ACTIVATIONS = (
    "fbgemm (quantized::linear_dynamic / linear_relu_dynamic) quantizes each layer's float32 input per tensor "
    "(one range for the whole batch), asymmetrically to uint8: lo = min(min(x), 0), hi = max(max(x), 0), "
    "s = (hi - lo) / 255 (127 with reduce_range; floored at 6.1e-5), zero point z = round(-lo / s), "
    "q = clip(round(x / s) + z, 0, 255); y = (sum_k q c - z sum_k c) * s * w_scale + bias in float32. For a "
    "post-relu input that step is max/255, half of lpjax's symmetric per-token int8 (max/127).")


class Sizes(NamedTuple):
    obs_dim: int
    hidden: int
    layers: int
    act_dim: int


FULL_SIZES = Sizes(obs_dim=24, hidden=2048, layers=3, act_dim=6)
QUICK_SIZES = Sizes(obs_dim=24, hidden=64, layers=2, act_dim=6)


class Variant(NamedTuple):
    name: str
    description: str
    weight_bytes: int
    fn: Callable[[np.ndarray], np.ndarray]


# ------------------------------------------------------------------------------------------------------- models


def make_params(sizes: Sizes, seed: int = 0) -> dict:
    """A Flax-initialized :class:`lpjax.nn.MLP` tree: ``{"params": {"Dense_0": {"kernel", "bias"}, ...}}``."""
    mlp = MLP((sizes.hidden,) * sizes.layers, sizes.act_dim)
    return jax.jit(mlp.init)(jax.random.PRNGKey(seed), jnp.zeros((1, sizes.obs_dim), jnp.float32))


def jax_int8_forward(layers: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], output_activation: str):
    """lpjax's int8 maths in XLA (per-token activations, ``int8_matmul(impl="reference")``), jitted, NumPy in/out."""
    weights = [(Int8Weight(jnp.asarray(c), jnp.asarray(s)), jnp.asarray(b)) for c, s, b in layers]

    @jax.jit
    def forward(weights, x):
        h = x.reshape(-1, x.shape[-1])
        for i, (w, b) in enumerate(weights):
            h = int8_matmul(h, w, bias=b, impl="reference")
            h = jax.nn.relu(h) if i < len(weights) - 1 else h
        h = jnp.tanh(h) if output_activation == "tanh" else h
        return h.reshape(x.shape[:-1] + h.shape[-1:])

    return lambda obs: np.asarray(forward(weights, np.asarray(obs, np.float32)))


def torch_models(params: dict, output_activation: str):
    """``(fp32 Sequential, quantize_dynamic int8 Sequential)`` with the weights of ``params``."""
    import torch

    tree = params["params"]
    modules = []
    for i in range(len(tree)):
        kernel, bias = np.asarray(tree[f"Dense_{i}"]["kernel"]), np.asarray(tree[f"Dense_{i}"]["bias"])
        linear = torch.nn.Linear(*kernel.shape)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel.T)))
            linear.bias.copy_(torch.from_numpy(np.array(bias)))
        modules.append(linear)
        if i < len(tree) - 1:
            modules.append(torch.nn.ReLU())
    if output_activation == "tanh":
        modules.append(torch.nn.Tanh())
    fp32 = torch.nn.Sequential(*modules).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's DeprecationWarning (kept: it is the baseline)
        int8 = torch.ao.quantization.quantize_dynamic(fp32, {torch.nn.Linear}, dtype=torch.qint8)
    return fp32, int8


def torch_call(model) -> Callable[[np.ndarray], np.ndarray]:
    import torch

    def call(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            y = model(torch.from_numpy(np.array(obs, np.float32).reshape(-1, obs.shape[-1])))
        y = y.numpy()
        return y[0] if obs.ndim == 1 else y

    return call


def torch_int8_bytes(model) -> int:
    """int8 weights + float32 biases + one float32 scale and int32 zero point per (per-tensor) weight."""
    total = 0
    for module in model.modules():
        if hasattr(module, "_packed_params") and hasattr(module, "weight"):
            w = module.weight()
            total += w.numel() + 4 * module.bias().numel() + 8
    return total


def make_variants(params: dict, sizes: Sizes, output_activation: str = "tanh") -> tuple[list[Variant], Int8MLP]:
    ours = Int8MLP.from_params(params, output_activation, threads=1)
    fp32 = Fp32MLP.from_params(params, output_activation)
    torch_fp32, torch_int8 = torch_models(params, output_activation)
    torch_fp32_bytes = int(sum(p.numel() * p.element_size() for p in torch_fp32.parameters()))
    variants = [
        Variant(JAX_FP32, "lpjax.inference.Fp32MLP: jax.jit fp32 forward", fp32.nbytes, fp32),
        Variant(NAIVE_INT8, "XLA int8: per-token int8 activations, lax.dot_general(int8, int8) -> int32 "
                "(kernels.int8_matmul impl='reference'), jitted", ours.nbytes,
                jax_int8_forward(ours.layers, output_activation)),
        Variant(OURS, f"lpjax.inference.Int8MLP: lpjax int8 weights on fbgemm (reduce_range={ours.reduce_range})",
                ours.nbytes, ours),
        Variant("torch_fp32", "torch.nn.Sequential(Linear, ReLU, ..., Tanh), inference_mode", torch_fp32_bytes,
                torch_call(torch_fp32)),
        Variant(TORCH_INT8, "torch.ao.quantization.quantize_dynamic(qint8): per-tensor weights, reduce_range=True",
                torch_int8_bytes(torch_int8), torch_call(torch_int8)),
    ]
    return variants, ours


# ------------------------------------------------------------------------------------------------------- timing


def time_variants(variants: Sequence[Variant], pool: np.ndarray, rounds: int, calls: int, warmup: int,
                  log: Callable[[str], None] = print) -> dict[str, dict]:
    """Per-call latencies (ms) of every variant, interleaved over ``rounds`` (order rotated each round)."""
    for v in variants:
        for i in range(warmup):
            v.fn(pool[i % len(pool)])
    samples: dict[str, list[list[float]]] = {v.name: [] for v in variants}
    log(f"timing: {rounds} rounds x {calls} calls per variant ({NAIVE_INT8}: {max(1, calls // NAIVE_CALL_FRACTION)})")
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    clock = time.perf_counter
    try:
        for r in range(rounds):
            shift = r % len(variants)
            for v in list(variants[shift:]) + list(variants[:shift]):
                n = max(1, calls // NAIVE_CALL_FRACTION) if v.name == NAIVE_INT8 else calls
                fn, times = v.fn, []
                for i in range(n):
                    obs = pool[(r * calls + i) % len(pool)]
                    start = clock()
                    fn(obs)
                    times.append(1e3 * (clock() - start))
                samples[v.name].append(times)
    finally:
        if gc_was_enabled:
            gc.enable()
    out = {}
    for v in variants:
        flat = np.concatenate(samples[v.name])
        out[v.name] = {
            "median_ms": float(np.median(flat)),
            "p90_ms": float(np.percentile(flat, 90)),
            "mean_ms": float(flat.mean()),
            "min_ms": float(flat.min()),
            "calls": int(flat.size),
            "round_medians_ms": [float(np.median(t)) for t in samples[v.name]],
        }
    return out


# ----------------------------------------------------------------------------------------------------- accuracy


def _forward64(layers, x):
    x = np.asarray(x, np.float64)
    for i, (w, b) in enumerate(layers):
        x = x @ np.asarray(w, np.float64) + np.asarray(b, np.float64)
        x = np.maximum(x, 0.0) if i < len(layers) - 1 else x
    return x


def accuracy(params: dict, ours: Int8MLP, obs: np.ndarray) -> dict:
    """Errors of the pre-tanh mean (and of the tanh action) against float64 forwards, batch 1 and batch 8."""
    tree = params["params"]
    fp32_layers = [(tree[f"Dense_{i}"]["kernel"], tree[f"Dense_{i}"]["bias"]) for i in range(len(tree))]
    deq_layers = ours.dequantized_layers()
    torch_fp32, torch_int8 = torch_models(params, "none")
    runtimes = {
        JAX_FP32: Fp32MLP.from_params(params, "none"),
        NAIVE_INT8: jax_int8_forward(ours.layers, "none"),
        OURS: Int8MLP.from_quantized(ours.layers, "none", threads=None, reduce_range=ours.reduce_range),
        f"{OURS}[reduce_range={not ours.reduce_range}]": Int8MLP.from_quantized(
            ours.layers, "none", threads=None, reduce_range=not ours.reduce_range),
        "torch_fp32": torch_call(torch_fp32),
        TORCH_INT8: torch_call(torch_int8),
    }
    batches = {"batch_1": obs[:, None, :], "batch_8": obs[: len(obs) // 8 * 8].reshape(-1, 8, obs.shape[-1])}
    out: dict[str, Any] = {}
    for batch_name, xs in batches.items():
        ref_deq = np.stack([_forward64(deq_layers, x) for x in xs])
        ref_fp32 = np.stack([_forward64(fp32_layers, x) for x in xs])
        out[batch_name] = {}
        for name, fn in runtimes.items():
            y = np.stack([fn(x) for x in xs]).astype(np.float64)
            row = {}
            for ref_name, ref in (("vs_dequantized_int8_float64", ref_deq), ("vs_fp32_float64", ref_fp32)):
                err = y - ref
                row[ref_name] = {
                    "rel_rms_mean": float(np.sqrt(np.mean(err ** 2) / np.mean(ref ** 2))),
                    "max_abs_mean": float(np.abs(err).max()),
                    "max_abs_action": float(np.abs(np.tanh(y) - np.tanh(ref)).max()),
                }
            out[batch_name][name] = row
    out["observations"] = len(obs)
    out["reference_rms_mean"] = float(np.sqrt(np.mean(_forward64(fp32_layers, obs) ** 2)))
    out["note"] = ("pre-tanh policy mean; 'vs_dequantized_int8_float64' isolates activation quantization for the "
                   f"lpjax int8 variants ({NAIVE_INT8}, {OURS}); {TORCH_INT8} has its own (per-tensor) weights, so "
                   "only its 'vs_fp32_float64' is like for like")
    return out


# -------------------------------------------------------------------------------------------------------- report


def _cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    wanted = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8")
                    return [fl for fl in line.split(":", 1)[1].split() if fl in wanted]
    except OSError:
        pass
    return []


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def run_benchmark(sizes: Sizes, rounds: int, calls: int, warmup: int, accuracy_obs: int, seed: int = 0,
                  log: Callable[[str], None] = print) -> dict:
    import torch

    torch.set_num_threads(1)
    params = make_params(sizes, seed)
    param_count = int(sum(x.size for x in jax.tree.leaves(params)))
    log(f"policy {sizes.obs_dim} -> {' -> '.join([str(sizes.hidden)] * sizes.layers)} -> {sizes.act_dim}: "
        f"{param_count:,} parameters")
    variants, ours = make_variants(params, sizes)
    pool = np.random.default_rng(seed + 1).normal(size=(256, sizes.obs_dim)).astype(np.float32)
    load_before = os.getloadavg()
    timings = time_variants(variants, pool, rounds, calls, warmup, log)
    load_after = os.getloadavg()
    log("accuracy ...")
    acc = accuracy(params, ours, np.random.default_rng(seed + 2).normal(
        size=(accuracy_obs, sizes.obs_dim)).astype(np.float32))

    rows = [{"variant": v.name, "description": v.description, "weight_bytes": v.weight_bytes, **timings[v.name]}
            for v in variants]
    by_name = {row["variant"]: row for row in rows}
    for row in rows:
        row["ratio_to_jax_fp32_median"] = row["median_ms"] / by_name[JAX_FP32]["median_ms"]
    ours_row, fp32_row, torch_row = by_name[OURS], by_name[JAX_FP32], by_name[TORCH_INT8]
    speedup = fp32_row["median_ms"] / ours_row["median_ms"]
    vs_torch = ours_row["median_ms"] / torch_row["median_ms"]
    targets = {
        "speedup_vs_jax_fp32": {
            "target": f">= {TARGET_SPEEDUP_VS_JAX_FP32}x (JAX fp32 median / ours median)",
            "median": speedup, "p90": fp32_row["p90_ms"] / ours_row["p90_ms"],
            "met": bool(speedup >= TARGET_SPEEDUP_VS_JAX_FP32)},
        "ratio_vs_torch_int8": {
            "target": f"<= {1 + TOLERANCE_VS_TORCH_INT8:.2f} (ours median / {TORCH_INT8} median: no slower, "
                      f"within {TOLERANCE_VS_TORCH_INT8:.0%})",
            "median": vs_torch, "p90": ours_row["p90_ms"] / torch_row["p90_ms"],
            "round_medians": [a / b for a, b in zip(ours_row["round_medians_ms"], torch_row["round_medians_ms"])],
            "met": bool(vs_torch <= 1 + TOLERANCE_VS_TORCH_INT8)},
    }
    return {
        "benchmark": RESULT_NAME,
        "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": {"jax": jax.__version__, "torch": torch.__version__, "numpy": np.__version__,
                     "python": platform.python_version()},
        "machine": {
            "cpu_model": _cpu_model(), "cpu_count": os.cpu_count(),
            "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "cpu_flags": _cpu_flags(), "platform": platform.platform(),
            "loadavg_1_5_15_before": list(load_before), "loadavg_1_5_15_after": list(load_after),
        },
        "config": {
            "sizes": sizes._asdict(), "param_count": param_count, "rounds": rounds, "calls_per_round": calls,
            "naive_int8_calls_per_round": max(1, calls // NAIVE_CALL_FRACTION), "warmup_calls": warmup,
            "seed": seed, "batch": 1, "output_activation": "tanh",
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "xla_single_threaded": SINGLE_THREAD_XLA_FLAGS in os.environ.get("XLA_FLAGS", ""),
            "torch_num_threads": torch.get_num_threads(),
            "torch_quantized_engine": torch.backends.quantized.engine,
            "fbgemm_saturates_8bit": fbgemm_saturates(), "ours_reduce_range": ours.reduce_range,
            "timing": "one perf_counter per call: NumPy obs (obs_dim,) in, NumPy action out (host<->device copies "
                      "included); rounds interleaved with the variant order rotated; gc disabled",
        },
        "fbgemm_activation_quantization": FBGEMM_ACTIVATIONS,
        "results": rows,
        "targets": targets,
        "accuracy": acc,
    }


def format_table(result: dict) -> str:
    header = (f"{'variant':<30} {'median ms':>10} {'p90 ms':>9} {'min ms':>9} {'x jax_fp32':>10} "
              f"{'weights MiB':>11} {'calls':>6}")
    lines = [header, "-" * len(header)]
    for row in result["results"]:
        lines.append(f"{row['variant']:<30} {row['median_ms']:>10.3f} {row['p90_ms']:>9.3f} {row['min_ms']:>9.3f} "
                     f"{row['ratio_to_jax_fp32_median']:>10.3f} {row['weight_bytes'] / 2**20:>11.2f} "
                     f"{row['calls']:>6}")
    lines.append("")
    for name, t in result["targets"].items():
        lines.append(f"{name}: median {t['median']:.2f}, p90 {t['p90']:.2f}; target {t['target']} -> "
                     f"{'MET' if t['met'] else 'MISSED'}")
    lines.append("")
    lines.append("accuracy of the pre-tanh mean (relative RMS error; max abs action error):")
    acc = result["accuracy"]
    for batch in ("batch_1", "batch_8"):
        for name, row in acc[batch].items():
            d, f = row["vs_dequantized_int8_float64"], row["vs_fp32_float64"]
            lines.append(f"  {batch} {name:<38} vs dequantized int8: {d['rel_rms_mean']:.2e} "
                         f"({d['max_abs_action']:.1e});  vs fp32: {f['rel_rms_mean']:.2e} ({f['max_abs_action']:.1e})")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["results"]
    names = [r["variant"] for r in rows]
    med = np.array([r["median_ms"] for r in rows])
    p90 = np.array([r["p90_ms"] for r in rows])
    colors = ["tab:orange" if n == OURS else "tab:blue" if n.startswith("jax") else "tab:gray" for n in names]
    fig, ax = plt.subplots(figsize=(9.0, 4.2))
    y = np.arange(len(rows))[::-1]
    ax.barh(y, med, color=colors, xerr=[np.zeros_like(med), p90 - med], capsize=3)
    for yi, m, p in zip(y, med, p90):
        ax.annotate(f"{m:.3f} ms", (p, yi), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_yticks(y, names)
    ax.set_xscale("log")
    ax.set_xlim(min(med) / 2, max(p90) * 4)
    s = result["config"]["sizes"]
    t = result["targets"]
    ax.set_xlabel("ms per batch-1 forward, one thread (bar: median, whisker: p90; log scale)")
    ax.set_title(f"Actor policy {s['obs_dim']}->{s['hidden']}x{s['layers']}->{s['act_dim']} on "
                 f"{result['machine']['cpu_model']}\nours: {t['speedup_vs_jax_fp32']['median']:.1f}x faster than "
                 f"jax_fp32, {t['ratio_vs_torch_int8']['median']:.2f}x the time of torch quantize_dynamic",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.actor_inference",
        description="Batch-1, single-threaded latency of the actor's 3x2048 MLP policy: JAX fp32, XLA int8, lpjax "
                    "Int8MLP (fbgemm), PyTorch fp32 and quantize_dynamic int8; plus their accuracy. Writes "
                    f"{RESULT_NAME}.json and {RESULT_NAME}.png.")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 20; quick: 2)")
    parser.add_argument("--calls", type=int, default=None, help="timed calls per variant per round (default 300; "
                        f"quick: 5; {NAIVE_INT8} gets calls // {NAIVE_CALL_FRACTION})")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up calls per variant (default 30; quick: 2)")
    parser.add_argument("--accuracy_obs", type=int, default=None, help="observations for the accuracy study "
                        "(default 256; quick: 16)")
    parser.add_argument("--hidden", type=int, default=None, help="hidden width (default 2048; quick: 64)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny policy, few calls: a smoke test, not a measurement")
    parser.add_argument("--out_dir", type=Path, default=DEFAULT_OUT_DIR)
    parser.add_argument("--no_plot", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    for name in ("rounds", "calls", "warmup", "hidden"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if args.accuracy_obs is not None and args.accuracy_obs < 8:
        raise ValueError(f"--accuracy_obs must be >= 8 (one batch of 8), got {args.accuracy_obs}.")
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    if args.hidden is not None:
        sizes = sizes._replace(hidden=args.hidden)
    pick = lambda value, full, quick: value if value is not None else (quick if args.quick else full)
    result = run_benchmark(sizes, rounds=pick(args.rounds, 20, 2), calls=pick(args.calls, 300, 5),
                           warmup=pick(args.warmup, 30, 2), accuracy_obs=pick(args.accuracy_obs, 256, 16),
                           seed=args.seed)
    result["command"] = command_line("benchmarks.actor_inference", argv)
    result["quick"] = bool(args.quick)
    write_results(result, format_table(result), args.out_dir, RESULT_NAME, None if args.no_plot else plot)
    return result


if __name__ == "__main__":
    main()
