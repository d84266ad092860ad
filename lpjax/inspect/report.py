"""``precision_report``: where a JAX computation overflows, underflows or loses precision, with what to do about it.

    report = lpjax.inspect.precision_report(jax.grad(loss), params, batch, dtype=jnp.float16)
    print(report)                       # severity-sorted table with suggestions, then a summary per module
    report.flagged()                    # the rows with something to fix, as :class:`Row` objects

Each :class:`Row` merges the equations of one primitive at one source line in one scope (the name stack
without its ``jvp``/``transpose`` wrappers: the Flax module path inside a module) and one pass (forward or
backward); see :mod:`lpjax.inspect.statistics` for what it counts and :mod:`lpjax.inspect.interpreter` for
which equations are checked against which format.

Severity: ``"error"`` when the row produces nan/inf or overflows; ``"warning"`` when a literal is lost, or at
least :data:`WARN_FRACTION` of its values underflow or are absorbed; ``"info"`` for smaller fractions; ``"ok"``
otherwise. Rows are sorted by severity, then by the largest affected fraction, then in program order (so among
the rows producing nan/inf, the first is where they started).

Some findings are *harmless* by construction; they keep their counts, say why in ``harmless``, and sort after
the others: anything inside a Kahan summation (its compensation keeps what the rounding drops), underflow and
absorption inside :mod:`lpjax.numerics`' fp16-safe forms, a broadcast scalar (an ``eps``) absorbed in an
addition, updated parameters that become subnormal without any flushing to 0, and overflow in a backward pass
that :func:`lpjax.optim.compound_loss_scaling` guards (the step is skipped and the scale lowered).

Limitations, by construction:

* Each operation is checked on its actual inputs. In a what-if check (float32 operations checked as float16),
  rounding does not propagate: the report finds the *causes* (an underflowing ``g^2``, an ``eps`` below the
  range), not the nan they would lead to downstream.
* Operations run one by one, as the jaxpr writes them; a compiled program may keep some float16 intermediates
  in float32 inside fusions and round less often.
* A Python constant is rounded into the narrow dtype while tracing, so an ``eps`` that rounded to 0 and a
  deliberate ``+ 0.0`` look alike: both are reported as a zero constant.
* nan/inf count as *produced* where every input was finite; a nan that passes through a comparison (a count of
  ``x == max(x)``, say) and comes out as a division by zero is counted again there. Rows producing nan/inf are
  in program order: the first is where it started.
"""

from __future__ import annotations

import collections
import dataclasses
import linecache
import math
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from jax.extend import source_info_util

from lpjax.inspect.interpreter import EquationRecord, evaluate
from lpjax.inspect.statistics import OpStatistics
from lpjax.optim import OPTIMIZER_SCOPE

SEVERITIES = ("error", "warning", "info", "ok")
WARN_FRACTION = 1e-3
"""Underflow and absorption below this fraction of a row's elements are ``"info"``, not ``"warning"``."""

