"""The GPU suite: what a task lent a GPU runs first (``make bench-gpu``), one command, at most 8 minutes on an H100
including compilation. Writes ``benchmarks/results/gpu_suite.{json,png}``, with every goal of issue 29 beside its
figure (``goals``).

Parts (``--parts`` takes names or letters, comma-separated; the default runs all, in this order):

* ``ceilings``: the measured bf16/fp8 matmul rates and HBM bandwidth, and whether float32 matmuls are TF32 here.
* ``matmul`` (e): the measurements behind ``matmul_impl="auto"``: ``"xla"`` against ``"pallas"`` per dtype and shape,
  and the table rows this GPU implies.
* ``table10`` (a): Björck et al.'s Table 10: one SAC update at cheetah-run's sizes, width {1024, 4096} x batch
  {1024, 4096}, for each of :data:`SAC_PRECISIONS`, all with ``matmul_impl="auto"``.
* ``optimizer`` (d): one step of the README's chain in float16 against ``optax.adam`` on a ~101M-parameter MLP,
  against its bytes-moved bound at the measured bandwidth and with its compiled HLO's traffic.
* ``fp8_rollout`` (c): decode tokens/s of :func:`lpjax.rollout.sample` with a ~0.94B-parameter transformer: bf16,
  fp8 W8A8 GEMMs, an fp8 KV cache, both.
* ``jitted_loop`` (b): env steps/s and updates/s of the jitted MJX loop with :mod:`benchmarks.gpu_train`'s
  settings, on 1 device and on all (needs the wheels of ``make gpu-wheels``).

Every figure is steady state (:mod:`benchmarks.steady_state`), compiled ahead of time with the compile time
recorded. The parts run in a supervised worker process: each item is recorded on its own (an error as its
message); a part past its limit (:func:`part_limit_s`), or a crashed worker, is killed, its finished items kept,
and a new worker runs the rest; a part stops starting items once its budget (:data:`BUDGET_S` x ``--budget_scale``)
is spent, and the suite stops at ``--deadline_s``. ``--quick`` runs every part at toy sizes (on the CPU, in the
default test tier): the same code paths, no meaningful figures.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import hlo_traffic
from benchmarks.common import command_line, figure, finish, format_table, parser, random_transitions, run_environment
from benchmarks.steady_state import CACHE_DIR, enable_compilation_cache, error_record, on_gpu, steady_state
from benchmarks.timing import interleaved

ORDER = ("ceilings", "matmul", "table10", "optimizer", "fp8_rollout", "jitted_loop")
LETTERS = {"a": "table10", "b": "jitted_loop", "c": "fp8_rollout", "d": "optimizer", "e": "matmul"}
BUDGET_S = {"ceilings": 30, "matmul": 45, "table10": 165, "optimizer": 15, "fp8_rollout": 90, "jitted_loop": 40}
"""Seconds each part may spend before it stops starting items."""
WORKER_START_S = 15
DEADLINE_S = 470
BUDGET_DERIVATION = (
    "Budgets from the seconds each item took on an H100 (benchmarks/results/gpu_suite.json, jax 0.11.2), ~15 s "
    "for the worker's start: ceilings 27 s; matmul 46 s; table10 30 s per fp32-highest item (27 s of it "
    "compiling) and 11 s per fp16 one, so its budget holds the first two rows at all four sizes; optimizer 14 s; "
    "fp8_rollout 10-65 s for bf16 and 12 s for the fp8 KV cache, each W8A8 variant over 160 s of compiling, so "
    "the default budget measures the first two and `--parts fp8_rollout --budget_scale 3` the rest; jitted_loop "
    "48 s for its first item. A part starts no item past its budget, so it can overrun by one item: about 455 s "
    "in the worst case."
)
"""How :data:`BUDGET_S` and :data:`DEADLINE_S` fit the 8 minutes (the json's ``estimate``)."""

# ----------------------------------------------------------------------------------------------------------------
# Running parts: items, budgets, the worker and its supervisor.


class Part:
    """One part's run: its result dict, its budget, and :meth:`item` to record each measurement on its own."""

    def __init__(self, name: str, budget_s: float, quick: bool, suite: dict, save: Callable[[], None]):
        self.name, self.budget_s, self.quick, self.suite, self._save = name, budget_s, quick, suite, save
        self.started = time.perf_counter()
        self.result: dict[str, Any] = {"budget_s": budget_s}

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def item(self, keys: Sequence[str], measure: Callable[..., Any], *args: Any) -> Any:
        """``measure(*args)`` stored at ``result[keys...]``, or ``{"skipped": ...}`` once the budget is spent, or
        the error it raised; saved to the progress file either way. Returns what was stored."""
        if self.elapsed() > self.budget_s:
            value: Any = {"skipped": f"budget of {self.budget_s:.0f} s spent"}
        else:
            print(f"[{self.name} {self.elapsed():6.1f} s] {' / '.join(keys)}", flush=True)
            started = time.perf_counter()
            try:
                value = measure(*args)
            except Exception as error:  # recorded: the part goes on with its next item
                value = error_record(error)
            if isinstance(value, dict):
                value.setdefault("seconds", time.perf_counter() - started)
        node = self.result
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
        self._save()
        return value


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def run_worker(
    progress: Path, parts: Sequence[str], quick: bool, budget_scale: float, cache: str, release: bool = True
) -> None:
    """Runs ``parts`` in this process, recording into the ``progress`` json (the supervisor reads it); with
    ``release``, JAX's caches are cleared after each part (a worker's device memory goes to the next part)."""
    enable_compilation_cache(cache)
    state = _read_json(progress) or {"parts": {}, "done": []}
    save = lambda: _write_json(progress, state)
    devices = jax.devices()
    state["device"] = dict(backend=jax.default_backend(), device_kind=devices[0].device_kind, device_count=len(devices))
    state["device"]["platform_version"] = getattr(devices[0].client, "platform_version", None)
    for name in parts:
        part = Part(name, BUDGET_S[name] * budget_scale, quick, state["parts"], save)
        state["parts"][name] = part.result
        state.update(current=name, current_started=time.time())
        save()
        try:
            PARTS[name](part)
        except Exception as error:  # the part's own failure, outside its items
            part.result.update(error_record(error))
        part.result["seconds"] = part.elapsed()
        state["done"].append(name)
        state["current"] = None
        save()
        if release:
            jax.clear_caches()
            gc.collect()


def _echo(stream, tail: collections.deque) -> None:
    for line in iter(stream.readline, ""):
        sys.stdout.write(line)
        sys.stdout.flush()
        tail.append(line.rstrip())


QUICK_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
"""XLA flags of a ``--quick`` worker: XLA:CPU compiles toy programs about twice as fast, and nothing is timed."""


def part_limit_s(name: str, args: argparse.Namespace) -> float:
    """Seconds the supervisor lets part ``name`` run before killing it: ``--part_limit``'s, else budget x 1.25 + 15."""
    if name in args.part_limit:
        return args.part_limit[name]
    return BUDGET_S[name] * args.budget_scale * 1.25 + 15


def supervise(
    parts: Sequence[str], args: argparse.Namespace, progress: Path, on_update: Callable[[dict], None]
) -> dict:
    """Runs the parts in worker processes (module docstring: the supervised worker); returns the progress state.
    ``on_update(state)`` is called after every part (the caller writes the json)."""
    started, remaining, state = time.monotonic(), list(parts), {"parts": {}, "done": []}
    _write_json(progress, state)
    command = [sys.executable, "-m", "benchmarks.gpu_suite", "--worker", str(progress), "--budget_scale"]
    command += [str(args.budget_scale), "--compilation_cache", args.compilation_cache]
    command += ["--quick"] if args.quick else []
    quick_flags = f"{os.environ.get('XLA_FLAGS', '')} {QUICK_XLA_FLAGS}".strip()
    env = dict(os.environ, XLA_FLAGS=quick_flags) if args.quick else None
    while remaining:
        if time.monotonic() - started > args.deadline_s - 5:
            for name in remaining:
                state["parts"][name] = {"skipped": f"suite deadline of {args.deadline_s:.0f} s reached"}
            break
        worker = [*command, "--parts", ",".join(remaining)]
        proc = subprocess.Popen(
            worker, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env
        )
        tail: collections.deque = collections.deque(maxlen=15)
        reader = threading.Thread(target=_echo, args=(proc.stdout, tail), daemon=True)
        reader.start()
        killed, reported = None, len(state["done"])
        while proc.poll() is None and not killed:
            time.sleep(0.5)
            state = _read_json(progress) or state
            if len(state["done"]) > reported:  # a part finished: the json has it, whatever happens next
                reported = len(state["done"])
                on_update(state)
            current = state.get("current")
            if time.monotonic() - started > args.deadline_s:
                killed = f"suite deadline of {args.deadline_s:.0f} s reached"
            elif current and time.time() - state["current_started"] > part_limit_s(current, args):
                killed = f"killed after {part_limit_s(current, args):.1f} s (its limit)"
        if killed:
            _kill(proc)
        reader.join(timeout=5)
        state = _read_json(progress) or state
        current, output = state.get("current"), list(tail)
        if current:  # killed or crashed inside a part: keep what it finished, mark it, go on
            error = killed or f"worker exited with status {proc.returncode}"
            seconds = time.time() - state["current_started"]
            state["parts"].setdefault(current, {}).update(error=error, worker_output_tail=output, seconds=seconds)
            state["done"].append(current)
            state["current"] = None
        remaining = [name for name in remaining if name not in state["done"]]
        if remaining and not current and (killed or proc.returncode):  # died between parts, or before the first
            error = killed or f"worker exited with status {proc.returncode} before this part"
            state["parts"].update({name: {"error": error, "worker_output_tail": output} for name in remaining})
            remaining = []
        _write_json(progress, state)
        on_update(state)
    return state


def _kill(proc: subprocess.Popen) -> None:
    """SIGTERM to the worker's process group, SIGKILL 5 s later."""
    for sig, timeout in ((signal.SIGTERM, 5), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)
            return


def compiled_record(compiled: Any, compile_s: float) -> dict[str, Any]:
    """Compile seconds and the compiled program's work instructions (:func:`benchmarks.hlo_traffic.kernel_count`)."""
    return {"compile_s": compile_s, "hlo_kernels": hlo_traffic.kernel_count(compiled.as_text())}


def aot(function: Any, *args: Any) -> tuple[Any, dict[str, Any]]:
    """``function.lower(*args).compile()`` (it shares jit's cache, so later calls do not compile), timed."""
    started = time.perf_counter()
    compiled = function.lower(*args).compile()
    return compiled, compiled_record(compiled, time.perf_counter() - started)


def part_ceilings(part: Part) -> None:
    from benchmarks import kernels

    part.item(["tf32"], tf32_check)
    if on_gpu() and not part.quick:
        part.item(["measured"], lambda: kernels.ceilings(iterations=10))
    else:
        part.result["measured"] = {"skipped": "the ceilings are measured with CUPTI on a GPU"}


def tf32_check(size: int = 1024) -> dict[str, Any]:
    """Relative error of a float32 matmul at JAX's default precision against ``"highest"``: ~1e-3 means TF32."""
    kx, kw = jax.random.split(jax.random.key(3))
    x, w = jax.random.normal(kx, (size, size)), jax.random.normal(kw, (size, size))
    default = jax.jit(jnp.dot)(x, w)
    with jax.default_matmul_precision("highest"):
        highest = jax.jit(jnp.dot)(x, w)
    error = float(jnp.max(jnp.abs(default - highest)) / jnp.max(jnp.abs(highest)))
    return {"default_vs_highest_relative_error": error, "default_is_tf32_like": error > 1e-5}


OBS_DIM, ACTION_DIM = 17, 6
"""cheetah-run from states."""
PAPER_SPEEDUP = {(1024, 1024): 0.96, (1024, 4096): 1.06, (4096, 1024): 2.83, (4096, 4096): 4.43}
"""Björck et al. Table 10 (V100): fp16 over fp32 per (width, batch), its columns (the sizes timed)."""
GOAL_SPEEDUP = {(1024, 1024): 1.0, (1024, 4096): 1.1, (4096, 1024): 3.0, (4096, 4096): 4.5}
"""Issue 29's goals for fp16 (paper methods) over fp32-highest."""

SAC_PRECISIONS: dict[str, tuple[str, str | None]] = {
    "fp32 highest": ("fp32", "highest"),
    "fp16 (paper methods)": ("fp16", None),
    "fp32 default (TF32 on Hopper)": ("fp32", None),
    "bf16": ("bf16", None),
    "fp16_sr": ("fp16_sr", None),
    "fp8": ("fp8", None),
}
"""Table rows: (config, ``jax.default_matmul_precision``); the first two at every size run first."""


def sac_config(name: str, width: int, batch: int) -> Any:
    """:class:`lpjax.agents.sac.SACConfig` of ``experiments/configs/sac/<name>.py`` at this size, with
    ``matmul_impl="auto"``."""
    from lpjax.agents import sac

    agent = importlib.import_module(f"experiments.configs.sac.{name}").get_config().agent.to_dict()
    return sac.SACConfig.from_mapping(agent | dict(hidden_dims=(width, width), batch_size=batch, matmul_impl="auto"))


def sac_update_item(label: str, width: int, batch: int, quick: bool) -> dict[str, Any]:
    """Compile and steady-state timing of one SAC update of row ``label`` at (``width``, ``batch``)."""
    from lpjax.agents import sac
    from lpjax.nn.matmul_choice import resolve_matmul_impl

    name, precision = SAC_PRECISIONS[label]
    config = sac_config(name, width, batch)
    with jax.default_matmul_precision(precision) if precision else contextlib.nullcontext():
        agent = jax.jit(lambda key: sac.init(key, jnp.zeros((OBS_DIM,)), ACTION_DIM, config))(jax.random.key(0))
        data = jax.device_put(random_transitions(np.random.default_rng(0), batch, OBS_DIM, ACTION_DIM))
        _, record = aot(sac.update, agent, data)
        agent, timing = steady_state(lambda s: sac.update(s, data)[0], agent, quick=quick, target_s=0.4, max_steps=500)
        agent, metrics = sac.update(agent, data)
    metrics = jax.device_get(metrics)
    out = record | timing | dict(config=f"experiments/configs/sac/{name}.py", matmul_precision=precision or "default")
    out["matmul_impl"] = resolve_matmul_impl("auto", config.precision.matmul_dtype, (batch, width, width))
    out["critic_loss_finite"] = bool(np.isfinite(metrics["critic_loss"]))
    return out | dict(critic_skipped_steps=float(metrics["critic_skipped_steps"]))


QUICK_SAC_PRECISIONS = ("fp32 highest", "fp16 (paper methods)", "fp8")
"""The rows ``--quick`` runs: one per code path (a precision context, the paper's methods, fp8 GEMMs)."""


def part_table10(part: Part) -> None:
    sizes = [(32, 32)] if part.quick else list(PAPER_SPEEDUP)
    labels = list(QUICK_SAC_PRECISIONS if part.quick else SAC_PRECISIONS)
    # What the goals compare first (fp32-highest and fp16 at every size), then the other rows at the corners
    # (1024/1024, 4096/4096), then at the other sizes: items past the budget are skipped in this order.
    corners = [size for size in sizes if size[0] == size[1]]
    order = [(label, size) for label in labels[:2] for size in sizes]
    order += [(label, size) for size in corners + [s for s in sizes if s not in corners] for label in labels[2:]]
    part.result["obs_dim"], part.result["action_dim"] = OBS_DIM, ACTION_DIM
    for label, (width, batch) in order:
        part.item(["sizes", f"w{width}_b{batch}", label], sac_update_item, label, width, batch, part.quick)


OPTIMIZER_VARIANTS = (("optax.adam", "float32"), ("optax.adam", "float16"), ("lpjax.chain", "float16"))


def optimizer_item(variant: str, dtype: str, quick: bool, hbm_tb_s: float) -> dict[str, Any]:
    """One optimizer step (``tx.update`` + ``apply_updates``, params and state donated) in steady state, its
    bytes-moved bound at ``hbm_tb_s`` and the traffic of its compiled HLO."""
    from benchmarks import optimizer_overhead

    make = {v.name: v.make for v in optimizer_overhead.VARIANTS}[variant]
    # ~101M parameters: 64 -> 4096 -> 6 x (4096 x 4096) -> 16
    mlp = optimizer_overhead.Sizes(in_dim=64, width=4096, hidden_layers=6, out_dim=16)
    params = optimizer_overhead.mlp_params(jax.random.key(0), optimizer_overhead.QUICK_SIZES if quick else mlp, dtype)
    grads = optimizer_overhead.random_grads(jax.random.key(1), params)
    tx = make()
    state = (params, tx.init(params))
    step = optimizer_overhead.make_step(tx)
    compiled, record = aot(step, *state, grads)
    sizes = {name: optimizer_overhead.tree_nbytes(tree) for name, tree in zip(("params", "state"), state)}
    traffic = hlo_traffic.summary(compiled.as_text(), sizes["params"])
    bound_bytes = 2 * (sizes["params"] + sizes["state"]) + optimizer_overhead.tree_nbytes(grads)
    state, timing = steady_state(lambda s: step(*s, grads), state, quick=quick, target_s=0.3, max_steps=200)
    bound_ms = bound_bytes / (hbm_tb_s * 1e12) * 1e3
    finite = all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(state[0]))
    out = record | timing | dict(params=sum(leaf.size for leaf in jax.tree.leaves(params)))
    out.update(param_bytes=sizes["params"], state_bytes=sizes["state"], bound_bytes=bound_bytes, bound_ms=bound_ms)
    out.update(hlo_traffic_bytes=traffic["read_bytes"] + traffic["written_bytes"], hlo_passes=traffic["passes"])
    out["gpu_over_bound"] = timing["gpu_ms_per_step"] / bound_ms if "gpu_ms_per_step" in timing else None
    return out | dict(wall_over_bound=timing["wall_ms_per_step"] / bound_ms, params_finite=finite)


