"""What the experiments' entry points share: their flags, resolving ``--config=NAME``, naming run directories,
and the ``main`` that trains (or resumes) a run and prints its summary."""

from __future__ import annotations

import dataclasses
import datetime
import json
import pathlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from absl import app, flags, logging
from ml_collections import config_flags

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
    """``runs/<kind>/<config>-<env>-seed<seed>-<UTC time>`` under the working directory."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    name = pathlib.Path(config_path.partition(":")[0]).stem
    return pathlib.Path.cwd() / "runs" / kind / f"{name}-{env.replace(':', '_')}-seed{seed}-{stamp}"


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


@dataclasses.dataclass(frozen=True)
class ExperimentFlags:
    """The flags every entry point defines: ``--config``, ``--run_dir``, ``--resume``, ``--progress``."""

    kind: str
    config: Any
    run_dir: Any
    resume: Any
    progress: Any


def define_experiment_flags(kind: str, example: str) -> ExperimentFlags:
    """Defines the shared flags for ``python -m experiments.<kind>`` (call once, at import)."""
    config = config_flags.DEFINE_config_file(
        "config",
        None,
        f"{kind.upper()} config: a file, or a name in experiments/configs/{kind} (e.g. {example}).",
        lock_config=True,
    )
    run_dir = flags.DEFINE_string("run_dir", None, f"Run directory (default: a new one under ./runs/{kind}/).")
    resume = flags.DEFINE_bool("resume", False, "Continue the run in --run_dir from its latest checkpoint.")
    progress = flags.DEFINE_bool("progress", True, "Show a progress bar.")
    flags.mark_flag_as_required("config")
    return ExperimentFlags(kind, config, run_dir, resume, progress)


def experiment_main(experiment: ExperimentFlags, train_for: Callable[[Any], Callable[..., dict]]) -> Callable:
    """The absl ``main``: ``train_for(config)`` picks the training function (imported lazily so ``--help`` stays
    fast); config errors (``ValueError``) become usage errors without a traceback; the summary is printed."""

    def main(argv):
        del argv
        if not flags.FLAGS["verbosity"].present:  # orbax logs every checkpoint step at INFO
            logging.set_verbosity(logging.WARNING)
        config = experiment.config.value
        if experiment.resume.value and experiment.run_dir.value is None:
            raise app.UsageError("--resume needs --run_dir (the run to continue).")
        run_dir = experiment.run_dir.value or default_run_dir(
            experiment.kind, flags.FLAGS["config"].config_filename, config.env, config.seed
        )
        try:
            summary = train_for(config)(
                config, run_dir, resume=experiment.resume.value, progress=experiment.progress.value
            )
        except ValueError as error:
            raise app.UsageError(str(error)) from error
        print(json.dumps(summary, indent=2))

    return main


def launch(kind: str, example: str, train_for: Callable[[Any], Callable[..., dict]]) -> None:
    """The whole ``python -m experiments.<kind>`` program: defines the shared flags (listed by ``--help`` as the
    program's own), resolves ``--config`` in ``experiments/configs/<kind>/`` and runs :func:`experiment_main`."""
    experiment = define_experiment_flags(kind, example)
    for name in ("config", "run_dir", "resume", "progress"):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])
    run_app(experiment_main(experiment, train_for), REPO_ROOT / "experiments" / "configs" / kind)
