"""What the experiments' entry points share: resolving ``--config=NAME`` and naming run directories."""

from __future__ import annotations

import datetime
import pathlib
import sys
from typing import Callable, Sequence

from absl import app

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def resolve_config_argument(argv: Sequence[str], config_dir: pathlib.Path) -> list[str]:
    """Rewrites ``--config=NAME[:override]`` to ``--config=<config_dir>/NAME`` when NAME is not a path.

    A value that names an existing file is kept; a bare name is looked up in ``config_dir`` (``.py`` optional).
    Raises ``SystemExit`` with the list of available configs when neither exists.
    """
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            value, index, prefix = arg.split("=", 1)[1], i, "--config="
        elif arg == "--config" and i + 1 < len(argv):
            value, index, prefix = argv[i + 1], i + 1, ""
        else:
            continue
        name, colon, override = value.partition(":")
        if pathlib.Path(name).is_file():
            return argv
        candidate = config_dir / (name if name.endswith(".py") else name + ".py")
        if not candidate.is_file():
            available = ", ".join(sorted(p.name for p in config_dir.glob("*.py") if not p.name.startswith("_")))
            raise SystemExit(f"Unknown config {name!r}: not a file, and not in {config_dir}. Available: {available}.")
        argv[index] = prefix + str(candidate) + colon + override
        return argv
    return argv


def default_run_dir(kind: str, config_path: str, env: str, seed: int) -> pathlib.Path:
    """``runs/<kind>/<config>-<env>-seed<seed>-<UTC time>`` under the repository root."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    name = pathlib.Path(config_path.partition(":")[0]).stem
    return REPO_ROOT / "runs" / kind / f"{name}-{env.replace(':', '_')}-seed{seed}-{stamp}"


HELP_FLAGS = ("--help", "-h", "-?", "--helpshort", "--helpfull")


def run_app(main: Callable, config_dir: pathlib.Path) -> None:
    """``absl.app.run(main)`` after resolving ``--config``; ``--help`` exits with status 0 (absl uses 1)."""
    sys.argv = resolve_config_argument(sys.argv, config_dir)
    try:
        app.run(main)
    except SystemExit as exit_:
        if exit_.code == 1 and any(arg in HELP_FLAGS for arg in sys.argv[1:]):
            sys.exit(0)
        raise
