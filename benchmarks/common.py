"""What every benchmark does with its result: print it, write ``<name>.json`` and, optionally, ``<name>.png``."""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Callable, Sequence

import numpy as np


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """The command that reproduces this run, for the json."""
    return f"python -m {module} " + " ".join(argv if argv is not None else sys.argv[1:])


def write_results(
    result: dict, table: str, out_dir: pathlib.Path, name: str, plot: Callable[[dict, pathlib.Path], None] | None = None
) -> None:
    """Prints ``table``, writes ``out_dir/name.json`` and, unless ``plot`` is None, ``out_dir/name.png``."""
    print()
    print(table)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{name}.json"
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {json_path}")
    if plot is not None:
        png_path = out_dir / f"{name}.png"
        plot(result, png_path)
        print(f"wrote {png_path}")


def random_transitions(rng: np.random.Generator, rows: int, obs_dim: int, action_dim: int) -> dict[str, np.ndarray]:
    """A batch of ``rows`` random float32 transitions (normal observations, uniform actions in [-1, 1] and rewards
    in [0, 1), discount 1), shaped as the off-policy learners sample them: input for timing an update."""
    return {
        "obs": rng.standard_normal((rows, obs_dim), np.float32),
        "action": rng.uniform(-1, 1, (rows, action_dim)).astype(np.float32),
        "reward": rng.uniform(0, 1, rows).astype(np.float32),
        "discount": np.ones(rows, np.float32),
        "next_obs": rng.standard_normal((rows, obs_dim), np.float32),
    }
