"""Batch-1 latency of an actor's policy on one CPU core: JAX fp32, XLA int8, lpjax's Int8MLP on ONNX Runtime, and
(where installed) PyTorch.

The policy is an :class:`lpjax.nn.MLP` ``24 -> 2048 -> 2048 -> 2048 -> 6`` (relu, tanh output), called as an actor
calls it: a NumPy observation in, a NumPy action out, host-device copies included. The variants
(:func:`make_runtimes`) run lpjax's int8 weights on XLA (:data:`XLA_INT8`, four ways of writing the int32
accumulation), on ONNX Runtime's ``DynamicQuantizeMatMul`` (``ort_int8``, ours) and on torch's fbgemm, beside each
library's own fp32 forward and own dynamic quantization. Everything runs single-threaded (XLA's Eigen pool off before
jax is imported); every call is timed on its own in interleaved rounds (:func:`benchmarks.timing.interleaved`).

torch has a CPU wheel here only for Python 3.11, so ``--with_python .venv-oldest/bin/python`` runs the benchmark in
that virtualenv first; each environment's run is kept under ``environments[...]``. Targets: ``ort_int8`` at least 2x
faster than ``jax_fp32`` and faster than ``torch_int8_quantize_dynamic``. Accuracy (untimed): the pre-tanh mean
against float64 forwards of the dequantized int8 and of the fp32 weights (:func:`like_for_like`).
"""

from __future__ import annotations

import os
import sys

SINGLE_THREAD_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
if __name__ == "__main__" and "jax" not in sys.modules:  # must precede the first `import jax`
    _flags = os.environ.get("XLA_FLAGS", "")
    if SINGLE_THREAD_XLA_FLAGS not in _flags:  # a --with_python child inherits them
        os.environ["XLA_FLAGS"] = f"{_flags} {SINGLE_THREAD_XLA_FLAGS}".strip()

import argparse
import collections
import importlib.metadata
import importlib.util
import itertools
import json
import logging
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from benchmarks.timing import interleaved
from lpjax.inference import Fp32MLP, Int8MLP, u8s8_saturates
from lpjax.inference.mlp_params import mlp_layers
from lpjax.nn import MLP
from lpjax.quant import quantize_int8_per_token

RESULT_NAME = "actor_inference"
DEFAULT_OUT_DIR = common.RESULTS
OURS = "ort_int8"
JAX_FP32 = "jax_fp32"
TORCH_INT8 = "torch_int8_quantize_dynamic"
TARGET_SPEEDUP_VS_JAX_FP32 = 2.0
TARGET_RATIO_VS_TORCH_INT8 = 1.0
FP32_VARIANTS = (JAX_FP32, "ort_fp32", "torch_fp32")
OWN_WEIGHTS_VARIANTS = ("ort_quantize_dynamic", TORCH_INT8)  # quantized by their library, not by lpjax
SIZED_PACKAGES = ("jax", "jaxlib", "onnxruntime", "onnx", "torch")
CPU_FEATURES = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8")
OPTIONS = {  # name: (full default, --quick default, minimum, help); passed on to --with_python runs with --seed
    "rounds": (10, 2, 1, "interleaved rounds"),
    "calls": (200, 5, 1, "timed calls per variant per round"),
    "warmup": (20, 2, 1, "warm-up calls per variant"),
    "accuracy_obs": (256, 16, 8, "observations for the accuracy (one batch of 8 at least)"),
    "hidden": (2048, 64, 1, "hidden width"),
}

CAVEATS = [
    "Shared machine: other jobs ran on its cpu_count cores during the measurements. Each run records its 1/5/15-min "
    "load averages before and after timing (machine.loadavg_1_5_15_*); medians over many interleaved calls damp "
    "that noise but do not remove it.",
    "Ratios within one run (one process, variants interleaved) are like for like. Ratios to "
    "torch_int8_quantize_dynamic of another environment (where this one has no torch) compare two processes run one "
    "after the other.",
    "Batch 1, one thread, a randomly initialized policy: a trained policy's activation ranges differ (accuracy).",
]

