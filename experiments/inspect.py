r"""``python -m experiments.inspect --config=fp16_naive.py --algo=sac``: the precision report of a learner's update.

Run it with ``-m`` from the repository root (as a script, its folder on ``sys.path`` would shadow the standard
library's ``inspect``). The library side is :mod:`lpjax.inspect`.

Builds the learner of an experiment config (a file, or a bare name in ``experiments/configs/<algo>/``; run from
the repository root), collects one batch by running its policy in the environment, and prints the precision
report (:func:`lpjax.inspect.precision_report`) of one update. For ``--algo=sac``, each phase is reported
separately, every phase from the same state:

* ``critic``: the critic's loss, its gradient, its optimizer step and the target networks' update;
* ``actor``: the actor's loss, gradient and optimizer step, then the temperature's.

For ``--algo=d4pg`` one report covers the update (rows under the scopes ``critic``, ``actor`` and ``target``),
on n-step transitions of the exploring policy.

``--checkpoint=RUN_DIR`` (SAC) inspects the networks of a trained run (its latest checkpoint) instead of a fresh
initialisation: the environment and network sizes come from the run's ``config.json``, the precision settings
(:data:`PRECISION_FIELDS`: the policy, the matmul implementation and the whole ``methods`` subtree) from
``--config``, and the parameters are cast to that policy (optimizer states start fresh). Failures that appear
late in training (a saturated, nearly deterministic policy) show up this way. ``--json=PATH`` saves the reports;
``--dtype`` chooses what float32 operations are checked as (``auto``: nothing when the config computes in a
narrow dtype, float16 otherwise: "what would break in fp16?").
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import flags
from ml_collections import config_flags

from lpjax.inspect import PrecisionReport, precision_report
from lpjax.inspect.formats import is_narrow

ALGOS = ("sac", "d4pg")
DTYPES = ("auto", "none", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
PRECISION_FIELDS = ("policy", "matmul_impl", "methods")
"""Agent fields taken from ``--config`` when inspecting a ``--checkpoint`` (the rest come from the run): the
fields of the off-policy learners' config (:class:`lpjax.agents.training.OffPolicyConfig`) that set the numerics,
``methods`` as a whole subtree (every field of :class:`lpjax.methods.PrecisionMethods`, so a method added there
is copied without a change here)."""

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Experiment config: a file, or a name in experiments/configs/<algo> (e.g. fp16_naive.py).",
    lock_config=True,
)
_ALGO = flags.DEFINE_enum("algo", "sac", ALGOS, "Learner to inspect.")
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Run directory of a trained run to take the networks from.")
_DTYPE = flags.DEFINE_enum(
    "dtype",
    "auto",
    DTYPES,
    "Format float32 operations are checked as ('none': not "
    "checked; 'auto': none for narrow policies, float16 otherwise).",
)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", None, "Batch size (default: the config's agent.batch_size).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the initialisation, the batch collection and the update.")
_LIMIT = flags.DEFINE_integer("limit", 20, "Rows printed per phase (all flagged rows go to --json).")
_JSON = flags.DEFINE_string("json", None, "Write the reports (flagged rows) to this JSON file.")


def what_if_dtype(choice: str, compute_dtype) -> Any:
    """The ``dtype`` argument of :func:`precision_report` for a ``--dtype`` choice and the config's compute dtype."""
    if choice == "auto":
        return None if is_narrow(compute_dtype) else jnp.float16
    return None if choice == "none" else jnp.dtype(choice)


def inspected_config(config: ml_collections.ConfigDict, checkpoint: str | None) -> ml_collections.ConfigDict:
    """``config``, or with ``checkpoint`` the run's config with ``config``'s :data:`PRECISION_FIELDS`."""
    if checkpoint is None:
        return config
    from experiments import sac_loop

    try:
        run_config = sac_loop.load_run_config(checkpoint)
    except FileNotFoundError as error:
        raise ValueError(f"--checkpoint={checkpoint}: {error}") from error
    agent = run_config.agent.to_dict()
    inspected = config.agent.to_dict()
    agent.update({field: inspected[field] for field in PRECISION_FIELDS if field in inspected})
    run_config.agent = ml_collections.ConfigDict(agent)
    return run_config


