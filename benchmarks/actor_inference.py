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
import importlib.metadata
import importlib.util
import itertools
import json
import logging
import platform
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from benchmarks.common import RESULTS, command_line, cpu_info, figure, finish, machine_info, package_versions, parser
from benchmarks.timing import interleaved
from lpjax.inference import Fp32MLP, Int8MLP, u8s8_saturates
from lpjax.inference.mlp_params import mlp_layers
from lpjax.inference.ort_int8 import Layer
from lpjax.nn import MLP
from lpjax.quant import quantize_int8_per_token

RESULT_NAME = "actor_inference"
DEFAULT_OUT_DIR = RESULTS
OURS = "ort_int8"
JAX_FP32 = "jax_fp32"
TORCH_INT8 = "torch_int8_quantize_dynamic"
TARGET_SPEEDUP_VS_JAX_FP32 = 2.0
TARGET_RATIO_VS_TORCH_INT8 = 1.0
SLOW_CALL_FRACTION = 20  # the slow XLA int8 variants are timed on calls // 20 calls per round
FP32_VARIANTS = (JAX_FP32, "ort_fp32", "torch_fp32")
OWN_WEIGHTS_VARIANTS = ("ort_quantize_dynamic", TORCH_INT8)  # quantized by their library, not by lpjax
SIZED_PACKAGES = ("jax", "jaxlib", "onnxruntime", "onnx", "torch")
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


class Sizes(NamedTuple):
    obs_dim: int
    hidden: int
    layers: int
    act_dim: int


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


def _widened_matmul(q, codes):
    return jnp.matmul(q.astype(jnp.int32), codes.astype(jnp.int32))


XLA_INT8 = {  # name: (description, weight storage dtype, int32 accumulation of (q (B, K) int8, codes (K, N)))
    "xla_int8_dot_general": (
        "jnp.dot(int8, int8, preferred_element_type=int32) (kernels.int8_matmul impl='reference')",
        jnp.int8,
        lambda q, codes: jnp.dot(q, codes, preferred_element_type=jnp.int32),
    ),
    "xla_int8_widened_matmul": (
        "jnp.matmul(int32(q), int32(codes)): int8 weights widened in the graph",
        jnp.int8,
        _widened_matmul,
    ),
    "xla_int32_weights_matmul": (
        "jnp.matmul(int32(q), codes32): weights stored widened to int32",
        jnp.int32,
        _widened_matmul,
    ),
    "xla_int8_multiply_reduce": (
        "sum_k int32(q)[:, :, None] * int32(codes)[None]: a multiply-reduce fusion",
        jnp.int8,
        lambda q, codes: jnp.sum(q.astype(jnp.int32)[:, :, None] * codes.astype(jnp.int32)[None], axis=1),
    ),
}


def xla_int8_forward(layers: Sequence[Layer], name: str, output_activation: str) -> Callable[[np.ndarray], np.ndarray]:
    """lpjax's int8 maths in XLA, jitted: per-token int8 activations, ``XLA_INT8[name]``'s int32 accumulation, then
    ``float32(acc) * s_x * s_w + bias`` (``lpjax.kernels.int8_matmul``'s epilogue)."""
    _, dtype, accumulate = XLA_INT8[name]
    weights = [(jnp.asarray(c, dtype), jnp.asarray(s), jnp.asarray(b)) for c, s, b in layers]

    @jax.jit
    def forward(weights, x):
        h = x.reshape(-1, x.shape[-1])
        for i, (codes, w_scale, bias) in enumerate(weights):
            q, x_scale = quantize_int8_per_token(h)
            h = accumulate(q, codes).astype(jnp.float32) * x_scale * w_scale + bias
            h = jax.nn.relu(h) if i < len(weights) - 1 else h
        h = jnp.tanh(h) if output_activation == "tanh" else h
        return h.reshape(x.shape[:-1] + h.shape[-1:])

    return lambda obs: np.asarray(forward(weights, np.asarray(obs, np.float32)))


