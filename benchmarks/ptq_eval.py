"""Post-training quantization of a trained SAC policy, in the style of QuaRL's Table 1 (ActorQ Table 2).

The latest checkpoint of a SAC run directory (default: the reproduction's fp32 cartpole-swingup seed 0 run) is
restored and its actor's weights quantized and dequantized (:func:`lpjax.quant.quantize_params`, as the papers
simulate the error) at each precision: ``fp32`` (the reference), ``fp16``, ``fp16_act`` (also the actor run in
float16) and, for each ``n`` of ``--bits``, ``int<n>`` and ``int<n>_per_channel``: the papers' uniform PTQ ``delta =
(|min(W, 0)| + |max(W, 0)|) / 2^n``, ``D = delta * round(W / delta)`` of every kernel. Per precision: the return of
the deterministic policy over ``--episodes`` seeded episodes; over the states the fp32 policy visits, the action
distance ``||tanh(mu_q(s)) - tanh(mu_32(s))||`` and ``KL(pi_fp32 || pi_q)`` of the pre-tanh diagonal Gaussians
(heavy-tailed where tanh saturates, so the median is the robust summary); ``||W - D(Q(W))||_F / ||W||_F``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import time
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import REPRODUCTION_RUNS, command_line, figure, finish, format_table, parser
from experiments import sac_loop
from experiments.sac_loop import load_run
from lpjax import quant
from lpjax.agents import sac

DEFAULT_RUN_DIR = REPRODUCTION_RUNS / "fp32" / "cartpole-swingup" / "seed0"
DEFAULT_BITS = (8, 6, 5, 4, 3, 2)
RESULT_NAME = "ptq_eval"


class RecordingEnv:
    """Wraps an environment and records every observation the policy acts on (reset and non-final steps)."""

    def __init__(self, env):
        self.env, self.observations = env, []

    def reset(self, **kwargs):
        obs = self.env.reset(**kwargs)
        self.observations.append(np.asarray(obs))
        return obs

    def step(self, action):
        obs, reward, terminated, truncated = self.env.step(action)
        if not (terminated or truncated):
            self.observations.append(np.asarray(obs))
        return obs, reward, terminated, truncated


@jax.jit
def gaussian(agent: sac.SACState, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(mean, log_std)`` of the pre-tanh Gaussian of ``agent``'s policy at ``obs``, in float32."""
    actor, critic = sac.networks(agent.config, agent.action_dim)
    features = critic.apply(agent.critic.params, obs, method=sac.SACCritic.encode)
    mean, log_std = actor.apply(agent.actor.params, features)
    return mean.astype(jnp.float32), log_std.astype(jnp.float32)


def gaussian_kl(mean_p, log_std_p, mean_q, log_std_q) -> np.ndarray:
    """``KL(N(mean_p, std_p^2) || N(mean_q, std_q^2))`` of diagonal Gaussians, summed over the last axis (float64)."""
    mean_p, log_std_p, mean_q, log_std_q = (np.asarray(a, np.float64) for a in (mean_p, log_std_p, mean_q, log_std_q))
    ratio = (np.exp(2 * log_std_p) + np.square(mean_p - mean_q)) / (2 * np.exp(2 * log_std_q))
    return np.sum(log_std_q - log_std_p + ratio - 0.5, axis=-1)


def _kernels(params: Any) -> list[np.ndarray]:
    return [np.asarray(x, np.float64) for x in jax.tree.leaves(params) if np.ndim(x) >= 2]


def run_benchmark(run_dir: pathlib.Path, episodes: int, bits: Sequence[int]) -> dict:
    config, loop, step = load_run(run_dir)
    _, eval_env = sac_loop.make_envs(config)
    actor_params, recorder = loop.agent.actor.params, RecordingEnv(eval_env)
    norm = sum(np.sum(np.square(w)) for w in _kernels(actor_params))
    # (row name, quant spec, precision policy override), fp32 first: the reference
    precisions = [("fp32", "fp32", None), ("fp16", "fp16", None), ("fp16_act", "fp16", "mixed_fp16")]
    precisions += [(f"int{n}{s}", f"int{n}{s}", None) for n in bits for s in ("", "_per_channel")]
    rows = []
    for name, spec, policy in precisions:
        started = time.perf_counter()
        params = quant.dequantize_params(quant.quantize_params(actor_params, spec))
        agent = loop.agent.replace(actor=loop.agent.actor._replace(params=params))
        if policy is not None:
            agent = agent.replace(config=dataclasses.replace(agent.config, policy=policy))
        evaluation = sac_loop.evaluate(loop._replace(agent=agent), eval_env if rows else recorder, episodes)
        if not rows:  # fp32: its evaluation episodes give the fixed set of states
            states = jnp.asarray(np.stack(recorder.observations))
        mean, log_std = gaussian(agent, states)
        actions = np.asarray(sac.act(agent, states, loop.key, deterministic=True), np.float64)
        if not rows:
            reference_gaussian, reference_actions = (mean, log_std), actions
        distance = np.linalg.norm(actions - reference_actions, axis=-1)
        kl = gaussian_kl(*reference_gaussian, mean, log_std)
        error = sum(np.sum(np.square(w - v)) for w, v in zip(_kernels(actor_params), _kernels(params)))
        parsed = quant.parse_spec(spec)
        row = {"name": name, "spec": parsed.name} | {k: getattr(parsed, k) for k in ("format", "bits", "per_channel")}
        row |= {
            "activations": "fp16" if policy else "fp32",
            "return_mean": evaluation["return"],
            "return_std": evaluation["return_std"],
            "action_l2_mean": float(np.mean(distance)),
            "action_l2_max": float(np.max(distance)),
            "kl_mean": float(np.mean(kl)),
            "kl_median": float(np.median(kl)),
            "kl_max": float(np.max(kl)),
            "weight_rel_error": float(np.sqrt(error / norm)),
            "seconds": time.perf_counter() - started,
        }
        rows.append(row)
        print(
            f"{name:>18}: return {row['return_mean']:8.1f} ± {row['return_std']:6.1f}   action L2 "
            f"{row['action_l2_mean']:.2e}   KL {row['kl_mean']:.2e}   ({row['seconds']:.0f} s)",
            flush=True,
        )
    fp32_return = rows[0]["return_mean"]
    for row in rows:
        row["return_ratio"] = row["return_mean"] / fp32_return if fp32_return else None
    return {
        "benchmark": RESULT_NAME,
        "jax_version": jax.__version__,
        "run_dir": str(pathlib.Path(run_dir).resolve()),
        "checkpoint_step": int(step),
        "env": config.env,
        "actor": {
            "hidden_dims": list(loop.agent.config.hidden_dims),
            "action_dim": int(loop.agent.action_dim),
            "policy": loop.agent.config.policy,
            "parameters": int(sum(np.size(x) for x in jax.tree.leaves(actor_params))),
        },
        "episodes": int(episodes),
        "states": int(states.shape[0]),
        "bits": [int(n) for n in bits],
        "quantizer": "delta = (|min(W,0)| + |max(W,0)|) / 2^n, Q(W) = round(W / delta), D = delta * Q; kernels "
        "only (biases fp32), per tensor or per output channel; activations fp32 (fp16 in fp16_act)",
        "kl": "KL(pi_fp32 || pi_q) of the pre-tanh Gaussians, summed over action dims, mean/median/max over states",
        "rows": rows,
    }


