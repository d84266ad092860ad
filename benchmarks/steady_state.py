"""Steady-state timing of a step function, as a training or decoding loop runs it: many steps dispatched
asynchronously, one wait at the end; and what the GPU benchmarks share (the compilation cache, error records).

A *step* is ``step(state) -> state`` (any pytree; a jitted function that donates its state is fine). Wall time per
step is the loop's time over its steps (host dispatch overlaps device work, as in a real loop; not the latency of
one blocked call). On a GPU, CUPTI (:func:`jax.experimental.mosaic.gpu.profiler.measure`) adds the GPU time per
step (summed kernel durations, launch gaps left out), the kernels per step and the heaviest kernels.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

Step = Callable[[Any], Any]
CACHE_DIR = "/tmp/lpjax-jax-cache"


def enable_compilation_cache(path: str) -> None:
    """Compiled programs taking over a second are kept in ``path`` (JAX's persistent cache); '' leaves it off."""
    if path:
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def error_record(error: BaseException, frames: int = 4) -> dict[str, str]:
    """What a failed measurement records: the error and the last ``frames`` frames of where it was raised."""
    tail = "".join(traceback.format_tb(error.__traceback__)[-frames:])
    return {"error": f"{type(error).__name__}: {error}"[:600], "where": tail[-1500:]}


def timed_steps(step: Step, state: Any, steps: int) -> tuple[Any, float]:
    """The state after ``steps`` asynchronously dispatched calls, each on the previous one's output, and the
    wall-clock ms per call (one wait at the end)."""
    start = time.perf_counter()
    for _ in range(steps):
        state = step(state)
    state = jax.block_until_ready(state)
    return state, 1e3 * (time.perf_counter() - start) / steps


def calibrated_steps(ms_per_step: float, target_s: float, min_steps: int, max_steps: int) -> int:
    """How many steps of ``ms_per_step`` last about ``target_s``, clipped to ``[min_steps, max_steps]``."""
    wanted = int(np.ceil(1e3 * target_s / max(ms_per_step, 1e-6)))
    return int(min(max_steps, max(min_steps, wanted)))


def on_gpu() -> bool:
    """Whether JAX's default backend is a GPU (CUPTI can time kernels)."""
    return jax.default_backend() == "gpu"


class TimedLoop(jax.stages.Wrapped):
    """``steps`` calls of ``step`` as one callable, continuing from the state the previous call reached;
    ``wall_ms`` holds each call's wall-clock ms per step. ``profiler.measure`` runs a ``jax.stages.Wrapped`` as it
    is (anything else it would jit again)."""

    def __init__(self, step: Step, state: Any, steps: int):
        self.step, self.state, self.steps = step, state, steps
        self.wall_ms: list[float] = []

    def __call__(self):
        self.state, ms = timed_steps(self.step, self.state, self.steps)
        self.wall_ms.append(ms)
        return self.state


def kernel_profile(loop: TimedLoop, top: int = 8) -> dict[str, Any]:
    """Wall time, GPU time and kernel launches per step of a :class:`TimedLoop`, and the ``top`` kernels by GPU time.

    ``profiler.measure`` calls the loop twice: first before CUPTI attaches (the timed run: CUPTI slows launches),
    then under CUPTI (the kernels), so profiling costs one extra loop, not two.
    """
    from jax.experimental.mosaic.gpu import profiler

    _, kernels = profiler.measure(loop, aggregate=False, iterations=1)()
    kernels, steps = kernels or [], loop.steps
    by_name: dict[str, list[float]] = {}
    for name, ms in kernels:
        by_name.setdefault(name[:100], []).append(ms)
    ranked = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:top]
    return {
        "wall_ms_per_step": loop.wall_ms[0],
        "gpu_ms_per_step": sum(ms for _, ms in kernels) / steps,
        "kernels_per_step": len(kernels) / steps,
        "top_kernels": {
            name: {"ms_per_step": sum(times) / steps, "launches_per_step": len(times) / steps} for name, times in ranked
        },
    }


def steady_state(
    step: Step,
    state: Any,
    *,
    target_s: float = 0.5,
    min_steps: int = 5,
    max_steps: int = 1000,
    warmup: int = 2,
    quick: bool = False,
) -> tuple[Any, dict[str, Any]]:
    """Wall time per step over an asynchronous loop and, on a GPU, CUPTI's GPU time and kernels per step.

    ``warmup`` blocked calls first (they compile what was not compiled ahead of time); then, unless ``min_steps ==
    max_steps``, two calls calibrate the loop to last about ``target_s``; then the loop, profiled on a GPU (a failed
    profile is recorded as ``profile_error`` and the loop timed without it). ``quick``: 2 steps, at most 1 warm-up
    call. Returns the final state and the record (``steps`` included).
    """
    if quick:
        target_s, min_steps, max_steps, warmup = 0.01, 2, 2, min(warmup, 1)
    for _ in range(warmup):
        state = jax.block_until_ready(step(state))
    steps = min_steps
    if min_steps != max_steps:
        state, one_ms = timed_steps(step, state, 2)
        steps = calibrated_steps(one_ms, target_s, min_steps, max_steps)
    record: dict[str, Any] = {"steps": steps}
    loop = TimedLoop(step, state, steps)
    if on_gpu():
        try:
            profile = kernel_profile(loop)
            return loop.state, record | profile
        except Exception as error:  # recorded: the wall time is still measured below
            record["profile_error"] = f"{type(error).__name__}: {error}"[:300]
    loop()
    return loop.state, record | {"wall_ms_per_step": loop.wall_ms[-1]}