ORT_ACTIVATIONS = (
    "ONNX Runtime's DynamicQuantizeMatMul quantizes each layer's float32 input per tensor (one range for the whole "
    "batch), asymmetrically to uint8, in float32: lo = min(min(x), 0), hi = max(max(x), 0), s = (hi - lo) / 255, "
    "zero point z = rint(-lo / s), q = clip(rint(x / s) + z, 0, 255); y = float32(sum_k (q - z) c) * (s * w_scale) "
    "+ bias. For a post-relu input that step is max/255, half of lpjax's symmetric per-token int8 (max/127)."
)


Sizes = collections.namedtuple("Sizes", "obs_dim hidden layers act_dim")
FULL_SIZES = Sizes(obs_dim=24, hidden=OPTIONS["hidden"][0], layers=3, act_dim=6)
QUICK_SIZES = Sizes(obs_dim=24, hidden=OPTIONS["hidden"][1], layers=2, act_dim=6)
Runtime = tuple[str, int, Callable[[np.ndarray], np.ndarray]]
"""A variant: its description, the bytes of the arrays it multiplies by, and ``obs -> y``."""


def _batched(call: Callable[[np.ndarray], Any]) -> Callable[[np.ndarray], np.ndarray]:
    """``call`` on a float32 ``(B, obs_dim)`` batch, as a NumPy ``obs -> y`` for one observation or a batch."""

    def run(obs: np.ndarray) -> np.ndarray:
        y = np.asarray(call(np.array(obs, np.float32).reshape(-1, obs.shape[-1])))
        return y[0] if obs.ndim == 1 else y

    return run


_dot = lambda q, codes: jnp.dot(q, codes, preferred_element_type=jnp.int32)
_widened = lambda q, codes: jnp.matmul(q.astype(jnp.int32), codes.astype(jnp.int32))
_reduce = lambda q, codes: jnp.sum(q.astype(jnp.int32)[:, :, None] * codes.astype(jnp.int32)[None], axis=1)
XLA_INT8 = {  # name: (description, weight storage dtype, int32 accumulation of (q (B, K) int8, codes (K, N)))
    "xla_int8_dot_general": (
        "jnp.dot(int8, int8, preferred_element_type=int32) (kernels.int8_matmul impl='reference')",
        jnp.int8,
        _dot,
    ),
    "xla_int8_widened_matmul": (
        "jnp.matmul(int32(q), int32(codes)): int8 weights widened in the graph",
        jnp.int8,
        _widened,
    ),
    "xla_int32_weights_matmul": ("jnp.matmul(int32(q), codes32): weights stored widened to int32", jnp.int32, _widened),
    "xla_int8_multiply_reduce": (
        "sum_k int32(q)[:, :, None] * int32(codes)[None]: a multiply-reduce fusion",
        jnp.int8,
        _reduce,
    ),
}


def xla_int8_runtime(ours: Int8MLP, name: str, output_activation: str) -> Runtime:
    """lpjax's int8 maths in XLA, jitted: per-token int8 activations, ``XLA_INT8[name]``'s int32 accumulation, then
    ``float32(acc) * s_x * s_w + bias`` (``lpjax.kernels.int8_matmul``'s epilogue)."""
    description, dtype, accumulate = XLA_INT8[name]
    weights = [(jnp.asarray(c, dtype), jnp.asarray(s), jnp.asarray(b)) for c, s, b in ours.layers]

    @jax.jit
    def forward(weights, h):
        for i, (codes, w_scale, bias) in enumerate(weights):
            q, x_scale = quantize_int8_per_token(h)
            h = accumulate(q, codes).astype(jnp.float32) * x_scale * w_scale + bias
            h = jax.nn.relu(h) if i < len(weights) - 1 else h
        return jnp.tanh(h) if output_activation == "tanh" else h

    nbytes = int(sum(x.nbytes for x in jax.tree.leaves(weights)))
    return f"XLA int8, per-token activations: {description}, jitted", nbytes, _batched(lambda x: forward(weights, x))


