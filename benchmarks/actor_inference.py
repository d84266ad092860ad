"""Batch-1 latency of an actor's policy on one CPU core: JAX fp32, XLA int8, lpjax's Int8MLP on ONNX Runtime, and
(where installed) PyTorch.

The policy is an :class:`lpjax.nn.MLP` ``24 -> 2048 -> 2048 -> 2048 -> 6`` (relu, tanh output), initialized by
Flax, called as an actor calls it (a NumPy observation in, a NumPy action out, host-device copies included):

* ``jax_fp32``: :class:`lpjax.inference.Fp32MLP`, one jitted fp32 forward;
* :data:`XLA_INT8`: lpjax's int8 maths jitted (per-token int8 activations, ``int8_matmul``'s epilogue), differing
  in how the int32 accumulation is written (slow: each timed on ``calls // SLOW_CALL_FRACTION`` calls per round);
* ``ort_int8``: :class:`lpjax.inference.Int8MLP`, lpjax's int8 weights on ONNX Runtime's
  ``DynamicQuantizeMatMul`` (``gemm="auto"``), and ``ort_int8_u8u8`` with ``gemm="u8u8"``;
* ``ort_fp32``: the fp32 graph on ONNX Runtime, and ``ort_quantize_dynamic``: that graph through
  ``onnxruntime.quantization.quantize_dynamic`` (its own per-channel int8 weights);
* with torch: ``torch_fp32``, ``torch_int8_quantize_dynamic`` (``torch.ao.quantization.quantize_dynamic``) and
  ``torch_int8_fbgemm`` (lpjax's int8 weights on ``quantized::linear_dynamic``, 8-bit activations).

Timing: single-threaded (XLA's Eigen pool off, set before jax is imported when run as a module; one ONNX Runtime
thread; ``torch.set_num_threads(1)``), every call timed on its own in interleaved rounds
(:func:`benchmarks.timing.interleaved`, ``per_call``), each call on the next observation of a fixed pool;
reported per variant: median, p90, mean and min over the calls and each round's median.

Environments: torch has a CPU wheel here only for Python 3.11, so the benchmark runs once per virtualenv
(``--with_python .venv-oldest/bin/python`` runs the other one first, as a subprocess with the same settings); each
run is stored under ``environments["python<X.Y>-jax<version>"]`` beside the others already there, with its
versions, installed sizes and load averages. ``summary`` gives every median's ratio to ``jax_fp32`` of its run and
to ``torch_int8_quantize_dynamic`` of its run (or of the environment that has torch). Targets: ``ort_int8`` at
least 2x faster than ``jax_fp32`` and faster than ``torch_int8_quantize_dynamic``.

Accuracy (untimed): the pre-tanh mean on ``--accuracy_obs`` observations at batch 1 and 8 against float64 forwards
of the dequantized int8 weights and of the fp32 weights (:func:`like_for_like` names each row's reference): the
relative RMS and max abs error of the mean and the max abs error of the action. Weight bytes: the arrays each
variant multiplies by (codes, scales, zero points, biases).
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

from benchmarks.common import RESULTS, command_line, cpu_info, figure, finish, parser
from benchmarks.timing import interleaved
from lpjax.inference import Fp32MLP, Int8MLP, u8s8_saturates
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
SHARED_OPTIONS = ("rounds", "calls", "warmup", "accuracy_obs", "hidden", "seed")  # passed on to --with_python runs

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


FULL_SIZES = Sizes(obs_dim=24, hidden=2048, layers=3, act_dim=6)
QUICK_SIZES = Sizes(obs_dim=24, hidden=64, layers=2, act_dim=6)


class Variant(NamedTuple):
    name: str
    description: str
    weight_bytes: int
    fn: Callable[[np.ndarray], np.ndarray]


# ------------------------------------------------------------------------------------------------- XLA int8


def _widened_matmul(q, codes):
    return jnp.matmul(q.astype(jnp.int32), codes.astype(jnp.int32))


def _multiply_reduce(q, codes):
    return jnp.sum(q.astype(jnp.int32)[:, :, None] * codes.astype(jnp.int32)[None], axis=1)


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
        _multiply_reduce,
    ),
}


def xla_int8_forward(layers: Sequence[Layer], name: str, output_activation: str) -> Callable[[np.ndarray], np.ndarray]:
    """lpjax's int8 maths in XLA, jitted, NumPy in/out: per-token int8 activations, ``XLA_INT8[name]``'s int32
    accumulation, then ``float32(acc) * s_x * s_w + bias`` (``lpjax.kernels.int8_matmul``'s epilogue)."""
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


# ------------------------------------------------------------------------------------------------- ONNX Runtime


def _float_layers(params: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    tree = params["params"]
    return [
        (np.asarray(tree[f"Dense_{i}"]["kernel"]), np.asarray(tree[f"Dense_{i}"]["bias"])) for i in range(len(tree))
    ]


def onnx_fp32_model(params: dict, output_activation: str):
    """The fp32 policy as an ONNX ``ModelProto``: ``MatMul``, ``Add`` and ``Relu`` per layer, ``Tanh`` last."""
    from onnx import TensorProto, helper, numpy_helper

    layers = _float_layers(params)
    nodes, weights, x = [], [], "obs"
    for i, (kernel, bias) in enumerate(layers):
        weights += [numpy_helper.from_array(kernel, f"kernel_{i}"), numpy_helper.from_array(bias, f"bias_{i}")]
        nodes += [
            helper.make_node("MatMul", [x, f"kernel_{i}"], [f"matmul_{i}"]),
            helper.make_node("Add", [f"matmul_{i}", f"bias_{i}"], [f"linear_{i}"]),
        ]
        x = f"linear_{i}"
        if i < len(layers) - 1:
            nodes.append(helper.make_node("Relu", [x], [f"relu_{i}"]))
            x = f"relu_{i}"
    if output_activation == "tanh":
        nodes.append(helper.make_node("Tanh", [x], ["tanh"]))
        x = "tanh"
    graph = helper.make_graph(
        nodes,
        "fp32_mlp",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["B", layers[0][0].shape[0]])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["B", layers[-1][0].shape[1]])],
        weights,
    )
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


