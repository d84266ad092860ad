"""python -m experiments.sac: --help, config resolution and errors, a short real run, SIGKILL + --resume, Ctrl-C,
a run directory in use or damaged."""

import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from experiments import sac_loop
from experiments.cli import REPO_ROOT, resolve_config_argument
from experiments.configs.sac import fp16
from experiments.run import checkpoint_steps
from lpjax.checkpoint import Checkpointer
from lpjax.run_lock import DirectoryLock
from lpjax.run_logging import read_metrics
from tests.run_refusals import assert_refusals, tree
from tests.sac_configs import assert_usage_error, run_cli, tiny_cartpole

CONFIG_DIR = REPO_ROOT / "experiments" / "configs" / "sac"


def _tiny(**overrides):
    """fp16 with all methods, tiny networks, cartpole with 250-step episodes (action repeat 4), 1000 agent steps,
    an evaluation every 500 and a checkpoint every 250."""
    sizes = dict(total_steps=1000, replay_capacity=2000, eval_every=500, checkpoint_every=250)
    return tiny_cartpole(fp16, **{**sizes, **overrides})


def _cli(*args, **kwargs):
    return run_cli("experiments.sac", *args, **kwargs)


def test_help_lists_the_flags():
    result = _cli("--help")
    assert result.returncode == 0
    for flag in ("--config", "--run_dir", "--resume", "--[no]progress"):
        assert flag in result.stdout


