"""Worked ports: programs nobody here wrote, made fp16 with lpjax by changing a few lines.

Each port is one module holding the fp32 program as its authors wrote it (with what the port changed listed in
its docstring): :mod:`experiments.ports.purejaxrl_ppo` (PureJaxRL's PPO: flax linen, ``TrainState``, vmap over
seeds inside one jit, on gymnax) and :mod:`experiments.ports.flax_mnist` (flax's nnx MNIST CNN with ``BatchNorm``
and ``Dropout``, on scikit-learn's digits). Its other versions are not copies: a :class:`Variant` lists the lines
it replaces, and :func:`load` runs the fp32 module's text with those lines replaced, so the diff that the docs
show (:func:`diff`) is exactly what runs.

Variants of every port:

* ``fp32``: the program as written;
* ``fp16_naive``: the model in float16 (``lpjax.precision.set_policy(model, "fp16", keep_float32=())``: every
  parameter, activation and statistic), with the program's own optimizer and gradients;
* ``fp16_lpjax``: :func:`lpjax.precision.set_policy` (normalization layers kept in float32), the program's
  optimizer wrapped in ``compound_loss_scaling`` (hAdam for Adam) and closed by ``kahan_summation``, and
  ``scaled_value_and_grad`` for the gradients;

and ablations named after what they change (see each port's ``VARIANTS``).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib.util
import pathlib
import sys
import types

MAX_CHANGED_LINES = 6
"""The most lines a port's ``fp16_lpjax`` variant may add or remove against its fp32 program."""


@dataclasses.dataclass(frozen=True)
class Variant:
    """A version of a port's program: ``edits`` are ``(line, replacement)`` pairs.

    ``line`` is one line of the fp32 program without its indentation, which must occur exactly once;
    ``replacement`` is one or more lines (``\\n``-separated) that take its place, indented as it was.
    """

    name: str
    edits: tuple[tuple[str, str], ...] = ()
    description: str = ""


def source(module_name: str) -> str:
    """The text of a port's fp32 program."""
    return pathlib.Path(importlib.util.find_spec(module_name).origin).read_text()


def apply_edits(text: str, edits: tuple[tuple[str, str], ...]) -> str:
    """``text`` with each edit's line replaced; raises ``ValueError`` unless each line occurs exactly once."""
    lines = text.splitlines()
    for old, new in edits:
        found = [i for i, line in enumerate(lines) if line.strip() == old]
        if len(found) != 1:
            raise ValueError(f"the edited line must occur exactly once, {old!r} occurs {len(found)} times")
        (i,) = found
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        lines[i : i + 1] = [indent + part for part in new.split("\n")]
    return "\n".join(lines) + "\n"


def load(module_name: str, variant: Variant) -> types.ModuleType:
    """A fresh module running ``variant``'s program: the fp32 module's text with ``variant.edits`` applied."""
    text = apply_edits(source(module_name), variant.edits)
    module = types.ModuleType(f"{module_name}[{variant.name}]", f"{variant.name} version of {module_name}")
    module.__file__ = importlib.util.find_spec(module_name).origin
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(text, f"<{module_name} {variant.name}>", "exec"), module.__dict__)
    return module


def diff(module_name: str, variant: Variant) -> str:
    """The unified diff from the fp32 program to ``variant``'s (what the docs show)."""
    before = source(module_name)
    after = apply_edits(before, variant.edits)
    name = module_name.replace(".", "/") + ".py"
    lines = difflib.unified_diff(
        before.splitlines(), after.splitlines(), f"{name} (fp32)", f"{name} ({variant.name})", n=0, lineterm=""
    )
    return "\n".join(lines) + "\n"


def changed_lines(module_name: str, variant: Variant) -> tuple[int, int]:
    """``(added, removed)`` lines of :func:`diff`."""
    lines = diff(module_name, variant).splitlines()
    added = sum(line.startswith("+") and not line.startswith("+++") for line in lines)
    removed = sum(line.startswith("-") and not line.startswith("---") for line in lines)
    return added, removed


def describe(module_name: str, variants: dict[str, Variant]) -> dict[str, dict]:
    """Each variant's description, edits as a diff and changed-line counts, for a benchmark's json."""
    records = {}
    for name, variant in variants.items():
        added, removed = changed_lines(module_name, variant)
        records[name] = {
            "description": variant.description,
            "lines_added": added,
            "lines_removed": removed,
            "diff": diff(module_name, variant) if variant.edits else "",
        }
    return records


def over_baseline(values: dict[str, list[float]], baseline: str = "fp32", floor: float = 0.0) -> dict[str, dict]:
    """Per variant: the seeds' values, their mean, and ``(value - floor) / (baseline - floor)`` seed by seed (the
    same seed's baseline run) and of the means. ``floor`` is the metric's worst value (0 for an accuracy or
    CartPole's return, -500 for Acrobot's), so the ratio says what fraction of the baseline's progress a variant
    made."""
    import numpy as np

    base = np.asarray(values[baseline], np.float64)
    summary = {}
    for name, seeds in values.items():
        v = np.asarray(seeds, np.float64)
        summary[name] = {
            "per_seed": [round(float(x), 4) for x in v],
            "mean": round(float(v.mean()), 4),
            "over_baseline_per_seed": [round(float(x), 4) for x in (v - floor) / (base - floor)],
            "over_baseline_of_means": round(float((v.mean() - floor) / (base.mean() - floor)), 4),
        }
    return summary


def parse_args(parser: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """``parser``'s arguments; the variants must include the baseline, fp32."""
    args = parser.parse_args(argv)
    if "fp32" not in args.variants:
        parser.error("--variants must include fp32 (the baseline of over_fp32)")
    return args


def result_header(result_name: str, argv, module_name: str, variants: dict[str, Variant], config: dict) -> dict:
    """The first entries of a port benchmark's json: what ran (command, versions, device, config, each variant's
    diff)."""
    import jax

    from benchmarks.common import command_line

    return {
        "benchmark": result_name,
        "command": command_line(f"benchmarks.{result_name}", argv),
        "jax_version": jax.__version__,
        "device": jax.devices()[0].device_kind,
        "config": config,
        "variants": describe(module_name, variants),
    }
