"""Memory of SAC training, float32 against float16 with all of the paper's methods, counted from shapes and dtypes.

Björck et al. (2021), Table 11, report that pure-fp16 SAC uses 1.53-1.73x less GPU memory than fp32 (V100); the
target here is ``TARGET_RATIO`` (1.8). XLA:CPU emulates float16, so nothing is measured from a device: every
figure is ``prod(shape) * itemsize`` of abstract values (``jax.eval_shape`` / ``jax.make_jaxpr`` on
``jax.ShapeDtypeStruct`` inputs, nothing allocated), the same on every platform.

Configurations (:data:`PRECISIONS`): ``fp32``; ``fp16`` with the paper's six methods; beyond the paper
(:data:`BEYOND_GOALS`), ``fp16_sr`` (stochastic rounding instead of the two Kahan buffers, float16 replay),
``fp16_sr_8bit`` (also hAdam's moments blockwise 8-bit) and ``fp16_sr_8bit_remat`` (also ``rematerialize``, whose
cost in time this CPU measures: ``--time_size``, :mod:`benchmarks.timing`). Two hidden layers of width 1024 or
4096 and batch 1024 or 4096 (the paper's sizes), observation 24 and action 6 (walker-walk). Components:

1. **state**: the whole ``SACState`` of ``jax.eval_shape(sac.init)``, by role (:func:`state_part`).
2. **residuals** of the critic, actor and temperature losses: what ``jax.vjp`` keeps for the backward pass, each
   loss differentiated as ``lpjax.agents.training.gradient_step`` does (loss times the loss scale, in float32,
   w.r.t. that network's parameters) on ``sac.update``'s inputs. ``residual_leaf_bytes`` is the raw count of the
   vjp function's leaves; ``jax.make_jaxpr`` of the same function classifies each (:func:`residuals`): an input
   of the update (already in the state: not counted again), a literal, a broadcast of a constant (``jax.nn.relu``
   saves ``full_like(g, 0)``; lpjax's :func:`lpjax.nn.dense.relu` saves only its output), a boolean mask or a
   computed activation. ``residual_bytes`` counts every distinct non-input residual; XLA may fuse the zero
   broadcasts away, so totals without them are reported too. Every raw count is cross-checked against
   ``jax.ad_checkpoint.print_saved_residuals`` (``cross_check``).
3. **batch**: the replay batch ``sac.update`` receives, float32 (float16 for the stochastic-rounding rows, whose
   configs store a float16 replay).
4. **total** = state + residuals + batch, and ``ratio = fp32 total / fp16 total``.

A count of what an update holds, not a measured peak: the critic's and actor's residuals are not alive at once,
gradients (``gradients_bytes``) and XLA's temporaries are not counted. ``excess_over_half`` attributes where fp16
falls short of 2x: the bytes fp16 uses beyond half of fp32's, by component.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import io
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import flax
import jax
import jax.ad_checkpoint
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np

import lpjax
from benchmarks.common import command_line, figure, finish, parser, random_transitions
from benchmarks.timing import interleaved
from lpjax.agents import sac
from lpjax.methods import PrecisionMethods
from lpjax.optim import loss_scale_or_one

TARGET_RATIO = 1.8
PAPER_TABLE_11 = (1.53, 1.73)  # fp32 / fp16 peak GPU memory, V100 (Björck et al. 2021)
# Table 11 itself, MB (cheetah-run from states, V100, PyTorch) per (width, batch): (fp32, fp16 with the methods).
PAPER_TABLE_11_MB = {
    (1024, 1024): (128, 77),
    (1024, 4096): (320, 185),
    (4096, 1024): (1265, 826),
    (4096, 4096): (1973, 1163),
}
OBS_DIM = 24  # walker-walk (dm_control) from states
ACTION_DIM = 6
HIDDEN_LAYERS = 2
FULL_SIZES = ((1024, 1024), (1024, 4096), (4096, 1024), (4096, 4096))  # (hidden width, batch size)
QUICK_SIZES = ((16, 8), (32, 16))
_SR = dict(kahan_gradients=False, kahan_momentum=False, stochastic_rounding=True)
PRECISIONS: dict[str, dict[str, Any]] = {
    "fp32": dict(policy="fp32"),
    "fp16": dict(policy="fp16", methods=PrecisionMethods.paper()),
    "fp16_sr": dict(policy="fp16", methods=PrecisionMethods.paper(**_SR)),
    "fp16_sr_8bit": dict(policy="fp16", methods=PrecisionMethods.paper(**_SR, moment_dtype="fp8")),
    "fp16_sr_8bit_remat": dict(
        policy="fp16", methods=PrecisionMethods.paper(**_SR, moment_dtype="fp8"), rematerialize=True
    ),
}
REPLAY_DTYPES = {"fp16_sr": jnp.float16, "fp16_sr_8bit": jnp.float16, "fp16_sr_8bit_remat": jnp.float16}
"""The replay's float dtype where it is not float32: the stochastic-rounding configs store float16 transitions
(``experiments/configs/sac/fp16_sr.py``: ``replay_dtype = "fp16"``), so their batch is float16."""
BASE, LOW = "fp32", "fp16"
BEYOND_GOALS = {"fp16_sr": 2.0, "fp16_sr_8bit": 2.5, "fp16_sr_8bit_remat": 2.5}
"""Beyond the paper: fp32 / total goals of fp16 with stochastic rounding instead of the Kahan buffers, with
hAdam's moments in float16 or blockwise 8-bit (float8 e4m3 codes, a float32 scale per 256 elements)."""
LOSSES = ("critic", "actor", "temperature")
COMPONENTS = ("state", "critic_residuals", "actor_residuals", "temperature_residuals", "batch")
STATE_PARTS = (
    "params",
    "adam_moments",
    "kahan_gradient_compensation",
    "target_critic",
    "kahan_momentum_compensation",
    "scalars",
)
RESULT_NAME = "sac_memory"


