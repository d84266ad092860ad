"""benchmarks/gpu_suite.py (and benchmarks/steady_state.py): every part at toy size on this CPU, the supervisor's
kill of a part over its limit, budgets, the goals' arithmetic, the CUPTI path with the profiler stood in for, and
the GPU programs lowered for an abstract H100."""

import dataclasses
import importlib
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from benchmarks import gpu_suite, steady_state
from benchmarks.common import random_transitions
from benchmarks.kernels import describe_lowering
from lpjax import rollout
from lpjax.agents import sac
from lpjax.kernels._common import TRITON_CUSTOM_CALL, abstract_gpu
from lpjax.nn import transformer_causal_lm


def _run(tmp_path, *args):
    # Budgets scaled up so that a slow machine skips no item the tests assert on; a test's own --budget_scale wins.
    result = gpu_suite.main(["--quick", "--out_dir", str(tmp_path), "--budget_scale", "20", *args])
    recorded = json.loads((tmp_path / "gpu_suite_quick.json").read_text())
    assert (tmp_path / "gpu_suite_quick.png").stat().st_size > 0
    assert recorded["environment"]["versions"]["jax"] == jax.__version__
    assert recorded["environment"]["lpjax"]["sources_sha256"]
    assert recorded["device"]["backend"] == "cpu" and recorded["quick"] is True
    assert len(recorded["goals"]) == 3 * len(gpu_suite.GOAL_SPEEDUP) + 4
    return result, recorded


def _timed(entry):
    """A measured item: compiled, timed in steady state, kernels counted from the HLO (no CUPTI on a CPU)."""
    assert "error" not in entry, entry.get("error")
    assert entry["compile_s"] > 0 and entry["hlo_kernels"] > 0
    assert entry["wall_ms_per_step"] > 0 and entry["steps"] >= 1
    assert "gpu_ms_per_step" not in entry


@pytest.mark.parametrize("name", sorted({name for name, _ in gpu_suite.SAC_PRECISIONS.values()}))
def test_sac_rows_are_the_experiment_configs_at_the_table_sizes(name):
    config = importlib.import_module(f"experiments.configs.sac.{name}").get_config()
    expected = sac.SACConfig.from_mapping(config.agent.to_dict())
    got = gpu_suite.sac_config(name, 4096, 1024)
    assert (got.hidden_dims, got.batch_size, got.matmul_impl) == ((4096, 4096), 1024, "auto")
    sizes = dict(hidden_dims=expected.hidden_dims, batch_size=expected.batch_size, matmul_impl=expected.matmul_impl)
    assert dataclasses.replace(got, **sizes) == expected


def test_parts_and_limits_parse_names_and_letters_in_suite_order():
    assert gpu_suite.parse_parts("e,a,ceilings") == ["ceilings", "matmul", "table10"]
    assert gpu_suite.parse_parts("b,c,d") == ["optimizer", "fp8_rollout", "jitted_loop"]
    assert gpu_suite.parse_limits("a=2.5,matmul=9") == {"table10": 2.5, "matmul": 9.0}
    for bad in ("f", "", "table11"):
        with pytest.raises(ValueError):
            gpu_suite.parse_parts(bad)
    with pytest.raises(ValueError, match="name=seconds"):
        gpu_suite.parse_limits("a=fast")
    estimate = gpu_suite.estimate(gpu_suite.ORDER, 1.0)
    assert estimate["total_budget_s"] < gpu_suite.DEADLINE_S < 480  # the 8 minutes


def test_quick_table10_times_each_code_path(tmp_path):
    _, recorded = _run(tmp_path, "--in_process", "--parts", "a")
    part = recorded["parts"]["table10"]
    assert part["seconds"] > 0
    rows = part["sizes"]["w32_b32"]
    assert list(rows) == list(gpu_suite.QUICK_SAC_PRECISIONS)
    for entry in rows.values():
        _timed(entry)
        assert entry["critic_loss_finite"] and entry["critic_skipped_steps"] == 0
        assert entry["matmul_impl"] == "xla"  # "auto" on a CPU
    assert rows["fp32 highest"]["matmul_precision"] == "highest"
    assert rows["fp32 highest"]["hlo_kernels"] < rows["fp8"]["hlo_kernels"]  # fp8's quantizers add kernels


