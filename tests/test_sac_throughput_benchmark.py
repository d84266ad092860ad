"""Smoke tests of benchmarks/sac_throughput.py: --quick runs into a temporary directory, their json checked for
consistency (timings are never asserted): brax inverted pendulum (fp32 only) in the default tier, and the
default quick setting (MJX cartpole-swingup with the dm_control host loop) in the slow tier."""

import dataclasses
import json
import pathlib
import statistics

import jax
import pytest

from benchmarks import sac_throughput as bench
from lpjax.methods import PrecisionMethods


def _record(out, argv):
    result = bench.main(["--quick", *argv, "--out-dir", str(out)])
    assert (out / "sac_throughput.png").stat().st_size > 0
    data = json.loads((out / "sac_throughput.json").read_text())
    assert data["settings"] == json.loads(json.dumps(result["settings"]))
    return data


def _check_rows(setting, variants):
    config, results = setting["config"], setting["results"]
    assert set(results) == {"brax", *variants}
    for name, row in results.items():
        assert len(row["sps"]) == config["rounds"], name
        assert all(sps > 0 for sps in row["sps"]) and row["warmup_sps"] > 0
        assert row["min"] <= row["median"] <= row["max"] and row["median"] == statistics.median(row["sps"])
        assert row["backend_compile_s"] > 0  # each side's compile was seen, outside the timed rounds
        assert row["last_critic_loss"] == row["last_critic_loss"]  # every side trained (not nan)
    for name in variants:
        agent = config["lpjax_agents"][name]
        assert agent["batch_size"] == config["batch_size"] and agent["hidden_dims"] == config["hidden"]
        assert agent["policy"] == name[-4:] and agent["methods"]["hadam"] == (name[-4:] == "fp16")
        ratios = setting["ratios_per_round"][name]
        assert ratios == pytest.approx([o / b for o, b in zip(results[name]["sps"], results["brax"]["sps"])])
    assert setting["ratio"] == pytest.approx(statistics.median(setting["ratios_per_round"]["lpjax_fp32"]))
    assert setting["target_met"] == (setting["ratio"] >= 1.0)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return _record(
        tmp_path_factory.mktemp("sac_throughput"),
        ["--env", "brax:inverted_pendulum", "--backend", "spring", "--host-env", "", "--num-envs", "8", "--no-fp16"],
    )


@pytest.mark.slow
def test_quick_run_records_matched_settings_and_consistent_throughput(recorded):
    assert set(recorded) == {"notes", "target_ratio", "settings", "medians", "target_met", "update_profile"}
    assert recorded["target_ratio"] == 1.0 and any("XLA:CPU" in note for note in recorded["notes"])
    (setting,) = recorded["settings"]
    run = setting["run"]  # what measured it
    assert run["quick"] and run["command"].startswith("python -m benchmarks.sac_throughput --quick")
    assert run["versions"]["jax"] == jax.__version__ and set(run["versions"]) == set(bench.PACKAGES)
    assert run["machine"]["cpu_count"] >= 1 and len(run["machine"]["load_average"]) == 3
    assert recorded["target_met"] == {"quick": setting["target_met"]}
    assert recorded["medians"] == {"quick": {name: row["median"] for name, row in setting["results"].items()}}
    config = setting["config"]
    assert config["env"] == "brax:inverted_pendulum" and config["backend"] == "spring" and config["host_env"] is None
    assert config["env_steps_per_round"] == config["iterations"] * config["num_envs"] == 64
    _check_rows(setting, ["lpjax_fp32"])  # --no-fp16, no host loop
    assert setting["results"]["lpjax_fp32"]["chunk_compile_s"] > 0 and "jitted_over_host" not in setting

    profile = recorded["update_profile"]  # one update alone, both sides, at the same sizes
    assert profile["setting"] == "quick" and profile["batch_size"] == config["batch_size"] and profile["run"] == run
    rows = profile["results"]
    assert set(rows) == {"brax", "lpjax_fp32"}
    for row in rows.values():
        assert row["flops"] > 0 and row["matmuls"] > 0 and len(row["ms"]) == profile["rounds"]
        assert row["ms_per_update"]["median"] == statistics.median(row["ms"]) > 0
    # Both do the same matmuls (XLA merges brax's duplicate policy forward pass): equal work within 5%.
    assert rows["lpjax_fp32"]["matmuls"] == rows["brax"]["matmuls"]
    assert rows["lpjax_fp32"]["flops"] == pytest.approx(rows["brax"]["flops"], rel=0.05)


