"""The refusals every entry point shares through :func:`experiments.run.run`, for the tests of each learner: a run
directory that another process writes, a ``config.json`` that is not JSON, and a garbage ``metrics.csv`` row (with
a config change that ``--resume`` allows, so that ``config.json`` would be rewritten). Each refusal is one line and
leaves the directory byte for byte as it was."""

from __future__ import annotations

import json
import os
import pathlib
import re
from collections.abc import Callable

import pytest

from lpjax.jsonable import to_jsonable
from lpjax.run_lock import DirectoryLock


def tree(directory: pathlib.Path) -> dict[str, bytes]:
    """Every file under ``directory`` with its bytes (directories as ``<dir>``)."""
    return {str(p.relative_to(directory)): p.read_bytes() if p.is_file() else b"<dir>" for p in directory.rglob("*")}


def fake_run(run_dir: pathlib.Path, config, step: int) -> None:
    """A run directory as a run of ``config`` stopped after its checkpoint at ``step`` leaves it, as far as the
    checks before anything is written see it: ``config.json``, two rows of ``metrics.csv`` and a checkpoint
    directory (empty: it is only listed)."""
    (run_dir / "checkpoints" / str(step)).mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(to_jsonable(config), indent=2, sort_keys=True) + "\n")
    (run_dir / "metrics.csv").write_text(f"step,wall_time,eval/return\n{step},1.5,3.0\n{step + 1},1.6,\n")


def assert_refusals(train: Callable[..., dict], config, run_dir: pathlib.Path, allowed_change: Callable) -> None:
    """Runs ``train(config, run_dir, resume=..., progress=False)`` on a :func:`fake_run` directory that is locked
    by another open file (with and without ``resume``), then with a damaged ``config.json`` and with a garbage
    ``metrics.csv`` row (``resume`` and ``allowed_change(config)``, a change ``--resume`` accepts): each must raise
    one line naming the holder or the file and line, and change nothing."""
    fake_run(run_dir, config, 10)
    before = tree(run_dir)

    def refused(config, resume: bool, message: str) -> None:
        with pytest.raises(ValueError) as raised:
            train(config, run_dir, resume=resume, progress=False)
        assert re.match(message, str(raised.value)), str(raised.value)
        assert "\n" not in str(raised.value)
        assert tree(run_dir) == before

    with DirectoryLock(run_dir):  # flock: another open file conflicts even within this process
        before = tree(run_dir)
        for resume in (False, True):
            refused(config, resume, rf"{re.escape(str(run_dir))} is in use by another process \(pid {os.getpid()} ")
    original = (run_dir / "config.json").read_text()
    (run_dir / "config.json").write_text('{"seed": 0,,}\n')
    before = tree(run_dir)
    refused(config, True, rf"{re.escape(str(run_dir / 'config.json'))}, line 1 column 12: not valid JSON: Expecting")
    (run_dir / "config.json").write_text(original)
    (run_dir / "metrics.csv").write_text("step,wall_time,eval/return\n10,1.5,3.0\nabc,1.6,\n")
    before = tree(run_dir)
    changed = allowed_change(config)
    refused(changed, True, rf"{re.escape(str(run_dir / 'metrics.csv'))}, line 3: step 'abc' is not an integer\.$")
