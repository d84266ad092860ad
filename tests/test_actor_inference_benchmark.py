"""Smoke test of benchmarks/actor_inference.py: a --quick run into a temporary directory that already holds a stale
run, with a stand-in interpreter for --with_python; checks the json's structure, the merge, the summary and the
accuracy of every variant, never the timings."""

import json
import sys

import pytest

from benchmarks import actor_inference as bench

OTHER_ENV = "python3.0-jax0.0.0"  # written by the stand-in interpreter of --with_python, with torch
STALE_ENV = "python2.9-jax0.0.0"  # already in the json before the run, without torch
TORCH_VARIANTS = ["torch_fp32", bench.TORCH_INT8, "torch_int8_fbgemm"]
VARIANTS = [bench.JAX_FP32, *bench.XLA_INT8, bench.OURS, "ort_int8_u8u8", "ort_fp32", "ort_quantize_dynamic"] + (
    TORCH_VARIANTS if bench.torch_available() else []
)
QUICK = ["--quick", "--rounds", "2", "--calls", "3", "--accuracy_obs", "8"]


def stored_run(medians):
    results = [{"variant": name, "median_ms": ms, "p90_ms": 1.5 * ms} for name, ms in medians.items()]
    return {"results": results, "config": {"sizes": bench.QUICK_SIZES._asdict()}, "machine": {"cpu_model": "cpu"}}


def stand_in_python(directory, env, run):
    """An executable that, called as ``python -m benchmarks.actor_inference ... --out_dir D``, writes ``run`` as the
    run of ``env`` into ``D`` and records the arguments it got."""
    (directory / "run.json").write_text(json.dumps(run))
    script = directory / "python"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, pathlib, sys\n"
        f"run = json.loads(pathlib.Path({str(directory / 'run.json')!r}).read_text())\n"
        "run['argv'] = sys.argv[1:]\n"
        "out = pathlib.Path(sys.argv[sys.argv.index('--out_dir') + 1])\n"
        f"(out / 'actor_inference.json').write_text(json.dumps({{'environments': {{{env!r}: run}}}}))\n"
    )
    script.chmod(0o755)
    return script


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("actor_inference")
    stale = stored_run({bench.JAX_FP32: 3.0, bench.OURS: 1.0})
    (out / "actor_inference.json").write_text(json.dumps({"environments": {STALE_ENV: stale}}))
    other = stand_in_python(
        tmp_path_factory.mktemp("other_python"),
        OTHER_ENV,
        stored_run({bench.JAX_FP32: 4.0, bench.OURS: 1.0, bench.TORCH_INT8: 2.0}),
    )
    result = bench.main([*QUICK, "--out_dir", str(out), "--with_python", str(other)])
    assert (out / "actor_inference.png").stat().st_size > 0
    data = json.loads((out / "actor_inference.json").read_text())
    assert data["summary"] == json.loads(json.dumps(result["summary"]))
    return data


def test_every_variant_is_timed_and_sized(recorded):
    run = recorded["environments"][bench.environment_key()]
    assert recorded["benchmark"] == "actor_inference" and run["quick"] is True
    assert [row["variant"] for row in run["results"]] == VARIANTS
    for row in run["results"]:
        assert 0 < row["min_ms"] <= row["median_ms"] <= row["p90_ms"]
        assert len(row["round_medians_ms"]) == 2
        assert row["calls"] == (2 if row["variant"] in bench.XLA_INT8 else 6)
        assert row["weight_bytes"] > 0
    rows = {row["variant"]: row for row in run["results"]}
    # int8 codes are a quarter of the float32 weights (plus scales and biases)
    assert rows[bench.OURS]["weight_bytes"] < 0.3 * rows[bench.JAX_FP32]["weight_bytes"]
    assert rows[bench.OURS]["weight_bytes"] == rows["xla_int8_dot_general"]["weight_bytes"]
    assert rows["xla_int32_weights_matmul"]["weight_bytes"] > 0.9 * rows[bench.JAX_FP32]["weight_bytes"]


