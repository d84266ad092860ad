r"""Train D4PG with ActorQ's int8 actors on dm_control: ``python -m experiments.d4pg --config=int8.py``.

``--config`` takes a file or a bare name from ``experiments/configs/d4pg/`` (int8, fp32, fp16, demo); any field
can be overridden, e.g. ``--config.num_actors=2 --config.backend=inprocess --config.ray_address=host:6379``.
Actors run as Ray processes (a local cluster by default) or in-process. Writes to ``--run_dir`` (default
``runs/d4pg/<config>-<env>-seed<seed>-<time>``): ``config.json``, ``metrics.csv``, TensorBoard events,
``checkpoints/``, ``actor_learner.json`` (throughput, time split, restarts) and ``learning_curve.png``.
``--resume`` continues the run in ``--run_dir`` from its last checkpoint.
"""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")

from experiments import cli


def train_for(config):
    del config
    from experiments import d4pg_loop

    return d4pg_loop.train


if __name__ == "__main__":
    cli.launch("d4pg", "int8.py", train_for)
