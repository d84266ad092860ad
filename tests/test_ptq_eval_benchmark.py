"""Smoke test of benchmarks/ptq_eval.py: a tiny fp32 SAC run (``sac_loop.train``, what ``python -m experiments.sac``
runs, in-process as in tests/experiments/test_sac_cli.py) in a temporary directory, then PTQ evaluation of its
actor (1 episode, 2 bit widths); the json's structure and the ordering of the distances are checked, returns
are not."""

import json

import pytest

from benchmarks import ptq_eval
from experiments import sac_loop
from experiments.cli import REPO_ROOT
from tests.sac_configs import tiny_cartpole


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("sac_run")
    assert sac_loop.train(tiny_cartpole(), run_dir, progress=False)["status"] == "finished"
    out = tmp_path_factory.mktemp("ptq_eval")
    result = ptq_eval.main(
        ["--run_dir", str(run_dir), "--episodes", "1", "--bits", "8,4", "--out_dir", str(out), "--name", "smoke"]
    )
    assert (out / "smoke.png").stat().st_size > 0
    data = json.loads((out / "smoke.json").read_text())
    assert data == json.loads(json.dumps(result))
    return data


def test_json_describes_the_run_and_every_precision(recorded):
    assert recorded["checkpoint_step"] == 300 and recorded["env"] == "dmc:cartpole-swingup"
    assert recorded["actor"]["hidden_dims"] == [32, 32] and recorded["actor"]["action_dim"] == 1
    assert recorded["episodes"] == 1 and recorded["bits"] == [8, 4]
    assert recorded["states"] == 250  # one episode of 1000 steps at action repeat 4, all acted on
    assert recorded["command"].startswith("python -m benchmarks.ptq_eval")
    names = [row["name"] for row in recorded["rows"]]
    assert names == ["fp32", "fp16", "fp16_act", "int8", "int8_per_channel", "int4", "int4_per_channel"]
    keys = "return_mean return_std return_ratio action_l2_mean action_l2_max kl_mean kl_median kl_max weight_rel_error"
    for row in recorded["rows"]:
        for key in keys.split():
            assert isinstance(row[key], float) and row[key] >= 0, (row["name"], key)
        assert row["action_l2_mean"] <= row["action_l2_max"] and row["kl_median"] <= row["kl_max"]
        assert row["kl_mean"] <= row["kl_max"]


def test_distances_are_zero_for_fp32_and_grow_as_bits_shrink(recorded):
    rows = {row["name"]: row for row in recorded["rows"]}
    fp32 = rows["fp32"]
    assert fp32["action_l2_mean"] == fp32["action_l2_max"] == fp32["kl_mean"] == fp32["kl_max"] == 0.0
    assert fp32["kl_median"] == 0.0
    assert fp32["weight_rel_error"] == 0.0 and fp32["return_ratio"] == 1.0
    for suffix in ("", "_per_channel"):
        int8, int4 = rows["int8" + suffix], rows["int4" + suffix]
        assert int4["action_l2_mean"] > int8["action_l2_mean"] >= 0
        assert int4["kl_mean"] > int8["kl_mean"] >= 0
        assert int4["weight_rel_error"] > int8["weight_rel_error"] > rows["fp16"]["weight_rel_error"] > 0
    assert rows["int8_per_channel"]["weight_rel_error"] <= rows["int8"]["weight_rel_error"]
    assert rows["fp16"]["action_l2_mean"] < rows["int8"]["action_l2_mean"]
    assert rows["fp16_act"]["activations"] == "fp16" and rows["int4"]["activations"] == "fp32"


def test_bad_flags_are_rejected():
    with pytest.raises(SystemExit):
        ptq_eval.parse_args(["--bits", "8,1"])
    with pytest.raises(SystemExit):
        ptq_eval.parse_args(["--episodes", "0"])
    with pytest.raises(FileNotFoundError, match="config.json"):
        ptq_eval.load_run(REPO_ROOT / "no_such_run")
