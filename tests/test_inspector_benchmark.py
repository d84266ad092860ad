"""Smoke test of benchmarks/inspector.py at a tiny scale (32x32 SAC, batch 32, no checkpoint): the json's
structure, the paper's findings in naive fp16 and not with the methods, and the identical lowering."""

import json

from benchmarks import inspector
from experiments.inspect import PAPER_FINDINGS


def test_inspector_benchmark_records_findings_times_and_zero_cost(tmp_path):
    argv = "--width 32 --batch 32 --env dmc:cartpole-swingup --checkpoint none --rounds 1 --seconds 0.2 --name smoke"
    result = inspector.main([*argv.split(), "--out_dir", str(tmp_path)])
    assert json.loads((tmp_path / "smoke.json").read_text()) == json.loads(json.dumps(result))
    assert (tmp_path / "smoke.png").stat().st_size > 0
    assert set(result["results"]) == {"fp16_naive/fresh", "fp16/fresh"}
    naive, fixed = result["results"]["fp16_naive/fresh"], result["results"]["fp16/fresh"]
    assert set(naive["paper_findings"]) == set(PAPER_FINDINGS)
    assert naive["paper_findings"]["Adam's eps rounds to 0"] and naive["paper_findings"]["Adam's g^2 underflows"]
    assert not any(fixed["paper_findings"].values())
    for entry in (naive, fixed):
        for phase in ("critic", "actor"):
            stats = entry["phases"][phase]
            assert stats["equations"] > 100 and stats["seconds"] > 0 and stats["warm_seconds"] > 0
    assert result["zero_cost_when_off"]["lowering_identical"] is True
    assert set(result["gradient_exponents"]) == {"fp16_naive", "fp16"}
    assert any("Dense" in layer for layer in result["gradient_exponents"]["fp16"])
