"""benchmarks/kernels.py: the roofline model's arithmetic and a run that writes complete results; on a GPU
(``--gpu``) its refusal without one, and a run whose GPU timings are stood in for (the timing itself needs CUPTI on a
GPU), which must assemble the json, the table and the plot; the recorded H100 results."""

import json

import jax
import pytest

from benchmarks import kernels as bench


def test_model_counts_flops_bytes_and_bounds():
    entry = bench.model_entry("fp16_matmul[bf16]", (1024, 1024, 1024))
    assert entry["flops"] == 2 * 1024**3
    # bf16 x and w read once, bf16 output written once, fp32 bias
    assert entry["bytes"]["compulsory"] == 2 * 1024 * 1024 * 3 + 4 * 1024
    # 64x64 tiles: x is re-read once per N block (16), w once per M block (16)
    assert entry["bytes"]["tiled"] == 2 * 1024 * 1024 * 16 * 2 + 2 * 1024 * 1024 + 4 * 1024
    h100 = entry["roofline"]["H100"]["compulsory"]
    assert h100["bound"] == "compute"
    assert h100["time_lower_bound_us"] == pytest.approx(entry["flops"] / 990e12 * 1e6)
    decode = bench.model_entry("fp8_blockwise_matmul", (16, 4096, 4096))["roofline"]["H200"]["compulsory"]
    assert decode["bound"] == "memory" and decode["attainable_tflops"] < 1580.0


def test_fp8_moves_fewer_bytes_than_bf16():
    fp8 = bench.model_entry("fp8_blockwise_matmul", (4096, 4096, 4096))["bytes"]["compulsory"]
    bf16 = bench.model_entry("fp16_matmul[bf16]", (4096, 4096, 4096))["bytes"]["compulsory"]
    assert 0.5 < fp8 / bf16 < 0.7  # operands halve, the bf16 output does not


def test_run_records_lowering_triples_and_points_to_the_gpu_timings(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "SHAPES", {"small": (64, 256, 128)})
    result = bench.main(["--out_dir", str(tmp_path), "--no_cpu_latency"])
    recorded = json.loads((tmp_path / "kernels.json").read_text())
    assert (tmp_path / "kernels.png").stat().st_size > 0
    assert recorded["gpu_timings"] == bench.GPU_TIMINGS
    triples = {(r["kernel"], r["backend"], r["arch"]): r for r in recorded["lowering_triples"]}
    assert len(triples) == len(bench.KERNELS) * len(bench.LOWERING_TARGETS)
    wgmma_types = {
        "fp16_matmul[bf16]": ".f32.bf16.bf16",
        "fp8_blockwise_matmul": ".f32.e4m3.e4m3",
        "int8_matmul": ".s32.s8.s8",
    }
    for name in bench.KERNELS:
        mosaic = triples[name, "mosaic_gpu", "sm_90a"]
        assert mosaic["lowers"] and mosaic["shapes"] == ["small"], mosaic
        assert [i.endswith(wgmma_types[name]) for i in mosaic["wgmma"]] == [True]
        assert recorded["lowers_for_cuda"][name]["small"]["mosaic_gpu@sm_90"]["mosaic_gpu_calls"] == 1
        for arch in ("sm_90", "sm_89", "sm_80"):
            triton = triples[name, "triton", arch]
            assert triton["lowers"] and triton["error"] is None and triton["wgmma"] == [], triton
            assert recorded["lowers_for_cuda"][name]["small"][f"triton@{arch}"]["triton_calls"] == 1
    assert result["model"]["int8_matmul"]["small"]["flops"] == 2 * 64 * 256 * 128


def test_triples_record_the_first_error_of_a_target_that_fails():
    ok = {"ok": True, "wgmma": ["w"]}
    failed = {"ok": False, "error": "ValueError: boom"}
    lowered = {
        "k": {
            "a": {f"{b}@{a}": ok for b, a in bench.LOWERING_TARGETS},
            "b": {f"{b}@{a}": ok for b, a in bench.LOWERING_TARGETS} | {"triton@sm_80": failed},
        }
    }
    rows = {(r["backend"], r["arch"]): r for r in bench.lowering_triples(lowered)}
    assert rows["triton", "sm_80"] == {
        "kernel": "k",
        "backend": "triton",
        "arch": "sm_80",
        "device_kind": bench.GPU_TARGETS["sm_80"][0],
        "lowers": False,
        "shapes": ["a"],
        "wgmma": ["w"],
        "error": "ValueError: boom",
    }
    assert rows["mosaic_gpu", "sm_90a"]["lowers"] and rows["mosaic_gpu", "sm_90a"]["shapes"] == ["a", "b"]


def test_sets_hold_twice_the_l2_cache_within_bounds():
    assert bench.num_sets(4 * 2**20) == bench.MAX_SETS  # SAC: 4 MiB per set, capped
    assert bench.num_sets(64 * 2**20) == 2  # LLM prefill: 2 x 64 MiB > 2 x 50 MiB
    assert bench.num_sets(10 * 2**20) == 10
    assert bench.num_sets(2**40) == 2


