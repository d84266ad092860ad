r"""Train a small LM with GRPO on a verifiable task: ``python -m experiments.grpo --config=fp8_tis.py``.

``--config`` takes a file or a bare name from ``experiments/configs/grpo/`` (fp32, bf16, fp16, fp8_tis,
fp8_no_tis, fp8_mis, fp8_geo, fp8_kv). The run warm-starts the model with a short supervised phase, then runs
GRPO iterations: rollouts in the configured precision, exact rewards, group-relative advantages, ``ppo_epochs``
passes of ``num_minibatches`` updates corrected for the rollout mismatch (``agent.rollout_correction``), and
a weight sync with KV-scale recalibration. Writes to
``--run_dir``: ``config.json``, ``metrics.csv``, TensorBoard events, ``checkpoints/`` and
``learning_curve.png``; ``--resume`` continues from the last checkpoint.
"""

from __future__ import annotations

from experiments import cli


def train_for(config):
    del config
    from experiments import grpo_loop

    return grpo_loop.train


if __name__ == "__main__":
    cli.launch("grpo", "fp8_tis.py", train_for)
