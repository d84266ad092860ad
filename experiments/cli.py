"""What the experiments' entry points share: their flags, resolving ``--config=NAME``, naming run directories,
and the ``main`` that trains (or resumes) a run and prints its summary."""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import importlib.util
import json
import os
import pathlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections
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


def _load_config(path: str) -> ml_collections.ConfigDict:
    """``get_config()`` of the config file at ``path``; a syntax error exits with one line (file, line, message)."""
    try:
        compile(pathlib.Path(path).read_text(), path, "exec")
    except SyntaxError as error:
        raise SystemExit(f"{error.filename}, line {error.lineno}: {error.msg} (in the --config file).") from None
    spec = importlib.util.spec_from_file_location("_checked_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def check_config_arguments(argv: Sequence[str]) -> None:
    """Exits with one line for a ``--config`` file with a syntax error, or an override ``--config.a.b=v`` of a key
    the config does not have (naming the key and its close matches), before absl parses the flags.

    Other problems (a failing ``get_config``, a value of the wrong type) are left to absl's parser.
    """
    path = next((a.split("=", 1)[1].partition(":")[0] for a in argv[1:] if a.startswith("--config=")), None)
    if path is None or not pathlib.Path(path).is_file():
        return
    config = _load_config(path)
    for arg in argv[1:]:
        if not arg.startswith("--config."):
            continue
        keys = arg[len("--config.") :].split("=", 1)[0].split(".")
        node = config
        for depth, key in enumerate(keys):
            valid = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
            if key not in valid:
                name = "config." + ".".join(keys[: depth + 1])
                close = difflib.get_close_matches(key, valid, n=3)
                hint = f"; did you mean {' or '.join(close)}?" if close else f"; valid keys: {', '.join(valid)}."
                raise SystemExit(f"Unknown config key {name!r}" + (hint if valid else ": it is not a ConfigDict."))
            node = node[key]


def check_run_dir(run_dir: pathlib.Path, resume: bool) -> None:
    """Raises ``ValueError`` (one line) for a run directory that cannot hold a run: a file, or not writable; and,
    with ``resume``, one holding no run to continue."""
    existing = next((p for p in (run_dir, *run_dir.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ValueError(f"--run_dir={run_dir}: {existing} is a file, not a directory.")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--run_dir={run_dir}: {existing} is not writable.")
    if resume:
        from experiments.run import require_run  # imports orbax: not for --help

        require_run(run_dir)


def default_run_dir(kind: str, config_path: str, env: str, seed: int) -> pathlib.Path:
    """``runs/<kind>/<config>-<env>-seed<seed>-<UTC time>`` under the working directory."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    name = pathlib.Path(config_path.partition(":")[0]).stem
    return pathlib.Path.cwd() / "runs" / kind / f"{name}-{env.replace(':', '_')}-seed{seed}-{stamp}"


HELP_FLAGS = ("--help", "-h", "-?", "--helpshort", "--helpfull")


def run_app(main: Callable, config_dir: pathlib.Path) -> None:
    """``absl.app.run(main)`` after resolving ``--config``; ``--help`` exits with status 0 (absl uses 1)."""
    sys.argv = resolve_config_argument(sys.argv, config_dir)
    check_config_arguments(sys.argv)
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
    fast) and the summary is printed. What stops a run is one line on stderr, without a traceback:

    * a refusal or a config error (``ValueError``), and a full disk (:class:`lpjax.disk.DiskFull`): exit status 1;
    * SIGINT (Ctrl-C) or SIGTERM (:class:`experiments.run.Interrupted`, from the moment ``main`` starts; a second
      one is ignored): ``interrupted at step N; the last checkpoint is step M; continue with --resume ...``, exit
      status 128 + the signal's number (130, 143).
    """

    def main(argv):
        del argv
        from experiments.run import Interrupted, handle_stop_signals, ignore_stop_signals  # imports orbax: not --help
        from lpjax.disk import DiskFull

        handle_stop_signals()
        if not flags.FLAGS["verbosity"].present:  # orbax logs every checkpoint step at INFO
            logging.set_verbosity(logging.WARNING)
        try:
            summary = _train(experiment, train_for)
        except (ValueError, DiskFull) as error:
            raise SystemExit(str(error)) from None  # one line: the message says what to change
        except Interrupted as interrupted:
            print(interrupted, file=sys.stderr, flush=True)
            raise SystemExit(interrupted.exit_code) from None
        finally:
            # The run is over: a signal now would only cut the exit short. Ignored, not handled: at exit Python resets
            # the signals it handles to the default action, and a second Ctrl-C would then kill the process.
            ignore_stop_signals()
        print(json.dumps(summary, indent=2))

    return main


def _train(experiment: ExperimentFlags, train_for: Callable[[Any], Callable[..., dict]]) -> dict:
    """Resolves the run directory and trains (or resumes) the run; returns its summary."""
    config = experiment.config.value
    if experiment.resume.value and experiment.run_dir.value is None:
        raise SystemExit("--resume needs --run_dir (the run to continue).")
    run_dir = pathlib.Path(
        experiment.run_dir.value
        or default_run_dir(experiment.kind, flags.FLAGS["config"].config_filename, config.env, config.seed)
    )
    check_run_dir(run_dir, experiment.resume.value)
    return train_for(config)(config, run_dir, resume=experiment.resume.value, progress=experiment.progress.value)


def launch(kind: str, example: str, train_for: Callable[[Any], Callable[..., dict]]) -> None:
    """The whole ``python -m experiments.<kind>`` program: defines the shared flags (listed by ``--help`` as the
    program's own), resolves ``--config`` in ``experiments/configs/<kind>/`` and runs :func:`experiment_main`."""
    experiment = define_experiment_flags(kind, example)
    for name in ("config", "run_dir", "resume", "progress"):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])
    run_app(experiment_main(experiment, train_for), REPO_ROOT / "experiments" / "configs" / kind)
