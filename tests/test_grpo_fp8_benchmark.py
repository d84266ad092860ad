"""benchmarks/grpo_fp8.py: the byte model, and a toy run that records every config's curves."""

import json

from benchmarks import grpo_fp8 as bench


def test_byte_model():
    kv = bench.kv_cache_bytes(layers=2, heads=4, head_dim=16, tokens=10)
    assert kv["fp32"] == 4 * 2 * 2 * 10 * 4 * 16 and kv["bf16"] == kv["fp32"] // 2
    assert kv["fp8"] == kv["fp32"] // 4 + 2 * 2 * 4 * 4  # codes + one float32 scale per layer, head, K/V
    w = bench.weight_bytes([(256, 200)])
    assert w["fp8"] == 256 * 200 + 4 * 2 * 2


def test_toy_run_records_curves_and_bytes(tmp_path):
    result = bench.main(
        ["--iterations", "10", "--seeds", "0", "--runs_dir", str(tmp_path / "runs"), "--out_dir", str(tmp_path)]
    )
    recorded = json.loads((tmp_path / "grpo_fp8.json").read_text())
    assert (tmp_path / "grpo_fp8.png").stat().st_size > 0
    assert set(recorded["runs"]) == set(bench.CONFIGS) and recorded["ratio_to_fp32"]["fp32"] == 1.0
    assert recorded["fp8_kv_smaller_than_bf16"] > 1.99
    assert len(result["runs"]["fp8_tis"][0]["reward"]) == 1  # logged every 10 iterations
