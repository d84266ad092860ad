"""benchmarks/grpo_fp8.py: the byte model, and a toy run that records every config's curves."""

import json

import pytest

from benchmarks import grpo_fp8 as bench


def test_byte_model():
    kv = bench.kv_cache_bytes(layers=2, heads=4, head_dim=16, tokens=10)
    assert kv["fp32"] == 4 * 2 * 2 * 10 * 4 * 16 and kv["bf16"] == kv["fp32"] // 2
    assert kv["fp8"] == kv["fp32"] // 4 + 2 * 2 * 4 * 4  # codes + one float32 scale per layer, head, K/V
    w = bench.weight_bytes([(256, 200)])
    assert w["fp8"] == 256 * 200 + 4 * 2 * 2


@pytest.mark.slow
def test_toy_run_records_every_config_and_the_summary(tmp_path):
    names = ["fp32", "fp8_no_tis", "fp8_mis"]
    result = bench.main(
        [
            "--iterations", "10", "--seeds", "0", "--configs", ",".join(names), "--task", "addition",
            "--num_digits", "2", "--temperature", "1.0", "--explore", "addition:2:1.0",
            "--runs_dir", str(tmp_path / "runs"), "--out_dir", str(tmp_path),
        ]
    )  # fmt: skip
    recorded = json.loads((tmp_path / "grpo_fp8.json").read_text())
    assert (tmp_path / "grpo_fp8.png").stat().st_size > 0
    assert set(recorded["runs"]) == set(names) and recorded["summary"]["fp32"]["ratio_to_fp32"] == 1.0
    assert recorded["corrections"] == {"fp32": "tis", "fp8_no_tis": "none", "fp8_mis": "mis"}
    assert recorded["setting"] == {"task": "addition", "num_digits": 2, "temperature": 1.0}
    assert (tmp_path / "runs" / "addition2_t1" / "fp8_mis" / "seed0").is_dir()
    summary = recorded["summary"]
    assert summary["fp32"]["mismatch_kl_mean"] < 1e-9 < summary["fp8_no_tis"]["mismatch_kl_mean"]
    assert recorded["degradation"]["fp8_no_correction_degrades"] == (summary["fp8_no_tis"]["ratio_to_fp32"] < 0.95)
    assert recorded["fp8_kv_smaller_than_bf16"] > 1.99
    (tried,) = recorded["settings_tried"]  # the same runs as the study's fp32 and fp8_no_tis seed 0
    assert tried["ratio"] == pytest.approx(summary["fp8_no_tis"]["ratio_to_fp32"])
    assert tried["fp8_mismatch_kl_mean"] == pytest.approx(summary["fp8_no_tis"]["mismatch_kl_mean"])
    assert len(result["runs"]["fp8_mis"][0]["reward"]) == 1  # logged every 10 iterations
    with pytest.raises(SystemExit):
        bench.main(["--configs", "fp7"])


def test_summary_and_degradation_by_hand():
    def run(rewards, kl):
        return {
            "reward": rewards,
            "mismatch_kl": [kl] * len(rewards),
            "rejected_fraction": [0.0],
            "eval_accuracy": [0.5],
        }

    runs = {
        "fp32": {0: run([0.0] * 5 + [1.0] * 5, 0.0), 1: run([0.5] * 10, 0.0)},
        "fp8_no_tis": {0: run([0.6] * 10, 0.01), 1: run([0.6] * 10, 0.03)},
        "fp8_tis": {0: run([0.8] * 10, 0.01), 1: run([0.72] * 10, 0.01)},
    }
    summary = bench.summarize(runs, list(runs))
    assert summary["fp32"]["final_reward_per_seed"] == [1.0, 0.5]
    assert summary["fp8_no_tis"]["ratio_to_fp32"] == pytest.approx(0.8)
    assert summary["fp8_no_tis"]["mismatch_kl_mean"] == pytest.approx(0.02)
    assert summary["fp8_tis"]["ratio_to_fp32"] == pytest.approx(1.01333, rel=1e-4)
    d = bench.degradation(summary)
    assert d["fp8_no_correction_degrades"] and d["recovered_by"] == ["fp8_tis"]
    zero = bench.summarize(
        {"fp32": {0: run([0.0] * 5, 0.0)}, "fp8_no_tis": {0: run([0.1] * 5, 0.01)}}, ["fp32", "fp8_no_tis"]
    )
    assert zero["fp8_no_tis"]["ratio_to_fp32"] is None  # no ratio to a zero reward
    assert bench.degradation(zero)["fp8_no_correction_degrades"] is False
