"""benchmarks.update_cost: the quick run measures kernels and time per update, per leaf and fused, and writes its
json and png; the fused layout never launches more kernels than per leaf; bad flags are refused."""

import json

import pytest

from benchmarks import update_cost


@pytest.mark.slow
def test_quick_run_records_kernels_and_times_per_layout(tmp_path):
    result = update_cost.main(["--quick", "--precisions", "fp32,fp16", "--out_dir", str(tmp_path)])
    assert set(result["rows"]) == {"fp32", "fp16"}
    for row in result["rows"].values():
        assert 0 < row["fused"]["kernels"] <= row["per_leaf"]["kernels"]
        assert row["fused"]["ms_per_update"] > 0 and row["per_leaf"]["ms_per_update"] > 0
    # The methods multiply the per-leaf kernels; fused, fp16 with them costs less than per leaf.
    fused = result["rows"]["fp16"]["fused"]
    assert fused["kernels"] < result["rows"]["fp16"]["per_leaf"]["kernels"]
    assert 0 < fused["kernels_scalars_not_donated"] < fused["kernels"]  # donated scalars cost copies
    goal = result["goal"]
    assert goal["fp16_fused_over_fp32_fused"] == pytest.approx(
        result["rows"]["fp16"]["fused"]["kernels"] / result["rows"]["fp32"]["fused"]["kernels"]
    )
    assert json.loads((tmp_path / "update_cost.json").read_text())["rows"] == result["rows"]
    assert (tmp_path / "update_cost.png").stat().st_size > 0


def test_bad_flags_are_refused(capsys):
    with pytest.raises(SystemExit):
        update_cost.parse_args(["--precisions", "fp16,fp7"])
    assert "unknown precisions ['fp7']" in capsys.readouterr().err