# --------------------------------------------------------------------------------------------------- counting


def nbytes(leaf: Any) -> int:
    """``prod(shape) * itemsize`` of an array or ``jax.ShapeDtypeStruct`` (no data is touched)."""
    return int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize


def tree_bytes(tree: Any) -> int:
    return sum(nbytes(leaf) for leaf in jax.tree.leaves(tree))


def make_config(precision: str, width: int, batch_size: int) -> sac.SACConfig:
    return sac.SACConfig(hidden_dims=(width,) * HIDDEN_LAYERS, batch_size=batch_size, **PRECISIONS[precision])


def abstract_state(config: sac.SACConfig, obs_dim: int, action_dim: int) -> sac.SACState:
    """``sac.init``'s state as ``jax.ShapeDtypeStruct`` leaves, without allocating it."""
    observation = np.zeros((obs_dim,), np.float32)
    return jax.eval_shape(lambda key: sac.init(key, observation, action_dim, config), jax.random.PRNGKey(0))


def abstract_batch(batch_size: int, obs_dim: int, action_dim: int, dtype: Any = jnp.float32) -> dict:
    """The replay batch ``sac.update`` takes, as ``jax.ShapeDtypeStruct`` leaves."""
    sds = lambda *shape: jax.ShapeDtypeStruct(shape, dtype)
    return {
        "obs": sds(batch_size, obs_dim),
        "action": sds(batch_size, action_dim),
        "reward": sds(batch_size),
        "discount": sds(batch_size),
        "next_obs": sds(batch_size, obs_dim),
    }


def state_part(path: str) -> str:
    """Role of a :class:`SACState` leaf, from its key path (``jax.tree_util.keystr``)."""
    if path.endswith(".key"):
        return "scalars"  # the PRNG keys: the agent's, and stochastic rounding's (optimizers and target)
    if path.startswith(".target_compensation"):
        return "kahan_momentum_compensation"
    if path.startswith(".target_critic"):
        return "target_critic"
    if ".compensation" in path:
        return "kahan_gradient_compensation"
    if re.search(r"\.(mu|nu|nu_sqrt)(\[|$)", path):
        return "adam_moments"
    if re.match(r"\.(actor|critic|temperature)\.params", path):
        return "params"
    return "scalars"  # step, key, Adam counts, loss scale and its counters, eps scale


def state_breakdown(state: Any) -> dict:
    """Bytes of the state by role (:data:`STATE_PARTS`), by dtype, and per network."""
    parts = dict.fromkeys(STATE_PARTS, 0)
    by_dtype: dict[str, int] = {}
    by_network: dict[str, int] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        name = jax.tree_util.keystr(path)
        parts[state_part(name)] += nbytes(leaf)
        by_dtype[np.dtype(leaf.dtype).name] = by_dtype.get(np.dtype(leaf.dtype).name, 0) + nbytes(leaf)
        network = name[1:].split(".")[0].split("[")[0]
        by_network[network] = by_network.get(network, 0) + nbytes(leaf)
    return {
        "total": tree_bytes(state),
        "parts": parts,
        "by_dtype": by_dtype,
        "by_field": by_network,
        "param_count": {
            net: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(getattr(state, net).params))
            for net in ("actor", "critic")
        },
    }


# ------------------------------------------------------------------------------------ the losses' backward passes


def _scaled(loss_fn: Callable, opt_state: Any, *args) -> Callable:
    """``params -> loss * loss_scale`` in float32, as ``lpjax.agents.training.gradient_step`` differentiates it."""
    scale = loss_scale_or_one(opt_state)

    def scaled(params):
        loss, _ = loss_fn(params, *args)
        return loss.astype(jnp.float32) * scale

    return scaled


