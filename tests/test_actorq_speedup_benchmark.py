"""benchmarks/actorq_speedup.py at toy scale (in-process actors, tiny networks): both runtimes train, the json
holds curves, times to target and actor records; finished runs are not retrained."""

import json

from benchmarks import actorq_speedup as bench


def test_toy_run_records_both_runtimes(tmp_path):
    argv = [
        "--backend",
        "inprocess",
        "--width",
        "32",
        "--batch",
        "32",
        "--steps",
        "1500",
        "--eval_every",
        "500",
        "--eval_episodes",
        "1",
        "--min_replay",
        "300",
        "--runs_dir",
        str(tmp_path / "runs"),
        "--out_dir",
        str(tmp_path),
    ]
    result = bench.main(argv)
    recorded = json.loads((tmp_path / "actorq_speedup.json").read_text())
    assert (tmp_path / "actorq_speedup.png").stat().st_size > 0
    row = recorded["per_seed"]["0"]
    assert set(row["time_to_target"]) == {"fp32", "int8"}
    assert row["target_return"] == 0.95 * row["fp32_final_return"]
    assert row["broadcast_bytes"]["fp32"] > 2 * row["broadcast_bytes"]["int8"]  # 32-wide: header and biases weigh in
    for runtime in ("fp32", "int8"):
        run = recorded["runs"]["0"][runtime]
        assert len(run["returns"]) == 3 and run["wall_s"] == sorted(run["wall_s"])
        assert all(s > 0 for s in row["actor_steps_per_s"][runtime])
    first_session = result["session_seconds"]
    again = bench.main(argv)  # both runs are done: nothing retrains
    assert again["session_seconds"] < first_session and again["per_seed"] == result["per_seed"]
