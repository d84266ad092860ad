"""Memory of SAC training, float32 against float16 with all of the paper's methods, counted from shapes and dtypes.

Björck et al. (2021), Table 11, report that pure-fp16 SAC uses 1.53-1.73x less GPU memory than fp32 (V100); the
target here is ``TARGET_RATIO``. XLA:CPU emulates float16, so nothing is measured from a device: every figure is
``prod(shape) * itemsize`` of abstract values (``jax.eval_shape`` / ``jax.make_jaxpr`` on ``jax.ShapeDtypeStruct``
inputs, nothing allocated), the same on every platform; the json's ``method`` says how each component is counted.
Beyond the paper (:data:`BEYOND_GOALS`): stochastic rounding instead of the two Kahan buffers (and a float16
replay), hAdam's moments blockwise 8-bit, and ``rematerialize``, whose cost in time this CPU measures
(``--time_size``).

A count of what an update holds, not a measured peak: the critic's and actor's residuals are not alive at once,
gradients and XLA's temporaries are not counted. ``excess_over_half`` attributes where fp16 falls short of 2x.
"""

from __future__ import annotations

import argparse
import collections
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
from benchmarks import common
from benchmarks.common import command_line, figure, finish, parser, random_transitions
from benchmarks.timing import interleaved
from lpjax.agents import sac
from lpjax.methods import PrecisionMethods
from lpjax.optim import loss_scale_or_one

RESULT_NAME = "sac_memory"
TARGET_RATIO = 1.8
PAPER_TABLE_11 = (1.53, 1.73)  # fp32 / fp16 peak GPU memory, V100 (Björck et al. 2021)
PAPER_TABLE_11_MB = {(1024, 1024): (128, 77), (1024, 4096): (320, 185), (4096, 1024): (1265, 826)}
PAPER_TABLE_11_MB[(4096, 4096)] = (1973, 1163)
"""Table 11 itself, MB (cheetah-run from states, V100, PyTorch) per (width, batch): (fp32, fp16 with the methods)."""
OBS_DIM, ACTION_DIM = 24, 6  # walker-walk (dm_control) from states
HIDDEN_LAYERS = 2
FULL_SIZES = ((1024, 1024), (1024, 4096), (4096, 1024), (4096, 4096))  # (hidden width, batch size)
QUICK_SIZES = ((16, 8), (32, 16))
_SR = dict(kahan_gradients=False, kahan_momentum=False, stochastic_rounding=True)
_8BIT = PrecisionMethods.paper(**_SR, moment_dtype="fp8")
PRECISIONS: dict[str, dict[str, Any]] = {
    "fp32": dict(policy="fp32"),
    "fp16": dict(policy="fp16", methods=PrecisionMethods.paper()),
    "fp16_sr": dict(policy="fp16", methods=PrecisionMethods.paper(**_SR)),
    "fp16_sr_8bit": dict(policy="fp16", methods=_8BIT),
    "fp16_sr_8bit_remat": dict(policy="fp16", methods=_8BIT, rematerialize=True),
}
REPLAY_DTYPES = dict.fromkeys(("fp16_sr", "fp16_sr_8bit", "fp16_sr_8bit_remat"), jnp.float16)
"""The stochastic-rounding configs store float16 transitions (``experiments/configs/sac/fp16_sr.py``)."""
BASE, LOW = "fp32", "fp16"
BEYOND_GOALS = {"fp16_sr": 2.0, "fp16_sr_8bit": 2.5, "fp16_sr_8bit_remat": 2.5}
"""fp32 / total goals beyond the paper."""
LOSSES = ("critic", "actor", "temperature")
COMPONENTS = ("state", "critic_residuals", "actor_residuals", "temperature_residuals", "batch")
STATE_PARTS = ("params", "adam_moments", "kahan_gradient_compensation", "target_critic")
STATE_PARTS += ("kahan_momentum_compensation", "scalars")
KINDS = ("input", "literal", "constant_broadcast", "bool_mask", "float_activation", "other")
"""What a residual is: an input of the update (in the state or batch already: not counted again), a literal, a
broadcast of a constant (``jax.nn.relu`` saves ``full_like(g, 0)``; :func:`lpjax.nn.dense.relu` only its output),
a boolean mask, a computed activation."""