def table(result: dict) -> str:
    actor, step = result["actor"]["hidden_dims"], result["checkpoint_step"]
    head = f"PTQ of the SAC actor {actor} of {result['env']} (step {step}), {result['episodes']} episodes, "
    keys = ("return_mean", "return_std", "return_ratio", "action_l2_mean", "kl_mean", "kl_median", "weight_rel_error")
    rows = [[row["name"], *("" if row[k] is None else row[k] for k in keys)] for row in result["rows"]]
    header = ["precision", "return", "±", "ratio", "action L2", "KL mean", "KL median", "W rel err"]
    formats = [">18", "8.1f", "<5.1f", "6.3f", "10.2e", "10.2e", "10.2e", "10.2e"]
    return "\n".join([head + f"{result['states']} states", *format_table(header, rows, formats)])


def plot(result: dict, path: pathlib.Path) -> None:
    """Return (left) and distance to the fp32 policy (right) against the bit width, the float rows as lines."""
    rows, bits = {row["name"]: row for row in result["rows"]}, sorted(result["bits"])
    floor = lambda value: max(value, 1e-12)  # a log axis
    with figure(path, 1, 2, figsize=(12, 4.6)) as (fig, (ax_r, ax_d)):
        for suffix, color, label in (("", "tab:blue", "per tensor"), ("_per_channel", "tab:orange", "per channel")):
            series = [rows[f"int{n}{suffix}"] for n in bits]
            returns, stds = [r["return_mean"] for r in series], [r["return_std"] for r in series]
            ax_r.errorbar(bits, returns, stds, fmt="o-", color=color, capsize=3, label=f"int, {label}")
            for key, style, alpha, what in (("action_l2_mean", "o-", 1.0, "action L2"), ("kl_mean", "s--", 0.6, "KL")):
                values = [floor(r[key]) for r in series]
                ax_d.plot(bits, values, style, color=color, alpha=alpha, label=f"{what}, int, {label}")
        for name, color in (("fp32", "black"), ("fp16", "tab:green"), ("fp16_act", "tab:olive")):
            ax_r.axhline(rows[name]["return_mean"], color=color, linestyle=":", label=name)
            if name != "fp32":
                ax_d.axhline(floor(rows[name]["action_l2_mean"]), color=color, ls=":", label=f"action L2, {name}")
        episodes = f"{result['episodes']} episode{'s' * (result['episodes'] > 1)}"
        title = f"{result['env']}, actor {result['actor']['hidden_dims']}, step {result['checkpoint_step']}"
        ax_r.set(xlabel="bits n", ylabel=f"mean return ± std ({episodes})", ylim=(0, None))
        ax_r.set_title(title, fontsize=9)
        ax_d.set(yscale="log", xlabel="bits n", ylabel="distance to the fp32 policy")
        ax_d.set_title(f"mean over {result['states']} states visited by the fp32 policy", fontsize=9)
        for ax in (ax_r, ax_d):
            ax.set_xticks(bits)
            ax.legend(fontsize=7)


def _bits(text: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--bits takes comma-separated integers, got {text!r}") from None
    if not values or any(not 2 <= n <= 16 for n in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"--bits takes distinct integers in [2, 16], got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    cli = parser(RESULT_NAME, __doc__)
    cli.add_argument("--run_dir", type=pathlib.Path, default=DEFAULT_RUN_DIR, help="SAC run directory")
    cli.add_argument("--episodes", type=int, default=10, help="evaluation episodes per precision (default 10)")
    cli.add_argument("--bits", type=_bits, default=list(DEFAULT_BITS), help="integer bit widths, comma-separated")
    args = cli.parse_args(argv)
    if args.episodes < 1:
        cli.error("--episodes must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    result = run_benchmark(args.run_dir, args.episodes, args.bits)
    result["command"] = command_line("benchmarks.ptq_eval", argv)
    return finish(args, result, table(result), plot)


if __name__ == "__main__":
    main()