def part_optimizer(part: Part) -> None:
    from benchmarks.kernels import GPUS

    tb_s, source = _get(part.suite, "ceilings", "measured", "hbm_tb_s"), "measured (ceilings)"
    if tb_s is None:  # the H100's datasheet figure
        tb_s, source = GPUS["H100"]["hbm_tb_s"], "H100 datasheet (ceilings not measured)"
    part.result.update(hbm_tb_s=tb_s, hbm_source=source)
    part.result["bound"] = "every input (params, state, grads) read once and every output (params, state) written once"
    for variant, dtype in OPTIMIZER_VARIANTS[::2] if part.quick else OPTIMIZER_VARIANTS:
        part.item(["variants", f"{variant} {dtype}"], optimizer_item, variant, dtype, part.quick, tb_s)


LM = {"vocab_size": 32768, "num_layers": 16, "num_heads": 16, "d_model": 2048, "d_ff": 8192}
ROLLOUT = {"batch": 64, "prompt": 64, "new_tokens": 256}
QUICK_LM = {"vocab_size": 64, "num_layers": 2, "num_heads": 2, "d_model": 32, "d_ff": 64}
QUICK_ROLLOUT = {"batch": 2, "prompt": 4, "new_tokens": 8}
ROLLOUT_VARIANTS = {
    "bf16": ("bf16", "bfloat16"),
    "fp8 KV cache": ("bf16", "float8_e4m3fn"),
    "fp8 W8A8 + fp8 KV cache": ("fp8", "float8_e4m3fn"),
    "fp8 W8A8": ("fp8", "bfloat16"),
}
"""(policy of the q/k/v/o and MLP layers, KV-cache dtype); embeddings, norms, attention core and lm_head are
float32 in all (:mod:`lpjax.nn.transformer`). The W8A8 variants come last: each compiles for minutes."""
QUICK_ROLLOUT_VARIANTS = ("bf16", "fp8 W8A8 + fp8 KV cache")
"""The CPU tier's variants: both fp8 paths (Pallas matmuls and the fp8 KV cache) in one."""