def nbytes(leaf: Any) -> int:
    """``prod(shape) * itemsize`` of an array or ``jax.ShapeDtypeStruct``."""
    return int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize


def tree_bytes(tree: Any) -> int:
    return sum(nbytes(leaf) for leaf in jax.tree.leaves(tree))


def make_config(precision: str, width: int, batch_size: int) -> sac.SACConfig:
    return sac.SACConfig(hidden_dims=(width,) * HIDDEN_LAYERS, batch_size=batch_size, **PRECISIONS[precision])


def abstract_batch(batch_size: int, obs_dim: int, action_dim: int, dtype: Any = jnp.float32) -> dict:
    """The replay batch ``sac.update`` takes, as ``jax.ShapeDtypeStruct`` leaves."""
    sizes = dict(obs=(obs_dim,), action=(action_dim,), reward=(), discount=(), next_obs=(obs_dim,))
    return {name: jax.ShapeDtypeStruct((batch_size, *shape), dtype) for name, shape in sizes.items()}


_PART_PATTERNS = (
    (r"\.key$", "scalars"),  # the PRNG keys: the agent's, and stochastic rounding's (optimizers and target)
    (r"^\.target_compensation", "kahan_momentum_compensation"),
    (r"^\.target_critic", "target_critic"),
    (r"\.compensation", "kahan_gradient_compensation"),
    (r"\.(mu|nu|nu_sqrt)(\[|$)", "adam_moments"),
    (r"^\.(actor|critic|temperature)\.params", "params"),
)
"""A :class:`SACState` leaf's role is the first of these its key path (``jax.tree_util.keystr``) matches; else
``scalars`` (step, Adam counts, loss scale and its counters, eps scale)."""


def state_breakdown(state: Any) -> dict:
    """Bytes of the state by role (:data:`STATE_PARTS`, from :data:`_PART_PATTERNS`), by dtype, and per network."""
    parts, by_dtype, by_network = dict.fromkeys(STATE_PARTS, 0), collections.Counter(), collections.Counter()
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        name = jax.tree_util.keystr(path)
        parts[next((part for pattern, part in _PART_PATTERNS if re.search(pattern, name)), "scalars")] += nbytes(leaf)
        by_dtype[np.dtype(leaf.dtype).name] += nbytes(leaf)
        by_network[name[1:].split(".")[0].split("[")[0]] += nbytes(leaf)
    count = lambda net: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(getattr(state, net).params))
    out = dict(total=tree_bytes(state), parts=parts, by_dtype=dict(by_dtype), by_field=dict(by_network))
    return out | {"param_count": {net: count(net) for net in ("actor", "critic")}}


def loss_of(loss: str, state: sac.SACState, batch: dict) -> tuple[Callable, Any]:
    """``(params -> loss * loss scale in float32, params)`` of the critic, actor or temperature loss on
    ``sac.update``'s inputs, as ``lpjax.agents.training.gradient_step`` differentiates it."""
    _, critic_net = sac.networks(state.config, state.action_dim)
    _, critic_key, actor_key, _ = jax.random.split(state.key, 4)
    encode = lambda obs: jax.lax.stop_gradient(critic_net.apply(state.critic.params, obs, method=sac.SACCritic.encode))
    next_features, features = encode(batch["next_obs"]), encode(batch["obs"])
    if loss == "critic":
        network, fn, args = state.critic, sac.critic_loss, (state, batch, next_features, critic_key)
    elif loss == "actor":
        network, fn, args = state.actor, sac.actor_loss, (state, features, actor_key)
    else:
        _, log_prob = sac.actor_loss(state.actor.params, state, features, actor_key)
        target = -float(state.action_dim) if state.config.target_entropy is None else state.config.target_entropy
        network, fn, args = state.temperature, sac.temperature_loss, (log_prob, target)
    scale = loss_scale_or_one(network.opt_state)
    return (lambda params: fn(params, *args)[0].astype(jnp.float32) * scale), network.params


def _vjp(loss: str, state: sac.SACState, batch: dict):
    """``jax.vjp``'s backward function of one loss w.r.t. its network's parameters."""
    return jax.vjp(*loss_of(loss, state, batch))[1]


VJPS: dict[str, Callable] = {name: functools.partial(_vjp, name) for name in LOSSES}