def ort_call(model) -> Callable[[np.ndarray], np.ndarray]:
    """A one-thread ONNX Runtime session of ``model`` (default graph optimizations) as a NumPy ``obs -> y``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    output = session.get_outputs()[0].name

    def call(obs: np.ndarray) -> np.ndarray:
        y = session.run([output], {"obs": np.asarray(obs, np.float32).reshape(-1, obs.shape[-1])})[0]
        return y[0] if obs.ndim == 1 else y

    return call


def onnx_weight_bytes(model) -> int:
    """Bytes of a model's weight initializers (codes, scales, zero points, biases)."""
    from onnx import numpy_helper

    return int(sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer))


# ------------------------------------------------------------------------------------------------------- torch


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def torch_models(params: dict, output_activation: str):
    """``(fp32 Sequential, quantize_dynamic int8 Sequential)`` with the weights of ``params``."""
    import torch

    layers = _float_layers(params)
    modules = []
    for i, (kernel, bias) in enumerate(layers):
        linear = torch.nn.Linear(*kernel.shape)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel.T)))
            linear.bias.copy_(torch.from_numpy(np.array(bias)))
        modules.append(linear)
        if i < len(layers) - 1:
            modules.append(torch.nn.ReLU())
    if output_activation == "tanh":
        modules.append(torch.nn.Tanh())
    fp32 = torch.nn.Sequential(*modules).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's DeprecationWarning (kept: it is the baseline)
        int8 = torch.ao.quantization.quantize_dynamic(fp32, {torch.nn.Linear}, dtype=torch.qint8)
    return fp32, int8


