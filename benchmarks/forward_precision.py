"""What the forward pass's precision alone changes in a trained SAC agent: its float32 parameters evaluated with
float32 activations and matmuls (the reference), with bfloat16 activations (``mixed_bf16``), and with bfloat16
activations and blockwise W8A8 fp8 GEMMs (``fp8``), on ``--samples`` transitions ``(s, a)`` of the run's own replay
buffer (its last checkpoint, for each of ``--runs``). It separates what the activation format costs from what the
fp8 GEMM adds. Per policy ``p``:

* ``q_rms_error``: ``rms(Q_p(s, a) - Q_32(s, a))`` over the transitions and both Q-networks, also over ``q_spread``
  (the std of ``Q_32``: the scale of the differences the critic must rank) and over ``td_error_rms`` (``sqrt(L_Q /
  2)`` of the run's last logged critic loss: a forward error of the TD error's size buries the signal the critic
  learns from, a small fraction of it cannot);
* ``action_grad_cosine``: the mean over states of ``cos(grad_a min_i Q_p, grad_a min_i Q_32)`` at ``a =
  tanh(mu_32(s))``, the direction the actor's update moves its actions (through the fp8 GEMM's straight-through
  gradient, as in training);
* ``action_l2``: the mean of ``||tanh(mu_p(s)) - tanh(mu_32(s))||_2``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
from collections.abc import Sequence

os.environ.setdefault("MUJOCO_GL", "egl")

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import run_evidence
from benchmarks.common import command_line, figure, finish, format_table, parser

RESULT_NAME = "forward_precision"
POLICIES = ("fp32", "mixed_bf16", "fp8")  # the reference first


def compare(agent, obs: jax.Array, action: jax.Array) -> dict[str, dict]:
    """The measures of ``agent`` under each of :data:`POLICIES` against float32, on states ``obs`` and replayed actions
    ``action`` (each ``(B, ...)``)."""
    from lpjax.agents import sac

    def forward(policy: str):
        """Under ``policy`` (the parameters unchanged): ``Q(s, action)`` of both Q-networks ``(2, B)``, the
        deterministic actions and ``a -> grad_a min_i Q(s, a)``."""
        config = dataclasses.replace(agent.config, policy=policy)
        q = lambda a: sac.SACCritic(config).apply(agent.critic.params, obs, a).astype(jnp.float32)
        mu = sac.act(agent.replace(config=config), obs, jax.random.PRNGKey(0), deterministic=True)
        return q(action), mu, jax.grad(lambda a: jnp.sum(jnp.min(q(a), axis=0)))

    q_32, mu_32, grad = forward("fp32")
    grad_32 = grad(mu_32)
    spread = float(jnp.std(q_32))
    out = {}
    for policy in POLICIES:
        q_p, mu_p, grad = forward(policy)
        grad_p = grad(mu_32)
        q_error = float(jnp.sqrt(jnp.mean(jnp.square(q_p - q_32))))
        norms = jnp.linalg.norm(grad_p, axis=-1) * jnp.linalg.norm(grad_32, axis=-1)
        out[policy] = {
            "q_rms_error": q_error,
            "q_spread": spread,
            "q_error_over_spread": q_error / spread if spread > 0 else None,
            "action_grad_cosine": float(jnp.mean(jnp.sum(grad_p * grad_32, axis=-1) / norms)),
            "action_l2": float(jnp.mean(jnp.linalg.norm(mu_p - mu_32, axis=-1))),
        }
    return out


def measure_run(run_dir: pathlib.Path, samples: int, seed: int) -> dict:
    """:func:`compare` on ``samples`` transitions of the run's replay buffer, with the run's own TD error."""
    from experiments.sac_loop import load_run
    from lpjax.replay import replay_sample

    if not (run_dir / "checkpoints").is_dir():  # checked first: restoring would create the directory
        raise FileNotFoundError(
            f"{run_dir} has no checkpoints/: expected a run directory of `python -m experiments.sac`."
        )
    config, loop, step = load_run(run_dir)
    if loop.replay is None:
        raise ValueError(f"{run_dir} did not save its replay buffer (config.save_replay is False).")
    batch = replay_sample(loop.replay, jax.random.PRNGKey(seed), samples)
    last_loss = run_evidence.last_logged(run_dir, ("train/critic_loss",))["critic_loss"]
    td_error = math.sqrt(last_loss / 2) if last_loss is not None else None
    rows = compare(loop.agent, batch["obs"], batch["action"])
    for row in rows.values():
        row["q_error_over_td_error"] = row["q_rms_error"] / td_error if td_error else None
    return {
        "run_dir": str(run_dir),
        "trained_policy": config.agent.policy,
        "env": config.env,
        "step": int(step),
        "samples": samples,
        "td_error_rms": td_error,
        "policies": rows,
    }


def table(result: dict) -> str:
    lines, keys = [], ("q_rms_error", "q_error_over_spread", "q_error_over_td_error", "action_grad_cosine", "action_l2")
    for run in result["runs"]:
        td_error = "-" if run["td_error_rms"] is None else f"{run['td_error_rms']:.3g}"
        lines.append(
            f"{run['run_dir']} (trained {run['trained_policy']}, step {run['step']}, "
            f"{run['samples']} transitions, TD error rms {td_error})"
        )
        rows = [[policy, *("-" if row[k] is None else row[k] for k in keys)] for policy, row in run["policies"].items()]
        header = ["policy", "Q rms error", "/ Q spread", "/ TD error", "grad_a cos", "action L2"]
        lines += format_table(header, rows, ["<11", "11.4g", "10.4f", "10.4f", "10.4f", "10.4f"], "  ")
    return "\n".join(lines)


def plot(result: dict, path: pathlib.Path) -> None:
    """Per run, the four measures of each policy as grouped bars."""
    runs = result["runs"]
    panels = (
        ("q_error_over_spread", "Q rms error / Q spread"),
        ("q_error_over_td_error", "Q rms error / the run's TD error rms"),
        ("action_grad_cosine", "cos(grad_a Q_p, grad_a Q_32)"),
        ("action_l2", "deterministic action L2"),
    )
    width = 0.8 / len(POLICIES)
    names = ["/".join(pathlib.Path(run["run_dir"]).parts[-3:]) for run in runs]
    with figure(path, 1, len(panels), dpi=110, figsize=(3.6 * len(panels), 3.8)) as (fig, axes):
        for ax, (key, title) in zip(axes, panels):
            for i, policy in enumerate(POLICIES):
                values = [run["policies"][policy][key] or 0.0 for run in runs]
                ax.bar(np.arange(len(runs)) + i * width, values, width, label=policy)
            ax.set_xticks(np.arange(len(runs)) + width * (len(POLICIES) - 1) / 2, names, rotation=20, fontsize=7)
            ax.set_title(title, fontsize=10)
            ax.grid(alpha=0.3, axis="y")
        axes[0].legend(fontsize=8)
        fig.suptitle("Trained SAC parameters, forward pass in fp32, with bf16 activations, with bf16 + fp8 GEMMs")


def main(argv: Sequence[str] | None = None) -> dict:
    cli = parser(RESULT_NAME, __doc__, out=("--results_dir",))
    cli.add_argument("--runs", type=pathlib.Path, nargs="+", required=True, help="SAC run directories")
    cli.add_argument("--samples", type=int, default=4096, help="replay transitions per run (default 4096)")
    cli.add_argument("--seed", type=int, default=0, help="seed of the replay sample")
    args = cli.parse_args(argv)
    if args.samples < 2:
        cli.error(f"--samples must be >= 2, got {args.samples}")
    result = {
        "benchmark": RESULT_NAME,
        "command": command_line(f"benchmarks.{RESULT_NAME}", argv),
        "jax_version": jax.__version__,
        "runs": [measure_run(run_dir.absolute(), args.samples, args.seed) for run_dir in args.runs],
        "notes": [
            "Each run's last checkpoint with its float32 parameters under each policy: fp32 (the reference), "
            "mixed_bf16 (bfloat16 activations, float32 matmuls), fp8 (bfloat16 activations, W8A8 E4M3 GEMMs).",
            "td_error_rms: sqrt(last logged critic loss / 2), the rms TD error of one Q-network when training ended.",
        ],
    }
    return finish(args, result, table(result), plot)


if __name__ == "__main__":
    main()
