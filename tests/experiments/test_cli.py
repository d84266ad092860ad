"""The entry points' argument checks (experiments/cli.py): one clear line, before any compute, for an unknown
override key, a config file with a syntax error, a run directory that cannot hold a run, and a --resume of
nothing."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from experiments.cli import REPO_ROOT, check_config_arguments, check_run_dir

SAC_FP16 = str(REPO_ROOT / "experiments" / "configs" / "sac" / "fp16.py")


def _exit_message(argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        check_config_arguments(argv)
    message = str(exit_.value.code)
    assert "\n" not in message
    return message


def test_an_unknown_override_key_names_the_key_and_its_close_matches():
    message = _exit_message(["prog", f"--config={SAC_FP16}", "--config.agent.batch_sise=3"])
    assert message == "Unknown config key 'config.agent.batch_sise'; did you mean batch_size?"
    message = _exit_message(["prog", f"--config={SAC_FP16}", "--config.agent.methods.hadm=True"])
    assert "'config.agent.methods.hadam'" not in message and "did you mean hadam?" in message
    message = _exit_message(["prog", f"--config={SAC_FP16}", "--config.agent.nonexistent=1"])
    assert message.startswith("Unknown config key 'config.agent.nonexistent'; valid keys: ") and "batch_size" in message
    message = _exit_message(["prog", f"--config={SAC_FP16}", "--config.seed.deeper=1"])
    assert message == "Unknown config key 'config.seed.deeper': it is not a ConfigDict."
    check_config_arguments(["prog", f"--config={SAC_FP16}", "--config.agent.methods.hadam=False", "--run_dir=x"])


def test_a_config_file_with_a_syntax_error_gives_the_file_and_the_line(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import ml_collections\n\n\ndef get_config(:\n    pass\n")
    assert _exit_message(["prog", f"--config={bad}"]) == f"{bad}, line 4: invalid syntax (in the --config file)."


def test_a_run_dir_that_cannot_hold_a_run_and_a_resume_of_nothing_are_refused(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("")
    for run_dir in (a_file, a_file / "below"):
        with pytest.raises(ValueError, match="is a file, not a directory"):
            check_run_dir(run_dir, resume=False)
    for run_dir in (tmp_path / "missing", tmp_path):
        with pytest.raises(ValueError, match="holds no run to continue"):
            check_run_dir(run_dir, resume=True)
    check_run_dir(tmp_path / "new" / "run", resume=False)
    (tmp_path / "checkpoints").mkdir()
    check_run_dir(tmp_path, resume=True)  # whether a checkpoint is complete is checked when the run opens it


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--config.agent.nonexistent=1"], "Unknown config key 'config.agent.nonexistent'"),
        (["--resume", "--run_dir={missing}"], "holds no run to continue"),
    ],
)
def test_the_command_line_prints_one_line_and_fails(tmp_path, args, expected):
    args = [a.format(missing=tmp_path / "missing") for a in args]
    result = subprocess.run(
        [sys.executable, "-m", "experiments.sac", "--config=fp16.py", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not pathlib.Path(tmp_path / "missing").exists()
