"""Small run configs shared by tests that train a real (tiny) run, and the command line run as a subprocess."""

import os
import subprocess
import sys

from experiments.cli import REPO_ROOT
from experiments.configs.sac import fp32

TINY_AGENT = {"hidden_dims": (32, 32), "batch_size": 32}
CARTPOLE = dict(env="dmc:cartpole-swingup", action_repeat=4, total_steps=300, seed_steps=200, replay_capacity=500)
CARTPOLE.update(eval_every=300, eval_episodes=1, log_every=100, checkpoint_every=300)
"""cartpole-swingup with 250-step episodes (action repeat 4), 300 agent steps of which 200 are random; one
evaluation and one checkpoint, at the end."""


def tiny_config(base, agent=None, **fields):
    """``base``'s config (a module of ``experiments/configs/<learner>``) with ``fields`` and the ``agent`` fields
    (default :data:`TINY_AGENT`: 32x32 networks, batch 32) set."""
    config = base.get_config()
    config.unlock()
    config.update(fields)
    config.agent.update(TINY_AGENT if agent is None else agent)
    return config


def tiny_cartpole(base=fp32, agent=None, **overrides):
    """:func:`tiny_config` of ``base`` (default fp32) on :data:`CARTPOLE`, with ``overrides``."""
    return tiny_config(base, agent, **{**CARTPOLE, **overrides})


def run_cli(module: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    """``python -m <module> *args`` from the checkout (headless rendering), its output captured as text."""
    env = dict(os.environ, MUJOCO_GL="egl")
    command = [sys.executable, "-m", module, *args]
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=env, **kwargs)


def assert_usage_error(result: subprocess.CompletedProcess, message: str) -> None:
    """A command that failed with ``message`` on stderr and no traceback."""
    assert result.returncode != 0 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