def test_quick_rollout_matmul_and_ceilings(tmp_path):
    _, recorded = _run(tmp_path, "--in_process", "--parts", "c,e,ceilings")
    parts = recorded["parts"]
    assert parts["ceilings"]["tf32"]["default_is_tf32_like"] is False  # a CPU computes float32 in float32
    assert "skipped" in parts["ceilings"]["measured"]
    variants = parts["fp8_rollout"]["variants"]
    assert list(variants) == list(gpu_suite.QUICK_ROLLOUT_VARIANTS)
    for entry in variants.values():
        _timed(entry)
        assert entry["tokens_per_s"] > 0 and entry["step_traffic_gb"] > 0
    fp8, bf16 = variants["fp8 W8A8 + fp8 KV cache"], variants["bf16"]
    assert fp8["parameters"] == bf16["parameters"] and fp8["parameter_bytes"] > bf16["parameter_bytes"]  # fp32 master
    matmul = parts["matmul"]
    for dtype in gpu_suite.MATMUL_DTYPES:
        for entry in matmul[dtype].values():
            assert entry["auto"] == "xla" and entry["fastest"] in ("xla", "pallas")
            assert entry["xla"]["ms_per_product"] > 0 and entry["pallas"]["ms_per_product"] > 0
    assert len(matmul["implied_rows"]["rows"]) == 9


def test_a_part_over_its_limit_is_killed_and_the_next_runs_in_a_new_worker(tmp_path):
    _, recorded = _run(tmp_path, "--parts", "a,d", "--part_limit", "a=1")
    killed = recorded["parts"]["table10"]
    assert killed["error"].startswith("killed after 1.0 s") and killed["worker_output_tail"]
    assert 1.0 <= killed["seconds"] < 30
    optimizer = recorded["parts"]["optimizer"]
    assert "error" not in optimizer and optimizer["hbm_source"].startswith("H100 datasheet")
    for entry in optimizer["variants"].values():
        _timed(entry)
        assert entry["params_finite"] and entry["bound_bytes"] >= 2 * entry["param_bytes"]
    chain = optimizer["variants"]["lpjax.chain float16"]
    assert chain["state_bytes"] > 2 * chain["param_bytes"]  # moments and the Kahan buffer


def test_once_the_budget_is_spent_items_are_skipped(tmp_path):
    _, recorded = _run(tmp_path, "--in_process", "--parts", "d", "--budget_scale", "0")
    variants = recorded["parts"]["optimizer"]["variants"]
    assert variants and all(v["skipped"].startswith("budget of 0 s spent") for v in variants.values())


def test_goals_compare_each_figure_with_its_target():
    def row(gpu, wall, kernels):
        return {"gpu_ms_per_step": gpu, "wall_ms_per_step": wall, "kernels_per_step": kernels}

    parts = {
        "table10": {
            "sizes": {
                "w1024_b1024": {"fp32 highest": row(1.0, 1.4, 114), "fp16 (paper methods)": row(0.95, 2.7, 168)},
                "w4096_b4096": {"fp32 highest": row(50.0, 50.5, 114), "fp16 (paper methods)": row(10.0, 10.5, 120)},
            }
        },
        "fp8_rollout": {
            "variants": {"bf16": {"tokens_per_s": 1000.0}, "fp8 W8A8 + fp8 KV cache": {"tokens_per_s": 1400.0}}
        },
        "optimizer": {"variants": {"lpjax.chain float16": {"gpu_over_bound": 1.5}}},
    }
    found = {g["goal"]: g for g in gpu_suite.goals(parts)}
    small = found["fp16 (paper methods) over fp32-highest, GPU time, w1024 b1024"]
    assert small["measured"] == pytest.approx(1 / 0.95) and small["met"] and small["paper"] == 0.96
    assert found["fp16 wall time per update no worse than fp32-highest's, w1024 b1024"]["met"] is False
    assert found["kernels per fp16 update <= 1.1x fp32's, w1024 b1024"]["measured"] == pytest.approx(168 / 114)
    big = found["fp16 (paper methods) over fp32-highest, GPU time, w4096 b4096"]
    assert big["measured"] == pytest.approx(5.0) and big["met"]
    assert found["kernels per fp16 update <= 1.1x fp32's, w4096 b4096"]["met"] is True
    assert found["fp16 (paper methods) over fp32-highest, GPU time, w1024 b4096"]["met"] is None  # unmeasured
    rollout_goal = found["FP8 rollout decode tokens/s over bf16's: fp8 W8A8 + fp8 KV cache"]
    assert rollout_goal["measured"] == pytest.approx(1.4) and rollout_goal["met"]
    assert found["optimizer (README chain, fp16) GPU time within 1.2x of its bytes-moved bound"]["met"] is False