def _decode_traffic(compiled: Any) -> dict[str, Any]:
    """Bytes one decode step moves: the traffic model (:mod:`benchmarks.hlo_traffic`) of the compiled program's
    largest loop body (the decode step), with its heaviest passes."""
    text = compiled.as_text()
    bodies = hlo_traffic.loop_bodies(text)
    if not bodies:
        return {}
    passes = hlo_traffic.passes(text, bodies[0])
    heaviest = sorted(passes, key=lambda p: -(p.read + p.written))[:6]
    return {
        "step_traffic_gb": sum(p.read + p.written for p in passes) / 1e9,
        "heaviest_passes": [f"{p.opcode} {p.name}: {(p.read + p.written) / 1e9:.3f} GB" for p in heaviest],
        "traffic_note": "operand plus result bytes of each pass of the loop body (benchmarks.hlo_traffic): a slice "
        "counts its whole operand, an in-place scatter its update",
    }


def rollout_item(label: str, quick: bool, shared: dict) -> dict[str, Any]:
    from lpjax import rollout
    from lpjax.nn import transformer_causal_lm

    policy, kv = ROLLOUT_VARIANTS[label]
    dims, sizes = (QUICK_LM, QUICK_ROLLOUT) if quick else (LM, ROLLOUT)
    batch, prompt, new = sizes["batch"], sizes["prompt"], sizes["new_tokens"]
    model = transformer_causal_lm({**dims, "max_len": prompt + new, "policy": policy}, kv_cache_dtype=kv)
    if policy not in shared:  # the parameters of a policy, shared by its two KV-cache variants
        shared[policy] = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
    params = shared[policy]
    prompts = jax.random.randint(jax.random.key(1), (batch, prompt), 0, dims["vocab_size"], jnp.int32)
    scales = model.calibrate_kv(params, prompts[: min(batch, 8)])
    settings = rollout.SamplingSettings(max_new_tokens=new, eos_id=0)
    compiled, record = aot(rollout.sample, model, params, prompts, jax.random.key(2), settings, scales)

    def step(state):
        key, _ = state
        return jax.random.fold_in(key, 1), rollout.sample(model, params, prompts, key, settings, scales)

    _, timing = steady_state(step, (jax.random.key(2), None), quick=quick, min_steps=1, max_steps=1, warmup=0)
    leaves = jax.tree.leaves(params)
    out = record | timing | _decode_traffic(compiled) | dict(policy=policy, kv_cache_dtype=kv)
    out.update(parameters=sum(leaf.size for leaf in leaves), parameter_bytes=sum(leaf.nbytes for leaf in leaves))
    out["tokens_per_s"] = batch * new / (timing["wall_ms_per_step"] / 1e3)
    out["gpu_tokens_per_s"] = batch * new / (timing["gpu_ms_per_step"] / 1e3) if "gpu_ms_per_step" in timing else None
    return out


