"""Smoke test of benchmarks/optimizer_overhead.py: a --quick run into a temporary directory."""

import json

import jax
import numpy as np

from benchmarks import optimizer_overhead as bench


def _expected_state_bytes(variant: str, param_bytes: int) -> int:
    """Optimizer-state sizes worked out by hand from the state definitions (scalars are 4-byte int32/float32)."""
    return {
        "optax.adam": 2 * param_bytes + 4,  # count, mu, nu
        "lpjax.hadam": 2 * param_bytes + 13,  # count, mu, nu_sqrt, scale, moment_scale, apply (bool)
        # scale, inner_scale, good_steps, skipped_steps + hadam's state + Kahan compensation (params' dtype).
        "lpjax.chain": 3 * param_bytes + 29,
    }[variant]


def test_quick_run_writes_complete_results(tmp_path):
    result = bench.main(["--quick", "--out-dir", str(tmp_path)])

    recorded = json.loads((tmp_path / "optimizer_overhead.json").read_text())
    assert (tmp_path / "optimizer_overhead.png").stat().st_size > 0
    assert recorded["results"] == json.loads(json.dumps(result["results"]))
    keys = "jax_version machine config param_count param_bytes target_ratio target_met ratios_to_adam results"
    assert set(keys.split()) <= set(recorded), set(keys.split()) - set(recorded)
    assert recorded["jax_version"] == jax.__version__
    assert recorded["machine"]["cpu_count"] >= 1 and recorded["machine"]["platform"]
    assert recorded["target_ratio"] == 1.5
    assert recorded["config"]["quick"] is True

    sizes = bench.QUICK_SIZES
    params = bench.mlp_params(jax.random.PRNGKey(0), sizes, "float32")
    assert recorded["param_count"] == sum(x.size for x in jax.tree.leaves(params))

    variants = {v.name: v for v in bench.VARIANTS}
    rows = recorded["results"]
    assert {(r["variant"], r["dtype"]) for r in rows} == {(v, d) for v in variants for d in bench.DTYPES}
    for row in rows:
        assert row["median_ms"] > 0 and row["min_ms"] > 0 and row["min_ms"] <= row["median_ms"] <= row["max_ms"]
        assert len(row["repeats_ms"]) == recorded["config"]["repeats"]
        assert row["ratio_to_adam_median"] > 0
        assert row["params_finite"]
        # Bytes reported == bytes of a freshly initialised state == the hand count.
        params = bench.mlp_params(jax.random.PRNGKey(0), sizes, row["dtype"])
        state = variants[row["variant"]].make().init(params)
        actual = sum(np.asarray(leaf).nbytes for leaf in jax.tree.leaves(state))
        assert row["opt_state_bytes"] == actual
        assert row["param_bytes"] == recorded["param_bytes"][row["dtype"]]
        assert row["param_bytes"] == sum(np.asarray(x).nbytes for x in jax.tree.leaves(params))
        assert row["opt_state_bytes"] == _expected_state_bytes(row["variant"], row["param_bytes"])
        if row["variant"] == bench.FULL_CHAIN:
            assert row["skipped_steps"] == 0  # timed the finite-step path, as intended
    for dtype in bench.DTYPES:
        assert recorded["ratios_to_adam"][dtype][bench.BASELINE]["median"] == 1.0
        full = recorded["ratios_to_adam"][dtype][bench.FULL_CHAIN]["median"]
        assert recorded["target_met"][dtype] == (full <= 1.5)


def test_traffic_accounting_reads_the_compiled_step():
    # On the quick MLP, in passes over parameter-shaped trees: Adam reads and writes each of its three trees at
    # least once, and the full lpjax chain moves at least as many bytes as hAdam plus a Kahan buffer.
    result = bench.run_benchmark(bench.QUICK_SIZES, 1, 1, 1, bench.VARIANTS, log=lambda _: None)
    rows = {(r["variant"], r["dtype"]): r for r in result["results"]}
    for dtype in bench.DTYPES:
        adam, chain = rows[(bench.BASELINE, dtype)]["traffic"], rows[(bench.FULL_CHAIN, dtype)]["traffic"]
        assert adam["written_trees"] >= 3.0 and adam["read_trees"] >= 5.0
        assert chain["traffic_trees"] >= adam["traffic_trees"] + 2.0
        assert {"parameters", "first moment", "second moment"} <= set(adam["by_output"])
        assert {"parameters", "first moment", "second moment", "Kahan compensation"} <= set(chain["by_output"])