def test_steady_state_times_an_asynchronous_loop():
    step = jax.jit(lambda x: x + 1.0)
    state, record = steady_state.steady_state(step, jnp.zeros(()), target_s=0.05, min_steps=3, max_steps=40)
    assert 3 <= record["steps"] <= 40 and record["wall_ms_per_step"] > 0
    assert float(state) == 2 + 2 + record["steps"]  # warm-up, calibration, the timed loop
    assert steady_state.calibrated_steps(2.0, 1.0, 5, 1000) == 500
    assert steady_state.calibrated_steps(2.0, 1.0, 5, 100) == 100
    assert steady_state.calibrated_steps(1e4, 1.0, 5, 100) == 5


def test_kernel_profile_reads_cupti_records(monkeypatch):
    """On a GPU the loop runs under profiler.measure (stood in for here: it calls the loop as the real one does,
    a warm-up then a run under CUPTI, and returns the kernel records of that run)."""
    from jax.experimental.mosaic.gpu import profiler

    def fake_measure(f, aggregate, iterations):
        assert isinstance(f, jax.stages.Wrapped) and not aggregate and iterations == 1

        def run():
            jax.block_until_ready(f())  # warm-up
            out = f()
            records = [("fusion_1", 0.01), ("gemm", 0.25), ("fusion_1", 0.02)] * f.steps
            return out, records

        return run

    monkeypatch.setattr(profiler, "measure", fake_measure)
    monkeypatch.setattr(steady_state, "on_gpu", lambda: True)
    step = jax.jit(lambda x: x + 1.0)
    state, record = steady_state.steady_state(step, jnp.zeros(()), min_steps=4, max_steps=4, warmup=1)
    assert float(state) == 1 + 2 * 4  # the warm-up, then the timed and the profiled loops
    assert record["steps"] == 4 and record["kernels_per_step"] == 3
    assert record["gpu_ms_per_step"] == pytest.approx(0.28)
    assert list(record["top_kernels"]) == ["gemm", "fusion_1"]
    assert record["top_kernels"]["fusion_1"] == pytest.approx({"ms_per_step": 0.03, "launches_per_step": 2})
    assert record["wall_ms_per_step"] > 0


def _lower_for_h100(fn, *args):
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
    with abstract_gpu("sm_90"):
        checks = [export.DisabledSafetyCheck.custom_call(TRITON_CUSTOM_CALL)]
        return describe_lowering(export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=checks)(*shapes))


def test_gpu_programs_lower_for_an_abstract_h100():
    """What the suite runs on an H100, lowered for one here: the fp8 SAC update and the fp8 rollout with "auto"
    use the Mosaic GPU fp8 kernel (wgmma on e4m3), the fp16 update XLA's dots only."""
    batch = random_transitions(np.random.default_rng(0), 64, gpu_suite.OBS_DIM, gpu_suite.ACTION_DIM)
    for name, kernels in (("fp8", True), ("fp16", False)):
        config = gpu_suite.sac_config(name, 256, 64)
        init = lambda key: sac.init(key, jnp.zeros((gpu_suite.OBS_DIM,)), gpu_suite.ACTION_DIM, config)
        agent = jax.eval_shape(init, jax.random.key(0))
        lowered = _lower_for_h100(lambda a, b: sac.update(a, b), agent, batch)
        assert (lowered["mosaic_gpu_calls"] > 0) == kernels and lowered["triton_calls"] == 0
        assert lowered["wgmma"] == (["wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"] if kernels else [])
    dims = dict(gpu_suite.QUICK_LM, num_layers=1, max_len=12, policy="fp8")
    model = transformer_causal_lm(dims, kv_cache_dtype="float8_e4m3fn")
    params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
    scales = jax.eval_shape(model.calibrate_kv, params, jnp.zeros((2, 4), jnp.int32))
    settings = rollout.SamplingSettings(max_new_tokens=8, eos_id=0)
    sample = lambda p, prompts, key, s: rollout.sample(model, p, prompts, key, settings, s)
    lowered = _lower_for_h100(sample, params, jnp.zeros((2, 4), jnp.int32), jax.random.key(0), scales)
    assert lowered["mosaic_gpu_calls"] > 0 and lowered["triton_calls"] == 0


def test_without_the_carried_wheels_the_jitted_loop_says_what_to_do(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mujoco_playground" else real(name)
    )
    part = gpu_suite.Part("jitted_loop", 10.0, True, {}, lambda: None)
    gpu_suite.part_jitted_loop(part)
    assert part.result["error"].startswith("not installed: mujoco_playground. Run `make gpu-wheels`")