def onnx_fp32_model(params: dict, output_activation: str):
    """The fp32 policy as an ONNX ``ModelProto``: ``MatMul``, ``Add`` and ``Relu`` per layer, ``Tanh`` last."""
    from onnx import TensorProto, helper, numpy_helper

    layers = mlp_layers(params)
    nodes, weights, x = [], [], "obs"
    for i, (kernel, bias) in enumerate(layers):
        weights += [numpy_helper.from_array(kernel, f"kernel_{i}"), numpy_helper.from_array(bias, f"bias_{i}")]
        nodes.append(helper.make_node("MatMul", [x, f"kernel_{i}"], [f"matmul_{i}"]))
        nodes.append(helper.make_node("Add", [f"matmul_{i}", f"bias_{i}"], [f"linear_{i}"]))
        x = f"linear_{i}"
        if i < len(layers) - 1:
            nodes.append(helper.make_node("Relu", [x], [f"relu_{i}"]))
            x = f"relu_{i}"
    if output_activation == "tanh":
        nodes.append(helper.make_node("Tanh", [x], ["tanh"]))
        x = "tanh"
    io = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", d])
        for n, d in (("obs", layers[0][0].shape[0]), (x, layers[-1][0].shape[1]))
    ]
    graph = helper.make_graph(nodes, "fp32_mlp", io[:1], io[1:], weights)
    return helper.make_model(graph, ir_version=7, opset_imports=[helper.make_opsetid("", 13)])


