"""benchmarks/jax_versions.py: the per-round ratios, the table, and the recorded json's consistency (no timing is
asserted)."""

import json
import pathlib

import numpy as np
import pytest

from benchmarks import jax_versions

RESULTS = pathlib.Path(jax_versions.__file__).parent / "results" / "jax_versions.json"


def _sample(jax_version, scale):
    return {
        "jax": jax_version,
        "python": "3.x",
        "xla_flags": "",
        **{w: (1.0, scale * (i + 1)) for i, w in enumerate(jax_versions.WORKLOADS)},
    }


def test_summary_takes_ratios_round_by_round_and_marks_unsupported_flags():
    rounds = {
        "oldest/default": [_sample("0.10.2", 1.0), _sample("0.10.2", 3.0)],
        "newest/default": [_sample("0.12", 2.0), _sample("0.12", 3.0)],
        "newest/xnnpack_off": [],
    }
    summary = jax_versions.summarize(rounds)
    assert summary["newest/xnnpack_off"] == {"supported": False}
    newest = summary["newest/default"]
    # Round ratios are 2.0 and 1.0: their median is 1.5, not the ratio of the medians (2.5 / 2.0).
    assert newest["sac_act_vs_baseline"] == pytest.approx(1.5)
    assert newest["mlp_3x2048_ms"] == pytest.approx(np.median([2.0 * 4, 3.0 * 4]))
    assert summary["oldest/default"]["sac_update_fp32_vs_baseline"] == 1.0
    table = jax_versions.table(summary)
    assert "unsupported flag" in table and "1.50x" in table


def test_unknown_variants_are_refused():
    with pytest.raises(SystemExit, match="unknown variants"):
        jax_versions.main(["--variants=default,turbo"])


def test_recorded_results_are_consistent():
    result = json.loads(RESULTS.read_text())
    assert result["versions"]["oldest"].startswith("0.10") and result["versions"]["newest"].startswith("0.12")
    summary = result["summary"]
    baseline = summary["/".join(jax_versions.BASELINE)]
    for name, row in summary.items():
        if not row["supported"]:
            continue
        samples = result["samples"][name]
        assert len(samples) == result["rounds"]
        for workload in jax_versions.WORKLOADS:
            assert row[f"{workload}_ms"] == pytest.approx(np.median([s[workload][1] for s in samples]))
            assert row[f"{workload}_ms"] > 0
    assert all(baseline[f"{w}_vs_baseline"] == 1.0 for w in jax_versions.WORKLOADS)