def part_fp8_rollout(part: Part) -> None:
    part.result.update(model=QUICK_LM if part.quick else LM, rollout=QUICK_ROLLOUT if part.quick else ROLLOUT)
    part.result["timing"] = "one sample() call (prefill + new_tokens decode steps in one lax.scan) is a step"
    shared: dict = {}
    for label in QUICK_ROLLOUT_VARIANTS if part.quick else ROLLOUT_VARIANTS:
        part.item(["variants", label], rollout_item, label, part.quick, shared)
    shared.clear()


LOOP_PRECISIONS = ("fp32", "fp16", "bf16")


def jitted_loop_item(precision: str, devices: int, quick: bool) -> dict[str, Any]:
    """env steps/s and updates/s of the jitted loop's chunk in steady state, on ``devices`` devices."""
    from benchmarks import gpu_train
    from experiments import sac_brax_loop

    settings = gpu_train.loop_settings(precision, quick, devices)
    iterations = gpu_train.chunk_iterations(quick)
    started = time.perf_counter()
    chunk = sac_brax_loop.chunk_fn(settings, iterations)
    loop = jax.block_until_ready(sac_brax_loop.init_loop(settings, 0))
    record = compiled_record(chunk, time.perf_counter() - started)
    loop, timing = steady_state(lambda s: chunk(s)[0], loop, quick=quick, target_s=1.5, min_steps=2, max_steps=20)
    envs, updates, per_s = settings.num_envs, settings.updates_per_step, 1e3 / timing["wall_ms_per_step"]
    out = record | timing | dict(devices=devices, num_envs=envs, updates_per_iteration=updates)
    out.update(iterations_per_chunk=iterations, env_steps_per_s=envs * iterations * per_s)
    out["updates_per_s"] = updates * iterations * per_s
    out["kernels_per_iteration"] = timing["kernels_per_step"] / iterations if "kernels_per_step" in timing else None
    return out | dict(actions_finite=bool(jax.device_get(chunk(loop)[1].actions_finite)))