def ort_runtimes(params: dict, output_activation: str) -> dict[str, Runtime]:
    """The fp32 policy as an ONNX graph and its ``quantize_dynamic``, in one-thread sessions (default graph
    optimizations) weighed by their initializers."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    layers, nodes, weights, x = mlp_layers(params), [], [], "obs"

    def node(op: str, inputs: list[str], output: str) -> str:
        nodes.append(helper.make_node(op, inputs, [output]))
        return output

    for i, (kernel, bias) in enumerate(layers):
        weights += [numpy_helper.from_array(kernel, f"kernel_{i}"), numpy_helper.from_array(bias, f"bias_{i}")]
        x = node("Add", [node("MatMul", [x, f"kernel_{i}"], f"matmul_{i}"), f"bias_{i}"], f"linear_{i}")
        x = node("Relu", [x], f"relu_{i}") if i < len(layers) - 1 else x
    x = node("Tanh", [x], "tanh") if output_activation == "tanh" else x
    obs = helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["B", layers[0][0].shape[0]])
    mean = helper.make_tensor_value_info(x, TensorProto.FLOAT, ["B", layers[-1][0].shape[1]])
    graph = helper.make_graph(nodes, "fp32_mlp", [obs], [mean], weights)
    fp32 = helper.make_model(graph, ir_version=7, opset_imports=[helper.make_opsetid("", 13)])
    logging.disable(logging.WARNING)  # its advice to pre-process the model (shape inference) is for convolutions
    try:
        with tempfile.TemporaryDirectory() as tmp:
            quantize_dynamic(fp32, f"{tmp}/int8.onnx", per_channel=True, weight_type=QuantType.QInt8)
            int8 = onnx.load(f"{tmp}/int8.onnx")
    finally:
        logging.disable(logging.NOTSET)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3

    def runtime(description: str, model) -> Runtime:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        nbytes = int(sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer))
        return description, nbytes, _batched(lambda x: session.run(None, {"obs": x})[0])

    plain = "ONNX Runtime fp32 graph (MatMul, Add, Relu, Tanh)"
    dynamic = "onnxruntime.quantization.quantize_dynamic(per_channel=True, QInt8) of that graph"
    return {"ort_fp32": runtime(plain, fp32), "ort_quantize_dynamic": runtime(dynamic, int8)}


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def torch_runtimes(params: dict, ours: Int8MLP, output_activation: str) -> dict[str, Runtime]:
    """torch's fp32 ``Sequential``, its ``quantize_dynamic`` int8 one, and lpjax's int8 codes and scales, bit for
    bit, as per-channel ``qint8`` fbgemm weights (``quantized::linear_relu_dynamic``, 8-bit activations)."""
    import torch

    torch.set_num_threads(1)
    float_layers, modules, packed = mlp_layers(params), [], []
    for i, (kernel, bias) in enumerate(float_layers):
        modules.append(torch.nn.Linear(*kernel.shape))
        with torch.no_grad():
            modules[-1].weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel.T)))
            modules[-1].bias.copy_(torch.from_numpy(np.array(bias)))
        if i < len(float_layers) - 1:
            modules.append(torch.nn.ReLU())
    fp32 = torch.nn.Sequential(*modules, *([torch.nn.Tanh()] if output_activation == "tanh" else [])).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization and quantized tensors are deprecated, still baselines
        int8 = torch.ao.quantization.quantize_dynamic(fp32, {torch.nn.Linear}, dtype=torch.qint8)
        for codes, scales, bias in ours.layers:
            weight = torch.from_numpy(codes.T.astype(np.float32) * scales[:, None])
            zeros = torch.zeros(codes.shape[1], dtype=torch.int64)
            q = torch.quantize_per_channel(weight, torch.from_numpy(scales.astype(np.float64)), zeros, 0, torch.qint8)
            packed.append(torch.ops.quantized.linear_prepack(q, torch.from_numpy(np.array(bias))))

    def fbgemm(h):
        for weight in packed[:-1]:
            h = torch.ops.quantized.linear_relu_dynamic(h, weight, False)
        h = torch.ops.quantized.linear_dynamic(h, packed[-1], False)
        return torch.tanh(h) if output_activation == "tanh" else h

    def run(fn):
        return _batched(torch.inference_mode()(lambda x: fn(torch.from_numpy(x)).numpy()))

    quantized = [m for m in int8.modules() if hasattr(m, "_packed_params") and hasattr(m, "weight")]
    fp32_bytes = int(sum(p.numel() * p.element_size() for p in fp32.parameters()))
    # int8 weights, float32 biases, one float32 scale and int32 zero point per weight
    int8_bytes = sum(m.weight().numel() + 4 * m.bias().numel() + 8 for m in quantized)
    dynamic = "torch.ao.quantization.quantize_dynamic(qint8): per-tensor weights, reduce_range=True"
    ours_on_fbgemm = "lpjax int8 weights on fbgemm (quantized::linear_relu_dynamic), 8-bit activations"
    return {
        "torch_fp32": ("torch.nn.Sequential(Linear, ReLU, ..., Tanh), inference_mode", fp32_bytes, run(fp32)),
        TORCH_INT8: (dynamic, int8_bytes, run(int8)),
        "torch_int8_fbgemm": (ours_on_fbgemm, ours.nbytes, run(fbgemm)),
    }


def make_runtimes(params: dict, ours: Int8MLP, output_activation: str) -> dict[str, Runtime]:
    """Every variant this environment can run."""
    fp32 = Fp32MLP.from_params(params, output_activation)
    if output_activation != ours.output_activation:
        ours = Int8MLP.from_quantized(ours.layers, output_activation, gemm=ours.gemm)
    u8u8 = Int8MLP.from_quantized(ours.layers, output_activation, gemm="u8u8")
    runtimes = {JAX_FP32: ("lpjax.inference.Fp32MLP: jax.jit fp32 forward", fp32.nbytes, fp32)}
    runtimes |= {name: xla_int8_runtime(ours, name, output_activation) for name in XLA_INT8}
    description = "lpjax.inference.Int8MLP: lpjax int8 weights on ONNX Runtime DynamicQuantizeMatMul"
    runtimes[OURS] = (f"{description} (gemm={ours.gemm!r})", ours.nbytes, ours)
    runtimes["ort_int8_u8u8"] = ("lpjax.inference.Int8MLP(gemm='u8u8'): the non-saturating kernel", u8u8.nbytes, u8u8)
    runtimes |= ort_runtimes(params, output_activation)
    return runtimes | (torch_runtimes(params, ours, output_activation) if torch_available() else {})


def latencies(calls_s: list[list[float]]) -> dict[str, Any]:
    """Statistics (ms) of one variant's per-call seconds, given round by round."""
    per_round = [1e3 * np.asarray(t) for t in calls_s]
    flat = np.concatenate(per_round)
    stats = [np.median(flat), np.percentile(flat, 90), flat.mean(), flat.min()]
    out = {f"{name}_ms": float(v) for name, v in zip(("median", "p90", "mean", "min"), stats)}
    return out | {"calls": int(flat.size), "round_medians_ms": [float(np.median(t)) for t in per_round]}


