"""lpjax.plots: learning-curve PNGs of run directories (without matplotlib: tests/test_optional.py)."""

import pytest

from lpjax.plots import plot_learning_curve, plot_run_curve
from lpjax.run_logging import RunLogger


def test_learning_curve_png_overlays_runs(tmp_path):
    for seed in range(2):
        with RunLogger(tmp_path / f"seed{seed}", tensorboard=False) as logger:
            for step in range(0, 1000, 100):
                logger.log(step, {"critic_loss": 1.0}, prefix="train")
                logger.log(step, {"return": step * (1 + seed) + (float("nan") if step == 500 else 0.0)}, prefix="eval")
    out = plot_learning_curve(
        [tmp_path / "seed0", tmp_path / "seed1" / "metrics.csv"], tmp_path / "plots" / "c.png", title="cheetah run"
    )
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (840, 540)
    single = plot_learning_curve(tmp_path / "seed0", tmp_path / "one.png", y="train/critic_loss")
    assert single.exists()
    with pytest.raises(ValueError, match="no column 'eval/missing'"):
        plot_learning_curve(tmp_path / "seed0", tmp_path / "bad.png", y="eval/missing")


def test_run_curve_plots_the_first_candidate_logged(tmp_path):
    assert plot_run_curve(tmp_path / "empty", "t", ["eval/return"]) is None  # no metrics file yet
    with RunLogger(tmp_path, tensorboard=False) as logger:
        logger.log(1, {"loss": float("nan")}, prefix="train")
        logger.log(2, {"loss": float("nan"), "alpha": 0.5}, prefix="train")
    assert plot_run_curve(tmp_path, "t", ["eval/return", "train/loss"]) is None  # never finite
    curve = plot_run_curve(tmp_path, "t", ["eval/return", "train/loss"], plot_nonfinite=["train/loss"])
    assert curve == str(tmp_path / "learning_curve.png") and (tmp_path / "learning_curve.png").stat().st_size > 0
    assert plot_run_curve(tmp_path, "t", ["eval/return", "train/alpha", "train/loss"]) == curve