LOOP_MODULES = ("ml_collections", "mujoco", "mujoco_playground", "brax", "tqdm")
"""What the jitted MJX loop imports beyond JAX's own stack (the wheels of ``make gpu-wheels``)."""


def part_jitted_loop(part: Part) -> None:
    from benchmarks import gpu_train

    missing = [name for name in LOOP_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        part.result["error"] = (
            f"not installed: {', '.join(missing)}. Run `make gpu-wheels` on a machine with network, carry "
            "gpu-wheels/ and run `make bench-gpu` (it installs them), see WORKSPACE.md"
        )
        return

    part.result["settings"] = gpu_train.settings(part.quick)
    precisions = ("fp16",) if part.quick else LOOP_PRECISIONS
    counts = [1] + ([jax.device_count()] if jax.device_count() > 1 else [])
    for devices in counts:
        for precision in precisions:
            part.item(["devices", str(devices), precision], jitted_loop_item, precision, devices, part.quick)


MATMUL_DTYPES = {"float8_e4m3fn": "fp8", "bfloat16": "bf16", "float16": "fp16"}
"""Matmul dtype -> the policy timed (fp8: float32 weights quantized per call, as a Dense holds them)."""
QUICK_SHAPES = {"sac": (32, 64, 64), "llm_prefill": (64, 128, 128), "llm_decode": (8, 128, 128)}


def matmul_item(dtype: str, shape_name: str, quick: bool) -> dict[str, Any]:
    """GPU ms per product of ``policy_dense`` with ``matmul_impl="xla"`` and ``"pallas"`` at one shape (operand sets
    beyond the L2 cache, as :mod:`benchmarks.kernels`), and what ``"auto"`` picks here."""
    from benchmarks.kernels import SHAPES, measure, num_sets
    from lpjax.nn import policy_dense
    from lpjax.nn.matmul_choice import resolve_matmul_impl
    from lpjax.precision import get_policy

    policy = get_policy(MATMUL_DTYPES[dtype])
    m, k, n = (QUICK_SHAPES if quick else SHAPES)[shape_name]
    sets = 2 if quick else num_sets(2 * (m * k + k * n))
    inputs = []
    for key in jax.random.split(jax.random.key(4), sets):
        kx, kw = jax.random.split(key)
        x = jax.random.normal(kx, (m, k), jnp.float32).astype(policy.compute_dtype)
        w = (jax.random.normal(kw, (k, n), jnp.float32) / math.sqrt(k)).astype(policy.param_dtype)
        inputs.append((x, w))
    out: dict[str, Any] = {"shape": [m, k, n], "sets_per_call": sets}
    for impl in ("xla", "pallas"):
        fn = lambda s, impl=impl: [policy_dense(x, w, None, policy=policy, matmul_impl=impl) for x, w in s]
        if on_gpu():
            timing = measure(fn, (inputs,), iterations=5 if quick else 10)
        else:
            compiled = jax.jit(fn).lower(inputs).compile()
            timing = {"wall_ms": 1e3 * interleaved({impl: lambda c=compiled: c(inputs)}, 1)[impl]["median_s"]}
        if "error" in timing:
            out[impl] = timing
            continue
        ms = timing.get("gpu_ms", timing["wall_ms"])
        out[impl] = {"ms_per_product": ms / sets, "kernels": len(timing.get("kernels", {})) or None}
    timed = {impl: out[impl]["ms_per_product"] for impl in ("xla", "pallas") if "ms_per_product" in out[impl]}
    out["fastest"] = min(timed, key=timed.__getitem__) if timed else None
    out["auto"] = resolve_matmul_impl("auto", dtype, (m, k, n))
    out["auto_is_fastest"] = out["auto"] == out["fastest"] if len(timed) == 2 else None
    return out


def part_matmul(part: Part) -> None:
    part.result["timing"] = "GPU ms per product (CUPTI) on a GPU; wall ms per product elsewhere (not comparable)"
    for dtype in MATMUL_DTYPES:
        for shape_name in ("sac", "llm_decode", "llm_prefill"):
            part.item([dtype, shape_name], matmul_item, dtype, shape_name, part.quick)
    rows = [
        {"dtype": dtype, "shape": entry["shape"], "ms": {i: entry[i]["ms_per_product"] for i in ("xla", "pallas")}}
        for dtype, shapes in part.result.items()
        if dtype in MATMUL_DTYPES
        for entry in shapes.values()
        if isinstance(entry, dict) and all("ms_per_product" in entry.get(i, {}) for i in ("xla", "pallas"))
    ]
    part.result["implied_rows"] = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "rows": rows}