def torch_fbgemm_forward(layers: Sequence[Layer], output_activation: str) -> Callable[[np.ndarray], np.ndarray]:
    """lpjax's int8 codes and scales, bit for bit, as per-channel ``qint8`` fbgemm weights, run with
    ``quantized::linear_relu_dynamic`` / ``linear_dynamic`` and 8-bit activations (``reduce_range=False``)."""
    import torch

    packed = []
    for codes, scales, bias in layers:
        weight = torch.from_numpy(codes.T.astype(np.float32) * scales[:, None])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # quantized tensor creation is deprecated
            q = torch.quantize_per_channel(
                weight,
                torch.from_numpy(scales.astype(np.float64)),
                torch.zeros(codes.shape[1], dtype=torch.int64),
                0,
                torch.qint8,
            )
        packed.append(torch.ops.quantized.linear_prepack(q, torch.from_numpy(np.array(bias))))

    def call(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            h = torch.from_numpy(np.array(obs, np.float32).reshape(-1, obs.shape[-1]))
            for weight in packed[:-1]:
                h = torch.ops.quantized.linear_relu_dynamic(h, weight, False)
            h = torch.ops.quantized.linear_dynamic(h, packed[-1], False)
            y = (torch.tanh(h) if output_activation == "tanh" else h).numpy()
        return y[0] if obs.ndim == 1 else y

    return call


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


# ------------------------------------------------------------------------------------------------------ variants


def make_params(sizes: Sizes, seed: int = 0) -> dict:
    """A Flax-initialized :class:`lpjax.nn.MLP` tree: ``{"params": {"Dense_0": {"kernel", "bias"}, ...}}``."""
    mlp = MLP((sizes.hidden,) * sizes.layers, sizes.act_dim)
    return jax.jit(mlp.init)(jax.random.PRNGKey(seed), jnp.zeros((1, sizes.obs_dim), jnp.float32))


def make_runtimes(params: dict, ours: Int8MLP, output_activation: str) -> dict[str, tuple[str, int, Callable]]:
    """Every variant this environment can run: ``{name: (description, weight bytes, obs -> y)}``."""
    fp32 = Fp32MLP.from_params(params, output_activation)
    if output_activation != ours.output_activation:
        ours = Int8MLP.from_quantized(ours.layers, output_activation, gemm=ours.gemm)
    u8u8 = Int8MLP.from_quantized(ours.layers, output_activation, gemm="u8u8")
    int32_bytes = ours.nbytes + 3 * sum(c.nbytes for c, _, _ in ours.layers)
    ort_fp32 = onnx_fp32_model(params, output_activation)
    ort_quantized = ort_quantize_dynamic_model(ort_fp32)
    runtimes = {JAX_FP32: ("lpjax.inference.Fp32MLP: jax.jit fp32 forward", fp32.nbytes, fp32)}
    for name, (description, dtype, _) in XLA_INT8.items():
        runtimes[name] = (
            f"XLA int8, per-token activations: {description}, jitted",
            int32_bytes if dtype == jnp.int32 else ours.nbytes,
            xla_int8_forward(ours.layers, name, output_activation),
        )
    runtimes.update(
        {
            OURS: (
                f"lpjax.inference.Int8MLP: lpjax int8 weights on ONNX Runtime DynamicQuantizeMatMul "
                f"(gemm={ours.gemm!r})",
                ours.nbytes,
                ours,
            ),
            "ort_int8_u8u8": ("lpjax.inference.Int8MLP(gemm='u8u8'): the non-saturating kernel", u8u8.nbytes, u8u8),
            "ort_fp32": (
                "ONNX Runtime fp32 graph (MatMul, Add, Relu, Tanh)",
                onnx_weight_bytes(ort_fp32),
                ort_call(ort_fp32),
            ),
            "ort_quantize_dynamic": (
                "onnxruntime.quantization.quantize_dynamic(per_channel=True, QInt8) of that graph",
                onnx_weight_bytes(ort_quantized),
                ort_call(ort_quantized),
            ),
        }
    )
    if torch_available():
        torch_fp32, torch_int8 = torch_models(params, output_activation)
        runtimes.update(
            {
                "torch_fp32": (
                    "torch.nn.Sequential(Linear, ReLU, ..., Tanh), inference_mode",
                    int(sum(p.numel() * p.element_size() for p in torch_fp32.parameters())),
                    torch_call(torch_fp32),
                ),
                TORCH_INT8: (
                    "torch.ao.quantization.quantize_dynamic(qint8): per-tensor weights, reduce_range=True",
                    torch_int8_bytes(torch_int8),
                    torch_call(torch_int8),
                ),
                "torch_int8_fbgemm": (
                    "lpjax int8 weights on fbgemm (quantized::linear_relu_dynamic), 8-bit activations",
                    ours.nbytes,
                    torch_fbgemm_forward(ours.layers, output_activation),
                ),
            }
        )
    return runtimes


# ------------------------------------------------------------------------------------------------------- timing


def time_variants(variants: Sequence[Variant], pool: np.ndarray, rounds: int, calls: int, warmup: int, log=print):
    """Per-call latencies (ms) of every variant in interleaved rounds (the XLA int8 ones on fewer calls), each
    call on the next observation of ``pool``; and the machine's load before and after."""
    slow_calls = max(1, calls // SLOW_CALL_FRACTION)
    log(f"timing: {rounds} rounds x {calls} calls per variant (XLA int8: {slow_calls})")
    observations = {v.name: itertools.cycle(pool) for v in variants}
    timing = interleaved(
        {v.name: (lambda fn=v.fn, obs=observations[v.name]: fn(next(obs))) for v in variants},
        rounds,
        calls={v.name: slow_calls if v.name in XLA_INT8 else calls for v in variants},
        warmup=warmup,
        per_call=True,
    )
    out = {}
    for v in variants:
        per_round = [1e3 * np.asarray(t) for t in timing[v.name]["calls_s"]]
        flat = np.concatenate(per_round)
        out[v.name] = {
            "median_ms": float(np.median(flat)),
            "p90_ms": float(np.percentile(flat, 90)),
            "mean_ms": float(flat.mean()),
            "min_ms": float(flat.min()),
            "calls": int(flat.size),
            "round_medians_ms": [float(np.median(t)) for t in per_round],
        }
    return out, timing["machine"]


# ----------------------------------------------------------------------------------------------------- accuracy


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
    fp32_layers, deq_layers = _float_layers(params), ours.dequantized_layers()
    runtimes = {
        name: fn
        for name, (_, _, fn) in make_runtimes(params, ours, "none").items()
        if name not in XLA_INT8 or name == "xla_int8_dot_general"
    }  # the XLA int8 variants are one maths
    batches = {"batch_1": obs[:, None, :], "batch_8": obs[: len(obs) // 8 * 8].reshape(-1, 8, obs.shape[-1])}
    out: dict[str, Any] = {}
    for batch_name, xs in batches.items():
        ref_deq = np.stack([_forward64(deq_layers, x) for x in xs])
        ref_fp32 = np.stack([_forward64(fp32_layers, x) for x in xs])
        out[batch_name] = {}
        for name, fn in runtimes.items():
            y = np.stack([fn(x) for x in xs]).astype(np.float64)
            row: dict[str, Any] = {"like_for_like": like_for_like(name)}
            for ref_name, ref in (("vs_dequantized_int8_float64", ref_deq), ("vs_fp32_float64", ref_fp32)):
                err = y - ref
                row[ref_name] = {
                    "rel_rms_mean": float(np.sqrt(np.mean(err**2) / np.mean(ref**2))),
                    "max_abs_mean": float(np.abs(err).max()),
                    "max_abs_action": float(np.abs(np.tanh(y) - np.tanh(ref)).max()),
                }
            out[batch_name][name] = row
    out["observations"] = len(obs)
    out["reference_rms_mean"] = float(np.sqrt(np.mean(_forward64(fp32_layers, obs) ** 2)))
    out["note"] = (
        "pre-tanh policy mean; each row's 'like_for_like' names the reference that isolates its own "
        "rounding: 'vs_dequantized_int8_float64' (activation quantization only) for the variants on "
        "lpjax's int8 weights, 'vs_fp32_float64' for the float32 ones and for those quantizing weights "
        "of their own"
    )
    return out


# -------------------------------------------------------------------------------------------------------- report


def environment_key() -> str:
    return f"python{sys.version_info.major}.{sys.version_info.minor}-jax{jax.__version__}"


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version(), "jax": jax.__version__, "numpy": np.__version__}
    for package in ("onnxruntime", "onnx", "torch"):
        if importlib.util.find_spec(package) is not None:
            versions[package] = __import__(package).__version__
    return versions


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
    sizes: Sizes,
    rounds: int,
    calls: int,
    warmup: int,
    accuracy_obs: int,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> dict:
    """One environment's run: timings, accuracy, configuration, versions and machine."""
    if torch_available():
        import torch

        torch.set_num_threads(1)
    params = make_params(sizes, seed)
    param_count = int(sum(x.size for x in jax.tree.leaves(params)))
    log(
        f"{environment_key()}: policy {sizes.obs_dim} -> {' -> '.join([str(sizes.hidden)] * sizes.layers)} -> "
        f"{sizes.act_dim}: {param_count:,} parameters"
    )
    ours = Int8MLP.from_params(params, "tanh", threads=1)
    variants = [Variant(name, *spec) for name, spec in make_runtimes(params, ours, "tanh").items()]
    pool = np.random.default_rng(seed + 1).normal(size=(256, sizes.obs_dim)).astype(np.float32)
    timings, load = time_variants(variants, pool, rounds, calls, warmup, log)
    log("accuracy ...")
    acc = accuracy(
        params, ours, np.random.default_rng(seed + 2).normal(size=(accuracy_obs, sizes.obs_dim)).astype(np.float32)
    )
    rows = [
        {"variant": v.name, "description": v.description, "weight_bytes": v.weight_bytes, **timings[v.name]}
        for v in variants
    ]
    flags = (cpu_info("flags") or "").split()
    return {
        "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": _versions(),
        "installed_mb": installed_mb(),
        "machine": {
            "cpu_model": cpu_info("model name") or platform.processor() or None,
            "cpu_count": os.cpu_count(),
            "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "cpu_flags": [
                f for f in ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags
            ],
            "platform": platform.platform(),
            "loadavg_1_5_15_before": load["load_before"],
            "loadavg_1_5_15_after": load["load_after"],
        },
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
        "results": rows,
        "accuracy": acc,
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
            rows.append(
                {
                    "environment": env,
                    "variant": variant,
                    "median_ms": ms,
                    "ratio_to_jax_fp32": ms / m[JAX_FP32],
                    "ratio_to_torch_int8_quantize_dynamic": None if torch_ms is None else ms / torch_ms,
                    "torch_environment": torch_env,
                }
            )
        speedup = m[JAX_FP32] / m[OURS]
        targets[env] = {
            "speedup_vs_jax_fp32": {
                "target": f">= {TARGET_SPEEDUP_VS_JAX_FP32}x (jax_fp32 median / {OURS} median, same run)",
                "median": speedup,
                "met": bool(speedup >= TARGET_SPEEDUP_VS_JAX_FP32),
            }
        }
        if torch_ms is not None:
            ratio = m[OURS] / torch_ms
            targets[env]["ratio_vs_torch_int8"] = {
                "target": f"< {TARGET_RATIO_VS_TORCH_INT8} ({OURS} median / {TORCH_INT8} median of {torch_env})",
                "median": ratio,
                "met": bool(ratio < TARGET_RATIO_VS_TORCH_INT8),
                "torch_environment": torch_env,
            }
    return {"rows": rows, "targets": targets}


def merged_result(previous: dict | None, runs: dict[str, dict]) -> dict:
    """The json with each of ``runs`` stored under ``environments[<its environment>]``, the other environments'
    runs of ``previous`` kept."""
    environments = dict(sorted({**(previous or {}).get("environments", {}), **runs}.items()))
    return {
        "benchmark": RESULT_NAME,
        "caveats": CAVEATS,
        "ort_activation_quantization": ORT_ACTIVATIONS,
        "environments": environments,
        "summary": summarize(environments),
    }


def format_table(result: dict, env: str) -> str:
    """Every run's medians and targets, and the accuracy of ``env``'s run."""
    header = f"{'environment':<24} {'variant':<28} {'median ms':>10} {'x jax_fp32':>10} {'x torch q_dyn':>13}"
    lines = [header, "-" * len(header)]
    for row in result["summary"]["rows"]:
        vs_torch = row["ratio_to_torch_int8_quantize_dynamic"]
        lines.append(
            f"{row['environment']:<24} {row['variant']:<28} {row['median_ms']:>10.3f} "
            f"{row['ratio_to_jax_fp32']:>10.3f} {'-' if vs_torch is None else f'{vs_torch:.3f}':>13}"
        )
    lines.append("")
    for env, targets in result["summary"]["targets"].items():
        for name, t in targets.items():
            lines.append(f"{env} {name}: {t['median']:.2f}; target {t['target']} -> {'MET' if t['met'] else 'MISSED'}")
    lines.append("")
    lines.append(f"{env}: accuracy of the pre-tanh mean at batch 1 (relative RMS error vs dequantized int8 / vs fp32):")
    for name, row in result["environments"][env]["accuracy"]["batch_1"].items():
        d, f = row["vs_dequantized_int8_float64"], row["vs_fp32_float64"]
        lines.append(f"  {name:<28} {d['rel_rms_mean']:.2e} / {f['rel_rms_mean']:.2e}")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    envs = list(result["environments"])
    variants = list(dict.fromkeys(row["variant"] for row in result["summary"]["rows"]))
    rows = {(env, row["variant"]): row for env, run in result["environments"].items() for row in run["results"]}
    with figure(path, figsize=(10.0, 0.3 * len(variants) * len(envs) + 1.8)) as (fig, ax):
        height = 0.8 / len(envs)
        y0 = np.arange(len(variants))[::-1]
        for j, env in enumerate(envs):
            machine = result["environments"][env]["machine"]
            loads = [machine.get(f"loadavg_1_5_15_{when}", [None])[0] for when in ("before", "after")]
            label = env if None in loads else f"{env} (1-min load {loads[0]:.1f} -> {loads[1]:.1f})"
            for yi, variant in zip(y0, variants):
                row = rows.get((env, variant))
                if row is None:
                    continue
                y = yi + 0.4 - height * (j + 0.5)
                ax.barh(
                    y,
                    row["median_ms"],
                    height=height,
                    color=f"C{j}",
                    label=label if variant == OURS else None,
                    xerr=[[0.0], [row["p90_ms"] - row["median_ms"]]],
                    capsize=2,
                    edgecolor=("black" if variant == OURS else "none"),
                )
                ax.annotate(
                    f"{row['median_ms']:.3f} ms",
                    (row["p90_ms"], y),
                    xytext=(4, 0),
                    textcoords="offset points",
                    va="center",
                    fontsize=7,
                )
        ax.set_yticks(y0, variants)
        ax.set_xscale("log")
        all_rows = list(rows.values())
        ax.set_xlim(min(r["median_ms"] for r in all_rows) / 2, max(r["p90_ms"] for r in all_rows) * 4)
        ax.legend(loc="lower right", fontsize=8)
        s = next(iter(result["environments"].values()))["config"]["sizes"]
        speedups = ", ".join(
            f"{env}: {t['speedup_vs_jax_fp32']['median']:.1f}x" for env, t in result["summary"]["targets"].items()
        )
        ax.set_xlabel("ms per batch-1 forward, one thread (bar: median, whisker: p90; log scale)")
        ax.set_title(
            f"Actor policy {s['obs_dim']}->{s['hidden']}x{s['layers']}->{s['act_dim']} on "
            f"{next(iter(result['environments'].values()))['machine']['cpu_model']}\n"
            f"{OURS} (lpjax Int8MLP) faster than jax_fp32 by {speedups}",
            fontsize=9,
        )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    cli = parser(RESULT_NAME, __doc__, quick="tiny policy, few calls: a smoke test, not a measurement")
    cli.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 10; quick: 2)")
    cli.add_argument("--calls", type=int, default=None, help="timed calls per variant per round (default 200; quick 5)")
    cli.add_argument("--warmup", type=int, default=None, help="warm-up calls per variant (default 20; quick: 2)")
    cli.add_argument("--accuracy_obs", type=int, default=None, help="observations for the accuracy (default 256)")
    cli.add_argument("--hidden", type=int, default=None, help="hidden width (default 2048; quick: 64)")
    cli.add_argument("--seed", type=int, default=0)
    cli.add_argument(
        "--with_python",
        type=Path,
        action="append",
        default=[],
        metavar="PYTHON",
        help="also run this benchmark, same settings, with another virtualenv's interpreter first (repeatable)",
    )
    return cli.parse_args(argv)


def run_with(python: Path, args: argparse.Namespace) -> dict[str, dict]:
    """This benchmark with ``args``'s settings, run by ``python`` in a subprocess: ``{environment: run}``."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [str(python), "-m", "benchmarks.actor_inference", "--out_dir", tmp, "--no_plot"]
        for name in SHARED_OPTIONS:
            if getattr(args, name) is not None:
                command += [f"--{name}", str(getattr(args, name))]
        subprocess.run(command + (["--quick"] if args.quick else []), check=True, cwd=RESULTS.parents[1])
        return json.loads((Path(tmp) / f"{RESULT_NAME}.json").read_text())["environments"]


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
    env = environment_key()
    runs = {}
    for python in args.with_python:
        runs.update(run_with(python, args))
        if env in runs:
            raise ValueError(f"--with_python {python} runs this benchmark's own environment ({env}).")
    pick = lambda value, full, quick: value if value is not None else (quick if args.quick else full)
    run = run_benchmark(
        sizes,
        rounds=pick(args.rounds, 10, 2),
        calls=pick(args.calls, 200, 5),
        warmup=pick(args.warmup, 20, 2),
        accuracy_obs=pick(args.accuracy_obs, 256, 16),
        seed=args.seed,
    )
    run["command"] = command_line("benchmarks.actor_inference", argv)
    run["quick"] = bool(args.quick)
    json_path = args.out_dir / f"{args.name}.json"
    previous = json.loads(json_path.read_text()) if json_path.exists() else None
    result = merged_result(previous, {**runs, env: run})
    return finish(args, result, format_table(result, env), plot)


if __name__ == "__main__":
    main()
