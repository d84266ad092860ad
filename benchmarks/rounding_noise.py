"""What each way of landing an update on float16 weights does to them: round-to-nearest, Kahan summation and
stochastic rounding, on the parameter update and on the Polyak target update, side by side against float64.

The weights are one 256x256 layer (``--size``) drawn as Flax initializes it, stored in float16. The parameter
updates stand in for Adam's: ``u_k = lr (s d + z_k) / sqrt(1 + s^2)``, a fixed direction ``d = +-1`` per weight
with share ``s`` (``--drift``) plus standard normal minibatch noise ``z_k``, cast to float16. The default ``lr`` is
below Adam's learning rate (1e-4) because a trained critic's Adam steps are (``|m| / sqrt(v)`` is well below 1 with
noisy gradients); ``--runs`` records the target lag of real SAC runs to set the errors against. The same updates
land on three copies through ``optax.apply_updates`` in float16, after ``kahan_summation()``, and after
``stochastic_rounding()``; the target follows the Kahan copy every ``--target_period`` updates (``tau`` 0.005) by
``optax.incremental_update``, ``kahan_polyak`` and ``stochastic_rounding_polyak``. The reference is float64: the
sum of the same float16 updates, and the Polyak recursion over the same online weights. Recorded every
``--log_every`` updates: the median ``|error|`` and bias along ``d`` in float16 ulps, and the signals they compete
with (how far the weights moved, how far the target lags).

Theory (the json's ``theory``): stochastic rounding's error per update has mean 0 and variance ``f (1 - f) <= 1/4``
ulp^2 (``1/6`` on average over a uniform fractional part ``f``). On the parameters it is a random walk, at most
``sqrt(k / 4)`` ulp rms after ``k`` updates; the target forgets it at rate ``tau``, at most ``sqrt((1/4) / (1 - (1 -
tau)^2))`` ulp rms in steady state; the median ``|error|`` of a normal sum is 0.674 of the rms. Round-to-nearest
loses every update below half an ulp; Kahan summation carries the residual, so its error stays below an ulp.
"""

from __future__ import annotations

import argparse
import math
import pathlib
from collections.abc import Sequence
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import run_evidence
from benchmarks.common import command_line, figure, finish, format_table, parser
from lpjax.optim import kahan_polyak, kahan_summation, stochastic_rounding, stochastic_rounding_polyak

RESULT_NAME = "rounding_noise"
METHODS = ("round_to_nearest", "kahan", "stochastic")

MEDIAN_OF_NORMAL = 0.6744897501960817
"""The median of ``|x|`` for a standard normal ``x``: a sum of many independent rounding errors is normal."""


def theory(tau: float, steps: int) -> dict:
    """Stochastic rounding's error in ulps (see Theory above): the root mean square for a uniform fractional part of
    the update (variance 1/6 per update), and the median ``|error|`` of the bound (1/4)."""
    target = 1.0 / (1.0 - (1.0 - tau) ** 2)
    return {
        "stochastic_parameter_rms_ulp_uniform": math.sqrt(steps / 6.0),
        "stochastic_parameter_median_ulp_bound": MEDIAN_OF_NORMAL * math.sqrt(steps / 4.0),
        "stochastic_target_rms_ulp_uniform": math.sqrt(target / 6.0),
        "stochastic_target_median_ulp_bound": MEDIAN_OF_NORMAL * math.sqrt(target / 4.0),
    }


def _in_ulps(got: jax.Array, exact: jax.Array) -> jax.Array:
    """``got - exact`` in units of the float16 ulp at float64 ``exact``: the gap to the next float16 away from 0."""
    h = jnp.abs(exact).astype(jnp.float16)
    ulp = (jnp.nextafter(h, jnp.asarray(jnp.inf, jnp.float16)) - h).astype(jnp.float64)
    return (got.astype(jnp.float64) - exact) / ulp