def test_other_environments_are_run_kept_and_summarized(recorded):
    env = bench.environment_key()
    assert list(recorded["environments"]) == sorted([STALE_ENV, OTHER_ENV, env])
    argv = recorded["environments"][OTHER_ENV]["argv"]  # what --with_python passed to the other interpreter
    out_dir = argv.index("--out_dir")
    assert argv[:2] == ["-m", "benchmarks.actor_inference"] and argv[out_dir + 1] != str(bench.DEFAULT_OUT_DIR)
    passed = argv[2:out_dir] + argv[out_dir + 2 :]
    assert passed == ["--no_plot", "--rounds", "2", "--calls", "3", "--accuracy_obs", "8", "--seed", "0", "--quick"]
    summary = {(row["environment"], row["variant"]): row for row in recorded["summary"]["rows"]}
    assert summary[(OTHER_ENV, bench.OURS)]["ratio_to_jax_fp32"] == 0.25
    assert summary[(OTHER_ENV, bench.OURS)]["ratio_to_torch_int8_quantize_dynamic"] == 0.5
    assert summary[(STALE_ENV, bench.OURS)]["ratio_to_torch_int8_quantize_dynamic"] == 0.5
    assert summary[(env, bench.JAX_FP32)]["ratio_to_jax_fp32"] == 1.0
    # the torch reference is the run's own where torch is installed, else the environment that has it
    torch_env = env if bench.torch_available() else OTHER_ENV
    assert summary[(env, bench.OURS)]["torch_environment"] == torch_env
    assert summary[(STALE_ENV, bench.OURS)]["torch_environment"] == OTHER_ENV
    targets = recorded["summary"]["targets"]
    assert targets[OTHER_ENV]["speedup_vs_jax_fp32"]["median"] == 4.0
    assert targets[OTHER_ENV]["ratio_vs_torch_int8"]["median"] == 0.5
    for name in ("speedup_vs_jax_fp32", "ratio_vs_torch_int8"):
        assert isinstance(targets[env][name]["met"], bool) and targets[env][name]["median"] > 0


def test_with_python_refuses_this_environment(tmp_path):
    same = stand_in_python(tmp_path, bench.environment_key(), stored_run({bench.JAX_FP32: 1.0, bench.OURS: 1.0}))
    with pytest.raises(ValueError, match="own environment"):
        bench.main([*QUICK, "--out_dir", str(tmp_path / "out"), "--with_python", str(same)])
    assert not (tmp_path / "out").exists()


def test_config_versions_and_caveats_are_recorded(recorded):
    run = recorded["environments"][bench.environment_key()]
    config = run["config"]
    assert config["sizes"] == bench.QUICK_SIZES._asdict()
    assert config["ours_gemm"] in ("u8s8", "u8u8") and isinstance(config["u8s8_saturates"], bool)
    assert {"python", "jax", "onnxruntime", "onnx"} <= set(run["versions"])
    assert ("torch" in run["versions"]) == bench.torch_available()
    assert set(run["installed_mb"]) == {"jax", "jaxlib", "onnxruntime", "onnx"} | (
        {"torch"} if bench.torch_available() else set()
    )
    assert all(mb > 0 for mb in run["installed_mb"].values())
    assert len(run["machine"]["loadavg_1_5_15_before"]) == len(run["machine"]["loadavg_1_5_15_after"]) == 3
    assert recorded["caveats"] == bench.CAVEATS
    assert "uint8" in recorded["ort_activation_quantization"]
    assert run["command"].startswith("python -m benchmarks.actor_inference --quick")


def _check_accuracy(acc, variants):
    """Every variant against its like-for-like float64 reference: float32 ones to float32 rounding, int8 ones to a
    real but small quantization error (the quick policy's activation quantization error is about 1%)."""
    for batch in ("batch_1", "batch_8"):
        for name in variants:
            row = acc[batch][name]
            assert row["like_for_like"] == bench.like_for_like(name)
            for ref in ("vs_dequantized_int8_float64", "vs_fp32_float64"):
                assert set(row[ref]) == {"rel_rms_mean", "max_abs_mean", "max_abs_action"}
            error = row[row["like_for_like"]]["rel_rms_mean"]
            if name in bench.FP32_VARIANTS:
                assert error < 1e-5, name
            else:
                assert 1e-5 < error < 0.05, name


def test_every_variant_agrees_with_its_reference(recorded):
    acc = recorded["environments"][bench.environment_key()]["accuracy"]
    assert acc["observations"] == 8
    measured = {v for v in VARIANTS if v not in bench.XLA_INT8} | {"xla_int8_dot_general"}  # the XLA ones: one maths
    for batch in ("batch_1", "batch_8"):
        assert set(acc[batch]) == measured
        assert acc[batch]["ort_int8_u8u8"] == acc[batch][bench.OURS]  # the two GEMMs agree bit for bit
    _check_accuracy(acc, measured)


@pytest.mark.torch
def test_torch_variants_are_measured_and_agree_with_their_references(recorded):
    pytest.importorskip("torch")  # the oldest tier has torch, so its variants must be in the run

    acc = recorded["environments"][bench.environment_key()]["accuracy"]
    _check_accuracy(acc, TORCH_VARIANTS)
    # torch's fbgemm on lpjax's int8 weights quantizes activations as ONNX Runtime does (per tensor, uint8)
    if not recorded["environments"][bench.environment_key()]["config"]["u8s8_saturates"]:
        for batch in ("batch_1", "batch_8"):
            assert acc[batch]["torch_int8_fbgemm"]["vs_dequantized_int8_float64"]["rel_rms_mean"] == pytest.approx(
                acc[batch][bench.OURS]["vs_dequantized_int8_float64"]["rel_rms_mean"], rel=0.05
            )


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="accuracy_obs"):
        bench.main(["--quick", "--accuracy_obs", "4"])
    with pytest.raises(ValueError, match="rounds"):
        bench.main(["--quick", "--rounds", "0"])