def _inputs(state: sac.SACState, batch: dict):
    """Keys and features as ``sac.update`` builds them (from states: features are the cast observations)."""
    _, critic_net = sac.networks(state.config, state.action_dim)
    _, critic_key, actor_key, _ = jax.random.split(state.key, 4)
    next_features = jax.lax.stop_gradient(
        critic_net.apply(state.critic.params, batch["next_obs"], method=sac.SACCritic.encode)
    )
    features = jax.lax.stop_gradient(critic_net.apply(state.critic.params, batch["obs"], method=sac.SACCritic.encode))
    return critic_key, actor_key, next_features, features


def loss_of(loss: str, state: sac.SACState, batch: dict) -> tuple[Callable, Any]:
    """``(params -> scaled loss, params)`` of the critic, actor or temperature loss, on ``sac.update``'s inputs."""
    critic_key, actor_key, next_features, features = _inputs(state, batch)
    if loss == "critic":
        fn = _scaled(sac.critic_loss, state.critic.opt_state, state, batch, next_features, critic_key)
        return fn, state.critic.params
    if loss == "actor":
        return _scaled(sac.actor_loss, state.actor.opt_state, state, features, actor_key), state.actor.params
    _, log_prob = sac.actor_loss(state.actor.params, state, features, actor_key)
    target_entropy = -float(state.action_dim) if state.config.target_entropy is None else state.config.target_entropy
    fn = _scaled(sac.temperature_loss, state.temperature.opt_state, log_prob, target_entropy)
    return fn, state.temperature.params


def _vjp(loss: str, state: sac.SACState, batch: dict):
    """``jax.vjp``'s backward function of one loss w.r.t. its network's parameters."""
    return jax.vjp(*loss_of(loss, state, batch))[1]


VJPS: dict[str, Callable] = {name: functools.partial(_vjp, name) for name in LOSSES}


def _producers(jaxpr) -> dict:
    return {var: eqn for eqn in jaxpr.eqns for var in eqn.outvars}


def _is_constant(atom, producers: dict, constvars: set) -> bool:
    """A literal, a hoisted constant, or a broadcast/convert of one (no dependence on any input)."""
    if isinstance(atom, jex.Literal) or atom in constvars:
        return True
    eqn = producers.get(atom)
    return (
        eqn is not None
        and eqn.primitive.name in ("broadcast_in_dim", "convert_element_type", "reshape")
        and all(_is_constant(x, producers, constvars) for x in eqn.invars)
    )


def residuals(vjp_of: Callable, state: Any, batch: dict) -> dict:
    """Bytes of the residuals held by ``vjp_of(state, batch)``, classified (see the module docstring).

    ``state`` and ``batch`` may be ``jax.ShapeDtypeStruct`` trees: nothing is allocated.
    """
    leaves = jax.tree.leaves(jax.eval_shape(vjp_of, state, batch))  # ShapeDtypeStructs of the vjp's residuals
    raw = sum(nbytes(leaf) for leaf in leaves)

    in_paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path((state, batch))]
    in_tree = jax.tree.structure((state, batch))

    def flat(*in_leaves):
        return jax.tree.leaves(vjp_of(*jax.tree.unflatten(in_tree, in_leaves)))

    closed = jax.make_jaxpr(flat)(*jax.tree.leaves((state, batch)))
    jaxpr = closed.jaxpr
    if len(jaxpr.outvars) != len(leaves):
        raise AssertionError(f"make_jaxpr found {len(jaxpr.outvars)} residuals, eval_shape {len(leaves)}")
    producers = _producers(jaxpr)
    constvars = set(jaxpr.constvars)
    invar_path = dict(zip(jaxpr.invars, in_paths))

    kinds = dict.fromkeys(("input", "literal", "constant_broadcast", "bool_mask", "float_activation", "other"), 0)
    counts = dict.fromkeys(kinds, 0)
    by_dtype: dict[str, int] = {}
    inputs: list[str] = []
    seen: set = set()
    duplicates = 0
    for var in jaxpr.outvars:
        aval = var.aval
        size = nbytes(aval)
        if not isinstance(var, jex.Literal):
            if var in seen:
                duplicates += 1
                continue
            seen.add(var)
        if isinstance(var, jex.Literal):
            kind = "literal"
        elif var in invar_path:
            kind = "input"
            inputs.append(f"{invar_path[var]}: {aval.str_short()}")
        elif _is_constant(var, producers, constvars):
            kind = "constant_broadcast"
        elif aval.dtype == np.bool_:
            kind = "bool_mask"
        elif jnp.issubdtype(aval.dtype, jnp.floating):
            kind = "float_activation"
        else:
            kind = "other"
        kinds[kind] += size
        counts[kind] += 1
        if kind != "input":
            by_dtype[np.dtype(aval.dtype).name] = by_dtype.get(np.dtype(aval.dtype).name, 0) + size
    new = sum(size for kind, size in kinds.items() if kind != "input")
    return {
        "residual_leaf_bytes": raw,  # every leaf of the vjp function, as jax.eval_shape gives them
        "residual_leaves": len(leaves),
        "duplicate_leaves": duplicates,
        "residual_bytes": new,  # distinct residuals that are not inputs of the update (state, batch)
        "residual_bytes_without_constant_broadcasts": new - kinds["constant_broadcast"],
        "by_kind": kinds,
        "count_by_kind": counts,
        "by_dtype": by_dtype,
        "inputs_saved": inputs,
    }


