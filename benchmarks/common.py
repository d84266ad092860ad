"""What every benchmark does with its result: print it, write ``<name>.json`` and, optionally, ``<name>.png``."""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
from collections.abc import Callable, Sequence

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]


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


def package_versions(packages: Sequence[str]) -> dict[str, str | None]:
    """Installed version of each distribution (``None`` when it is not installed), read without importing it."""
    versions: dict[str, str | None] = {}
    for name in packages:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def source_record(folders: Sequence[str] = ("lpjax", "kernels", "benchmarks", "experiments")) -> dict[str, str | None]:
    """Which lpjax ran: the version in setup.cfg, the git commit when the checkout has one, and a sha256 over the
    Python sources of ``folders`` (it names the code also where the working tree travelled without its .git)."""
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted((REPO / folder).rglob("*.py")):
            digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    version = re.search(r"^version = (\S+)", (REPO / "setup.cfg").read_text(), re.M)
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "version": version.group(1) if version else None,
        "git_commit": commit,
        "sources_sha256": digest.hexdigest(),
    }


def nvidia_smi() -> list[dict[str, str]] | str:
    """The GPUs ``nvidia-smi`` lists (name, driver version, memory, compute capability), without initializing CUDA
    in this process; a string saying why when it cannot run."""
    fields = ("name", "driver_version", "memory.total", "compute_cap")
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as error:
        return f"nvidia-smi unavailable: {type(error).__name__}"
    return [dict(zip(fields, (v.strip() for v in line.split(",")))) for line in out.strip().splitlines()]


RUN_PACKAGES = (
    "jax",
    "jaxlib",
    "jax-cuda13-plugin",
    "jax-cuda13-pjrt",
    "jax-cuda12-plugin",
    "jax-cuda12-pjrt",
    "flax",
    "optax",
    "orbax-checkpoint",
    "chex",
    "numpy",
    "mujoco",
    "mujoco-mjx",
    "playground",
    "brax",
    "ml_collections",
)
"""The distributions :func:`run_environment` records."""


def run_environment() -> dict:
    """Where and with what a benchmark ran, read without initializing JAX's backends: date, Python, platform, CPU
    count, the GPUs and driver (:func:`nvidia_smi`), package versions (:data:`RUN_PACKAGES`) and lpjax's source
    (:func:`source_record`)."""
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "gpus": nvidia_smi(),
        "versions": package_versions(RUN_PACKAGES),
        "lpjax": source_record(),
    }