def test_efficiency_is_the_roofline_bound_over_the_time():
    compute_bound = bench.efficiency(flops=2e12, nbytes=1e6, seconds=4e-3, tflops=1000.0, tb_s=2.0)
    assert compute_bound["bound_us"] == pytest.approx(2000.0)
    assert compute_bound["fraction_of_roofline"] == pytest.approx(0.5)
    memory_bound = bench.efficiency(flops=1e9, nbytes=4e9, seconds=4e-3, tflops=1000.0, tb_s=2.0)
    assert memory_bound["bound_us"] == pytest.approx(2000.0)


def test_refuses_without_a_gpu(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--gpu"])
    assert "needs a CUDA GPU; JAX's default backend is 'cpu'" in capsys.readouterr().err


def test_run_assembles_timings_rooflines_and_plot(tmp_path, monkeypatch):
    calls = []

    def fake_measure(fn, args, iterations):
        calls.append(fn)
        if len(calls) == 5:
            return {"error": "ValueError: does not compile"}
        return {"gpu_ms": 2.0, "wall_ms": 2.5, "kernels": {"0:matmul": 1.5, "1:quantize": 0.5}}

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(bench, "measure", fake_measure)
    monkeypatch.setattr(bench, "gpu_backends", lambda: ["mosaic_gpu", "triton"])
    monkeypatch.setattr(bench, "SHAPES", {"llm_prefill": (64, 256, 128)})
    monkeypatch.setattr(bench, "SAC_SETTINGS", {k: bench.SAC_SETTINGS[k] for k in ("fp32", "bf16")})
    result = bench.main(["--gpu", "--out_dir", str(tmp_path), "--iterations", "3"])
    recorded = json.loads((tmp_path / "kernels_gpu.json").read_text())
    assert (tmp_path / "kernels_gpu.png").stat().st_size > 0
    assert recorded["measured_ceilings"]["hbm_tb_s"] == pytest.approx(2 * 2**30 / 2e-3 / 1e12)
    fp8 = recorded["kernels"]["fp8_blockwise_matmul"]["llm_prefill"]
    assert set(fp8) == {"sets_per_call", "kernel[mosaic_gpu]", "kernel[triton]", "xla_dot[bf16]", "xla_dot[fp8]"}
    sets = fp8["sets_per_call"]
    assert sets == bench.num_sets(2 * (64 * 256 + 256 * 128))
    timing = fp8["kernel[mosaic_gpu]"]
    assert timing["ms_per_product"] == pytest.approx(2.0 / sets)
    assert timing["tflops"] == pytest.approx(2 * 64 * 256 * 128 / (2e-3 / sets) / 1e12)
    # The fp8 kernel's roof is the fp8 rate; XLA's bf16 dot beside it is held to the bf16 roof and bytes.
    measured = recorded["measured_ceilings"]
    assert timing["roofline_measured"]["bound_us"] >= 2 * 64 * 256 * 128 / (measured["fp8_tflops"] * 1e12) * 1e6
    bf16_bound = fp8["xla_dot[bf16]"]["roofline_measured"]["bound_us"]
    assert bf16_bound > timing["roofline_measured"]["bound_us"]
    failed = [t for shapes in recorded["kernels"].values() for e in shapes.values() for t in e.values()]
    assert {"error": "ValueError: does not compile"} in failed
    assert len(recorded["block_sweep_llm_prefill"]["int8_matmul"]) == 2 * len(bench.BLOCK_SWEEP["int8_matmul"])
    assert recorded["sac_update"]["bf16"]["speedup_vs_fp32"] == pytest.approx(1.0)
    assert result["backends"] == ["mosaic_gpu", "triton"]


def test_recorded_h100_results_are_complete_and_under_the_datasheet_roof():
    """The recorded run (benchmarks/results/kernels_gpu.json) covers every kernel, shape, backend and SAC
    setting, and no timing beats the datasheet roofline: a time under that bound would be a timing error."""
    recorded = json.loads((bench.Path(bench.__file__).parent / "results" / "kernels_gpu.json").read_text())
    assert recorded["device"].startswith("NVIDIA H100")
    assert recorded["backends"] == ["mosaic_gpu", "triton"]
    assert set(recorded["kernels"]) == set(bench.KERNELS)
    for name, shapes in recorded["kernels"].items():
        assert set(shapes) == set(bench.SHAPES)
        for entry in shapes.values():
            timings = {label: t for label, t in entry.items() if label != "sets_per_call"}
            assert {"kernel[mosaic_gpu]", "kernel[triton]"} | {
                f"xla_dot[{k}]" for k in bench.XLA_BASELINES[name]
            } == set(timings)
            for t in timings.values():
                assert 0 < t["roofline_h100_datasheet"]["fraction_of_roofline"] <= 1.0
    for name, sweep in recorded["block_sweep_llm_prefill"].items():
        assert len(sweep) == 2 * len(bench.BLOCK_SWEEP[name])
    assert set(recorded["sac_update"]) == set(bench.SAC_SETTINGS)
    assert recorded["sac_update"]["fp32"]["speedup_vs_fp32"] == 1.0