_TRANSFORM = re.compile(r"\b\w+\(|\)")
_SUMMARY = re.compile(r"^(?P<file>.*?):(?P<line>\d+)(?::\d+)? \((?P<function>.*)\)$")
_KAHAN = os.path.join("lpjax", "optim", "kahan.py")
_NUMERICS = os.path.join("lpjax", "numerics.py")
_LOSS_SCALER = os.path.join("lpjax", "optim", "loss_scaling.py")
_OPTAX_UPDATES = os.path.join("optax", "_src", "update.py")  # apply_updates, incremental_update (Polyak)
_HARMLESS_SOURCES = (  # (source path, problems, why they are harmless there)
    (
        _KAHAN,
        ("overflow", "underflow", "absorbed", "zero constant"),
        "inside Kahan summation: the compensation keeps what the rounding drops",
    ),
    (
        _NUMERICS,
        ("underflow", "absorbed"),
        "inside lpjax.numerics' fp16-safe forms: terms this small vanish next to those they are added to",
    ),
)
_SUBNORMAL_PARAMETERS = (
    "updated parameters near 0 become subnormal, none flushed to 0: their absolute precision is kept"
)
_LOSS_SCALED = (
    "handled by dynamic loss scaling: the step with non-finite gradients is skipped and the scale "
    "lowered (a lower init_scale, a learner's methods.init_scale, avoids the skipped steps)"
)
_SCALAR_ABSORBED = (
    "a broadcast scalar (an eps or offset) meets values that dwarf it or that it dwarfs, as an eps is meant to"
)


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of a :class:`PrecisionReport`.

    Attributes:
      primitive: the JAX primitive (``"exp"``, ``"integer_pow"``, ``"add"``, ...).
      source: ``"file:line"`` of the user code that emitted it (paths relative to the working directory, or
        to ``site-packages`` for libraries).
      function: the Python function at ``source``.
      code: the source line's text.
      scope: the name stack without transformation wrappers (the Flax module path inside a module), or ``""``.
      name_stack: the raw name stack of the row's first equation (e.g. ``critic/transpose(jvp(SACCritic))/q``).
      backward: whether it belongs to the transposed (backward) part of a gradient (its name stack has a
        ``transpose``); derivative factors JAX computes alongside the forward pass (the JVP) count as forward.
      dtype: the dtype it computes in.
      format: the format its values were checked against (``None``: not checked, only nan/inf counted).
      shape: output shape (of the first merged equation).
      equations: number of equations merged into the row.
      calls: evaluations recorded (loop iterations count separately).
      elements: output elements checked.
      overflow_frac, underflow_frac, flushed_frac, absorbed_frac: fractions of ``elements`` that overflow,
        underflow (to subnormal or zero), flush to zero, or are absorbed in an addition.
      nonfinite: nan/inf elements produced here from finite inputs.
      zero_constant: adds a literal that is 0 in its dtype (or underflows the checked format).
      power: the primitive raises to a power of magnitude at least 2 (``square``, ``x * x``, ``integer_pow``
        with ``|y| >= 2``, ``pow``).
      min_abs, max_abs: the smallest non-zero and largest finite ``|x|`` of the exact values.
      dynamic_range: ``(smallest non-zero, largest finite)`` ``|y|`` of the actual outputs, in their own dtype
        (``None`` when there were none).
      exponents: histogram ``{floor(log2 |x|): count}`` of the exact non-zero values.
      severity: ``"error"``, ``"warning"``, ``"info"`` or ``"ok"``.
      problem: what was found (``"overflow"``, ``"underflow"``, ``"absorbed"``, ``"zero constant"``,
        ``"nonfinite"``), ``""`` when nothing.
      suggestion: what to do about it (names the lpjax method that fixes it).
      harmless: why the finding does not matter here, or ``None``.
    """

    primitive: str
    source: str
    function: str
    code: str
    scope: str
    name_stack: str
    backward: bool
    dtype: str
    format: str | None
    shape: tuple[int, ...]
    equations: int
    calls: int
    elements: int
    overflow_frac: float
    underflow_frac: float
    flushed_frac: float
    absorbed_frac: float
    nonfinite: int
    zero_constant: bool
    power: bool
    min_abs: float
    max_abs: float
    dynamic_range: tuple[float, float] | None
    exponents: dict[int, int]
    severity: str
    problem: str
    suggestion: str
    harmless: str | None

    @property
    def score(self) -> float:
        """The largest affected fraction (nan/inf and lost literals count fully): the sort key within a severity."""
        nonfinite = 1.0 if self.nonfinite else 0.0
        constant = 1.0 if self.zero_constant else 0.0
        return max(nonfinite, self.overflow_frac, self.underflow_frac, self.absorbed_frac, constant)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (``exponents`` keys become strings)."""
        values = dataclasses.asdict(self)
        values["shape"] = list(self.shape)
        values["exponents"] = {str(k): v for k, v in sorted(self.exponents.items())}
        values["min_abs"] = None if math.isinf(self.min_abs) else self.min_abs
        return values


