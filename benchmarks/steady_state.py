"""Steady-state timing of a step function, as a training or decoding loop runs it: many steps dispatched
asynchronously, one wait at the end.

A *step* is ``step(state) -> state`` (any pytree; a jitted function that donates its state is fine, since each
call gets the previous call's output). :func:`steady_state` reports

* ``wall_ms_per_step``: wall-clock time of ``steps`` consecutive calls made without waiting, divided by
  ``steps`` (host dispatch overlaps device work, as in a real loop; not the latency of one blocked call). The
  number of steps is calibrated to last about ``target_s``, between ``min_steps`` and ``max_steps``;
* on a GPU, from CUPTI (:func:`jax.experimental.mosaic.gpu.profiler.measure`, as :func:`benchmarks.kernels.measure`):
  ``gpu_ms_per_step`` (the summed durations of every kernel the steps launched, divided by the steps: GPU
  time, launch gaps left out), ``kernels_per_step`` (launches per step) and the kernels that took the most GPU
  time (``top_kernels``). ``profiler.measure`` runs the loop twice, once before CUPTI attaches and once under
  it: the first run is the timed one (CUPTI slows launches), so profiling costs one extra loop, not two.

Everything is measured after ``warmup`` blocked calls (compile functions ahead of time, or the first call would
compile).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

Step = Callable[[Any], Any]


def run_steps(step: Step, state: Any, steps: int) -> Any:
    """``steps`` calls of ``step``, each on the previous one's output, without waiting for any."""
    for _ in range(steps):
        state = step(state)
    return state


def timed_steps(step: Step, state: Any, steps: int) -> tuple[Any, float]:
    """The state after ``steps`` asynchronously dispatched calls, and the wall-clock ms per call (one wait at the
    end)."""
    start = time.perf_counter()
    state = jax.block_until_ready(run_steps(step, state, steps))
    return state, 1e3 * (time.perf_counter() - start) / steps


def calibrated_steps(ms_per_step: float, target_s: float, min_steps: int, max_steps: int) -> int:
    """How many steps of ``ms_per_step`` last about ``target_s``, clipped to ``[min_steps, max_steps]``."""
    wanted = int(np.ceil(1e3 * target_s / max(ms_per_step, 1e-6)))
    return int(min(max_steps, max(min_steps, wanted)))


def on_gpu() -> bool:
    """Whether JAX's default backend is a GPU (CUPTI can time kernels)."""
    return jax.default_backend() == "gpu"


class TimedLoop(jax.stages.Wrapped):
    """``steps`` calls of ``step`` as one callable, each call continuing from the state the previous one reached
    and waiting for it at its end; ``wall_ms`` holds each call's wall-clock ms per step.

    A ``jax.stages.Wrapped`` is what ``profiler.measure`` runs as it is (anything else it would jit again).
    """

    def __init__(self, step: Step, state: Any, steps: int):
        self.step, self.state, self.steps = step, state, steps
        self.wall_ms: list[float] = []

    def __call__(self):
        self.state, ms = timed_steps(self.step, self.state, self.steps)
        self.wall_ms.append(ms)
        return self.state


def kernel_profile(loop: TimedLoop, top: int = 8) -> dict[str, Any]:
    """Wall time, GPU time and kernel launches per step of a :class:`TimedLoop` (a GPU only: CUPTI).

    ``profiler.measure`` calls the loop twice: the first call, before CUPTI attaches, gives ``wall_ms_per_step``;
    the second, under CUPTI, ``gpu_ms_per_step`` (summed kernel durations), ``kernels_per_step`` and
    ``top_kernels`` (``{name: {"ms_per_step", "launches_per_step"}}`` for the ``top`` kernels by GPU time).
    ``loop.state`` advances ``2 * loop.steps`` calls.
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
) -> tuple[Any, dict[str, Any]]:
    """Wall time per step over an asynchronous loop and, on a GPU, CUPTI's GPU time and kernels per step.

    ``warmup`` blocked calls first; then, unless ``min_steps == max_steps``, two calls time a step to calibrate
    the loop's length (:func:`calibrated_steps`); then the loop: on a GPU :func:`kernel_profile` (its un-profiled
    run is the timed one), elsewhere :func:`timed_steps`. If the profile fails, the loop is timed without it and
    the error recorded (``profile_error``). Returns the final state and the record (``steps`` included).
    """
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
