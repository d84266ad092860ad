"""CPU latency of lpjax's hot paths on the oldest and the newest supported jax (the Makefile's ``.venv-oldest`` and
``.venv``), side by side on XLA:CPU: one SAC update in fp32 and in fp16 with the paper's methods (256x256 networks,
batch 256), ``sac.act`` on one observation, and a float32 3x2048 MLP at batch 1 (ActorQ's policy size, a
memory-bound chain of matrix-vector products).

Each measurement is a worker process (``--worker``) with one environment's Python and one set of ``XLA_FLAGS``
(:data:`VARIANTS`: the defaults, and the XLA:CPU switches that differ between the versions): the first call's
seconds and the median of ``--reps`` calls of each workload. Rounds interleave every (environment, variant) pair;
reported are the medians over rounds and each pair's ratio to jax 0.10.2 with default flags, round by round. A flag
a version does not know (XLA aborts on it) is recorded as unsupported.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import time
from collections.abc import Sequence

import numpy as np

from benchmarks.common import REPO, command_line, figure, finish, format_table, parser, random_transitions
from benchmarks.timing import interleaved

ENVIRONMENTS = {"oldest": ".venv-oldest", "newest": ".venv"}
VARIANTS = {
    "default": "",
    "xnnpack_off": "--xla_cpu_use_xnnpack=false",
    "xnnpack_on": "--xla_cpu_use_xnnpack=true",
    "eigen_single_thread": "--xla_cpu_multi_thread_eigen=false",
}
WORKLOADS = ("sac_update_fp32", "sac_update_fp16", "sac_act", "mlp_3x2048")
BASELINE = ("oldest", "default")
NOTES = [
    "XLA:CPU on this machine's 2 cores; fp16 is emulated on a CPU, so the fp16 update says nothing of a GPU's.",
    "Each figure is the median over rounds of one worker's median; workers in one round run back to back, so a "
    "burst of load hits neighbouring rows. Differences within about 30% between rows are within the spread of "
    "the rounds (see samples).",
    "The variants test the XLA:CPU switches whose defaults differ between the versions (XNNPACK dots, Eigen's "
    "thread pool); 'xnnpack_on' / 'xnnpack_off' force the switch either way on both versions.",
]


def _timed(fn, reps: int) -> tuple[float, float]:
    """``(first_call_s, median_ms)``: the first call (compiling), then the median of ``reps`` after 2 warm-ups."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    return first, 1e3 * interleaved({"call": fn}, reps, warmup=2, per_call=True)["call"]["median_s"]


def worker(reps: int) -> dict:
    """Times every workload in this process (its jax, its ``XLA_FLAGS``)."""
    import jax
    import jax.numpy as jnp

    from lpjax.agents import sac
    from lpjax.methods import PrecisionMethods

    obs_dim, action_dim, batch_size = 5, 1, 256
    rng = np.random.default_rng(0)
    batch = jax.tree.map(jnp.asarray, random_transitions(rng, batch_size, obs_dim, action_dim))
    result = {"jax": jax.__version__, "python": platform.python_version(), "xla_flags": os.environ.get("XLA_FLAGS", "")}
    for precision, methods in (("fp32", PrecisionMethods()), ("fp16", PrecisionMethods.paper())):
        config = sac.SACConfig(policy=precision, hidden_dims=(256, 256), batch_size=batch_size, methods=methods)
        holder = [sac.init(jax.random.key(0), jnp.zeros(obs_dim), action_dim, config)]

        def step():
            holder[0], metrics = sac.update(holder[0], batch)
            jax.block_until_ready(metrics)

        result[f"sac_update_{precision}"] = _timed(step, reps)
        if precision == "fp32":
            obs, key = jnp.zeros((1, obs_dim)), jax.random.key(1)
            result["sac_act"] = _timed(lambda: sac.act(holder[0], obs, key).block_until_ready(), reps)

    sizes = [(64, 2048), (2048, 2048), (2048, 2048), (2048, 6)]
    weights = [jnp.asarray(rng.standard_normal(size, np.float32) * 0.02) for size in sizes]

    @jax.jit
    def mlp(weights, x):
        for w in weights[:-1]:
            x = jax.nn.relu(x @ w)
        return jnp.tanh(x @ weights[-1])

    x = jnp.ones((1, 64), jnp.float32)
    result["mlp_3x2048"] = _timed(lambda: mlp(weights, x).block_until_ready(), reps)
    return result