@dataclasses.dataclass(frozen=True)
class PrecisionReport:
    """The result of :func:`precision_report`.

    Attributes:
      rows: every recorded row, sorted by severity (harmless findings after the others), then by score.
      dtype: the what-if format float32/float64 operations were checked against (``None``: not checked).
      outputs: ``fn``'s outputs, as the interpreter computed them.
      equations: equations evaluated (loop bodies once per iteration).
      seconds: wall time of tracing and interpreting.
    """

    rows: tuple[Row, ...]
    dtype: str | None
    outputs: Any
    equations: int
    seconds: float

    def flagged(self, include_harmless: bool = True) -> list[Row]:
        """Rows with a finding (severity ``"error"`` or ``"warning"``), optionally without the harmless ones."""
        return [
            row
            for row in self.rows
            if row.severity in ("error", "warning") and (include_harmless or row.harmless is None)
        ]

    def find(
        self, primitive: str | None = None, source: str | None = None, scope: str | None = None, flagged: bool = True
    ) -> list[Row]:
        """Rows matching every given criterion (``source`` and ``scope`` match as substrings)."""
        rows = self.flagged() if flagged else self.rows
        return [
            row
            for row in rows
            if (primitive is None or row.primitive == primitive)
            and (source is None or source in row.source)
            and (scope is None or scope in row.scope)
        ]

    def by_scope(self) -> dict[str, list[Row]]:
        """Flagged rows grouped by scope (Flax module path), scopes in order of their worst row."""
        groups: dict[str, list[Row]] = collections.defaultdict(list)
        for row in self.flagged():
            groups[row.scope or "(top level)"].append(row)
        return dict(groups)

    def table(self, limit: int | None = 25, include_harmless: bool = True) -> str:
        """The flagged rows as a text table (at most ``limit``), then one summary line per scope."""
        rows = self.flagged(include_harmless)
        shown = rows if limit is None else rows[:limit]
        checked = self.dtype or "own narrow dtypes only"
        lines = [
            f"precision report: {len(rows)} flagged of {len(self.rows)} rows, {self.equations} equations "
            f"evaluated in {self.seconds:.1f} s (float32 ops checked as: {checked})"
        ]
        if not rows:
            return lines[0] + "\nnothing overflows, underflows, is absorbed or turns non-finite."
        header = (
            f"{'severity':8} {'problem':13} {'primitive':14} {'format':13} {'ovf%':>6} {'unf%':>6} "
            f"{'abs%':>6} {'nan/inf':>7}  source / scope -> suggestion"
        )
        lines += [header, "-" * len(header)]
        for row in shown:
            severity = "harmless" if row.harmless else row.severity
            advice = f"harmless: {row.harmless}" if row.harmless else row.suggestion
            context = "/".join(part for part in (row.scope, "backward" if row.backward else "") if part)
            where = row.source + (f"  [{context}]" if context else "")
            lines.append(
                f"{severity:8} {row.problem:13} {row.primitive:14} {row.format or '-':13} "
                f"{100 * row.overflow_frac:6.2f} {100 * row.underflow_frac:6.2f} "
                f"{100 * row.absorbed_frac:6.2f} {row.nonfinite:7d}  {where}\n{'':>79}-> {advice}"
            )
        if len(rows) > len(shown):
            lines.append(f"... {len(rows) - len(shown)} more flagged rows (report.flagged())")
        lines.append("by scope:")
        for scope, group in self.by_scope().items():
            counts = collections.Counter(row.severity for row in group if row.harmless is None)
            harmless = sum(row.harmless is not None for row in group)
            parts = [f"{counts[s]} {s}" for s in SEVERITIES if counts[s]] + (
                [f"{harmless} harmless"] if harmless else []
            )
            lines.append(f"  {scope}: " + ", ".join(parts))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable summary: dtype, counts, timing and the flagged rows."""
        return {
            "dtype": self.dtype,
            "equations": self.equations,
            "seconds": self.seconds,
            "rows": len(self.rows),
            "flagged": [row.to_dict() for row in self.flagged()],
        }


def precision_report(fn: Callable, *args, dtype: Any = jnp.float16, **kwargs) -> PrecisionReport:
    """Runs ``fn(*args, **kwargs)`` by interpreting its jaxpr and reports, per primitive, what rounding does.

    Args:
      fn: any JAX-traceable function of arrays (a loss, ``jax.grad`` of a loss, a jitted update, ...); ``args``
        and ``kwargs`` are pytrees of arrays (bind static arguments with ``functools.partial``).
      dtype: the format float32/float64 operations are checked against, as if they computed in it ("what
        would break in float16?"). Operations that already compute in a narrower dtype (float16, bfloat16,
        float8) are always checked in their own dtype. ``None`` checks only those.

    Returns:
      A :class:`PrecisionReport`; ``print`` it for the table. Nothing is added to ``fn`` itself: with the
      inspector not called, the computation is unchanged and costs nothing extra.
    """
    start = time.perf_counter()
    outputs, interp = evaluate(fn, args, kwargs, what_if=dtype)
    loss_scaled = any(_LOSS_SCALER in _source(record.equation)[0] for record in interp.records.values())
    rows = _merge(interp.records.values(), loss_scaled)  # in program order (of each row's first equation)
    rows.sort(key=lambda row: (SEVERITIES.index(row.severity), row.harmless is not None, -row.score))
    equations = sum(record.stats.calls for record in interp.records.values())
    return PrecisionReport(
        tuple(rows), None if dtype is None else jnp.dtype(dtype).name, outputs, equations, time.perf_counter() - start
    )


def _merge(records, loss_scaled: bool) -> list[Row]:
    groups: dict[tuple, tuple[EquationRecord, OpStatistics, int, bool]] = {}
    for record in records:
        source, function = _source(record.equation)
        scope, backward = _scope(record.name_stack)
        key = (record.primitive, source, function, scope, backward, record.dtype, record.format)
        if key not in groups:
            groups[key] = (record, OpStatistics(), 0, False)
        first, stats, count, power = groups[key]
        stats.merge(record.stats)
        groups[key] = (first, stats, count + 1, power or _is_power(record.equation))
    return [
        _row(first, stats, count, power, *key[1:5], loss_scaled=loss_scaled)
        for key, (first, stats, count, power) in groups.items()
    ]


def _row(
    record: EquationRecord,
    stats: OpStatistics,
    equations: int,
    power: bool,
    source: str,
    function: str,
    scope: str,
    backward: bool,
    loss_scaled: bool,
) -> Row:
    accumulation = _OPTAX_UPDATES in source
    fractions = dict(
        overflow_frac=stats.fraction(stats.overflow),
        underflow_frac=stats.fraction(stats.underflow),
        flushed_frac=stats.fraction(stats.flushed),
        absorbed_frac=stats.fraction(stats.absorbed),
    )
    if stats.nonfinite:
        problem = "nonfinite"
    elif stats.overflow:
        problem = "overflow"
    elif stats.zero_constant:
        problem = "zero constant"
    elif stats.underflow and (stats.underflow >= stats.absorbed and not (accumulation and stats.absorbed)):
        problem = "underflow"  # in parameter updates, lost steps (absorbed) matter more than subnormal values
    elif stats.absorbed:
        problem = "absorbed"
    else:
        problem = ""
    in_optimizer = OPTIMIZER_SCOPE in scope.split("/") or source.startswith(("optax", os.path.join("lpjax", "optim")))
    # Absorption matters where small terms accumulate (parameter and target updates); elsewhere it is info.
    significant = max(fractions["underflow_frac"], fractions["absorbed_frac"] if in_optimizer else 0.0)
    if problem in ("nonfinite", "overflow"):
        severity = "error"
    elif problem == "zero constant" or significant >= WARN_FRACTION:
        severity = "warning"
    else:
        severity = "info" if problem else "ok"
    harmless = next(
        (reason for path, problems, reason in _HARMLESS_SOURCES if path in source and problem in problems), None
    )
    if problem == "absorbed" and stats.absorbed_scalar:
        harmless = _SCALAR_ABSORBED
    if problem in ("overflow", "nonfinite") and backward and loss_scaled:
        harmless = _LOSS_SCALED
    if problem == "underflow" and accumulation and not stats.flushed:
        harmless = _SUBNORMAL_PARAMETERS
    return Row(
        primitive=record.primitive,
        source=source,
        function=function,
        code=_code(source),
        scope=scope,
        name_stack=record.name_stack,
        backward=backward,
        dtype=record.dtype,
        format=record.format,
        shape=record.shape,
        equations=equations,
        calls=stats.calls,
        elements=stats.elements,
        nonfinite=stats.nonfinite,
        zero_constant=stats.zero_constant,
        power=power,
        min_abs=stats.min_abs,
        max_abs=stats.max_abs,
        dynamic_range=(None if math.isinf(stats.own_min_abs) else (stats.own_min_abs, stats.own_max_abs)),
        exponents=dict(stats.exponents),
        severity=severity,
        problem=problem,
        suggestion=_suggest(
            problem,
            record.primitive,
            record.format or record.dtype,
            power,
            backward,
            in_optimizer,
            accumulation=accumulation,
        ),
        harmless=harmless,
        **fractions,
    )


def _suggest(
    problem: str, primitive: str, fmt: str, power: bool, backward: bool, in_optimizer: bool, accumulation: bool = False
) -> str:
    """The fix lpjax offers for a finding (Björck et al., 2021 for the RL methods): the function, and for a method
    of the learners the field of their config's :class:`lpjax.methods.PrecisionMethods` that turns it on
    (``methods.<field>``)."""
    if not problem:
        return ""
    if accumulation and problem == "absorbed":
        return (
            "a parameter or target-network update loses its small steps: use Kahan summation "
            "(lpjax.optim.kahan_summation for parameters, lpjax.optim.kahan_polyak for target networks; "
            "methods.kahan_gradients and methods.kahan_momentum)"
        )
    if accumulation and problem == "underflow":
        return (
            f"parameters this close to 0 are subnormal in {fmt} (absolute precision kept, relative lost); "
            "keep float32 master weights (lpjax.precision.Policy) if it matters"
        )
    if problem == "absorbed" and in_optimizer:
        return (
            "small updates are lost in this sum: use Kahan summation (lpjax.optim.kahan_summation for "
            "parameter updates, lpjax.optim.kahan_polyak for target networks; methods.kahan_gradients and "
            "methods.kahan_momentum)"
        )
    if problem == "absorbed":
        return (
            "the smaller addend does not change the result: harmless in a one-off sum; in a running sum, "
            "use Kahan summation"
        )
    if problem == "zero constant":
        return (
            f"adds a constant that is 0 in {fmt} (an eps that underflowed?): use compound loss scaling, "
            "which scales Adam's eps with the loss scale (lpjax.optim.compound_loss_scaling; "
            "methods.loss_scaling), or a larger eps"
        )
    if problem == "nonfinite" and primitive == "div":
        return (
            "nan/inf from a division: its denominator is 0 (underflowed, or counted from nan: see the rows "
            "before); in Adam use hAdam (lpjax.optim.hadam; methods.hadam) with compound loss scaling "
            "(methods.loss_scaling)"
        )
    if problem == "nonfinite" and primitive in ("log", "log1p"):
        return "log of 0 or a negative value: an argument underflowed; use a stable form from lpjax.numerics"
    if primitive == "exp" and problem in ("overflow", "nonfinite"):
        return (
            "exp overflows: use the softplus-fix (lpjax.numerics.tanh_log_det_jacobian; SAC's "
            "methods.softplus_fix) or bound the exponent"
        )
    if power and in_optimizer:
        return (
            f"Adam's second moment g^2 leaves {fmt}'s range: use hAdam (lpjax.optim.hadam; methods.hadam), "
            "which keeps sqrt(v)"
        )
    if power:
        return (
            f"a square or power leaves {fmt}'s range: compute it from a ratio, or in float32; for a Gaussian's "
            "variance sigma^2 (or its inverse in the backward pass) use the normal-fix "
            "(lpjax.numerics.normal_log_prob squares (x - mu) / sigma; SAC's methods.normal_fix)"
        )
    if in_optimizer:
        return (
            f"the optimizer's moments or updates leave {fmt}'s range: use compound loss scaling "
            "(lpjax.optim.compound_loss_scaling, which rescales the moments; methods.loss_scaling) with hAdam "
            "(methods.hadam)"
        )
    if backward:
        return "gradients leave the range: use loss scaling (lpjax.optim.compound_loss_scaling; methods.loss_scaling)"
    if primitive in ("dot_general", "conv_general_dilated", "reduce_sum") and problem == "overflow":
        return (
            "a sum of products overflows: accumulate in float32 (preferred_element_type) or standardize the "
            "weights (lpjax.numerics.weight_standardize)"
        )
    if primitive == "convert_element_type":
        return (
            f"values leave {fmt}'s range at this cast: rescale them (loss scaling), or keep this tensor in "
            "float32 (lpjax.precision.Policy)"
        )
    return f"values leave {fmt}'s range: keep this operation in float32 (lpjax.precision.Policy) or rescale it"


def _is_power(eqn) -> bool:
    """``x^2``, ``x^-2``, ``x^y``... (``square``, ``integer_pow`` with ``|y| >= 2``, ``pow``, ``x * x``)."""
    name = eqn.primitive.name
    return (
        name in ("square", "pow")
        or (name == "integer_pow" and abs(eqn.params.get("y", 1)) >= 2)
        or (name == "mul" and eqn.invars[0] is eqn.invars[1])
    )


def _source(eqn) -> tuple[str, str]:
    """``("file:line", function)`` of the innermost user frame (``summarize`` gives ``file:line:col (fn)``)."""
    match = _SUMMARY.match(source_info_util.summarize(eqn.source_info))
    if match is None:
        return "<unknown>", ""
    return f"{_short_path(match['file'])}:{match['line']}", match["function"]


def _code(source: str) -> str:
    path, _, line = source.rpartition(":")
    full = path if os.path.isabs(path) or os.path.exists(path) else _site_packages_path(path)
    return linecache.getline(full, int(line)).strip() if line.isdigit() and full else ""


def _site_packages_path(relative: str) -> str:
    for directory in sys.path:
        candidate = os.path.join(directory, relative)
        if os.path.isfile(candidate):
            return candidate
    return ""


def _short_path(path: str) -> str:
    """A source path relative to its install directory (pip's ``site-packages``, Debian's and Colab's
    ``dist-packages``) or to the working directory; other paths unchanged."""
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in path:
            return path.split(marker, 1)[1]
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _scope(name_stack: str) -> tuple[str, bool]:
    """``(scope, backward)``: ``actor/transpose(actor)/jvp(actor)/Dense_0`` -> ``("actor/Dense_0", True)``."""
    backward = "transpose(" in name_stack
    parts: list[str] = []
    for part in _TRANSFORM.sub("", name_stack).split("/"):
        if part and (not parts or parts[-1] != part):
            parts.append(part)
    return "/".join(parts), backward