def _is_constant(atom, producers: dict, constvars: set) -> bool:
    """A literal, a hoisted constant, or a broadcast/convert of one (no dependence on any input)."""
    if isinstance(atom, jex.Literal) or atom in constvars:
        return True
    eqn = producers.get(atom)
    if eqn is None or eqn.primitive.name not in ("broadcast_in_dim", "convert_element_type", "reshape"):
        return False
    return all(_is_constant(x, producers, constvars) for x in eqn.invars)


def residuals(loss: str, state: Any, batch: dict) -> dict:
    """Bytes of the residuals held by the backward function of ``loss`` (:data:`VJPS`; abstract inputs: nothing is
    allocated): ``residual_leaf_bytes``, every leaf of it; ``residual_bytes``, the distinct ones that are not inputs;
    each classified (:data:`KINDS`) by ``jax.make_jaxpr`` of the same function; and its :func:`cross_check`."""
    leaves = jax.tree.leaves(jax.eval_shape(VJPS[loss], state, batch))
    jaxpr = jax.make_jaxpr(VJPS[loss])(state, batch).jaxpr
    producers = {var: eqn for eqn in jaxpr.eqns for var in eqn.outvars}
    in_paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path((state, batch))]
    invar_path = dict(zip(jaxpr.invars, in_paths))
    kinds, counts, by_dtype = dict.fromkeys(KINDS, 0), dict.fromkeys(KINDS, 0), collections.Counter()
    inputs, seen, constvars = [], set(), set(jaxpr.constvars)
    for var in jaxpr.outvars:
        aval, literal = var.aval, isinstance(var, jex.Literal)
        if not literal and var in seen:
            continue  # a duplicate leaf
        seen.add(None if literal else var)
        if literal:
            kind = "literal"
        elif var in invar_path:
            kind = "input"
            inputs.append(f"{invar_path[var]}: {aval.str_short()}")
        elif _is_constant(var, producers, constvars):
            kind = "constant_broadcast"
        elif aval.dtype == np.bool_:
            kind = "bool_mask"
        else:
            kind = "float_activation" if jnp.issubdtype(aval.dtype, jnp.floating) else "other"
        kinds[kind] += nbytes(aval)
        counts[kind] += 1
        if kind != "input":
            by_dtype[np.dtype(aval.dtype).name] += nbytes(aval)
    new = sum(size for kind, size in kinds.items() if kind != "input")
    out = dict(residual_leaf_bytes=tree_bytes(leaves), residual_leaves=len(leaves))
    out.update(duplicate_leaves=len(leaves) - sum(counts.values()), residual_bytes=new)
    out.update(residual_bytes_without_constant_broadcasts=new - kinds["constant_broadcast"], by_kind=kinds)
    out.update(count_by_kind=counts, by_dtype=dict(by_dtype), inputs_saved=inputs)
    return out | {"print_saved_residuals": cross_check(loss, state, batch, out)}


def measure(precision: str, width: int, batch_size: int, obs_dim: int, action_dim: int) -> dict:
    """Every component's bytes for one configuration, from abstract values only."""
    print(f"tracing {precision} width {width} batch {batch_size} ...")
    config = make_config(precision, width, batch_size)
    observation = np.zeros((obs_dim,), np.float32)
    state = jax.eval_shape(lambda key: sac.init(key, observation, action_dim, config), jax.random.PRNGKey(0))
    batch = abstract_batch(batch_size, obs_dim, action_dim, REPLAY_DTYPES.get(precision, jnp.float32))
    state_info, res = state_breakdown(state), {name: residuals(name, state, batch) for name in LOSSES}
    components = {"state": state_info["total"], "batch": tree_bytes(batch)}
    components.update({f"{name}_residuals": res[name]["residual_bytes"] for name in LOSSES})
    without = sum(r["by_kind"]["constant_broadcast"] for r in res.values())
    config = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(config).items()}
    row = dict(precision=precision, config=config, width=width, batch_size=batch_size, hidden_layers=HIDDEN_LAYERS)
    row.update(obs_dim=obs_dim, action_dim=action_dim, components=components, total_bytes=sum(components.values()))
    row["total_bytes_without_constant_broadcasts"] = sum(components.values()) - without
    row.update(state=state_info, residuals=res)
    row["batch"] = {k: f"{np.dtype(v.dtype).name}{list(v.shape)}" for k, v in batch.items()}
    row["batch_bytes_if_stored_fp16"] = tree_bytes(abstract_batch(batch_size, obs_dim, action_dim, jnp.float16))
    row["gradients_bytes"] = tree_bytes((state.actor.params, state.critic.params, state.temperature.params))
    return row