def simulate(
    size: int, steps: int, log_every: int, lr: float, tau: float, period: int, drift: float, seed: int
) -> dict:
    """Runs all methods on the same updates (see the module docstring); returns the logged curves: per method the
    median ``|error|`` and the median bias ``error * d`` (negative when updates are lost) of the parameters and the
    target. Medians, because an ulp-relative mean is dominated by the few weights nearest zero, whose ulps are tiny."""
    with jax.enable_x64(True):
        init_key, direction_key, noise_key = jax.random.split(jax.random.key(seed), 3)
        p0 = (jax.random.truncated_normal(init_key, -2.0, 2.0, (size,)) / 16.0 / 0.87962566).astype(jnp.float16)
        direction = jnp.where(jax.random.bernoulli(direction_key, 0.5, (size,)), 1.0, -1.0)
        nearest = SimpleNamespace(init=lambda t: (), update=lambda p, t, s: (optax.incremental_update(p, t, tau), s))
        rules = {  # per method: the optax transform landing a parameter update, and the target's Polyak update
            "round_to_nearest": (optax.identity(), nearest),
            "kahan": (kahan_summation(), kahan_polyak(tau)),
            "stochastic": (stochastic_rounding(seed), stochastic_rounding_polyak(tau, seed + 1)),
        }

        def step(carry, keys):
            """``period`` parameter updates, then one target update following the Kahan copy (the most exact)."""
            (params, targets), (param_states, target_states), exact = carry  # scan passes fresh containers
            for key in keys:
                noise = jax.random.normal(key, (size,))
                u = (lr * (drift * direction + noise) / math.sqrt(1.0 + drift**2)).astype(jnp.float16)
                for method, (transform, _) in rules.items():
                    d, param_states[method] = transform.update(u, param_states[method], params[method])
                    params[method] = optax.apply_updates(params[method], d)
                exact["param"] = exact["param"] + u.astype(jnp.float64)
            online = params["kahan"]
            exact["target"] = exact["target"] + tau * (online.astype(jnp.float64) - exact["target"])
            for method, (_, polyak) in rules.items():
                targets[method], target_states[method] = polyak.update(online, targets[method], target_states[method])
            return carry, None

        @jax.jit
        def segment(carry, keys):
            carry, _ = jax.lax.scan(step, carry, keys)
            (params, targets), _, exact = carry
            out = {method: {} for method in METHODS}
            for side, weights in (("param", params), ("target", targets)):
                for method in METHODS:
                    e = _in_ulps(weights[method], exact[side])
                    out[method] |= {side: jnp.median(jnp.abs(e)), f"{side}_bias": jnp.median(e * direction)}
            out["signal"] = {
                "param_moved": jnp.median(jnp.abs(_in_ulps(p0, exact["param"]))),
                "target_lag": jnp.median(jnp.abs(_in_ulps(params["kahan"], exact["target"]))),
            }
            return carry, out

        states = tuple({m: rule[i].init(p0) for m, rule in rules.items()} for i in (0, 1))
        copies = dict.fromkeys(METHODS, p0)
        carry = ((copies, copies), states, dict.fromkeys(("param", "target"), p0.astype(jnp.float64)))
        keys = jax.random.split(noise_key, steps).reshape(steps // log_every, log_every // period, period)
        logged = []
        for segment_keys in keys:
            carry, measured = segment(carry, segment_keys)
            logged.append(measured)
    stacked = jax.tree.map(lambda *values: [float(v) for v in values], *logged)
    curves = {method: stacked[method] for method in (*METHODS, "signal")}
    return {"steps": list(range(log_every, steps + 1, log_every)), "curves": curves}


def summarize(simulated: dict) -> dict:
    """The final errors per method, and how large each is against its signal."""
    curves = simulated["curves"]
    signal = {name: values[-1] for name, values in curves["signal"].items()}
    half = len(simulated["steps"]) // 2  # the target's steady state: the mean over the logged second half
    final, steady = {}, {}
    for method in METHODS:
        final[method] = {name: values[-1] for name, values in curves[method].items()}
        final[method]["param_over_moved"] = final[method]["param"] / signal["param_moved"]
        final[method]["target_over_lag"] = final[method]["target"] / signal["target_lag"]
        steady[method] = float(np.mean(curves[method]["target"][half:]))
    return {"final": final, "signal": signal, "target_steady_state": steady}


def real_lags(run_dirs: Sequence[pathlib.Path]) -> dict:
    """The median ``|p - t|`` in float16 ulps of ``t`` between each online critic matrix and its target in the last
    checkpoint of each SAC run: the lag that a rounding error of the target competes with in training."""
    out = {}
    for run_dir in run_dirs:
        state = run_evidence.last_checkpoint(run_dir)
        if state is None:
            raise ValueError(
                f"{run_dir}: no checkpoints directory or no readable checkpoint in it; --runs takes SAC run "
                "directories."
            )
        critics = {"critic": {}, "target_critic": {}}  # each matrix by its path below its last "params"
        for keys, leaf in jax.tree_util.tree_leaves_with_path(state):
            path = tuple(str(getattr(k, "key", k)) for k in keys)
            network = next((n for n in ("target_critic", "critic") if n in path), None)
            if network and "params" in path and getattr(leaf, "ndim", 0) == 2 and min(leaf.shape) >= 2:
                critics[network][path[len(path) - path[::-1].index("params") :]] = leaf
        online, target = critics["critic"], critics["target_critic"]
        lags = {}
        with jax.enable_x64(True):
            for name, t in sorted(target.items()):
                if name not in online:
                    raise ValueError(f"{run_dir}: the target critic's {'/'.join(name)} has no online counterpart.")
                lag = _in_ulps(jnp.asarray(online[name]), jnp.asarray(t, jnp.float64))
                lags["/".join(name)] = float(jnp.median(jnp.abs(lag)))
        if not lags:
            raise ValueError(f"{run_dir}: no critic and target_critic matrices in the last checkpoint.")
        out[str(run_dir)] = lags
    return out


def table(result: dict) -> str:
    s, t = result["summary"], result["theory"]
    lines = [
        f"after {result['steps'][-1]} updates of {result['config']['size']} float16 weights "
        "(median |error| and median bias in float16 ulps, against float64)"
    ]
    keys = ("param", "param_bias", "param_over_moved", "target", "target_bias", "target_over_lag")
    rows = [[m, *(s["final"][m][k] for k in keys), s["target_steady_state"][m]] for m in METHODS]
    header = ["method", "param", "bias", "/ moved", "target", "bias", "/ lag", "steady"]
    lines += format_table(header, rows, ["<18", "9.2f", "8.2f", "9.4f", "9.2f", "8.2f", "8.4f", "8.2f"])
    lines.append(
        f"signal: the weights moved {s['signal']['param_moved']:.1f} ulp, the target lags "
        f"{s['signal']['target_lag']:.1f} ulp (medians); stochastic rounding's theory (median |error|): parameters <= "
        f"{t['stochastic_parameter_median_ulp_bound']:.1f} ulp, target <= {t['stochastic_target_median_ulp_bound']:.2f}"
        " ulp"
    )
    for run, lags in result["real_target_lags"].items():
        lines.append(f"real lag in {run}: " + ", ".join(f"{k} {v:.1f}" for k, v in lags.items()))
    return "\n".join(lines)


def plot(result: dict, path: pathlib.Path) -> None:
    """Median error against float64 over the updates, parameters (left) and target (right), log scale."""
    steps = np.asarray(result["steps"])
    colors = {"round_to_nearest": "tab:red", "kahan": "tab:green", "stochastic": "darkgoldenrod"}
    bound = dict(linestyle="--", color="gray", label="stochastic: theory's bound")
    sides = (
        ("param", "param_moved", "parameters"),
        ("target", "target_lag", f"Polyak target, tau {result['config']['tau']}"),
    )
    with figure(path, 1, 2, dpi=110, figsize=(11, 4.2)) as (_, panels):
        for axes, (side, signal, title) in zip(panels, sides):
            for method in METHODS:
                axes.plot(steps, result["curves"][method][side], color=colors[method], label=method)
            axes.plot(steps, result["curves"]["signal"][signal], "k:", label=signal.replace("_", " "))
            if side == "param":
                axes.plot(steps, MEDIAN_OF_NORMAL * np.sqrt(steps / 4.0), **bound)
            else:
                axes.axhline(result["theory"]["stochastic_target_median_ulp_bound"], **bound)
            axes.set(yscale="log", xlabel="updates", ylabel="median |error| vs float64 (float16 ulps)")
            axes.set_title(title, fontsize="medium")
            axes.grid(True, alpha=0.3)
            axes.legend(fontsize="x-small")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    cli = parser(RESULT_NAME, __doc__, quick="4096 weights, 2000 updates: a smoke test", out=("--results_dir",))
    cli.add_argument("--size", type=int, default=65_536, help="weights (default: one 256x256 layer)")
    cli.add_argument("--steps", type=int, default=20_000, help="updates")
    cli.add_argument("--log_every", type=int, default=500, help="record the errors every N updates")
    cli.add_argument("--lr", type=float, default=3e-5, help="update size: the rms of a weight's step")
    cli.add_argument("--tau", type=float, default=0.005, help="Polyak step size of the target")
    cli.add_argument("--target_period", type=int, default=2, help="parameter updates per target update")
    cli.add_argument("--drift", type=float, default=0.0, help="the persistent direction's share of an update")
    cli.add_argument("--seed", type=int, default=0)
    cli.add_argument("--runs", type=pathlib.Path, nargs="*", default=[], help="SAC run directories: their target lag")
    args = cli.parse_args(argv)
    if args.quick:
        args.size, args.steps, args.log_every = 4096, 2000, 500
    if min(args.size, args.steps, args.log_every, args.target_period) < 1:
        cli.error("--size, --steps, --log_every and --target_period must be >= 1")
    if args.steps % args.log_every or args.log_every % args.target_period:
        cli.error("--steps must be a multiple of --log_every, and --log_every of --target_period")
    if not 0.0 < args.tau <= 1.0:
        cli.error(f"--tau must be in (0, 1], got {args.tau}")
    if not args.lr > 0:
        cli.error(f"--lr must be > 0, got {args.lr}")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    lags = real_lags(args.runs)  # first: a bad --runs fails before the simulation
    simulated = simulate(
        args.size, args.steps, args.log_every, args.lr, args.tau, args.target_period, args.drift, args.seed
    )
    result = {
        "benchmark": RESULT_NAME,
        "command": command_line(f"benchmarks.{RESULT_NAME}", argv),
        "jax_version": jax.__version__,
        "config": {k: v for k, v in vars(args).items() if k not in ("out_dir", "name", "no_plot", "runs", "quick")},
        **simulated,
        "theory": theory(args.tau, args.steps),
        "real_target_lags": lags,
        "notes": [
            "Errors in each weight's float16 ulps at the float64 reference: median |error| and median error x "
            "direction (bias: negative where updates are lost).",
            "signal: how far the weights moved (param_moved) and the target lags the online weights (target_lag); "
            "*_over_* compare an error with them. real_target_lags: that lag in real SAC runs (--runs).",
        ],
        "summary": summarize(simulated),
    }
    return finish(args, result, table(result), plot)


if __name__ == "__main__":
    main()
