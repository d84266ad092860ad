"""Smoke test of benchmarks/sac_throughput.py: a --quick run (inverted pendulum, fp32 only) into a temporary
directory, its json checked for consistency; timings are never asserted."""

import dataclasses
import json
import statistics

import jax
import pytest

from benchmarks import sac_throughput as bench


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("sac_throughput")
    result = bench.main(["--quick", "--env", "inverted_pendulum", "--no-fp16", "--out-dir", str(out)])
    assert (out / "sac_throughput.png").stat().st_size > 0
    data = json.loads((out / "sac_throughput.json").read_text())
    assert data["settings"] == json.loads(json.dumps(result["settings"]))
    return data


def test_quick_run_records_matched_settings_and_consistent_throughput(recorded):
    for key in ("jax_version", "brax_version", "machine", "quick", "target_ratio", "settings", "target_met",
                "update_profile", "command"):
        assert key in recorded, key
    assert recorded["jax_version"] == jax.__version__ and recorded["target_ratio"] == 1.0 and recorded["quick"]
    (setting,) = recorded["settings"]
    assert recorded["target_met"] == {"quick": setting["target_met"]}
    config = setting["config"]
    assert config["env"] == "inverted_pendulum" and config["backend"] == "spring"
    assert config["env_steps_per_round"] == config["iterations"] * config["num_envs"]
    agent = config["lpjax_agents"]["lpjax_fp32"]
    assert agent["policy"] == "fp32" and agent["batch_size"] == config["batch_size"]
    assert agent["hidden_dims"] == config["hidden"] and not agent["hadam"]

    results = setting["results"]
    assert set(results) == {"brax", "lpjax_fp32"}  # --no-fp16
    for name, row in results.items():
        assert len(row["sps"]) == config["rounds"], name
        assert all(sps > 0 for sps in row["sps"]) and row["warmup_sps"] > 0
        assert row["min"] <= row["median"] <= row["max"] and row["median"] == statistics.median(row["sps"])
        assert row["backend_compile_s"] > 0  # each side's compile was seen, outside the timed rounds
        assert row["last_critic_loss"] == row["last_critic_loss"]  # both sides trained (not nan)
    assert results["lpjax_fp32"]["chunk_compile_s"] > 0
    ratios = setting["ratios_per_round"]["lpjax_fp32"]
    assert ratios == pytest.approx([o / b for o, b in zip(results["lpjax_fp32"]["sps"], results["brax"]["sps"])])
    assert setting["ratio"] == pytest.approx(statistics.median(ratios))
    assert setting["target_met"] == (setting["ratio"] >= 1.0)

    profile = recorded["update_profile"]  # one update alone, both sides, at the same sizes
    assert profile["setting"] == "quick" and profile["batch_size"] == config["batch_size"]
    rows = profile["results"]
    assert set(rows) == {"brax", "lpjax_fp32"}
    for row in rows.values():
        assert row["flops"] > 0 and row["matmuls"] > 0 and len(row["ms"]) == profile["rounds"]
        assert row["ms_per_update"]["median"] == statistics.median(row["ms"]) > 0
    # Both do the same matmuls (XLA merges brax's duplicate policy forward pass): equal work within 5%.
    assert rows["lpjax_fp32"]["matmuls"] == rows["brax"]["matmuls"]
    assert rows["lpjax_fp32"]["flops"] == pytest.approx(rows["brax"]["flops"], rel=0.05)


def test_brax_compat_shim_is_removed_after_use():
    with bench.brax_jax_compat():
        assert callable(jax.device_put_replicated)
    with pytest.raises(AttributeError):
        jax.device_put_replicated  # noqa: B018  (removed in jax 0.10)


def test_settings_overrides_and_the_fp16_reference():
    args = bench.parse_args(["--settings", "one_update", "--num-envs", "64", "--hidden", "64,64"])
    (setting,) = args.chosen
    assert (setting.name, setting.num_envs, setting.hidden, setting.updates_per_step) == ("one_update", 64,
                                                                                          (64, 64), 1)
    assert [s.name for s in bench.parse_args([]).chosen] == list(bench.SETTINGS)
    with pytest.raises(SystemExit):
        bench.parse_args(["--settings", "nope"])
    agent = bench.lpjax_settings(setting, "fp16").agent
    assert agent.policy == "fp16" and all(getattr(agent, m) for m in bench.sac_base.ALL_METHODS)
    assert agent.hidden_dims == (64, 64) and agent.batch_size == setting.batch_size
    fp32 = bench.lpjax_settings(setting, "fp32").agent
    assert dataclasses.replace(agent, policy="fp32", **{m: False for m in bench.sac_base.ALL_METHODS}) == fp32