def compare(base: dict, low: dict) -> dict:
    """fp32/fp16 ratios of the totals, the components and the state parts, fp16's bytes beyond half of fp32's
    (``excess_over_half``), and counterfactuals of what keeps the ratio below 2 (not configurations that exist)."""
    ratio, half = (lambda a, b: (a / b) if a and b else None), (lambda a, b: b - a / 2)
    each = lambda f, get: {k: f(get(base)[k], get(low)[k]) for k in get(base)}
    comps, parts = (lambda row: row["components"]), (lambda row: row["state"]["parts"])
    excess = each(half, comps)
    t32, t16 = base["total_bytes"], low["total_bytes"]
    total = t32 / t16
    kahan = low["state"]["parts"]["kahan_gradient_compensation"] + low["state"]["parts"]["kahan_momentum_compensation"]
    masks = [sum(row["residuals"][loss]["by_kind"]["bool_mask"] for loss in LOSSES) for row in (base, low)]
    # The best any fp16 implementation with these methods could do: its state as it is, all else half of fp32's.
    ceiling = t32 / (low["components"]["state"] + (t32 - base["components"]["state"]) / 2)
    paper = PAPER_TABLE_11_MB.get((base["width"], base["batch_size"]))
    out = dict(width=base["width"], batch_size=base["batch_size"], total_ratio=total)
    out["total_ratio_without_kahan_buffers"] = t32 / (t16 - kahan)
    out["total_ratio_without_kahan_buffers_and_bool_masks"] = (t32 - masks[0]) / (t16 - kahan - masks[1])
    without = [row["total_bytes_without_constant_broadcasts"] for row in (base, low)]
    out.update(total_ratio_without_constant_broadcasts=without[0] / without[1], component_ratios=each(ratio, comps))
    out.update(state_part_ratios=each(ratio, parts), excess_over_half_bytes=excess)
    out.update(state_excess_over_half_bytes=each(half, parts))
    out["total_ratio_if_component_halved"] = {c: t32 / (t16 - excess[c]) for c in excess}
    out.update(largest_excess=max(excess, key=excess.get), total_ratio_ceiling_with_kahan_state=ceiling)
    out.update(target_ratio=TARGET_RATIO, target_met=bool(total >= TARGET_RATIO))
    out["target_reachable_with_kahan_state"] = bool(ceiling >= TARGET_RATIO)
    out["total_mb"] = {BASE: t32 / 1e6, low["precision"]: t16 / 1e6}
    return out | {"paper_table_11_mb": None if paper is None else dict(zip((BASE, LOW), paper))}


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
        shape = tuple(int(d) for d in dims.split(",") if d)
        rows.append((nbytes(jax.ShapeDtypeStruct(shape, _DTYPE_ABBREV[dtype])), description))
    return rows


def cross_check(loss: str, state: Any, batch: dict, ours: dict) -> dict:
    """:func:`residuals`' raw count of one loss against ``print_saved_residuals`` of that loss as a function of its
    parameters alone (the rest closed over: it differentiates every argument it is given), under
    ``jax.eval_shape``."""
    with contextlib.redirect_stdout(io.StringIO()) as out:
        jax.eval_shape(lambda s, b: jax.ad_checkpoint.print_saved_residuals(*loss_of(loss, s, b)), state, batch)
    rows = parse_saved_residuals(out.getvalue())
    groups = collections.Counter()
    for size, description in rows:
        prefixes = ("from the argument", "from a constant", "from a literal", "output of")
        groups[next((k for k in prefixes if description.startswith(k)), "other")] += size
    total = sum(size for size, _ in rows)
    check = dict(print_saved_residuals_bytes=total, print_saved_residuals_lines=len(rows))
    equal = ours["residual_leaf_bytes"] == total and ours["residual_leaves"] == len(rows)
    return check | dict(print_saved_residuals_by_description=dict(groups), equal=equal)