PARTS: dict[str, Callable[[Part], None]] = {
    "ceilings": part_ceilings,
    "table10": part_table10,
    "optimizer": part_optimizer,
    "fp8_rollout": part_fp8_rollout,
    "jitted_loop": part_jitted_loop,
    "matmul": part_matmul,
}

# ----------------------------------------------------------------------------------------------------------------
# Goals, table, plot.


def _get(tree: dict, *keys: str) -> Any:
    for key in keys:
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def goals(parts: dict) -> list[dict[str, Any]]:
    """Issue 29's goals, each with its target and the measured figure (``met`` is None where unmeasured)."""

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    def goal(text: str, target: float | None, measured: float | None, at_least: bool = True, **extra) -> dict:
        met = None if measured is None or target is None else (measured >= target) == at_least
        return {"goal": text, "target": target, **extra, "measured": measured, "met": met}

    out = []
    for (width, batch), target in GOAL_SPEEDUP.items():
        row, size = _get(parts, "table10", "sizes", f"w{width}_b{batch}") or {}, f"w{width} b{batch}"
        fp32, fp16 = row.get("fp32 highest", {}), row.get("fp16 (paper methods)", {})
        speedup = ratio(fp32.get("gpu_ms_per_step"), fp16.get("gpu_ms_per_step"))
        text = f"fp16 (paper methods) over fp32-highest, GPU time, {size}"
        out.append(goal(text, target, speedup, paper=PAPER_SPEEDUP[(width, batch)]))
        wall = ratio(fp32.get("wall_ms_per_step"), fp16.get("wall_ms_per_step"))
        out.append(goal(f"fp16 wall time per update no worse than fp32-highest's, {size}", 1.0, wall))
        kernels = ratio(fp16.get("kernels_per_step"), fp32.get("kernels_per_step"))
        out.append(goal(f"kernels per fp16 update <= 1.1x fp32's, {size}", 1.1, kernels, at_least=False))
    variants = _get(parts, "fp8_rollout", "variants") or {}
    for label in ("fp8 W8A8 + fp8 KV cache", "fp8 KV cache", "fp8 W8A8"):
        measured = ratio(_get(variants, label, "tokens_per_s"), _get(variants, "bf16", "tokens_per_s"))
        target = 1.3 if label.startswith("fp8 W8A8 +") else None
        out.append(goal(f"FP8 rollout decode tokens/s over bf16's: {label}", target, measured))
    chain = _get(parts, "optimizer", "variants", "lpjax.chain float16", "gpu_over_bound")
    text = "optimizer (README chain, fp16) GPU time within 1.2x of its bytes-moved bound"
    return out + [goal(text, 1.2, chain, at_least=False)]