# ----------------------------------------------------------------------------------------------------- measure


def measure(precision: str, width: int, batch_size: int, obs_dim: int, action_dim: int) -> dict:
    """Every component's bytes for one configuration, from abstract values only."""
    config = make_config(precision, width, batch_size)
    state = abstract_state(config, obs_dim, action_dim)
    batch = abstract_batch(batch_size, obs_dim, action_dim, REPLAY_DTYPES.get(precision, jnp.float32))
    state_info = state_breakdown(state)
    res = {name: residuals(VJPS[name], state, batch) for name in LOSSES}
    for name in LOSSES:
        res[name]["print_saved_residuals"] = cross_check(name, state, batch, res[name])
    components = {"state": state_info["total"], "batch": tree_bytes(batch)}
    components.update({f"{name}_residuals": res[name]["residual_bytes"] for name in LOSSES})
    without = sum(r["by_kind"]["constant_broadcast"] for r in res.values())
    grads = tree_bytes(state.actor.params) + tree_bytes(state.critic.params) + tree_bytes(state.temperature.params)
    return {
        "precision": precision,
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(config).items()},
        "width": width,
        "batch_size": batch_size,
        "hidden_layers": HIDDEN_LAYERS,
        "obs_dim": obs_dim,
        "action_dim": action_dim,
        "components": components,
        "total_bytes": sum(components.values()),
        "total_bytes_without_constant_broadcasts": sum(components.values()) - without,
        "state": state_info,
        "residuals": res,
        "batch": {k: f"{np.dtype(v.dtype).name}{list(v.shape)}" for k, v in batch.items()},
        "batch_bytes_if_stored_fp16": tree_bytes(abstract_batch(batch_size, obs_dim, action_dim, jnp.float16)),
        "gradients_bytes": grads,
    }


def compare(base: dict, low: dict) -> dict:
    """fp32/fp16 ratios of every component and of the totals, and each component's ``excess_over_half``."""
    ratio = lambda a, b: (a / b) if a and b else None
    comps = {c: ratio(base["components"][c], low["components"][c]) for c in base["components"]}
    parts = {p: ratio(base["state"]["parts"][p], low["state"]["parts"][p]) for p in STATE_PARTS}
    excess = {c: low["components"][c] - base["components"][c] / 2 for c in base["components"]}
    state_excess = {p: low["state"]["parts"][p] - base["state"]["parts"][p] / 2 for p in STATE_PARTS}
    total = base["total_bytes"] / low["total_bytes"]
    low_name = low["precision"]
    # Total ratio if one component alone were exactly halved (what each one costs the headline ratio).
    if_halved = {c: base["total_bytes"] / (low["total_bytes"] - excess[c]) for c in base["components"]}
    kahan = low["state"]["parts"]["kahan_gradient_compensation"] + low["state"]["parts"]["kahan_momentum_compensation"]
    masks = sum(low["residuals"][loss]["by_kind"]["bool_mask"] for loss in LOSSES)
    # The best any fp16 implementation with these methods could do: its state (fp16 params, moments and target
    # plus both Kahan buffers) as it is, everything else exactly half of fp32's.
    #   ceiling = T32 / (S16 + (T32 - S32) / 2)
    base_state, low_state = base["components"]["state"], low["components"]["state"]
    ceiling = base["total_bytes"] / (low_state + (base["total_bytes"] - base_state) / 2)
    paper = PAPER_TABLE_11_MB.get((base["width"], base["batch_size"]))
    base_masks = sum(base["residuals"][loss]["by_kind"]["bool_mask"] for loss in LOSSES)
    return {
        "width": base["width"],
        "batch_size": base["batch_size"],
        "total_ratio": total,
        # Counterfactuals, to show what keeps the ratio below 2 (not configurations that exist):
        "total_ratio_without_kahan_buffers": base["total_bytes"] / (low["total_bytes"] - kahan),
        "total_ratio_without_kahan_buffers_and_bool_masks": (
            (base["total_bytes"] - base_masks) / (low["total_bytes"] - kahan - masks)
        ),
        "total_ratio_without_constant_broadcasts": (
            base["total_bytes_without_constant_broadcasts"] / low["total_bytes_without_constant_broadcasts"]
        ),
        "component_ratios": comps,
        "state_part_ratios": parts,
        "excess_over_half_bytes": excess,
        "state_excess_over_half_bytes": state_excess,
        "total_ratio_if_component_halved": if_halved,
        "largest_excess": max(excess, key=excess.get),
        "total_ratio_ceiling_with_kahan_state": ceiling,
        "target_ratio": TARGET_RATIO,
        "target_met": bool(total >= TARGET_RATIO),
        "target_reachable_with_kahan_state": bool(ceiling >= TARGET_RATIO),
        "total_mb": {BASE: base["total_bytes"] / 1e6, low_name: low["total_bytes"] / 1e6},
        "paper_table_11_mb": None if paper is None else dict(zip((BASE, LOW), paper)),
    }