METHOD = {
    "summary": "bytes = prod(shape) * itemsize of abstract values; no device memory statistics, nothing "
    "allocated (jax.eval_shape / jax.make_jaxpr on jax.ShapeDtypeStruct inputs)",
    "state": "jax.eval_shape(sac.init) -> SACState; sum over leaves, grouped by role from the key path",
    "residuals": "jax.eval_shape(lambda s, b: jax.vjp(loss * loss_scale, params)[1]) -> leaves of the vjp function = "
    "residual_leaf_bytes; jax.make_jaxpr of the same function classifies each residual (input of the update / "
    "literal / constant broadcast / bool mask / float activation); residual_bytes = distinct residuals that are not "
    "inputs (inputs are in the state or batch already)",
    "batch": "obs, action, reward, discount, next_obs, as the replay buffer stores them: float32, float16 for "
    "fp16_sr and fp16_sr_8bit (replay_dtype='fp16')",
    "total": "state + critic, actor and temperature residual_bytes + batch (gradients and XLA temporaries not "
    "included; critic and actor residuals are summed although they are live one at a time)",
    "ratio": "fp32 total bytes / fp16 total bytes; target >= 1.8",
    "ceiling": "total_ratio_ceiling_with_kahan_state = fp32 total / (fp16 state + (fp32 total - fp32 state) / 2): the "
    "ratio if everything but the fp16 training state (params, Adam moments, target critic and the two Kahan "
    "buffers) were exactly half of fp32's",
    "cross_check": "raw residual count vs jax.ad_checkpoint.print_saved_residuals of each loss as a function of its "
    "parameters only (state and batch closed over), under jax.eval_shape, for every configuration",
}
"""How each figure of the json is counted (the json's ``method``)."""


