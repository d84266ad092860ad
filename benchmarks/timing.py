"""The benchmarks' timing harness: variants timed side by side in interleaved rounds, reported as medians, with the
machine's load beside them.

A shared machine slows every variant alike over a round, and a round-robin order spreads what it cannot: each
round times every variant once, in an order rotated from round to round, after an untimed warm-up call of each.
A variant is a zero-argument callable that runs the work once and returns something :func:`jax.block_until_ready`
accepts, so asynchronous dispatch is waited for inside the timed region (and only there).
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable, Mapping

import jax


def machine_load() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (``None`` where the platform has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def interleaved(variants: Mapping[str, Callable[[], object]], rounds: int, calls: int = 1) -> dict[str, dict]:
    """Seconds per call of each variant: ``rounds`` rounds, each timing ``calls`` consecutive calls of every variant
    (one ``perf_counter`` span around them, the result blocked on at its end), the variants' order rotated each
    round, garbage collection off while timing.

    Returns ``{name: {"median_s", "min_s", "max_s", "rounds_s"}}`` (per call), and the machine's load before and
    after under the key ``"machine"`` as ``{"load_before", "load_after"}``.
    """
    if rounds < 1 or calls < 1:
        raise ValueError(f"rounds and calls must be >= 1, got {rounds} and {calls}.")
    names = list(variants)
    for name in names:
        jax.block_until_ready(variants[name]())
    per_round: dict[str, list[float]] = {name: [] for name in names}
    load_before = machine_load()
    enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                started = time.perf_counter()
                out = None
                for _ in range(calls):
                    out = variants[name]()
                jax.block_until_ready(out)
                per_round[name].append((time.perf_counter() - started) / calls)
    finally:
        if enabled:
            gc.enable()
    result: dict[str, dict] = {
        name: {
            "median_s": statistics.median(times),
            "min_s": min(times),
            "max_s": max(times),
            "rounds_s": times,
        }
        for name, times in per_round.items()
    }
    result["machine"] = {"load_before": load_before, "load_after": machine_load()}
    return result