# ------------------------------------------------------------------------------------------------ cross-check

_DTYPE_ABBREV = dict(f16=np.float16, bf16=jnp.bfloat16, f32=np.float32, f64=np.float64, bool=np.bool_)
_DTYPE_ABBREV.update(i32=np.int32, u32=np.uint32, i64=np.int64, u8=np.uint8, u16=np.uint16)


def parse_saved_residuals(text: str) -> list[tuple[int, str]]:
    """``(bytes, description)`` of each line ``jax.ad_checkpoint.print_saved_residuals`` printed."""
    rows = []
    for line in text.strip().splitlines():
        match = re.match(r"^(\w+)\[([\d,]*)\] (.*)$", line.strip())
        if match is None:
            raise ValueError(f"unparsed print_saved_residuals line: {line!r}")
        dtype, dims, description = match.groups()
        shape = [int(d) for d in dims.split(",") if d]
        rows.append((int(np.prod(shape, dtype=np.int64)) * np.dtype(_DTYPE_ABBREV[dtype]).itemsize, description))
    return rows


def saved_residuals_of(loss: str, state: sac.SACState, batch: dict) -> list[tuple[int, str]]:
    """``print_saved_residuals`` of one loss as a function of its parameters alone (the rest closed over: it
    differentiates every argument it is given), with real arrays or under ``jax.eval_shape``."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        jax.ad_checkpoint.print_saved_residuals(*loss_of(loss, state, batch))
    return parse_saved_residuals(out.getvalue())


def cross_check(loss: str, state: Any, batch: dict, ours: dict) -> dict:
    """:func:`residuals`' raw count of one loss against ``print_saved_residuals``, abstractly (no allocation)."""
    found: list = []

    def run(state, batch):
        found.append(saved_residuals_of(loss, state, batch))
        return 0

    jax.eval_shape(run, state, batch)
    rows = found[0]
    groups: dict[str, int] = {}
    for size, description in rows:
        kind = next(
            (
                k
                for k in ("from the argument", "from a constant", "from a literal", "output of")
                if description.startswith(k)
            ),
            "other",
        )
        groups[kind] = groups.get(kind, 0) + size
    total = sum(size for size, _ in rows)
    return {
        "print_saved_residuals_bytes": total,
        "print_saved_residuals_lines": len(rows),
        "print_saved_residuals_by_description": groups,
        "equal": ours["residual_leaf_bytes"] == total and ours["residual_leaves"] == len(rows),
    }


# ---------------------------------------------------------------------------------------------------- driver