def test_bare_config_names_resolve_and_unknown_ones_list_the_choices():
    argv = resolve_config_argument(["prog", "--config=fp16.py", "--config.seed=3"], CONFIG_DIR)
    assert argv[1] == f"--config={CONFIG_DIR / 'fp16.py'}"
    assert resolve_config_argument(["prog", "--config", "fp32"], CONFIG_DIR)[2] == str(CONFIG_DIR / "fp32.py")
    with pytest.raises(SystemExit, match="Available: bf16.py, demo.py, fp16.py"):
        resolve_config_argument(["prog", "--config=fp17.py"], CONFIG_DIR)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(env="dmc:cheetah-fly"), "cheetah"),
        (dict(env="gym:Ant"), "dmc:<domain>-<task>"),
        (dict(seed_steps=5000), "seed_steps"),
        (dict(replay_capacity=16), "larger than the replay buffer"),
        (dict(total_steps=0), "total_steps"),
        (dict(replay_dtype="fp17"), "Unknown dtype name 'fp17'"),
        (dict(replay_dtype="fp8"), "replay_dtype must be a 16- or 32-bit float"),
        (dict(mesh=dict(data=4, fsdp=1)), r"4 devices, but there are 1 .*xla_force_host_platform_device_count"),
        (dict(mesh=dict(data=1, fsdp=2)), r"mesh.fsdp=2 shards .* add --config.agent.fused_optimizer=False"),
        (dict(replay_shards=3), r"replay_shards \(3\) must be a multiple"),
        (dict(replay_shards=4, seed_steps=2), r"seed_steps must be >= replay_shards - 1 \(3\)"),
    ],
)
def test_bad_run_configs_fail_before_any_compute(overrides, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        sac_loop.train(_tiny(**overrides), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_cli_reports_config_errors_without_a_traceback(tmp_path):
    result = _cli(
        "--config=fp16.py",
        "--config.agent.batch_size=4096",
        "--config.replay_capacity=100",
        f"--run_dir={tmp_path / 'run'}",
        "--noprogress",
    )
    assert_usage_error(result, "larger than the replay buffer")


def test_short_run_logs_evaluates_checkpoints_and_plots(tmp_path):
    summary = sac_loop.train(_tiny(), tmp_path, progress=False)
    assert summary["status"] == "finished" and summary["env_steps"] == 1000
    metrics = read_metrics(tmp_path)
    evals = metrics["eval/return"][np.isfinite(metrics["eval/return"])]
    assert len(evals) == 2 and np.all(evals >= 0)
    losses = metrics["train/critic_loss"][np.isfinite(metrics["train/critic_loss"])]
    assert len(losses) >= 7 and np.all(np.isfinite(losses))
    assert set(metrics["train/critic_loss_scale"][np.isfinite(metrics["train/critic_loss_scale"])]) == {1e4}
    assert (tmp_path / "learning_curve.png").stat().st_size > 5000
    assert (tmp_path / "config.json").is_file()
    assert Checkpointer(tmp_path / "checkpoints").latest_step() == 1000
    with pytest.raises(ValueError, match="already holds checkpoints"):
        sac_loop.train(_tiny(), tmp_path, progress=False)


# _tiny() as command-line flags.
TINY_FLAGS = [
    "--config=fp16.py",
    "--config.env=dmc:cartpole-swingup",
    "--config.action_repeat=4",
    "--config.total_steps=1000",
    "--config.seed_steps=200",
    "--config.replay_capacity=2000",
    "--config.eval_every=500",
    "--config.eval_episodes=1",
    "--config.log_every=100",
    "--config.checkpoint_every=250",
    "--config.agent.hidden_dims=32,32",
    "--config.agent.batch_size=32",
    "--noprogress",
]


def _start(run_dir, *flags, stderr=subprocess.DEVNULL):
    """``python -m experiments.sac`` with :data:`TINY_FLAGS` on ``run_dir``, in the background."""
    return subprocess.Popen(
        [sys.executable, "-m", "experiments.sac", *TINY_FLAGS, *flags, f"--run_dir={run_dir}"],
        cwd=REPO_ROOT,
        env=dict(os.environ, MUJOCO_GL="egl"),
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
    )


def _wait_for(child, path, timeout=300):
    deadline = time.time() + timeout
    while not path.exists() and time.time() < deadline and child.poll() is None:
        time.sleep(0.02)
    assert path.exists(), f"{path} did not appear (the run exited with {child.poll()})"


def _wait_for_lock(child, run_dir, timeout=600):
    """Waits until ``child`` holds ``run_dir``'s lock (a killed run's stale lock file names another pid)."""
    deadline, path = time.time() + timeout, run_dir / "run.lock"
    while time.time() < deadline and child.poll() is None:
        if path.exists() and path.read_text().startswith(f"pid {child.pid} "):
            return
        time.sleep(0.02)


def _loop_leaves(run_dir, step):
    """The leaves of a run's checkpoint ``step`` as numpy arrays (typed keys as their key data)."""
    config = _tiny()
    target = sac_loop.init_loop(config, sac_loop.validate(config), sac_loop.make_envs(config)[0])
    with Checkpointer(run_dir / "checkpoints") as checkpointer:
        state, _ = checkpointer.restore(step, target=target)

    def key_data(x):
        return jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x

    return [np.asarray(leaf) for leaf in jax.tree.leaves(jax.tree.map(key_data, state))]


def _logged(run_dir):
    """metrics.csv's rows without what depends on the wall clock (the time and the throughput columns)."""
    timed = {"wall_time", "train/env_steps_per_s", "train/updates_per_s"}
    return {column: values for column, values in read_metrics(run_dir).items() if column not in timed}


def test_sigkilled_run_resumes_bit_identically(tmp_path):
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    sac_loop.train(_tiny(), reference, progress=False)

    child = _start(killed)
    _wait_for(child, killed / "checkpoints" / "250")
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL
    interrupted_at = Checkpointer(killed / "checkpoints").latest_step()
    assert interrupted_at is not None and interrupted_at < 1000
    # The killed run's lock file stays, naming it; the operating system released the lock, so it does not block.
    assert (killed / "run.lock").read_text().startswith(f"pid {child.pid} on host ")

    sac_loop.train(_tiny(), killed, resume=True, progress=False)
    leaves = [_loop_leaves(run, 1000) for run in (reference, killed)]
    assert len(leaves[0]) == len(leaves[1]) > 20
    for a, b in zip(*leaves):
        np.testing.assert_array_equal(a, b)
    ref_metrics, resumed_metrics = read_metrics(reference), read_metrics(killed)
    np.testing.assert_array_equal(ref_metrics["eval/return"], resumed_metrics["eval/return"])
    assert not (killed / "run.lock").exists()


def test_repeated_ctrl_c_stops_with_one_line_and_keeps_the_last_checkpoint(tmp_path):
    """Ctrl-C behaves like SIGTERM: one line on stderr (no KeyboardInterrupt traceback), every further Ctrl-C
    included, sent without pause until the process has exited (while the run stops, and while the interpreter
    shuts down, where Python puts its signal handlers back to the default action); the exit status is 128 +
    SIGINT."""
    run_dir = tmp_path / "run"
    child = _start(run_dir, stderr=subprocess.PIPE)
    _wait_for(child, run_dir / "checkpoints" / "250")
    deadline = time.monotonic() + 300
    while child.poll() is None and time.monotonic() < deadline:
        child.send_signal(signal.SIGINT)
        time.sleep(0.01)
    _, stderr = child.communicate(timeout=10)
    assert child.returncode == 128 + signal.SIGINT, stderr[-3000:]
    assert re.fullmatch(
        rf"interrupted at step \d+; the last checkpoint is step 250; continue with --resume --run_dir="
        rf"{re.escape(str(run_dir))}\n",
        stderr,
    ), stderr[-3000:]
    assert Checkpointer(run_dir / "checkpoints").latest_step() == 250 and not (run_dir / "run.lock").exists()


def test_a_run_directory_in_use_or_damaged_is_refused_before_anything_is_written(tmp_path):
    assert_refusals(sac_loop.train, _tiny(), tmp_path, lambda config: _tiny(total_steps=2000))
    with DirectoryLock(tmp_path):  # and through the command line: one line, exit status 1
        before = tree(tmp_path)
        result = _cli(*TINY_FLAGS, f"--run_dir={tmp_path}")
        assert tree(tmp_path) == before
    assert result.returncode == 1
    assert re.fullmatch(
        rf"{re.escape(str(tmp_path))} is in use by another process \(pid {os.getpid()} on host \S+, started "
        r"[\d-]+ [\d:]+ UTC; lock file \S+\): wait for it to end, or stop it, or choose another --run_dir\.\n",
        result.stderr,
    ), result.stderr


@pytest.mark.slow
def test_short_pixels_run_renders_trains_and_evaluates(tmp_path):
    from experiments.configs.sac import pixels

    sizes = dict(action_repeat=0, total_steps=150, seed_steps=50, replay_capacity=300, eval_every=150, log_every=50)
    config = tiny_cartpole(pixels, dict(hidden_dims=(32,), batch_size=8, encoder_features=16), **sizes)
    config.checkpoint_every = 150
    summary = sac_loop.train(config, tmp_path, progress=False)
    assert summary["status"] == "finished"
    metrics = read_metrics(tmp_path)
    assert np.isfinite(metrics["eval/return"]).sum() == 1
    losses = metrics["train/critic_loss"][np.isfinite(metrics["train/critic_loss"])]
    assert len(losses) >= 2
    loop, _ = Checkpointer(tmp_path / "checkpoints").restore(
        150, target=sac_loop.init_loop(config, sac_loop.validate(config), sac_loop.make_envs(config)[0])
    )
    assert loop.replay.data["obs"].dtype == np.uint8 and loop.replay.data["obs"].shape[1:] == (84, 84, 9)


def test_naive_fp16_diverges_cleanly_and_still_plots(tmp_path):
    from experiments.configs.sac import fp16_naive

    sizes = dict(total_steps=400, seed_steps=50, eval_every=400, log_every=10, checkpoint_every=400)
    config = tiny_cartpole(fp16_naive, action_repeat=8, **sizes)
    summary = sac_loop.train(config, tmp_path, progress=False)
    assert summary["status"].startswith("diverged") and summary["env_steps"] < 400
    assert summary["curve"] is not None and pathlib.Path(summary["curve"]).is_file()
    last = {k: v[-1] for k, v in read_metrics(tmp_path).items() if k.startswith("train/")}
    # The first update already breaks the actor and the temperature (the critic is still finite).
    assert np.isnan(last["train/actor_loss"]) and np.isnan(last["train/alpha"])


@pytest.mark.slow
def test_a_float16_replay_trains_the_fp16_learner_identically(tmp_path):
    """The fp16 networks cast their inputs to float16 first: storing the transitions in float16 changes the
    replay's bytes, not one loss of the run."""
    from experiments.configs.sac import fp16_sr

    def run(replay_dtype, name):
        config = tiny_cartpole(fp16_sr, replay_dtype=replay_dtype)
        sac_loop.train(config, tmp_path / name, progress=False)
        metrics = read_metrics(tmp_path / name)
        return {k: v for k, v in metrics.items() if k.startswith(("train/critic", "train/actor", "train/q", "eval/"))}

    half, full = run("fp16", "half"), run("float32", "full")
    assert set(half) == set(full) and np.isfinite(half["train/critic_loss"]).sum() >= 1
    for key in half:
        np.testing.assert_array_equal(half[key], full[key])


@pytest.mark.slow
def test_chaos_runs_killed_at_random_moments_end_bit_identical_to_an_uninterrupted_one(tmp_path):
    """Each of 4 runs is stopped again and again by SIGKILL, SIGTERM or SIGINT at a random moment (after a random
    delay, while a checkpoint is being written, right after a metrics row) and continued with ``--resume`` (or
    started again, when it stopped before its first checkpoint) until it finishes. Every run must end with the
    uninterrupted run's final state, bit for bit, and its metrics rows, none duplicated or missing. Seeded: the
    same choices each time (the moments they land on depend on the machine's speed)."""
    rng = random.Random(31)
    reference = tmp_path / "reference"
    sac_loop.train(_tiny(), reference, progress=False)
    reference_leaves, reference_rows = _loop_leaves(reference, 1000), _logged(reference)
    for trial in range(4):
        run_dir, sessions = tmp_path / f"chaos{trial}", []
        for attempt in range(12):
            resume = bool(checkpoint_steps(run_dir))  # a complete checkpoint (not a killed save's tmp directory)
            child = _start(run_dir, *(["--resume"] if resume else []), stderr=subprocess.PIPE)
            _wait_for_lock(child, run_dir)  # the run has started (its signal handlers are in)
            signum = rng.choice([signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
            moment = rng.choice(["delay", "checkpoint", "row"])
            if attempt < 8:  # then it may finish
                if moment == "delay":
                    deadline = time.time() + rng.uniform(0.5, 20.0)
                    while time.time() < deadline and child.poll() is None:
                        time.sleep(0.01)
                elif moment == "checkpoint":  # while orbax writes <step>.orbax-checkpoint-tmp
                    while child.poll() is None and not list((run_dir / "checkpoints").glob("*.orbax-checkpoint-tmp*")):
                        time.sleep(0.002)
                else:  # right after a new metrics row
                    size = (run_dir / "metrics.csv").stat().st_size if (run_dir / "metrics.csv").exists() else 0
                    while child.poll() is None and (
                        not (run_dir / "metrics.csv").exists() or (run_dir / "metrics.csv").stat().st_size <= size
                    ):
                        time.sleep(0.002)
                if child.poll() is None:
                    child.send_signal(signum)
            _, stderr = child.communicate(timeout=600)
            sessions.append(f"{signal.Signals(signum).name} {moment}: exit {child.returncode}")
            if child.returncode == 0:
                print(f"run {trial}: {'; '.join(sessions)}")  # shown with pytest -s
                break
            assert child.returncode in (-signal.SIGKILL, 128 + signal.SIGTERM, 128 + signal.SIGINT), stderr[-3000:]
            if child.returncode != -signal.SIGKILL:
                assert re.fullmatch(r"interrupted (at step \d+; |before the run started; |by SIG)[^\n]*\n", stderr), (
                    stderr
                )
        else:
            pytest.fail(f"run {trial} did not finish in 12 sessions")
        for a, b in zip(_loop_leaves(run_dir, 1000), reference_leaves, strict=True):
            np.testing.assert_array_equal(a, b)
        rows = _logged(run_dir)
        assert rows.keys() == reference_rows.keys()
        for column, values in reference_rows.items():
            np.testing.assert_array_equal(rows[column], values, err_msg=f"run {trial}: {column}")
