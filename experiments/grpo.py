r"""Train a small LM with GRPO on a verifiable task: ``python -m experiments.grpo --config=fp8_tis.py``.

``--config`` takes a file or a bare name from ``experiments/configs/grpo/`` (fp32, bf16, fp8_tis, fp8_no_tis,
fp8_kv). The run warm-starts the model with a short supervised phase, then runs GRPO iterations: rollouts in the
configured precision, exact rewards, group-relative advantages, a TIS-corrected update, and a weight sync with
KV-scale recalibration. Writes to ``--run_dir``: ``config.json``, ``metrics.csv``, TensorBoard events,
``checkpoints/`` and ``learning_curve.png``; ``--resume`` continues from the last checkpoint.
"""

from __future__ import annotations

from absl import flags

from experiments import cli
from experiments.cli import REPO_ROOT, define_experiment_flags, experiment_main, run_app

CONFIG_DIR = REPO_ROOT / "experiments" / "configs" / "grpo"
FLAGS = define_experiment_flags("grpo", "fp8_tis.py")
flags.adopt_module_key_flags(cli)  # --help lists the shared flags


def train_for(config):
    del config
    from experiments import grpo_loop

    return grpo_loop.train


if __name__ == "__main__":
    run_app(experiment_main(FLAGS, train_for), CONFIG_DIR)