def _forward64(layers, x):
    x = np.asarray(x, np.float64)
    for i, (w, b) in enumerate(layers):
        x = x @ np.asarray(w, np.float64) + np.asarray(b, np.float64)
        x = np.maximum(x, 0.0) if i < len(layers) - 1 else x
    return x


def like_for_like(variant: str) -> str:
    """The accuracy reference that isolates ``variant``'s own rounding: the fp32 forward for the float32 variants and
    for those that quantize with their own weights, the dequantized lpjax int8 forward for the rest."""
    return "vs_fp32_float64" if variant in FP32_VARIANTS + OWN_WEIGHTS_VARIANTS else "vs_dequantized_int8_float64"


def accuracy(params: dict, ours: Int8MLP, obs: np.ndarray) -> dict:
    """Errors of the pre-tanh mean (and of the tanh action) against float64 forwards, batch 1 and batch 8."""
    references = {"vs_dequantized_int8_float64": ours.dequantized_layers(), "vs_fp32_float64": mlp_layers(params)}
    skipped = list(XLA_INT8)[1:]  # the XLA int8 variants are one maths
    runtimes = {name: fn for name, (_, _, fn) in make_runtimes(params, ours, "none").items() if name not in skipped}
    batches = {"batch_1": obs[:, None, :], "batch_8": obs[: len(obs) // 8 * 8].reshape(-1, 8, obs.shape[-1])}
    out: dict[str, Any] = {}
    for batch_name, xs in batches.items():
        refs = {ref: np.stack([_forward64(layers, x) for x in xs]) for ref, layers in references.items()}
        out[batch_name] = {}
        for name, fn in runtimes.items():
            y = np.stack([fn(x) for x in xs]).astype(np.float64)
            row: dict[str, Any] = {"like_for_like": like_for_like(name)}
            for ref_name, ref in refs.items():
                err = y - ref
                row[ref_name] = {
                    "rel_rms_mean": float(np.sqrt(np.mean(err**2) / np.mean(ref**2))),
                    "max_abs_mean": float(np.abs(err).max()),
                    "max_abs_action": float(np.abs(np.tanh(y) - np.tanh(ref)).max()),
                }
            out[batch_name][name] = row
    out["observations"] = len(obs)
    out["reference_rms_mean"] = float(np.sqrt(np.mean(_forward64(references["vs_fp32_float64"], obs) ** 2)))
    out["note"] = (
        "pre-tanh policy mean; each row's 'like_for_like' names the reference that isolates its own "
        "rounding: 'vs_dequantized_int8_float64' (activation quantization only) for the variants on "
        "lpjax's int8 weights, 'vs_fp32_float64' for the float32 ones and for those quantizing weights "
        "of their own"
    )
    return out


def environment_key() -> str:
    return f"python{sys.version_info.major}.{sys.version_info.minor}-jax{jax.__version__}"


def installed_mb() -> dict[str, float]:
    """Disk size (MB) of each installed distribution of :data:`SIZED_PACKAGES`, from its file list."""
    sizes = {}
    for name, version in common.package_versions(SIZED_PACKAGES).items():
        if version is not None:
            paths = (Path(f.locate()) for f in importlib.metadata.files(name) or [])
            sizes[name] = round(sum(p.stat().st_size for p in paths if p.is_file()) / 1e6, 1)
    return sizes


def run_benchmark(sizes: Sizes, rounds: int, calls: int, warmup: int, accuracy_obs: int, seed: int) -> dict:
    """One environment's run: per-call latencies of every variant, accuracy, configuration, versions and machine."""
    mlp = MLP((sizes.hidden,) * sizes.layers, sizes.act_dim)  # initialized by Flax
    params = jax.jit(mlp.init)(jax.random.PRNGKey(seed), jnp.zeros((1, sizes.obs_dim), jnp.float32))
    param_count = int(sum(x.size for x in jax.tree.leaves(params)))
    hidden = " -> ".join([str(sizes.hidden)] * sizes.layers)
    print(f"{environment_key()}: policy {sizes.obs_dim} -> {hidden} -> {sizes.act_dim}: {param_count:,} parameters")
    ours = Int8MLP.from_params(params, "tanh", threads=1)
    runtimes = make_runtimes(params, ours, "tanh")
    pool = np.random.default_rng(seed + 1).normal(size=(256, sizes.obs_dim)).astype(np.float32)
    slow_calls = max(1, calls // 20)  # the slow XLA int8 variants
    print(f"timing: {rounds} rounds x {calls} calls per variant (XLA int8: {slow_calls})")
    cycles = {name: itertools.cycle(pool) for name in runtimes}  # each call on the next observation
    variants = {name: (lambda fn=fn, obs=cycles[name]: fn(next(obs))) for name, (_, _, fn) in runtimes.items()}
    counts = {name: slow_calls if name in XLA_INT8 else calls for name in runtimes}
    timing = interleaved(variants, rounds, calls=counts, warmup=warmup, per_call=True)
    print("accuracy ...")
    observations = np.random.default_rng(seed + 2).normal(size=(accuracy_obs, sizes.obs_dim)).astype(np.float32)
    flags, info = (common.cpu_info("flags") or "").split(), common.machine_info()
    machine = {key: info[key] for key in ("cpu_model", "cpu_count", "cpu_affinity")}
    machine |= {"cpu_flags": [f for f in CPU_FEATURES if f in flags], "platform": info["platform"]}
    machine |= {f"loadavg_1_5_15_{when}": timing["machine"][f"load_{when}"] for when in ("before", "after")}
    versions = common.package_versions(("jax", "numpy", "onnxruntime", "onnx", "torch"))
    xla_flags = os.environ.get("XLA_FLAGS", "")
    config = dict(sizes=sizes._asdict(), param_count=param_count, rounds=rounds, calls_per_round=calls)
    config.update(slow_calls_per_round=slow_calls, warmup_calls=warmup, seed=seed, batch=1, output_activation="tanh")
    config.update(xla_flags=xla_flags, xla_single_threaded=SINGLE_THREAD_XLA_FLAGS in xla_flags, ort_intra_op_threads=1)
    config.update(u8s8_saturates=u8s8_saturates(), ours_gemm=ours.gemm)
    config["timing"] = (
        "one perf_counter per call: NumPy obs (obs_dim,) in, NumPy action out (host<->device copies included); "
        "rounds interleaved with the variant order rotated; gc disabled"
    )
    return {
        "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": {"python": info["python"]} | {k: v for k, v in versions.items() if v},
        "installed_mb": installed_mb(),
        "machine": machine,
        "config": config,
        "results": [
            {"variant": name, "description": description, "weight_bytes": nbytes, **latencies(timing[name]["calls_s"])}
            for name, (description, nbytes, _) in runtimes.items()
        ],
        "accuracy": accuracy(params, ours, observations),
    }


def summarize(environments: dict[str, dict]) -> dict:
    """Every run's medians with their ratios to ``jax_fp32`` (same run) and to torch ``quantize_dynamic`` (the same
    run, or the first environment that has it), and the targets of ``ort_int8`` in each run."""
    medians = {env: {row["variant"]: row["median_ms"] for row in run["results"]} for env, run in environments.items()}
    first_torch_env = next((env for env, m in medians.items() if TORCH_INT8 in m), None)
    rows, targets = [], {}
    for env, m in medians.items():
        torch_env = env if TORCH_INT8 in m else first_torch_env
        torch_ms = medians[torch_env][TORCH_INT8] if torch_env else None
        for variant, ms in m.items():
            row = {"environment": env, "variant": variant, "median_ms": ms, "ratio_to_jax_fp32": ms / m[JAX_FP32]}
            row[f"ratio_to_{TORCH_INT8}"] = None if torch_ms is None else ms / torch_ms
            rows.append(row | {"torch_environment": torch_env})
        speedup = m[JAX_FP32] / m[OURS]
        text = f">= {TARGET_SPEEDUP_VS_JAX_FP32}x (jax_fp32 median / {OURS} median, same run)"
        met = speedup >= TARGET_SPEEDUP_VS_JAX_FP32
        targets[env] = {"speedup_vs_jax_fp32": dict(target=text, median=speedup, met=met)}
        if torch_ms is not None:
            ratio = m[OURS] / torch_ms
            text = f"< {TARGET_RATIO_VS_TORCH_INT8} ({OURS} median / {TORCH_INT8} median of {torch_env})"
            met = ratio < TARGET_RATIO_VS_TORCH_INT8
            targets[env]["ratio_vs_torch_int8"] = dict(target=text, median=ratio, met=met, torch_environment=torch_env)
    return {"rows": rows, "targets": targets}


def table(result: dict, env: str) -> str:
    """Every run's medians and targets, and the accuracy of ``env``'s run."""
    keys = ("environment", "variant", "median_ms", "ratio_to_jax_fp32", f"ratio_to_{TORCH_INT8}")
    rows = [["-" if row[k] is None else row[k] for k in keys] for row in result["summary"]["rows"]]
    header = ["environment", "variant", "median ms", "x jax_fp32", "x torch q_dyn"]
    lines = common.format_table(header, rows, ["<24", "<28", "10.3f", "10.3f", "13.3f"]) + [""]
    for other, targets in result["summary"]["targets"].items():
        for name, t in targets.items():
            met = "MET" if t["met"] else "MISSED"
            lines.append(f"{other} {name}: {t['median']:.2f}; target {t['target']} -> {met}")
    lines += ["", f"{env}: accuracy of the pre-tanh mean at batch 1 (relative RMS error):"]
    rows = [
        [name, *(row[f"vs_{ref}_float64"]["rel_rms_mean"] for ref in ("dequantized_int8", "fp32"))]
        for name, row in result["environments"][env]["accuracy"]["batch_1"].items()
    ]
    return "\n".join(lines + common.format_table(["", "vs int8", "vs fp32"], rows, ["<28", "9.2e", "9.2e"], "  "))


def plot(result: dict, path: Path) -> None:
    """Median (bar) and p90 (whisker) ms of every variant, one bar per environment, ours outlined."""
    runs = result["environments"]
    variants = list(dict.fromkeys(row["variant"] for row in result["summary"]["rows"]))
    rows = {(env, row["variant"]): row for env, run in runs.items() for row in run["results"]}
    with common.figure(path, figsize=(10.0, 0.3 * len(variants) * len(runs) + 1.8)) as (fig, ax):
        height, y0 = 0.8 / len(runs), np.arange(len(variants))[::-1]
        for j, (env, run) in enumerate(runs.items()):
            loads = [run["machine"].get(f"loadavg_1_5_15_{when}", [None])[0] for when in ("before", "after")]
            label = env if None in loads else f"{env} (1-min load {loads[0]:.1f} -> {loads[1]:.1f})"
            for yi, variant in zip(y0, variants):
                if (row := rows.get((env, variant))) is not None:
                    y, ms, ours = yi + 0.4 - height * (j + 0.5), row["median_ms"], variant == OURS
                    edge = "black" if ours else "none"
                    bar = dict(color=f"C{j}", label=label if ours else None, capsize=2, edgecolor=edge)
                    ax.barh(y, ms, height=height, xerr=[[0.0], [row["p90_ms"] - ms]], **bar)
                    text = dict(xytext=(4, 0), textcoords="offset points", va="center", fontsize=7)
                    ax.annotate(f"{ms:.3f} ms", (row["p90_ms"], y), **text)
        ax.set_yticks(y0, variants)
        ax.set_xscale("log")
        ax.set_xlim(min(r["median_ms"] for r in rows.values()) / 2, max(r["p90_ms"] for r in rows.values()) * 4)
        ax.legend(loc="lower right", fontsize=8)
        first = next(iter(runs.values()))
        s = first["config"]["sizes"]
        targets = result["summary"]["targets"]
        speedups = ", ".join(f"{env}: {t['speedup_vs_jax_fp32']['median']:.1f}x" for env, t in targets.items())
        ax.set_xlabel("ms per batch-1 forward, one thread (bar: median, whisker: p90; log scale)")
        ax.set_title(
            f"Actor policy {s['obs_dim']}->{s['hidden']}x{s['layers']}->{s['act_dim']} on "
            f"{first['machine']['cpu_model']}\n{OURS} (lpjax Int8MLP) faster than jax_fp32 by {speedups}",
            fontsize=9,
        )


def run_with(python: Path, args: argparse.Namespace) -> dict[str, dict]:
    """This benchmark with ``args``'s settings, run by ``python`` in a subprocess: ``{environment: run}``."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [str(python), "-m", "benchmarks.actor_inference", "--out_dir", tmp, "--no_plot"]
        for name in (*OPTIONS, "seed"):
            if getattr(args, name) is not None:
                command += [f"--{name}", str(getattr(args, name))]
        subprocess.run(command + (["--quick"] if args.quick else []), check=True, cwd=common.REPO)
        return json.loads((Path(tmp) / f"{RESULT_NAME}.json").read_text())["environments"]


def main(argv: Sequence[str] | None = None) -> dict:
    cli = common.parser(RESULT_NAME, __doc__, quick="tiny policy, few calls: a smoke test, not a measurement")
    for name, (full, quick, _, text) in OPTIONS.items():
        cli.add_argument(f"--{name}", type=int, default=None, help=f"{text} (default {full}; quick: {quick})")
    cli.add_argument("--seed", type=int, default=0)
    with_help = "also run this benchmark, same settings, with another virtualenv's interpreter first (repeatable)"
    cli.add_argument("--with_python", type=Path, action="append", default=[], metavar="PYTHON", help=with_help)
    args = cli.parse_args(argv)
    settings = {k: v[args.quick] if getattr(args, k) is None else getattr(args, k) for k, v in OPTIONS.items()}
    for name, value in settings.items():
        if value < OPTIONS[name][2]:
            raise ValueError(f"--{name} must be >= {OPTIONS[name][2]}, got {value}.")
    sizes = (QUICK_SIZES if args.quick else FULL_SIZES)._replace(hidden=settings.pop("hidden"))
    env = environment_key()
    runs = {}
    for python in args.with_python:
        runs.update(run_with(python, args))
        if env in runs:
            raise ValueError(f"--with_python {python} runs this benchmark's own environment ({env}).")
    run = run_benchmark(sizes, **settings, seed=args.seed)
    run |= {"command": common.command_line("benchmarks.actor_inference", argv), "quick": bool(args.quick)}
    json_path = args.out_dir / f"{args.name}.json"
    previous = json.loads(json_path.read_text()) if json_path.exists() else {}  # its other environments are kept
    environments = dict(sorted({**previous.get("environments", {}), **runs, env: run}.items()))
    result = {"benchmark": RESULT_NAME, "caveats": CAVEATS, "ort_activation_quantization": ORT_ACTIVATIONS}
    result |= {"environments": environments, "summary": summarize(environments)}
    return common.finish(args, result, table(result, env), plot)


if __name__ == "__main__":
    main()