def restore_networks(checkpoint: str, state):
    """``state`` with the actor, critic, target critic and temperature of ``checkpoint``'s latest step, cast to
    ``state``'s parameter dtypes (optimizer states stay fresh: they depend only on the parameters' shapes)."""
    from experiments import sac_loop

    trained = sac_loop.load_run(checkpoint)[1].agent

    def cast_like(source, like):
        return jax.tree.map(lambda s, d: jnp.asarray(s, d.dtype), source, like)

    return state.replace(
        actor=state.actor._replace(params=cast_like(trained.actor.params, state.actor.params)),
        critic=state.critic._replace(params=cast_like(trained.critic.params, state.critic.params)),
        target_critic=cast_like(trained.target_critic, state.target_critic),
        temperature=state.temperature._replace(params=cast_like(trained.temperature.params, state.temperature.params)),
    )


def collect_batch(env, policy, batch_size: int, seed: int, n_step: int = 1, gamma: float = 1.0) -> dict:
    """``batch_size`` transitions of ``policy(obs, key) -> action`` in ``env``, as a replay batch.

    Transitions are ``n_step``-step, as :class:`lpjax.nstep.NStepAccumulator` builds them (``n_step=1``,
    ``gamma=1``: SAC's one-step transitions, ``discount`` 0 only at a terminal).
    """
    from lpjax.nstep import NStepAccumulator

    accumulator, transitions = NStepAccumulator(n_step, gamma), []
    key, episode = jax.random.key(seed), 0
    obs = env.reset(seed=seed)
    while len(transitions) < batch_size:
        key, action_key = jax.random.split(key)
        action = np.asarray(policy(jnp.asarray(obs), action_key))
        if not np.all(np.isfinite(action)):
            raise RuntimeError(
                "the policy produced non-finite actions while collecting the batch; inspect "
                "with a policy that runs (e.g. without --checkpoint)."
            )
        next_obs, reward, terminated, truncated = env.step(action)
        transitions += accumulator.add(
            obs, action, reward, 0.0 if terminated else 1.0, next_obs, episode_end=terminated or truncated
        )
        obs = next_obs
        if terminated or truncated:
            episode += 1
            obs = env.reset(seed=seed + episode)
    return {
        name: jnp.asarray(np.stack([t[name] for t in transitions[:batch_size]]))
        for name in ("obs", "action", "reward", "discount", "next_obs")
    }


def with_batch_size(agent_config, batch_size: int | None):
    """``agent_config`` with ``--batch_size`` in place of its own (``None``: unchanged)."""
    if batch_size is None:
        return agent_config
    if batch_size < 1:
        raise ValueError(f"--batch_size must be >= 1, got {batch_size}.")
    return dataclasses.replace(agent_config, batch_size=batch_size)


def sac_reports(
    config: ml_collections.ConfigDict, checkpoint: str | None, dtype_choice: str, batch_size: int | None, seed: int
) -> dict[str, PrecisionReport]:
    """The precision reports of SAC's ``critic`` and ``actor`` phases (see the module docstring)."""
    from experiments import sac_loop
    from lpjax.agents import sac

    agent_config = with_batch_size(sac_loop.validate(config), batch_size)
    env = sac_loop.make_envs(config)[0]
    init_key, critic_key, actor_key = jax.random.split(jax.random.key(seed), 3)
    state = sac.init(init_key, jnp.zeros(env.observation_shape, env.observation_dtype), env.action_dim, agent_config)
    if checkpoint is not None:
        state = restore_networks(checkpoint, state)
    batch = collect_batch(env, lambda obs, key: sac.act(state, obs[None], key)[0], agent_config.batch_size, seed)
    if agent_config.pixels:  # the critic sees the augmented and the original batch, as in sac.update
        batch = jax.tree.map(lambda a: jnp.concatenate([a, a]), batch)
    dtype = what_if_dtype(dtype_choice, agent_config.precision.compute_dtype)
    return {
        "critic": precision_report(sac.critic_update, state, batch, critic_key, dtype=dtype),
        "actor": precision_report(sac.actor_update, state, batch["obs"], actor_key, dtype=dtype),
    }


PAPER_FINDINGS = (
    "Adam's g^2 underflows",
    "Adam's eps rounds to 0",
    "Gaussian variance underflows",
    "softplus exp overflows",
)
"""The fp16 problems of SAC that Björck et al. (2021) fix (with hAdam, compound loss scaling, normal-fix and
softplus-fix), as :func:`paper_findings` recognises them."""


