"""The benchmarks' timing harness: variants timed side by side in interleaved rounds, reported as medians, with the
machine's load beside them. A shared machine slows every variant alike over a round, and rotating the order from
round to round spreads what it cannot. A variant is a zero-argument callable returning something
:func:`jax.block_until_ready` accepts, so asynchronous dispatch is waited for inside the timed region.
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np


def machine_load() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (``None`` where the platform has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def summary(values: Sequence[float]) -> dict[str, float]:
    """``{"median", "min", "max"}`` of ``values``."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def interleaved(
    variants: Mapping[str, Callable[[], object]],
    rounds: int,
    calls: int | Mapping[str, int] = 1,
    warmup: int = 1,
    per_call: bool = False,
) -> dict[str, dict]:
    """Seconds per call of each variant: ``warmup`` untimed calls of each, then ``rounds`` rounds, each timing
    ``calls`` consecutive calls (one number, or one per variant) of every variant in one span blocked on at its
    end, the order rotated each round, garbage collection off. With ``per_call`` each call is its own span, kept in
    ``calls_s`` (per round, the seconds of each call).

    Returns ``{name: {"median_s", "min_s", "max_s", "rounds_s"}}`` (``rounds_s``: each round's seconds per call,
    with ``per_call`` the median of its calls) and ``{"load_before", "load_after"}`` under ``"machine"``.
    """
    counts = {name: calls[name] if isinstance(calls, Mapping) else calls for name in variants}
    if rounds < 1 or min(counts.values(), default=1) < 1 or warmup < 0:
        raise ValueError(f"rounds and calls must be >= 1 and warmup >= 0, got {rounds}, {calls} and {warmup}.")
    names = list(variants)
    for name in names:
        for _ in range(warmup):
            jax.block_until_ready(variants[name]())
    spans: dict[str, list[list[float]]] = {name: [] for name in names}
    load_before = machine_load()
    enabled, clock = gc.isenabled(), time.perf_counter
    gc.collect()
    gc.disable()
    try:
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                fn, n = variants[name], counts[name]
                if per_call:
                    times = []
                    for _ in range(n):
                        started = clock()
                        out = fn()
                        if not isinstance(out, (np.ndarray, type(None))):  # host results need no wait
                            jax.block_until_ready(out)
                        times.append(clock() - started)
                    spans[name].append(times)
                    continue
                started = clock()
                out = None
                for _ in range(n):
                    out = fn()
                jax.block_until_ready(out)
                spans[name].append([(clock() - started) / n])
    finally:
        if enabled:
            gc.enable()
    result: dict[str, dict] = {}
    for name, per_round in spans.items():
        times = [statistics.median(t) for t in per_round]
        result[name] = {f"{stat}_s": value for stat, value in summary(times).items()} | {"rounds_s": times}
        if per_call:
            result[name]["calls_s"] = per_round
    result["machine"] = {"load_before": load_before, "load_after": machine_load()}
    return result


class CompileTimer:
    """Counts XLA's backend compilations (``jax.monitoring`` events) and sums their seconds into the ``section``
    open at the time."""

    def __init__(self):
        self.count, self.seconds, self._current = 0, {}, None
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event: str, duration: float, **_: Any) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            self.count += 1
            if self._current is not None:
                self.seconds[self._current] = self.seconds.get(self._current, 0.0) + duration

    @contextlib.contextmanager
    def section(self, name: str | None):
        previous, self._current = self._current, name
        try:
            yield
        finally:
            self._current = previous