def run_benchmark(sizes: Sequence[tuple[int, int]], obs_dim: int, action_dim: int) -> dict:
    start = time.perf_counter()
    rows, comparisons, beyond = [], [], []
    for width, batch_size in sizes:
        pair = {precision: measure(precision, width, batch_size, obs_dim, action_dim) for precision in PRECISIONS}
        rows += pair.values()
        comparisons.append(compare(pair[BASE], pair[LOW]))
        for precision, goal in BEYOND_GOALS.items():
            entry = compare(pair[BASE], pair[precision])
            beyond.append(
                dict(precision=precision, width=width, batch_size=batch_size, total_ratio=entry["total_ratio"])
                | dict(goal=goal, goal_met=bool(entry["total_ratio"] >= goal))
                | {k: entry[k] for k in ("component_ratios", "state_part_ratios", "excess_over_half_bytes", "total_mb")}
            )
    checks = [
        {k: r[k] for k in ("precision", "width", "batch_size")}
        | {"loss": loss, "residual_leaf_bytes": r["residuals"][loss]["residual_leaf_bytes"]}
        | r["residuals"][loss]["print_saved_residuals"]
        for r in rows
        for loss in LOSSES
    ]
    precisions = {
        name: {k: dataclasses.asdict(v) if k == "methods" else v for k, v in spec.items()}
        for name, spec in PRECISIONS.items()
    }
    result = dict(benchmark=RESULT_NAME, timestamp_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    result.update(jax_version=jax.__version__, flax_version=flax.__version__)
    result.update(lpjax_version=getattr(lpjax, "__version__", None), python=sys.version.split()[0], method=METHOD)
    result.update(precisions=precisions, obs_dim=obs_dim, action_dim=action_dim, hidden_layers=HIDDEN_LAYERS)
    result["env_note"] = f"obs dim {obs_dim}, action dim {action_dim}: dm_control walker-walk from states"
    result["sizes"] = [{"width": w, "batch_size": b} for w, b in sizes]
    result.update(target_ratio=TARGET_RATIO, paper_table_11_ratio_range=list(PAPER_TABLE_11), results=rows)
    result["comparisons"] = comparisons
    result["target_met"] = {f"w{c['width']}_b{c['batch_size']}": c["target_met"] for c in comparisons}
    result["beyond"] = beyond
    result["beyond_goals_met"] = {f"{b['precision']}/w{b['width']}_b{b['batch_size']}": b["goal_met"] for b in beyond}
    result["cross_check"] = {"all_equal": all(c["equal"] for c in checks), "checks": checks}
    return result | {"seconds": time.perf_counter() - start}


def rematerialize_time(width: int, batch_size: int, obs_dim: int, action_dim: int, rounds: int = 5) -> dict:
    """Milliseconds per compiled ``sac.update`` of ``fp16_sr_8bit`` with and without ``rematerialize``, medians of
    interleaved rounds, states donated."""
    batch = random_transitions(np.random.default_rng(0), batch_size, obs_dim, action_dim)
    batch = jax.tree.map(lambda x: jnp.asarray(x, jnp.float16), batch)
    plain, remat = names = ("fp16_sr_8bit", "fp16_sr_8bit_remat")
    states, steps = {}, {}
    for name in names:
        states[name] = sac.init(jax.random.key(0), jnp.zeros(obs_dim), action_dim, make_config(name, width, batch_size))
        steps[name] = sac.update.lower(states[name], batch).compile()

    def update(name):
        states[name], metrics = steps[name](states[name], batch)
        return metrics

    timing = interleaved({name: functools.partial(update, name) for name in names}, rounds)
    ms = {name: 1e3 * timing[name]["median_s"] for name in names}
    out = dict(width=width, batch_size=batch_size, backend=jax.default_backend(), ms_per_update=ms)
    out.update(time_ratio=ms[remat] / ms[plain], rounds=rounds, machine=timing["machine"])
    note = "float16 is emulated on a CPU: the ratio, not the milliseconds, is the figure; on a GPU the recomputed "
    return out | {"note": note + "forward passes cost about a third of a backward pass each"}


def _by_size(result: dict) -> dict:
    """The rows of ``result`` by ``(precision, width, batch size)``."""
    return {(r["precision"], r["width"], r["batch_size"]): r for r in result["results"]}


def format_table(result: dict) -> str:
    by_key, rows, mib = _by_size(result), [], lambda n: n / 2**20
    verdict, pad = (lambda met: "MET" if met else "MISSED"), " " * 13
    for c in result["comparisons"]:
        for precision in PRECISIONS:
            row = by_key[(precision, c["width"], c["batch_size"])]
            values = [mib(row["components"][k]) for k in COMPONENTS] + [mib(row["total_bytes"])]
            rows.append([c["width"], c["batch_size"], precision, *values])
        ratios = [f"{c['component_ratios'][k]:.3f}" for k in COMPONENTS] + [f"{c['total_ratio']:.3f}"]
        note = f"  (without zero broadcasts: {c['total_ratio_without_constant_broadcasts']:.3f}; target "
        note += f"{TARGET_RATIO}: {verdict(c['target_met'])}; largest excess: {c['largest_excess']})"
        rows.append(["", "", "fp32/fp16", *ratios, note])
        excess = c["excess_over_half_bytes"].items()
        excess = ", ".join(f"{k.replace('_residuals', ' res')} {mib(v):.2f}" for k, v in excess)
        rows.append(
            f"{pad} fp16 bytes beyond half of fp32 (MiB): {excess}; ratio without the Kahan buffers "
            f"{c['total_ratio_without_kahan_buffers']:.3f}, and without bool masks "
            f"{c['total_ratio_without_kahan_buffers_and_bool_masks']:.3f}"
        )
        ceiling, paper, mb = c["total_ratio_ceiling_with_kahan_state"], c["paper_table_11_mb"], c["total_mb"]
        rows.append(f"{pad} ceiling with the Kahan state (all else halved): {ceiling:.3f}")
        if paper is not None:
            rows[-1] += f"; MB here {mb[BASE]:.0f} / {mb[LOW]:.0f}, paper Table 11 {paper[BASE]} / {paper[LOW]}"
    header = ["width", "batch", "prec", "state", "critic res", "actor res", "temp res", "batch", "total MiB"]
    lines = common.format_table(header, rows, [">6", ">6", "<12"] + [">10.2f"] * 6 + [""], rule=True)
    lines += ["", "beyond the paper, fp32 / total (goal):"]
    for b in result["beyond"]:
        r = b["component_ratios"]
        lines.append(
            f"  {b['precision']:<13} w{b['width']:<5} b{b['batch_size']:<5} {b['total_ratio']:.3f}x "
            f"(goal {b['goal']}: {verdict(b['goal_met'])}; state {r['state']:.3f}, critic res "
            f"{r['critic_residuals']:.3f}, actor res {r['actor_residuals']:.3f}, batch {r['batch']:.3f})"
        )
    parts = result["comparisons"][0]["state_part_ratios"].items()
    parts = ", ".join(f"{p} {v:.2f}" if v else f"{p} (fp16 only)" for p, v in parts)
    lines += ["", f"state by role, fp32/fp16 ratio:  {parts}"]
    if "rematerialize_time" in result:
        t, ms = result["rematerialize_time"], result["rematerialize_time"]["ms_per_update"]
        lines.append(
            f"rematerialize, time per update at w{t['width']} b{t['batch_size']} ({t['backend']}): "
            f"{ms['fp16_sr_8bit']:.1f} -> {ms['fp16_sr_8bit_remat']:.1f} ms ({t['time_ratio']:.2f}x)"
        )
    check = "raw residual bytes vs jax.ad_checkpoint.print_saved_residuals, every configuration and loss: "
    return "\n".join([*lines, check + ("all equal" if result["cross_check"]["all_equal"] else "DIFFERENT")])


def plot(result: dict, path: Path) -> None:
    """Left: each precision's MiB by component per size (fp32 plain, the others hatched); right: the ratios."""
    by_key = _by_size(result)
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
                vals = np.array([by_key[(precision, c["width"], c["batch_size"])]["components"][comp] for c in comps])
                label = comp.replace("_", " ") if j == 0 else None
                ax.bar(pos, vals / 2**20, bar, bottom=bottom, color=colors[comp], linewidth=0.5, label=label, **style)
                bottom += vals / 2**20
            for p, total in zip(pos, bottom):
                ax.annotate(precision.replace("fp16_", ""), (p, total), fontsize=6, rotation=90, **offset)
        bold = offset | dict(xytext=(0, 12), fontsize=9, weight="bold")
        for xi, c in zip(x, comps):
            top = by_key[(BASE, c["width"], c["batch_size"])]["total_bytes"] / 2**20
            ax.annotate(f"{c['total_ratio']:.2f}x", (xi, top), **bold)
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
        style = dict(marker="_", s=400, color="tab:red", linewidths=2, zorder=3)
        ax_r.scatter(x - 0.4 + width / 2, ceiling, **style, label="total's ceiling with the Kahan state")
        for (precision, goal), marker, color in zip(BEYOND_GOALS.items(), "os^", ("tab:cyan", "tab:pink", "tab:pink")):
            ratios = [b["total_ratio"] for b in result["beyond"] if b["precision"] == precision]
            label = f"total, {precision} (goal {goal}x)"
            ax_r.scatter(x, ratios, marker=marker, color=color, edgecolors="black", zorder=4, label=label)
        ax_r.axhline(2.0, color="k", linewidth=0.8, linestyle=":", label="2x (everything halved)")
        ax_r.axhline(TARGET_RATIO, color="tab:red", linewidth=1, linestyle="--", label=f"target {TARGET_RATIO}x")
        ax_r.axhspan(*PAPER_TABLE_11, color="tab:olive", alpha=0.15, label="paper Table 11 (V100)")
        ax_r.set_xticks(x, labels)
        ax_r.set(ylabel="fp32 bytes / fp16 bytes", ylim=(0, 3.25))
        title = f"ratios; obs {result['obs_dim']}, action {result['action_dim']}, {result['hidden_layers']} hidden "
        ax_r.set_title(title + f"layers; jax {result['jax_version']}", fontsize=9)
        ax_r.legend(fontsize=7, loc="upper center", ncol=3)


def _sizes(text: str) -> list[tuple[int, int]]:
    try:
        pairs = [tuple(int(v) for v in item.split("x")) for item in text.split(",")]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 or min(p) < 1 for p in pairs):
        raise argparse.ArgumentTypeError(f"sizes are WIDTHxBATCH[,WIDTHxBATCH...] of positive ints, got {text!r}")
    return pairs


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    cli = parser(RESULT_NAME, __doc__, quick=f"tiny sizes {QUICK_SIZES} (width, batch): a smoke test")
    cli.add_argument("--sizes", type=_sizes, default=None, help="WIDTHxBATCH,... (default: the paper's four)")
    cli.add_argument("--obs-dim", type=int, default=OBS_DIM, help=f"observation dim (default {OBS_DIM}, walker)")
    cli.add_argument("--action-dim", type=int, default=ACTION_DIM, help=f"action dim (default {ACTION_DIM}, walker)")
    cli.add_argument("--time_size", type=_sizes, help="WIDTHxBATCH at which to time rematerialize (default 1024x1024)")
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