def run_benchmark(
    sizes: Sequence[tuple[int, int]],
    obs_dim: int = OBS_DIM,
    action_dim: int = ACTION_DIM,
    log: Callable[[str], None] = print,
) -> dict:
    start = time.perf_counter()
    rows, comparisons, beyond = [], [], []
    for width, batch_size in sizes:
        pair = {}
        for precision in PRECISIONS:
            log(f"tracing {precision} width {width} batch {batch_size} ...")
            pair[precision] = measure(precision, width, batch_size, obs_dim, action_dim)
            rows.append(pair[precision])
        comparisons.append(compare(pair[BASE], pair[LOW]))
        for precision, goal in BEYOND_GOALS.items():
            entry = compare(pair[BASE], pair[precision])
            beyond.append(
                {
                    "precision": precision,
                    "width": width,
                    "batch_size": batch_size,
                    "total_ratio": entry["total_ratio"],
                    "goal": goal,
                    "goal_met": bool(entry["total_ratio"] >= goal),
                    "component_ratios": entry["component_ratios"],
                    "state_part_ratios": entry["state_part_ratios"],
                    "excess_over_half_bytes": entry["excess_over_half_bytes"],
                    "total_mb": entry["total_mb"],
                }
            )
    checks = [
        {
            "precision": r["precision"],
            "width": r["width"],
            "batch_size": r["batch_size"],
            "loss": loss,
            "residual_leaf_bytes": r["residuals"][loss]["residual_leaf_bytes"],
            **r["residuals"][loss]["print_saved_residuals"],
        }
        for r in rows
        for loss in LOSSES
    ]
    check = {"all_equal": all(c["equal"] for c in checks), "checks": checks}
    return {
        "benchmark": RESULT_NAME,
        "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "jax_version": jax.__version__,
        "flax_version": flax.__version__,
        "lpjax_version": getattr(lpjax, "__version__", None),
        "python": sys.version.split()[0],
        "method": {
            "summary": "bytes = prod(shape) * itemsize of abstract values; no device memory statistics, nothing "
            "allocated (jax.eval_shape / jax.make_jaxpr on jax.ShapeDtypeStruct inputs)",
            "state": "jax.eval_shape(sac.init) -> SACState; sum over leaves, grouped by role from the key path",
            "residuals": "jax.eval_shape(lambda s, b: jax.vjp(loss * loss_scale, params)[1]) -> leaves of the "
            "vjp function = residual_leaf_bytes; jax.make_jaxpr of the same function classifies each "
            "residual (input of the update / literal / constant broadcast / bool mask / float "
            "activation); residual_bytes = distinct residuals that are not inputs (inputs are in "
            "the state or batch already)",
            "batch": "obs, action, reward, discount, next_obs, as the replay buffer stores them: float32, float16 "
            "for fp16_sr and fp16_sr_8bit (replay_dtype='fp16')",
            "total": "state + critic, actor and temperature residual_bytes + batch (gradients and XLA temporaries "
            "not included; critic and actor residuals are summed although they are live one at a time)",
            "ratio": "fp32 total bytes / fp16 total bytes; target >= 1.8",
            "ceiling": "total_ratio_ceiling_with_kahan_state = fp32 total / (fp16 state + (fp32 total - fp32 "
            "state) / 2): the ratio if everything but the fp16 training state (params, Adam moments, "
            "target critic and the two Kahan buffers) were exactly half of fp32's",
            "cross_check": "raw residual count vs jax.ad_checkpoint.print_saved_residuals of each loss as a "
            "function of its parameters only (state and batch closed over), under jax.eval_shape, "
            "for every configuration",
        },
        "precisions": {
            name: {k: dataclasses.asdict(v) if k == "methods" else v for k, v in spec.items()}
            for name, spec in PRECISIONS.items()
        },
        "obs_dim": obs_dim,
        "action_dim": action_dim,
        "hidden_layers": HIDDEN_LAYERS,
        "env_note": f"obs dim {obs_dim}, action dim {action_dim}: dm_control walker-walk from states",
        "sizes": [{"width": w, "batch_size": b} for w, b in sizes],
        "target_ratio": TARGET_RATIO,
        "paper_table_11_ratio_range": list(PAPER_TABLE_11),
        "results": rows,
        "comparisons": comparisons,
        "target_met": {f"w{c['width']}_b{c['batch_size']}": c["target_met"] for c in comparisons},
        "beyond": beyond,
        "beyond_goals_met": {f"{b['precision']}/w{b['width']}_b{b['batch_size']}": b["goal_met"] for b in beyond},
        "cross_check": check,
        "seconds": time.perf_counter() - start,
    }


def rematerialize_time(width: int, batch_size: int, obs_dim: int, action_dim: int, rounds: int = 5) -> dict:
    """Milliseconds per compiled ``sac.update`` of ``fp16_sr_8bit`` with and without ``rematerialize`` at one
    size, on this machine: medians of interleaved rounds (:func:`benchmarks.timing.interleaved`), states donated."""
    rng = np.random.default_rng(0)
    batch = jax.tree.map(
        lambda x: jnp.asarray(x, jnp.float16), random_transitions(rng, batch_size, obs_dim, action_dim)
    )
    states, steps = {}, {}
    for name in ("fp16_sr_8bit", "fp16_sr_8bit_remat"):
        config = make_config(name, width, batch_size)
        states[name] = sac.init(jax.random.key(0), jnp.zeros(obs_dim), action_dim, config)
        steps[name] = sac.update.lower(states[name], batch).compile()

    def update(name):
        states[name], metrics = steps[name](states[name], batch)
        return metrics

    timing = interleaved({name: functools.partial(update, name) for name in states}, rounds)
    ms = {name: 1e3 * timing[name]["median_s"] for name in states}
    return {
        "width": width,
        "batch_size": batch_size,
        "backend": jax.default_backend(),
        "ms_per_update": ms,
        "time_ratio": ms["fp16_sr_8bit_remat"] / ms["fp16_sr_8bit"],
        "rounds": rounds,
        "machine": timing["machine"],
        "note": "float16 is emulated on a CPU: the ratio, not the milliseconds, is the figure; on a GPU the "
        "recomputed forward passes cost about a third of a backward pass each",
    }


def _mib(n: float) -> str:
    return f"{n / 2**20:10.2f}"