def run_worker(python: pathlib.Path, flags: str, reps: int) -> list[dict]:
    """One worker process's sample, in a list; none when XLA rejects the flags (or the worker fails: see stderr)."""
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    command = [str(python), "-m", "benchmarks.jax_versions", "--worker", f"--reps={reps}"]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"  {python} XLA_FLAGS={flags!r}: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
        return []
    return [json.loads(proc.stdout.strip().splitlines()[-1])]


def summarize(rounds: dict) -> dict:
    """Per (environment, variant): median over rounds of each workload's median ms, first-call seconds, and the
    ratio to the baseline (jax 0.10.2, default flags) in the same round."""
    baseline = rounds.get("/".join(BASELINE), [])
    summary = {}
    for name, samples in rounds.items():
        summary[name] = row = {"supported": bool(samples)}
        if not samples:
            continue
        row |= {"jax": samples[0]["jax"], "python": samples[0]["python"]}
        for w in WORKLOADS:
            row[f"{w}_ms"] = float(np.median([s[w][1] for s in samples]))
            row[f"{w}_first_call_s"] = float(np.median([s[w][0] for s in samples]))
            if baseline:
                row[f"{w}_vs_baseline"] = float(np.median([s[w][1] / b[w][1] for s, b in zip(samples, baseline)]))
    return summary


def table(summary: dict) -> str:
    rows = [
        [name, *(f"{row[f'{w}_ms']:8.3f} ms ({row.get(f'{w}_vs_baseline', float('nan')):4.2f}x)" for w in WORKLOADS)]
        if row["supported"]
        else [name, "unsupported flag"]
        for name, row in summary.items()
    ]
    return "\n".join(format_table(["environment/variant", *WORKLOADS], rows, ["<32"] + [">22"] * len(WORKLOADS)))


def plot(result: dict, path: pathlib.Path) -> None:
    rows = {k: v for k, v in result["summary"].items() if v["supported"]}
    colors = ["tab:blue" if n.startswith("oldest") else "tab:orange" for n in rows]
    with figure(path, 1, len(WORKLOADS), figsize=(4 * len(WORKLOADS), 4), dpi=100) as (fig, axes):
        for ax, workload in zip(axes, WORKLOADS):
            ax.barh(list(rows), [row[f"{workload}_ms"] for row in rows.values()], color=colors)
            ax.set_title(f"{workload} (ms, median)")
            ax.invert_yaxis()
            if ax is not axes[0]:
                ax.set_yticklabels([])
        fig.suptitle(f"jax {result['versions']['oldest']} (blue) vs {result['versions']['newest']} (orange), XLA:CPU")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    cli = parser("jax_versions", __doc__, out=("--out",))
    cli.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every (environment, variant)")
    cli.add_argument("--reps", type=int, default=100, help="timed calls per workload per worker")
    cli.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of VARIANTS")
    cli.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return cli.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict | None:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.reps)))
        return None
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {sorted(VARIANTS)}")
    pythons = {env: REPO / venv / "bin" / "python" for env, venv in ENVIRONMENTS.items()}
    missing = [str(p) for p in pythons.values() if not p.is_file()]
    if missing:
        raise SystemExit(f"missing environments {missing}: build them with `make venv venv-oldest`")
    rounds: dict[str, list] = {f"{env}/{variant}": [] for env in pythons for variant in variants}
    load = [os.getloadavg()[0]]
    for round_ in range(args.rounds):
        for name in rounds:
            env, variant = name.split("/")
            print(f"round {round_ + 1}/{args.rounds}: {name}", flush=True)
            rounds[name] += run_worker(pythons[env], VARIANTS[variant], args.reps)
        load.append(os.getloadavg()[0])
    summary = summarize(rounds)
    versions = {
        env: next((r["jax"] for n, r in summary.items() if n.startswith(env) and r["supported"]), None)
        for env in pythons
    }
    result = {
        "benchmark": "jax_versions",
        "command": command_line("benchmarks.jax_versions", argv),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average_1min_per_round": load},
        "versions": versions,
        "variants": {v: VARIANTS[v] for v in variants},
        "reps": args.reps,
        "rounds": args.rounds,
        "notes": NOTES,
        "summary": summary,
        "samples": rounds,
    }
    return finish(args, result, table(summary), plot)


if __name__ == "__main__":
    main()