def paper_findings(reports: dict[str, PrecisionReport]) -> dict[str, list]:
    """The flagged, not harmless rows of each of :data:`PAPER_FINDINGS` in SAC's phase reports."""
    rows = [row for report in reports.values() for row in report.flagged(include_harmless=False)]
    gaussian = os.path.join("lpjax", "agents", "sac", "squashed_gaussian.py")
    return {
        PAPER_FINDINGS[0]: [
            r
            for r in rows
            if r.power and "optimizer" in r.scope.split("/") and r.underflow_frac > 0 and r.source.startswith("optax")
        ],
        PAPER_FINDINGS[1]: [r for r in rows if r.zero_constant and "optimizer" in r.scope.split("/")],
        PAPER_FINDINGS[2]: [
            r for r in rows if r.primitive == "square" and gaussian in r.source and r.underflow_frac > 0
        ],
        PAPER_FINDINGS[3]: [
            r for r in rows if r.primitive == "exp" and gaussian in r.source and (r.overflow_frac > 0 or r.nonfinite)
        ],
    }


def d4pg_reports(
    config: ml_collections.ConfigDict, checkpoint: str | None, dtype_choice: str, batch_size: int | None, seed: int
) -> dict[str, PrecisionReport]:
    """The precision report of one D4PG update (critic, actor and targets, under those name scopes) on a batch of
    n-step transitions of its exploring policy (sigma ``config.max_sigma``)."""
    import lpjax.envs
    from experiments import d4pg_loop
    from lpjax.agents import d4pg

    if checkpoint is not None:
        raise ValueError("--checkpoint is implemented for --algo=sac only.")
    agent_config = with_batch_size(d4pg_loop.validate(config), batch_size)
    env = lpjax.envs.make(config.env, seed=config.seed)
    state = d4pg.init(jax.random.key(seed), jnp.zeros(env.observation_shape), env.action_dim, agent_config)

    def policy(obs, key):
        return d4pg.act(state.actor.params, obs[None], key, config.max_sigma, agent_config, env.action_dim)[0]

    batch = collect_batch(env, policy, agent_config.batch_size, seed, agent_config.n_step, agent_config.gamma)
    dtype = what_if_dtype(dtype_choice, agent_config.precision.compute_dtype)
    return {"update": precision_report(d4pg.update, state, batch, dtype=dtype)}


REPORTS = {"sac": sac_reports, "d4pg": d4pg_reports}


def check_json_path(json_path: str | None) -> None:
    """Raises ``ValueError`` (one line) when the ``--json`` file cannot be written, before any compute."""
    if not json_path:
        return
    path = pathlib.Path(json_path)
    existing = next(p for p in (path.parent.absolute(), *path.parent.absolute().parents) if p.exists())
    if path.is_dir() or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--json={json_path} cannot be written ({existing} is not a writable directory).")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"--json={json_path} is not writable.")


def main(argv):
    if len(argv) > 1:
        raise SystemExit(f"Unexpected arguments: {argv[1:]}")
    if _CONFIG.value is None:
        raise SystemExit("--config is required (e.g. --config=fp16_naive.py).")
    try:
        check_json_path(_JSON.value)
        config = inspected_config(_CONFIG.value, _CHECKPOINT.value)
        reports = REPORTS[_ALGO.value](config, _CHECKPOINT.value, _DTYPE.value, _BATCH_SIZE.value, _SEED.value)
    except ValueError as error:
        raise SystemExit(str(error)) from None  # one line: the message says what to change
    source = f"the networks of {_CHECKPOINT.value}" if _CHECKPOINT.value else "a fresh initialisation"
    print(f"{_ALGO.value.upper()} {config.agent.policy} on {config.env}, {source}; one update per phase.")
    for phase, report in reports.items():
        print(f"\n=== {phase} ===")
        print(report.table(limit=_LIMIT.value))
    print("\nThe fp16 problems Björck et al. (2021) fix (the last two are SAC's Gaussian policy):")
    for name, rows in paper_findings(reports).items():
        where = ", ".join(sorted({f"{row.source} [{row.scope}]" for row in rows}))
        print(f"  {name}: {'found at ' + where if rows else 'not found'}")
    if _JSON.value:
        path = pathlib.Path(_JSON.value)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps(
                {
                    "config": config.to_dict(),
                    "checkpoint": _CHECKPOINT.value,
                    "reports": {phase: r.to_dict() for phase, r in reports.items()},
                },
                indent=1,
            )
        )
        print(f"\nwrote {path}")


def run() -> None:
    """Entry point: resolves ``--config`` in ``experiments/configs/<algo>`` and runs :func:`main`."""
    from experiments.cli import REPO_ROOT, run_app

    algo = next((arg.split("=", 1)[1] for arg in sys.argv[1:] if arg.startswith("--algo=")), "sac")
    if algo not in ALGOS:
        raise SystemExit(f"--algo={algo}: the inspector's CLI supports {', '.join(ALGOS)}.")
    run_app(main, REPO_ROOT / "experiments" / "configs" / algo)


if __name__ == "__main__":
    run()