def format_table(result: dict) -> str:
    by_key = {(r["precision"], r["width"], r["batch_size"]): r for r in result["results"]}
    header = (
        f"{'width':>6} {'batch':>6} {'prec':<12} {'state':>10} {'critic res':>10} {'actor res':>10} "
        f"{'temp res':>10} {'batch':>10} {'total MiB':>10}"
    )
    lines = [header, "-" * len(header)]
    for comp in result["comparisons"]:
        w, b = comp["width"], comp["batch_size"]
        for precision in PRECISIONS:
            c = by_key[(precision, w, b)]["components"]
            lines.append(
                f"{w:>6} {b:>6} {precision:<12} {_mib(c['state'])} {_mib(c['critic_residuals'])} "
                f"{_mib(c['actor_residuals'])} {_mib(c['temperature_residuals'])} {_mib(c['batch'])} "
                f"{_mib(by_key[(precision, w, b)]['total_bytes'])}"
            )
        r = comp["component_ratios"]
        lines.append(
            f"{'':>6} {'':>6} {'fp32/fp16':<12} {r['state']:>10.3f} {r['critic_residuals']:>10.3f} "
            f"{r['actor_residuals']:>10.3f} {r['temperature_residuals']:>10.3f} {r['batch']:>10.3f} "
            f"{comp['total_ratio']:>10.3f}   (without zero broadcasts: "
            f"{comp['total_ratio_without_constant_broadcasts']:.3f}; "
            f"target {TARGET_RATIO}: {'MET' if comp['target_met'] else 'MISSED'}; "
            f"largest excess: {comp['largest_excess']})"
        )
        lines.append(
            f"{'':>13} fp16 bytes beyond half of fp32 (MiB): "
            + ", ".join(
                f"{k.replace('_residuals', ' res')} {v / 2**20:.2f}" for k, v in comp["excess_over_half_bytes"].items()
            )
            + f"; ratio without the Kahan buffers {comp['total_ratio_without_kahan_buffers']:.3f}, "
            f"and without bool masks {comp['total_ratio_without_kahan_buffers_and_bool_masks']:.3f}"
        )
        paper = comp["paper_table_11_mb"]
        lines.append(
            f"{'':>13} ceiling with the Kahan state (all else halved): "
            f"{comp['total_ratio_ceiling_with_kahan_state']:.3f}"
            + (
                ""
                if paper is None
                else f"; MB here {comp['total_mb'][BASE]:.0f} / {comp['total_mb'][LOW]:.0f}"
                f", paper Table 11 {paper[BASE]} / {paper[LOW]}"
            )
        )
    lines.append("")
    lines.append("beyond the paper, fp32 / total (goal):")
    for b in result["beyond"]:
        r = b["component_ratios"]
        lines.append(
            f"  {b['precision']:<13} w{b['width']:<5} b{b['batch_size']:<5} {b['total_ratio']:.3f}x "
            f"(goal {b['goal']}: {'MET' if b['goal_met'] else 'MISSED'}; state {r['state']:.3f}, critic res "
            f"{r['critic_residuals']:.3f}, actor res {r['actor_residuals']:.3f}, batch {r['batch']:.3f})"
        )
    lines.append("")
    lines.append(
        "state by role, fp32/fp16 ratio:  "
        + ", ".join(
            f"{p} {v:.2f}" if v else f"{p} (fp16 only)"
            for p, v in result["comparisons"][0]["state_part_ratios"].items()
        )
    )
    if "rematerialize_time" in result:
        t = result["rematerialize_time"]
        lines.append(
            f"rematerialize, time per update at w{t['width']} b{t['batch_size']} ({t['backend']}): "
            f"{t['ms_per_update']['fp16_sr_8bit']:.1f} -> {t['ms_per_update']['fp16_sr_8bit_remat']:.1f} ms "
            f"({t['time_ratio']:.2f}x)"
        )
    check = result["cross_check"]
    lines.append(
        f"raw residual bytes vs jax.ad_checkpoint.print_saved_residuals, every configuration and loss: "
        f"{'all equal' if check['all_equal'] else 'DIFFERENT'}"
    )
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """Left: each precision's MiB by component per size (fp32 plain, the others hatched); right: the ratios."""
    by_key = {(r["precision"], r["width"], r["batch_size"]): r for r in result["results"]}
    comps = result["comparisons"]
    labels = [f"w{c['width']}\nb{c['batch_size']}" for c in comps]
    x = np.arange(len(comps))
    colors = dict(zip(COMPONENTS, ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:gray")))
    offset = dict(xytext=(0, 2), textcoords="offset points", ha="center")
    with figure(path, 1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [1.25, 1]}) as (_, (ax, ax_r)):
        bar = 0.8 / len(PRECISIONS)
        for j, precision in enumerate(PRECISIONS):
            pos = x + (j - (len(PRECISIONS) - 1) / 2) * bar
            bottom = np.zeros(len(comps))
            style = dict(edgecolor="black", hatch="//") if j else dict(edgecolor="white")
            for comp in COMPONENTS:
                rows = [by_key[(precision, c["width"], c["batch_size"])] for c in comps]
                vals = np.array([row["components"][comp] for row in rows]) / 2**20
                label = comp.replace("_", " ") if j == 0 else None
                ax.bar(pos, vals, bar, bottom=bottom, color=colors[comp], linewidth=0.5, label=label, **style)
                bottom += vals
            for p, total in zip(pos, bottom):
                ax.annotate(precision.replace("fp16_", ""), (p, total), fontsize=6, rotation=90, **offset)
        for xi, c in zip(x, comps):
            top = by_key[(BASE, c["width"], c["batch_size"])]["total_bytes"] / 2**20
            ax.annotate(
                f"{c['total_ratio']:.2f}x", (xi, top), fontsize=9, weight="bold", **offset | {"xytext": (0, 12)}
            )
        ax.set_xticks(x, labels)
        ax.set(ylabel="MiB (counted from shapes and dtypes)", ylim=(0, ax.get_ylim()[1] * 1.1))
        title = "SAC training memory: fp32 (plain), fp16 + the paper's methods, fp16 with stochastic rounding (sr) and "
        ax.set_title(title + "with 8-bit moments (sr_8bit) (hatched)\nbold: fp32/fp16 total", fontsize=9)
        ax.legend(fontsize=8, loc="upper left")

        shown = [comp for comp in COMPONENTS if comp != "temperature_residuals"]  # a few KiB: not worth a bar
        series = [("total", [c["total_ratio"] for c in comps], "black")]
        series += [(comp, [c["component_ratios"][comp] for c in comps], colors[comp]) for comp in shown]
        width = 0.8 / len(series)
        for i, (name, vals, color) in enumerate(series):
            ax_r.bar(x - 0.4 + width * (i + 0.5), vals, width, label=name.replace("_", " "), color=color)
        ceiling = [c["total_ratio_ceiling_with_kahan_state"] for c in comps]
        label = "total's ceiling with the Kahan state"
        ax_r.scatter(
            x - 0.4 + width / 2, ceiling, marker="_", s=400, color="tab:red", linewidths=2, zorder=3, label=label
        )
        for precision, marker in zip(BEYOND_GOALS, ("o", "s", "^")):
            ratios = [b["total_ratio"] for b in result["beyond"] if b["precision"] == precision]
            color = "tab:cyan" if marker == "o" else "tab:pink"
            label = f"total, {precision} (goal {BEYOND_GOALS[precision]}x)"
            ax_r.scatter(x, ratios, marker=marker, color=color, edgecolors="black", zorder=4, label=label)
        ax_r.axhline(2.0, color="k", linewidth=0.8, linestyle=":", label="2x (everything halved)")
        ax_r.axhline(TARGET_RATIO, color="tab:red", linewidth=1, linestyle="--", label=f"target {TARGET_RATIO}x")
        ax_r.axhspan(*PAPER_TABLE_11, color="tab:olive", alpha=0.15, label="paper Table 11 (V100)")
        ax_r.set_xticks(x, labels)
        ax_r.set(ylabel="fp32 bytes / fp16 bytes", ylim=(0, 3.25))
        ax_r.set_title(
            f"ratios; obs {result['obs_dim']}, action {result['action_dim']}, "
            f"{result['hidden_layers']} hidden layers; jax {result['jax_version']}",
            fontsize=9,
        )
        ax_r.legend(fontsize=7, loc="upper center", ncol=3)


def _sizes(text: str) -> list[tuple[int, int]]:
    try:
        pairs = [tuple(int(v) for v in item.split("x")) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes are WIDTHxBATCH[,WIDTHxBATCH...], got {text!r}") from None
    if not pairs or any(len(p) != 2 or min(p) < 1 for p in pairs):
        raise argparse.ArgumentTypeError(f"sizes are WIDTHxBATCH[,WIDTHxBATCH...] of positive ints, got {text!r}")
    return pairs


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    cli = parser(RESULT_NAME, __doc__, quick=f"tiny sizes {QUICK_SIZES} (width, batch): a smoke test")
    cli.add_argument("--sizes", type=_sizes, default=None, help="WIDTHxBATCH,... (default: the paper's four)")
    cli.add_argument("--obs-dim", type=int, default=OBS_DIM, help=f"observation dim (default {OBS_DIM}, walker)")
    cli.add_argument("--action-dim", type=int, default=ACTION_DIM, help=f"action dim (default {ACTION_DIM}, walker)")
    cli.add_argument(
        "--time_size", type=_sizes, default=None, help="WIDTHxBATCH at which to time rematerialize (default 1024x1024)"
    )
    args = cli.parse_args(argv)
    if args.obs_dim < 1 or args.action_dim < 1:
        cli.error("--obs-dim and --action-dim must be >= 1")
    if args.sizes is None:
        args.sizes = list(QUICK_SIZES if args.quick else FULL_SIZES)
    if args.time_size is None and not args.quick:
        args.time_size = [(1024, 1024)]
    if args.time_size is not None and len(args.time_size) != 1:
        cli.error("--time_size takes one WIDTHxBATCH")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    result = run_benchmark(args.sizes, args.obs_dim, args.action_dim)
    if args.time_size:
        result["rematerialize_time"] = rematerialize_time(*args.time_size[0], args.obs_dim, args.action_dim)
    result["quick"] = bool(args.quick)
    result["command"] = command_line("benchmarks.sac_memory", argv)
    return finish(args, result, format_table(result), plot)


if __name__ == "__main__":
    main(sys.argv[1:])