def ort_quantize_dynamic_model(model):
    """``onnxruntime.quantization.quantize_dynamic(model, per_channel=True, weight_type=QInt8)``."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.disable(logging.WARNING)  # its advice to pre-process the model (shape inference) is for convolutions
    try:
        with tempfile.TemporaryDirectory() as tmp:
            onnx.save(model, f"{tmp}/fp32.onnx")
            quantize_dynamic(f"{tmp}/fp32.onnx", f"{tmp}/int8.onnx", per_channel=True, weight_type=QuantType.QInt8)
            return onnx.load(f"{tmp}/int8.onnx")
    finally:
        logging.disable(logging.NOTSET)


def ort_runtime(description: str, model) -> Runtime:
    """A one-thread ONNX Runtime session of ``model`` (default graph optimizations), weighed by its initializers."""
    import onnxruntime as ort
    from onnx import numpy_helper

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    output = session.get_outputs()[0].name
    nbytes = int(sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer))
    return description, nbytes, _batched(lambda x: session.run([output], {"obs": x})[0])


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def torch_runtimes(params: dict, ours: Int8MLP, output_activation: str) -> dict[str, Runtime]:
    """torch's fp32 ``Sequential``, its ``quantize_dynamic`` int8 one, and lpjax's int8 codes and scales, bit for
    bit, as per-channel ``qint8`` fbgemm weights (``quantized::linear_relu_dynamic``, 8-bit activations)."""
    import torch

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
        def call(x):
            with torch.inference_mode():
                return fn(torch.from_numpy(x)).numpy()

        return _batched(call)

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
    int32_bytes = ours.nbytes + 3 * sum(c.nbytes for c, _, _ in ours.layers)
    onnx_fp32 = onnx_fp32_model(params, output_activation)
    runtimes = {JAX_FP32: ("lpjax.inference.Fp32MLP: jax.jit fp32 forward", fp32.nbytes, fp32)}
    for name, (description, dtype, _) in XLA_INT8.items():
        runtimes[name] = (
            f"XLA int8, per-token activations: {description}, jitted",
            int32_bytes if dtype == jnp.int32 else ours.nbytes,
            xla_int8_forward(ours.layers, name, output_activation),
        )
    description = "lpjax.inference.Int8MLP: lpjax int8 weights on ONNX Runtime DynamicQuantizeMatMul"
    runtimes[OURS] = (f"{description} (gemm={ours.gemm!r})", ours.nbytes, ours)
    runtimes["ort_int8_u8u8"] = ("lpjax.inference.Int8MLP(gemm='u8u8'): the non-saturating kernel", u8u8.nbytes, u8u8)
    runtimes["ort_fp32"] = ort_runtime("ONNX Runtime fp32 graph (MatMul, Add, Relu, Tanh)", onnx_fp32)
    runtimes["ort_quantize_dynamic"] = ort_runtime(
        "onnxruntime.quantization.quantize_dynamic(per_channel=True, QInt8) of that graph",
        ort_quantize_dynamic_model(onnx_fp32),
    )
    return runtimes | (torch_runtimes(params, ours, output_activation) if torch_available() else {})


def time_variants(runtimes: dict[str, Runtime], pool: np.ndarray, rounds: int, calls: int, warmup: int, log=print):
    """Per-call latencies (ms) of every variant in interleaved rounds (the XLA int8 ones on fewer calls), each
    call on the next observation of ``pool``; and the machine's load before and after."""
    slow_calls = max(1, calls // SLOW_CALL_FRACTION)
    log(f"timing: {rounds} rounds x {calls} calls per variant (XLA int8: {slow_calls})")
    observations = {name: itertools.cycle(pool) for name in runtimes}
    timing = interleaved(
        {name: (lambda fn=fn, obs=observations[name]: fn(next(obs))) for name, (_, _, fn) in runtimes.items()},
        rounds,
        calls={name: slow_calls if name in XLA_INT8 else calls for name in runtimes},
        warmup=warmup,
        per_call=True,
    )
    out = {}
    for name in runtimes:
        per_round = [1e3 * np.asarray(t) for t in timing[name]["calls_s"]]
        flat = np.concatenate(per_round)
        out[name] = {
            "median_ms": float(np.median(flat)),
            "p90_ms": float(np.percentile(flat, 90)),
            "mean_ms": float(flat.mean()),
            "min_ms": float(flat.min()),
            "calls": int(flat.size),
            "round_medians_ms": [float(np.median(t)) for t in per_round],
        }
    return out, timing["machine"]


def _forward64(layers, x):
    x = np.asarray(x, np.float64)
    for i, (w, b) in enumerate(layers):
        x = x @ np.asarray(w, np.float64) + np.asarray(b, np.float64)
        x = np.maximum(x, 0.0) if i < len(layers) - 1 else x
    return x


def like_for_like(variant: str) -> str:
    """The accuracy reference that isolates ``variant``'s own rounding: the fp32 forward for the float32 variants and
    for those that quantize with their own weights, the dequantized lpjax int8 forward for the rest."""
    if variant in FP32_VARIANTS or variant in OWN_WEIGHTS_VARIANTS:
        return "vs_fp32_float64"
    return "vs_dequantized_int8_float64"


def accuracy(params: dict, ours: Int8MLP, obs: np.ndarray) -> dict:
    """Errors of the pre-tanh mean (and of the tanh action) against float64 forwards, batch 1 and batch 8."""
    references = {"vs_dequantized_int8_float64": ours.dequantized_layers(), "vs_fp32_float64": mlp_layers(params)}
    runtimes = {  # the XLA int8 variants are one maths
        name: fn
        for name, (_, _, fn) in make_runtimes(params, ours, "none").items()
        if name not in XLA_INT8 or name == "xla_int8_dot_general"
    }
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
    for name in SIZED_PACKAGES:
        try:
            files = importlib.metadata.distribution(name).files or []
        except importlib.metadata.PackageNotFoundError:
            continue
        paths = (Path(f.locate()) for f in files)
        sizes[name] = round(sum(p.stat().st_size for p in paths if p.is_file()) / 1e6, 1)
    return sizes


def run_benchmark(
    sizes: Sizes, rounds: int, calls: int, warmup: int, accuracy_obs: int, seed: int = 0, log=print
) -> dict:
    """One environment's run: timings, accuracy, configuration, versions and machine."""
    if torch_available():
        import torch

        torch.set_num_threads(1)
    mlp = MLP((sizes.hidden,) * sizes.layers, sizes.act_dim)  # initialized by Flax
    params = jax.jit(mlp.init)(jax.random.PRNGKey(seed), jnp.zeros((1, sizes.obs_dim), jnp.float32))
    param_count = int(sum(x.size for x in jax.tree.leaves(params)))
    hidden = " -> ".join([str(sizes.hidden)] * sizes.layers)
    log(f"{environment_key()}: policy {sizes.obs_dim} -> {hidden} -> {sizes.act_dim}: {param_count:,} parameters")
    ours = Int8MLP.from_params(params, "tanh", threads=1)
    runtimes = make_runtimes(params, ours, "tanh")
    pool = np.random.default_rng(seed + 1).normal(size=(256, sizes.obs_dim)).astype(np.float32)
    timings, load = time_variants(runtimes, pool, rounds, calls, warmup, log)
    log("accuracy ...")
    observations = np.random.default_rng(seed + 2).normal(size=(accuracy_obs, sizes.obs_dim)).astype(np.float32)
    flags, info = (cpu_info("flags") or "").split(), machine_info()
    features = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8")
    machine = {key: info[key] for key in ("cpu_model", "cpu_count", "cpu_affinity")}
    machine |= {"cpu_flags": [f for f in features if f in flags], "platform": info["platform"]}
    machine |= {f"loadavg_1_5_15_{when}": load[f"load_{when}"] for when in ("before", "after")}
    versions = package_versions(("jax", "numpy", "onnxruntime", "onnx", "torch"))
    return {
        "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": {"python": platform.python_version()} | {k: v for k, v in versions.items() if v},
        "installed_mb": installed_mb(),
        "machine": machine,
        "config": {
            "sizes": sizes._asdict(),
            "param_count": param_count,
            "rounds": rounds,
            "calls_per_round": calls,
            "slow_calls_per_round": max(1, calls // SLOW_CALL_FRACTION),
            "warmup_calls": warmup,
            "seed": seed,
            "batch": 1,
            "output_activation": "tanh",
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "xla_single_threaded": SINGLE_THREAD_XLA_FLAGS in os.environ.get("XLA_FLAGS", ""),
            "ort_intra_op_threads": 1,
            "u8s8_saturates": u8s8_saturates(),
            "ours_gemm": ours.gemm,
            "timing": "one perf_counter per call: NumPy obs (obs_dim,) in, NumPy action out (host<->device copies "
            "included); rounds interleaved with the variant order rotated; gc disabled",
        },
        "results": [
            {"variant": name, "description": description, "weight_bytes": nbytes, **timings[name]}
            for name, (description, nbytes, _) in runtimes.items()
        ],
        "accuracy": accuracy(params, ours, observations),
    }


def summarize(environments: dict[str, dict]) -> dict:
    """Every run's medians with their ratios to ``jax_fp32`` (same run) and to torch ``quantize_dynamic`` (the same
    run, or the first environment that has it), and the targets of ``ort_int8`` in each run."""
    medians = {env: {row["variant"]: row["median_ms"] for row in run["results"]} for env, run in environments.items()}
    torch_envs = [env for env, m in medians.items() if TORCH_INT8 in m]
    rows, targets = [], {}
    for env, m in medians.items():
        torch_env = env if TORCH_INT8 in m else (torch_envs[0] if torch_envs else None)
        torch_ms = medians[torch_env][TORCH_INT8] if torch_env else None
        for variant, ms in m.items():
            row = {"environment": env, "variant": variant, "median_ms": ms, "ratio_to_jax_fp32": ms / m[JAX_FP32]}
            row[f"ratio_to_{TORCH_INT8}"] = None if torch_ms is None else ms / torch_ms
            rows.append(row | {"torch_environment": torch_env})
        speedup = m[JAX_FP32] / m[OURS]
        target = f">= {TARGET_SPEEDUP_VS_JAX_FP32}x (jax_fp32 median / {OURS} median, same run)"
        met = bool(speedup >= TARGET_SPEEDUP_VS_JAX_FP32)
        targets[env] = {"speedup_vs_jax_fp32": {"target": target, "median": speedup, "met": met}}
        if torch_ms is not None:
            ratio = m[OURS] / torch_ms
            target = f"< {TARGET_RATIO_VS_TORCH_INT8} ({OURS} median / {TORCH_INT8} median of {torch_env})"
            met = bool(ratio < TARGET_RATIO_VS_TORCH_INT8)
            targets[env]["ratio_vs_torch_int8"] = {"target": target, "median": ratio, "met": met}
            targets[env]["ratio_vs_torch_int8"]["torch_environment"] = torch_env
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
    envs, runs = list(result["environments"]), result["environments"]
    variants = list(dict.fromkeys(row["variant"] for row in result["summary"]["rows"]))
    rows = {(env, row["variant"]): row for env, run in runs.items() for row in run["results"]}
    with figure(path, figsize=(10.0, 0.3 * len(variants) * len(envs) + 1.8)) as (fig, ax):
        height, y0 = 0.8 / len(envs), np.arange(len(variants))[::-1]
        for j, env in enumerate(envs):
            loads = [runs[env]["machine"].get(f"loadavg_1_5_15_{when}", [None])[0] for when in ("before", "after")]
            label = env if None in loads else f"{env} (1-min load {loads[0]:.1f} -> {loads[1]:.1f})"
            for yi, variant in zip(y0, variants):
                if (row := rows.get((env, variant))) is None:
                    continue
                y, ms, ours = yi + 0.4 - height * (j + 0.5), row["median_ms"], variant == OURS
                bar = dict(
                    color=f"C{j}", label=label if ours else None, capsize=2, edgecolor="black" if ours else "none"
                )
                ax.barh(y, ms, height=height, xerr=[[0.0], [row["p90_ms"] - ms]], **bar)
                text = dict(xytext=(4, 0), textcoords="offset points", va="center", fontsize=7)
                ax.annotate(f"{ms:.3f} ms", (row["p90_ms"], y), **text)
        ax.set_yticks(y0, variants)
        ax.set_xscale("log")
        ax.set_xlim(min(r["median_ms"] for r in rows.values()) / 2, max(r["p90_ms"] for r in rows.values()) * 4)
        ax.legend(loc="lower right", fontsize=8)
        first = next(iter(runs.values()))
        s = first["config"]["sizes"]
        speedups = ", ".join(
            f"{env}: {t['speedup_vs_jax_fp32']['median']:.1f}x" for env, t in result["summary"]["targets"].items()
        )
        ax.set_xlabel("ms per batch-1 forward, one thread (bar: median, whisker: p90; log scale)")
        ax.set_title(
            f"Actor policy {s['obs_dim']}->{s['hidden']}x{s['layers']}->{s['act_dim']} on "
            f"{first['machine']['cpu_model']}\n{OURS} (lpjax Int8MLP) faster than jax_fp32 by {speedups}",
            fontsize=9,
        )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    cli = parser(RESULT_NAME, __doc__, quick="tiny policy, few calls: a smoke test, not a measurement")
    for name, (full, quick, _, text) in OPTIONS.items():
        cli.add_argument(f"--{name}", type=int, default=None, help=f"{text} (default {full}; quick: {quick})")
    cli.add_argument("--seed", type=int, default=0)
    with_help = "also run this benchmark, same settings, with another virtualenv's interpreter first (repeatable)"
    cli.add_argument("--with_python", type=Path, action="append", default=[], metavar="PYTHON", help=with_help)
    return cli.parse_args(argv)


def run_with(python: Path, args: argparse.Namespace) -> dict[str, dict]:
    """This benchmark with ``args``'s settings, run by ``python`` in a subprocess: ``{environment: run}``."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [str(python), "-m", "benchmarks.actor_inference", "--out_dir", tmp, "--no_plot"]
        for name in (*OPTIONS, "seed"):
            if getattr(args, name) is not None:
                command += [f"--{name}", str(getattr(args, name))]
        subprocess.run(command + (["--quick"] if args.quick else []), check=True, cwd=RESULTS.parents[1])
        return json.loads((Path(tmp) / f"{RESULT_NAME}.json").read_text())["environments"]


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
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
    run["command"] = command_line("benchmarks.actor_inference", argv)
    run["quick"] = bool(args.quick)
    json_path = args.out_dir / f"{args.name}.json"
    previous = json.loads(json_path.read_text()) if json_path.exists() else {}  # its other environments are kept
    environments = dict(sorted({**previous.get("environments", {}), **runs, env: run}.items()))
    result = {"benchmark": RESULT_NAME, "caveats": CAVEATS, "ort_activation_quantization": ORT_ACTIVATIONS}
    result |= {"environments": environments, "summary": summarize(environments)}
    return finish(args, result, table(result, env), plot)


if __name__ == "__main__":
    main()