@pytest.mark.slow
def test_quick_mjx_run_times_the_jitted_loop_brax_and_the_dm_control_host_loop(tmp_path):
    data = _record(tmp_path, ["--no-profile"])
    (setting,) = data["settings"]
    config = setting["config"]
    assert (config["env"], config["backend"]) == ("mjx:cartpole-swingup", None)
    assert config["host_env"] == "dmc:cartpole-swingup"
    variants = ["lpjax_fp32", "lpjax_fp16", "lpjax_host_fp32", "lpjax_host_fp16"]
    _check_rows(setting, variants)
    agents = config["lpjax_agents"]
    assert agents["lpjax_fp32"] == agents["lpjax_host_fp32"] and agents["lpjax_fp16"] == agents["lpjax_host_fp16"]
    host = setting["results"]["lpjax_host_fp32"]
    assert len(host["round_wall_s"]) == config["rounds"] + 1  # the warm-up round too
    assert setting["jitted_over_host"] == pytest.approx(
        statistics.median(j / h for j, h in zip(setting["results"]["lpjax_fp32"]["sps"], host["sps"]))
    )


def test_a_run_keeps_the_earlier_results_it_did_not_measure():
    def setting(name, run):
        return {"name": name, "results": {"brax": {"median": 1.0}}, "target_met": run == "new", "run": run}

    earlier = bench.summarize(
        [setting("quick", "old"), setting("one_update", "old"), setting("brax_colab", "old")],
        {"setting": "brax_colab", "run": "old"},
    )
    result = bench.summarize([setting("mjx_cartpole", "new"), setting("one_update", "new")], None)
    merged = bench.with_earlier_results(result, earlier)
    assert [(s["name"], s["run"]) for s in merged["settings"]] == [
        ("brax_colab", "old"),
        ("one_update", "new"),
        ("mjx_cartpole", "new"),
        ("quick", "old"),
    ]
    assert merged["update_profile"] == {"setting": "brax_colab", "run": "old"}  # this run profiled nothing
    assert merged["target_met"] == {"brax_colab": False, "one_update": True, "mjx_cartpole": True, "quick": False}
    assert merged == bench.summarize(merged["settings"], merged["update_profile"])


def test_recorded_results_are_complete():
    """benchmarks/results/sac_throughput.json: every setting of SETTINGS, the MJX ones side by side in one run."""
    recorded = json.loads((pathlib.Path(bench.__file__).parent / "results" / "sac_throughput.json").read_text())
    assert [s["name"] for s in recorded["settings"]] == list(bench.SETTINGS)
    assert recorded == bench.summarize(recorded["settings"], recorded["update_profile"])
    by_name = {s["name"]: s for s in recorded["settings"]}
    assert by_name["mjx_cartpole"]["run"] == by_name["mjx_cartpole_128"]["run"]
    variants = {"brax", "lpjax_fp32", "lpjax_fp16", "lpjax_host_fp32", "lpjax_host_fp16"}
    assert set(by_name["mjx_cartpole"]["results"]) == variants
    assert not any(s["run"]["quick"] for s in recorded["settings"])


def test_brax_compat_shim_is_removed_after_use():
    with bench.brax_jax_compat():
        assert callable(jax.device_put_replicated)
    with pytest.raises(AttributeError):
        jax.device_put_replicated  # noqa: B018  (removed in jax 0.10)


def test_settings_overrides_and_the_fp16_reference():
    args = bench.parse_args(["--settings", "one_update", "--num-envs", "64", "--hidden", "64,64"])
    (setting,) = args.chosen
    assert (setting.name, setting.num_envs, setting.hidden, setting.updates_per_step) == ("one_update", 64, (64, 64), 1)
    assert [s.name for s in bench.parse_args([]).chosen] == list(bench.SETTINGS)
    agent = bench.lpjax_settings(setting, "fp16").agent
    assert agent.policy == "fp16" and agent.methods == PrecisionMethods.paper()
    assert agent.hidden_dims == (64, 64) and agent.batch_size == setting.batch_size
    fp32 = bench.lpjax_settings(setting, "fp32").agent
    assert dataclasses.replace(agent, policy="fp32", methods=PrecisionMethods()) == fp32
    host = bench.host_config(bench.SETTINGS["mjx_cartpole"], "fp16", seed=3)
    assert host.env == "dmc:cartpole-swingup" and host.seed == 3 and host.seed_steps == 0
    assert bench.sac_loop.validate(host) == bench.agent_config(bench.SETTINGS["mjx_cartpole"], "fp16")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--settings", "nope"], "unknown settings"),
        (["--settings", "mjx_cartpole", "--num-envs", "8"], "host_env needs num_envs=1"),
        (["--settings", "one_update", "--env", "dmc:cheetah-run"], "env must be 'brax:<env>' or 'mjx:"),
        (["--settings", "one_update", "--env", "mjx:cartpole-swingup"], "backend is for brax envs only"),
        (["--quick", "--host-env", "brax:halfcheetah"], "host_env must be 'dmc:<domain>-<task>'"),
        (["--quick", "--rounds", "0"], "rounds and iterations must be >= 1"),
    ],
)
def test_bad_settings_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    assert message in capsys.readouterr().err
