"""benchmarks/kernels.py: the roofline model's arithmetic, and a run that writes complete results."""

import json

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
