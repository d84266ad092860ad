r"""Train SAC in fp32, fp16 or bf16 on dm_control, brax or MJX: ``python -m experiments.sac --config=fp16.py``.

``--config`` takes a file or a bare name from ``experiments/configs/sac/`` (fp32, fp16, fp16_naive, bf16,
pixels, pixels_fp32, demo, mjx); any field can be overridden, e.g. ``--config.env=dmc:walker-walk
--config.total_steps=100000 --config.agent.hidden_dims=256,256``. Writes to ``--run_dir`` (default
``runs/sac/<config>-<env>-seed<seed>-<time>``): ``config.json``, ``metrics.csv``, TensorBoard events,
``checkpoints/`` and ``learning_curve.png``. ``--resume`` continues the run in ``--run_dir`` from its last
checkpoint, bit-identically to an uninterrupted run.
"""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")

from experiments import cli


def train_for(config):
    """The jitted loop for ``brax:`` and ``mjx:`` environments, the dm_control host loop otherwise."""
    import lpjax.envs
    from experiments import sac_brax_loop, sac_loop

    return (sac_brax_loop if lpjax.envs.is_jitted(config.env) else sac_loop).train


if __name__ == "__main__":
    cli.launch("sac", "fp16.py", train_for)
