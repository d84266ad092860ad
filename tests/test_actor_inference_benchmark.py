"""Smoke test of benchmarks/actor_inference.py: a --quick run into a temporary directory; checks the json's
structure and the accuracy bookkeeping, never the timings."""

import json

import pytest

pytest.importorskip("torch")

from benchmarks import actor_inference as bench

VARIANTS = [bench.JAX_FP32, bench.NAIVE_INT8, bench.OURS, "torch_fp32", bench.TORCH_INT8]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("actor_inference")
    result = bench.main(["--quick", "--rounds", "2", "--calls", "3", "--accuracy_obs", "8", "--out_dir", str(out)])
    assert (out / "actor_inference.png").stat().st_size > 0
    data = json.loads((out / "actor_inference.json").read_text())
    assert data["targets"] == json.loads(json.dumps(result["targets"]))
    return data


def test_every_variant_is_timed_and_sized(recorded):
    assert recorded["benchmark"] == "actor_inference" and recorded["quick"] is True
    assert [row["variant"] for row in recorded["results"]] == VARIANTS
    for row in recorded["results"]:
        assert 0 < row["min_ms"] <= row["median_ms"] <= row["p90_ms"]
        assert len(row["round_medians_ms"]) == 2
        assert row["calls"] == (2 if row["variant"] == bench.NAIVE_INT8 else 6)
        assert row["weight_bytes"] > 0
    rows = {row["variant"]: row for row in recorded["results"]}
    assert rows[bench.JAX_FP32]["ratio_to_jax_fp32_median"] == 1.0
    # int8 codes are a quarter of the float32 weights (plus scales and biases)
    assert rows[bench.OURS]["weight_bytes"] < 0.3 * rows[bench.JAX_FP32]["weight_bytes"]
    assert rows[bench.OURS]["weight_bytes"] == rows[bench.NAIVE_INT8]["weight_bytes"]


def test_targets_and_config_are_recorded(recorded):
    targets = recorded["targets"]
    assert set(targets) == {"speedup_vs_jax_fp32", "ratio_vs_torch_int8"}
    for target in targets.values():
        assert isinstance(target["met"], bool) and target["median"] > 0 and "target" in target
    config = recorded["config"]
    assert config["sizes"] == bench.QUICK_SIZES._asdict()
    assert config["torch_num_threads"] == 1 and isinstance(config["ours_reduce_range"], bool)
    assert "uint8" in recorded["fbgemm_activation_quantization"]
    assert recorded["command"].startswith("python -m benchmarks.actor_inference --quick")


def test_accuracy_covers_both_batches_and_references(recorded):
    acc = recorded["accuracy"]
    assert acc["observations"] == 8
    for batch in ("batch_1", "batch_8"):
        assert set(VARIANTS) <= set(acc[batch])
        for row in acc[batch].values():
            for ref in ("vs_dequantized_int8_float64", "vs_fp32_float64"):
                assert set(row[ref]) == {"rel_rms_mean", "max_abs_mean", "max_abs_action"}
        # float32 runtimes match the float64 forward of the same weights; int8 ones carry quantization error
        assert acc[batch][bench.JAX_FP32]["vs_fp32_float64"]["rel_rms_mean"] < 1e-5
        assert 1e-5 < acc[batch][bench.OURS]["vs_dequantized_int8_float64"]["rel_rms_mean"] < 0.05


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="accuracy_obs"):
        bench.main(["--quick", "--accuracy_obs", "4"])
    with pytest.raises(ValueError, match="rounds"):
        bench.main(["--quick", "--rounds", "0"])
