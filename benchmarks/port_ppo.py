"""PureJaxRL's PPO made fp16 with lpjax (experiments/ports/purejaxrl_ppo.py): fp32, naive fp16 and lpjax fp16 side
by side on gymnax's CartPole-v1 and Acrobot-v1, each variant over the same seeds vmapped inside one jit.

    python -m benchmarks.port_ppo                      # 5e5 steps (PureJaxRL's), seeds 0-2, both tasks
    python -m benchmarks.port_ppo --quick              # a smoke run: 4096 steps, CartPole, 2 seeds

The variants are the fp32 program with a few lines replaced (:mod:`experiments.ports`); their diffs are in the
json. The metric is PureJaxRL's (``NOTES``). Needs gymnax (setup.cfg's ``gymnax`` extra).
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Sequence

import jax
import numpy as np

import lpjax
from benchmarks import common
from benchmarks.common import figure, port_finish, port_parser
from experiments import ports

RESULT_NAME = "port_ppo"
MODULE = "experiments.ports.purejaxrl_ppo"
FLOORS = {"CartPole-v1": 0.0, "Acrobot-v1": -500.0}
"""The return of an agent that never learns: CartPole's 0, Acrobot's -500 (it never swings up)."""
ROOT_SEED = 30  # PureJaxRL's jax.random.PRNGKey(30); seed k trains from fold_in(key(30), k)
CURVE_POINTS = 100

_IMPORT = ("import optax", "import optax\nimport lpjax")
_NETWORK = 'network = ActorCritic(env.action_space(env_params).n, activation=config["ACTIVATION"])'
_TX = 'tx = optax.chain(optax.clip_by_global_norm(config["MAX_GRAD_NORM"]), optax.adam(learning_rate, eps=1e-5))'
_GRAD_FN = "grad_fn = jax.value_and_grad(_loss_fn, has_aux=True)"
_GRAD_CALL = "total_loss, grads = grad_fn(train_state.params, traj_batch, advantages, targets)"
_FP16_NETWORK = (_NETWORK, f'network = lpjax.precision.set_policy({_NETWORK.removeprefix("network = ")}, "fp16")')
VARIANTS = {
    "fp32": ports.Variant("fp32", description="PureJaxRL's program as written"),
    "fp16_naive": ports.Variant(
        "fp16_naive",
        (_IMPORT, _FP16_NETWORK),
        "the network in float16 (parameters, activations, outputs), PureJaxRL's optax chain and jax.value_and_grad",
    ),
    "fp16_lpjax": ports.Variant(
        "fp16_lpjax",
        (
            _IMPORT,
            _FP16_NETWORK,
            (
                _TX,
                "tx = lpjax.optim.compound_loss_scaling(optax.chain(optax.clip_by_global_norm("
                'config["MAX_GRAD_NORM"]), lpjax.optim.hadam(learning_rate, eps=1e-5)))\n'
                "tx = optax.chain(tx, lpjax.optim.kahan_summation())",
            ),
            (_GRAD_FN, "grad_fn = lpjax.optim.scaled_value_and_grad(_loss_fn, has_aux=True)"),
            (_GRAD_CALL, _GRAD_CALL.replace("grad_fn(", "grad_fn(train_state, ")),
        ),
        "the float16 network, the clipped Adam inside compound_loss_scaling with hAdam, Kahan-summed updates, "
        "gradients of the scaled loss",
    ),
}
NOTES = [
    "final_return: mean of PureJaxRL's returned_episode_returns (the last finished episode of each of the 4 "
    "environments) over the last 10% of the updates, per seed; over_baseline: (return - floor) / (fp32's "
    "return - floor) with floor 0 on CartPole-v1 and -500 on Acrobot-v1, seed by seed and of the means.",
    "Each variant runs its seeds vmapped in one jit, as PureJaxRL does; seed k starts from "
    "fold_in(PRNGKey(30), k) in every variant. seconds_with_compilation times that one call.",
]


def run(variant: str, env_name: str, seeds: Sequence[int], total_timesteps: float) -> dict:
    """Trains ``variant`` on ``env_name`` for every seed (vmapped, one jit); returns its record."""
    module = ports.load(MODULE, VARIANTS[variant])
    config = module.get_config(env_name)
    config["TOTAL_TIMESTEPS"] = total_timesteps
    keys = jax.vmap(lambda s: jax.random.fold_in(jax.random.key(ROOT_SEED), s))(np.asarray(seeds))
    start = time.perf_counter()
    out = jax.block_until_ready(jax.jit(jax.vmap(module.make_train(config)))(keys))
    seconds = time.perf_counter() - start
    returns = np.asarray(out["metrics"]["returned_episode_returns"], np.float64).mean(axis=(2, 3))  # seeds x updates
    last = max(1, returns.shape[1] // 10)
    points = np.linspace(0, returns.shape[1] - 1, min(CURVE_POINTS, returns.shape[1])).round().astype(int)
    train_state = out["runner_state"][0]
    return {
        "final_return": [round(float(r), 2) for r in returns[:, -last:].mean(axis=1)],
        "skipped_steps": [int(s) for s in np.broadcast_to(lpjax.optim.skipped_steps(train_state), len(seeds))],
        "final_loss_scale": [float(s) for s in np.broadcast_to(lpjax.optim.loss_scale_or_one(train_state), len(seeds))],
        "all_finite": bool(all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(train_state.params))),
        "curve_updates": [int(p) for p in points],
        "curve": [[round(float(r), 2) for r in row[points]] for row in returns],
        "seconds_with_compilation": round(seconds, 1),
    }


def plot(result: dict, path: pathlib.Path) -> None:
    envs = list(result["results"])
    with figure(path, 1, len(envs), dpi=110, figsize=(6 * len(envs), 4), squeeze=False) as (_, axes):
        for ax, env in zip(axes[0], envs):
            for variant, record in result["results"][env].items():
                x = np.asarray(record["curve_updates"]) * result["config"]["steps_per_update"]
                curves = np.asarray(record["curve"])
                (line,) = ax.plot(x, curves.mean(axis=0), label=f"{variant} ({np.mean(record['final_return']):.1f})")
                ax.fill_between(x, curves.min(axis=0), curves.max(axis=0), color=line.get_color(), alpha=0.15)
            ax.set_title(f"PureJaxRL PPO, {env} ({len(result['config']['seeds'])} seeds: mean, min-max)")
            ax.set(xlabel="environment steps", ylabel="episode return")
            ax.legend(loc="lower right")


def format_table(result: dict) -> str:
    rows = [
        [env, variant, ", ".join(f"{v:.1f}" for v in row["per_seed"]), row["mean"], row["over_baseline_of_means"]]
        + [sum(result["results"][env][variant]["skipped_steps"])]
        for env, summary in result["summary"].items()
        for variant, row in summary.items()
    ]
    header = ["task", "variant", "return per seed", "mean", "over fp32", "skipped"]
    return "\n".join(common.format_table(header, rows, ["<12", "<11", "<32", ">8.1f", ">9.3f", ">8d"]))


def main(argv: Sequence[str] | None = None) -> dict:
    cli = port_parser(RESULT_NAME, __doc__, VARIANTS, quick="4096 steps on CartPole-v1, seeds 0 and 1")
    cli.add_argument("--envs", nargs="+", default=list(FLOORS), choices=list(FLOORS))
    cli.add_argument("--total_timesteps", type=float, default=5e5, help="PureJaxRL's TOTAL_TIMESTEPS")
    args = ports.parse_args(cli, argv)
    if args.quick:
        args.envs, args.seeds, args.total_timesteps = ["CartPole-v1"], [0, 1], 4096.0
    results = {env: {v: run(v, env, args.seeds, args.total_timesteps) for v in args.variants} for env in args.envs}
    config = dict(envs=args.envs, seeds=args.seeds, total_timesteps=args.total_timesteps)
    config.update(steps_per_update=4 * 128, quick=args.quick)  # NUM_ENVS * NUM_STEPS
    summary = {
        env: ports.over_baseline({v: record["final_return"] for v, record in runs.items()}, floor=FLOORS[env])
        for env, runs in results.items()
    }
    return port_finish(args, argv, MODULE, VARIANTS, config, results, summary, NOTES, format_table, plot)


if __name__ == "__main__":
    main()