MEASURED = ("wall_ms_per_step", "error", "skipped", "ms_per_product")
"""Keys that mark a dict of a part's result as one item's record."""


def _items(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict):
            if any(k in value for k in MEASURED):
                yield f"{prefix}{key}", value
            else:
                yield from _items(value, f"{prefix}{key} / ")


def _summary(leaf: dict) -> str:
    if "error" in leaf:
        return "ERROR " + leaf["error"].splitlines()[0][:90]
    if "skipped" in leaf:
        return "skipped: " + leaf["skipped"]
    if "ms_per_product" in leaf:
        return f"{leaf['ms_per_product']:.4f} ms/product"
    parts = [f"wall {leaf['wall_ms_per_step']:.3f} ms"]
    if "gpu_ms_per_step" in leaf:
        parts.append(f"GPU {leaf['gpu_ms_per_step']:.3f} ms")
    kernels = leaf.get("kernels_per_step", leaf.get("hlo_kernels"))
    if kernels is not None:
        parts.append(f"{kernels:.0f} kernels" + ("" if "kernels_per_step" in leaf else " (HLO)"))
    for key in ("tokens_per_s", "env_steps_per_s", "updates_per_s"):
        if leaf.get(key):
            parts.append(f"{leaf[key]:.0f} {key.removesuffix('_per_s').replace('_', ' ')}/s")
    if "compile_s" in leaf:
        parts.append(f"compile {leaf['compile_s']:.1f} s")
    return ", ".join(parts)


def table(result: dict) -> str:
    """The suite's figures, one line per item, then the goals."""
    device = result.get("device") or {}
    jax_version = result["environment"]["versions"]["jax"]
    lines = [f"{device.get('device_kind', '?')} ({device.get('backend', '?')}), jax {jax_version}"]
    for name, part in result["parts"].items():
        status = part.get("error") or part.get("skipped") or ""
        lines.append(f"== {name}: {part.get('seconds', 0):.0f} s {status[:100]}")
        lines += [f"   {path:60s} {_summary(leaf)}" for path, leaf in _items(part)]
    goals = [
        [g["goal"][:80], str(g["target"]), "unmeasured" if g["measured"] is None else g["measured"], str(g["met"])]
        for g in result["goals"]
    ]
    header, formats = ["== goals", "target", "measured", "met"], ["<83", ">6", "10.3f", ">5"]
    return "\n".join(lines + format_table(header, goals, formats))


def _bars(ax, entries: dict, key: str, title: str, fallback: str | None = None) -> None:
    names = list(entries)
    values = [_get(entries, n, key) or _get(entries, n, fallback) or 0.0 for n in names]
    ax.bar(range(len(names)), values)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=7)
    ax.set_title(title, fontsize=9)


