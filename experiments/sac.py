r"""Train SAC in fp32, fp16 or bf16 on dm_control or brax: ``python -m experiments.sac --config=fp16.py``.

``--config`` takes a file or a bare name from ``experiments/configs/sac/`` (fp32, fp16, fp16_naive, bf16,
pixels, pixels_fp32, demo); any field can be overridden, e.g. ``--config.env=dmc:walker-walk
--config.total_steps=100000 --config.agent.hidden_dims=256,256``. Writes to ``--run_dir`` (default
``runs/sac/<config>-<env>-seed<seed>-<time>``): ``config.json``, ``metrics.csv``, TensorBoard events,
``checkpoints/`` and ``learning_curve.png``. ``--resume`` continues the run in ``--run_dir`` from its last
checkpoint, bit-identically to an uninterrupted run.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("MUJOCO_GL", "egl")

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from experiments.cli import REPO_ROOT, default_run_dir, run_app  # noqa: E402

CONFIG_DIR = REPO_ROOT / "experiments" / "configs" / "sac"

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "SAC config: a file, or a name in experiments/configs/sac (e.g. fp16.py).", lock_config=True)
_RUN_DIR = flags.DEFINE_string("run_dir", None, "Run directory (default: a new one under runs/sac/).")
_RESUME = flags.DEFINE_bool("resume", False, "Continue the run in --run_dir from its latest checkpoint.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar.")
flags.mark_flag_as_required("config")


def main(argv):
    del argv
    if not flags.FLAGS["verbosity"].present:  # orbax logs every checkpoint step at INFO
        logging.set_verbosity(logging.WARNING)
    from experiments import sac_brax_loop, sac_loop  # imported after flag parsing so --help stays fast

    config = _CONFIG.value
    if _RESUME.value and _RUN_DIR.value is None:
        raise app.UsageError("--resume needs --run_dir (the run to continue).")
    run_dir = _RUN_DIR.value or default_run_dir("sac", flags.FLAGS["config"].config_filename, config.env,
                                                config.seed)
    try:
        loop = sac_brax_loop if config.env.startswith("brax:") else sac_loop
        summary = loop.train(config, run_dir, resume=_RESUME.value, progress=_PROGRESS.value)
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    run_app(main, CONFIG_DIR)