def plot(result: dict, path: Path) -> None:
    """Four panels: Table 10's speedups over fp32-highest, rollout tokens/s, the optimizer against its bound, the
    jitted loop's throughput."""
    parts = result["parts"]
    sizes = _get(parts, "table10", "sizes") or {}
    labels = [label for label in SAC_PRECISIONS if label != "fp32 highest"]
    timed = "GPU time" if any(_get(r, "fp32 highest", "gpu_ms_per_step") for r in sizes.values()) else "wall time"
    with figure(path, 1, 4, dpi=110, figsize=(20, 4.5)) as (fig, axes):
        ms = lambda row, label: _get(row, label, "gpu_ms_per_step") or _get(row, label, "wall_ms_per_step") or math.nan
        for i, label in enumerate(labels):  # 0 where either is missing
            values = [float(np.nan_to_num(ms(row, "fp32 highest") / ms(row, label))) for row in sizes.values()]
            axes[0].bar(np.arange(len(sizes)) + i * 0.8 / len(labels), values, 0.8 / len(labels), label=label)
        axes[0].set_xticks(np.arange(len(sizes)) + 0.4 - 0.4 / len(labels), list(sizes), fontsize=8)
        axes[0].axhline(1.0, color="k", lw=0.8)
        axes[0].set(title=f"a. SAC update: speedup over fp32-highest ({timed})", ylabel="x")
        axes[0].legend(fontsize=6)
        _bars(axes[1], _get(parts, "fp8_rollout", "variants") or {}, "tokens_per_s", "c. decode tokens/s")
        variants = _get(parts, "optimizer", "variants") or {}
        _bars(axes[2], variants, "gpu_over_bound", "d. optimizer: time over bytes-moved bound", "wall_over_bound")
        axes[2].axhline(1.2, color="k", ls="--", lw=0.8)
        loop = _get(parts, "jitted_loop", "devices") or {}
        loop = {f"{d} dev {p}": v for d, row in loop.items() for p, v in row.items()}
        _bars(axes[3], loop, "updates_per_s", "b. jitted loop: updates/s")
        device = (result.get("device") or {}).get("device_kind", "?")
        fig.suptitle(f"gpu_suite on {device}" + (" (quick: toy sizes)" if result.get("quick") else ""), fontsize=10)


# ----------------------------------------------------------------------------------------------------------------
# Command line.


def parse_parts(text: str) -> list[str]:
    """``--parts``: names of :data:`ORDER` or letters of :data:`LETTERS`, comma-separated, run in suite order."""
    names = [LETTERS.get(token, token) for token in map(str.strip, text.split(",")) if token]
    unknown = [name for name in names if name not in PARTS]
    if unknown:
        raise ValueError(f"unknown part {unknown[0]!r}; valid: {', '.join(ORDER)} or letters {', '.join(LETTERS)}")
    if not names:
        raise ValueError("--parts selects no part")
    return [name for name in ORDER if name in names]


def parse_limits(text: str) -> dict[str, float]:
    """``--part_limit``: ``name=seconds`` pairs (names or letters), comma-separated."""
    limits = {}
    for token in filter(None, map(str.strip, text.split(","))):
        name, _, seconds = token.partition("=")
        try:
            limits[parse_parts(name)[0]] = float(seconds)
        except ValueError as error:
            raise ValueError(f"--part_limit wants name=seconds, got {token!r} ({error})") from None
    return limits


def estimate(parts: Sequence[str], budget_scale: float) -> dict[str, Any]:
    """The time the suite may take: worker start, the parts' budgets, the deadline (module docstring)."""
    budgets = {name: BUDGET_S[name] * budget_scale for name in parts}
    total = WORKER_START_S + sum(budgets.values())
    return dict(worker_start_s=WORKER_START_S, budgets_s=budgets, total_budget_s=total, derivation=BUDGET_DERIVATION)


def main(argv: Sequence[str] | None = None) -> dict | None:
    cli = parser(
        "gpu_suite", __doc__, quick="toy sizes (the CPU test tier): code paths, no figures; writes gpu_suite_quick"
    )
    cli.add_argument("--parts", default=",".join(ORDER), help=f"comma-separated: {', '.join(ORDER)}, or a-e")
    cli.add_argument("--budget_scale", type=float, default=1.0, help="multiplies every part's budget")
    cli.add_argument("--deadline_s", type=float, default=DEADLINE_S, help="the whole suite's hard limit")
    cli.add_argument("--part_limit", default="", help="name=seconds,...: kill a part after this long")
    cli.add_argument("--in_process", action="store_true", help="run the parts here, without a worker process")
    cli.add_argument("--compilation_cache", default=CACHE_DIR, help="persistent compilation cache ('': none)")
    cli.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = cli.parse_args(argv)
    args.name = "gpu_suite_quick" if args.quick and args.name == "gpu_suite" else args.name
    try:
        parts = parse_parts(args.parts)
        args.part_limit = parse_limits(args.part_limit)
    except ValueError as error:
        cli.error(str(error))
    if args.worker:
        run_worker(args.worker, parts, args.quick, args.budget_scale, "" if args.quick else args.compilation_cache)
        return None
    result = dict(command=command_line("benchmarks.gpu_suite", argv), environment=run_environment(), quick=args.quick)
    result["estimate"] = estimate(parts, args.budget_scale)
    result["timing"] = (
        "steady state: wall ms per step over asynchronously dispatched steps; on a GPU GPU ms and kernels per step "
        "from CUPTI (benchmarks/steady_state.py); compile time apart"
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    def update(state: dict) -> None:
        result.update(device=state.get("device"), parts={n: state["parts"][n] for n in parts if n in state["parts"]})
        result["goals"] = goals(result["parts"])
        result["seconds"] = time.perf_counter() - started
        (args.out_dir / f"{args.name}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")

    with tempfile.TemporaryDirectory() as tmp:
        progress = Path(tmp) / "progress.json"
        if args.in_process:
            run_worker(progress, parts, args.quick, args.budget_scale, "", release=False)
            state = _read_json(progress)
        else:
            state = supervise(parts, args, progress, update)
    update(state)
    return finish(args, result, table(result), plot)


if __name__ == "__main__":
    main()
