"""Evaluates a jaxpr equation by equation, recording :class:`~lpjax.inspect.statistics.OpStatistics` per equation.

Each primitive runs eagerly on its actual inputs, exactly as written (so values match an op-by-op execution;
XLA's fusions may keep some float16 intermediates in float32 and round less often). An equation is *checked*
against a format ``F``:

* its own dtype when that is narrower than float32 (float16, bfloat16, float8): the exact value is the same
  primitive applied to the unrounded inputs (in float64 NumPy for the common arithmetic, elementwise and
  contraction primitives; otherwise by JAX on float32-upcast inputs; for a cast, the input itself), so values
  that rounded to zero or inf in the narrow dtype are still seen;
* ``what_if`` (a dtype or ``None``) for float32/float64 equations: their values as computed, checked as if
  rounded into ``what_if``. With ``what_if=None`` they are not checked (nan/inf they produce still are).
  XLA:CPU flushes float32 subnormals to zero, so a what-if check cannot see values below float32's smallest
  normal (2^-126, bfloat16's too).

Only primitives that round (arithmetic, transcendental functions, reductions, contractions, casts) are checked;
data movement (reshape, slicing, select, ...) never creates an overflow or underflow.

Nested jaxprs are interpreted too: ``jit``, ``custom_jvp_call``, ``custom_vjp_call``, ``remat``/``checkpoint``,
``closed_call``, and the control flow ``scan``, ``while`` and ``cond`` (every loop iteration is recorded into
the same equation, so loop bodies get aggregated statistics; a ``cond`` records the branch taken). Other
higher-order primitives run as one opaque operation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from lpjax.inspect.formats import NumberFormat, is_narrow, number_format
from lpjax.inspect.statistics import OpStatistics

ROUNDING_PRIMITIVES = frozenset(
    {
        "add",
        "add_any",
        "sub",
        "mul",
        "div",
        "rem",
        "pow",
        "integer_pow",
        "square",
        "sqrt",
        "rsqrt",
        "cbrt",
        "exp",
        "exp2",
        "expm1",
        "log",
        "log1p",
        "tanh",
        "logistic",
        "sin",
        "cos",
        "tan",
        "atan2",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "asinh",
        "acosh",
        "atanh",
        "erf",
        "erfc",
        "erf_inv",
        "lgamma",
        "digamma",
        "reduce_sum",
        "reduce_prod",
        "cumsum",
        "cumprod",
        "cumlogsumexp",
        "dot_general",
        "conv_general_dilated",
        "convert_element_type",
        "reduce_precision",
    }
)
"""Primitives whose output is a newly rounded value (the ones the inspector checks)."""

ADDITIONS = frozenset({"add", "add_any", "sub"})
_CASTS = frozenset({"convert_element_type", "reduce_precision"})
_HIGHER_ORDER: dict[str, Callable] = {}


@dataclasses.dataclass
class EquationRecord:
    """What the interpreter saw of one equation (one row of the report before merging).

    Attributes:
      primitive: the primitive's name.
      equation: the ``JaxprEqn`` (for its source info).
      name_stack: the full name stack (enclosing equations' stacks joined with ``/``).
      dtype: the output's own dtype name.
      format: the checked format's name, or ``None`` if the equation's values were not checked.
      shape: the output's shape.
      stats: the accumulated :class:`OpStatistics`.
    """

    primitive: str
    equation: Any
    name_stack: str
    dtype: str
    format: str | None
    shape: tuple[int, ...]
    stats: OpStatistics


class Interpreter:
    """Runs closed jaxprs and keeps one :class:`EquationRecord` per (call path, equation)."""

    def __init__(self, what_if: Any = None):
        self.what_if: NumberFormat | None = None if what_if is None else number_format(what_if)
        self.records: dict[tuple[int, ...], EquationRecord] = {}

    def run(self, closed: jex_core.ClosedJaxpr, args: Sequence[Any]) -> list[Any]:
        return self.eval_jaxpr(closed.jaxpr, closed.consts, args, path=(), stack="")

    def eval_jaxpr(
        self, jaxpr: jex_core.Jaxpr, consts: Sequence[Any], args: Sequence[Any], path: tuple[int, ...], stack: str
    ) -> list[Any]:
        env: dict[Any, Any] = {}

        def read(var):
            return var.val if isinstance(var, jex_core.Literal) else env[var]

        for var, value in zip(jaxpr.constvars, consts):
            env[var] = value
        for var, value in zip(jaxpr.invars, args):
            env[var] = value
        for eqn in jaxpr.eqns:
            invals = [read(var) for var in eqn.invars]
            eqn_stack = _join(stack, str(eqn.source_info.name_stack))
            eqn_path = path + (id(eqn),)
            handler = _HIGHER_ORDER.get(eqn.primitive.name)
            if handler is not None:
                outvals = handler(self, eqn, invals, eqn_path, eqn_stack)
            else:
                with eqn.ctx.manager:
                    outvals = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
                outvals = list(outvals) if eqn.primitive.multiple_results else [outvals]
                self.record(eqn, invals, outvals, eqn_path, eqn_stack)
            for var, value in zip(eqn.outvars, outvals):
                if not isinstance(var, jex_core.DropVar):
                    env[var] = value
        return [read(var) for var in jaxpr.outvars]

    def record(self, eqn, invals: Sequence[Any], outvals: Sequence[Any], path: tuple[int, ...], stack: str) -> None:
        """Accumulates the statistics of one evaluation of ``eqn`` (its first floating output)."""
        floating = [value for value in outvals if _is_float(value)]
        if not floating:
            return
        output = floating[0]
        own = np.dtype(output.dtype)
        name = eqn.primitive.name
        if is_narrow(own):
            fmt = number_format(own)
        else:  # a what-if format no narrower than the equation's own dtype checks nothing
            fmt = self.what_if if self.what_if is not None and self.what_if.bits < own.itemsize * 8 else None
        record = self.records.get(path)
        if record is None:
            record = EquationRecord(
                name, eqn, stack, own.name, fmt.name if fmt else None, tuple(np.shape(output)), OpStatistics()
            )
            self.records[path] = record
        stats = record.stats
        stats.calls += 1
        actual = np.asarray(output).astype(np.float64 if own == np.float64 else np.float32)
        nonfinite = int(actual.size - np.count_nonzero(np.isfinite(actual)))
        stats.add_range(actual)
        inputs_finite = nonfinite == 0 or all(_all_finite(value) for value in invals)
        if nonfinite and inputs_finite:
            stats.add_nonfinite(nonfinite)
        if fmt is None or name not in ROUNDING_PRIMITIVES or _widening_cast(name, invals[0], own):
            return
        exact = _exact_output(eqn, invals, output) if is_narrow(own) else actual
        stats.add_values(np.asarray(exact), fmt, inputs_finite)
        if name in ADDITIONS and len(invals) == 2:
            stats.add_absorbed(_as_float(invals[0]), _as_float(invals[1]), fmt)
            stats.zero_constant |= any(_constant_lost(var, fmt) for var in eqn.invars)


def higher_order(*names: str):
    """Registers an evaluator ``fn(interpreter, eqn, invals, path, stack) -> outvals`` for primitives ``names``."""

    def register(fn):
        for name in names:
            _HIGHER_ORDER[name] = fn
        return fn

    return register


@higher_order(
    "jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "remat", "checkpoint", "remat2"
)
def _call(interp: Interpreter, eqn, invals, path, stack):
    inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
    if isinstance(inner, jex_core.ClosedJaxpr):
        return interp.eval_jaxpr(inner.jaxpr, inner.consts, invals, path, stack)
    return interp.eval_jaxpr(inner, (), invals, path, stack)


@higher_order("scan")
def _scan(interp: Interpreter, eqn, invals, path, stack):
    params = eqn.params
    body: jex_core.ClosedJaxpr = params["jaxpr"]
    if "num_consts" in params:
        num_consts, num_carry = params["num_consts"], params["num_carry"]
    else:  # jax >= 0.11: ft_in groups the operands as (consts, carry, xs), each group a flat tree
        groups = getattr(params["ft_in"], "elts", params["ft_in"])
        num_consts, num_carry = len(groups[0]), len(groups[1])
    length = params["length"]
    consts, carry, xs = (
        invals[:num_consts],
        invals[num_consts : num_consts + num_carry],
        invals[num_consts + num_carry :],
    )
    ys = []
    for i in reversed(range(length)) if params["reverse"] else range(length):
        out = interp.eval_jaxpr(body.jaxpr, body.consts, [*consts, *carry, *(x[i] for x in xs)], path, stack)
        carry, y = out[:num_carry], out[num_carry:]
        ys.append(y)
    if params["reverse"]:
        ys.reverse()
    y_avals = [var.aval for var in body.jaxpr.outvars[num_carry:]]
    stacked = [
        jnp.stack([y[j] for y in ys]) if ys else jnp.zeros((0, *aval.shape), aval.dtype)
        for j, aval in enumerate(y_avals)
    ]
    return [*carry, *stacked]


@higher_order("while")
def _while(interp: Interpreter, eqn, invals, path, stack):
    params = eqn.params
    cond: jex_core.ClosedJaxpr = params["cond_jaxpr"]
    body: jex_core.ClosedJaxpr = params["body_jaxpr"]
    cond_consts = invals[: params["cond_nconsts"]]
    body_consts = invals[params["cond_nconsts"] : params["cond_nconsts"] + params["body_nconsts"]]
    carry = invals[params["cond_nconsts"] + params["body_nconsts"] :]
    while bool(interp.eval_jaxpr(cond.jaxpr, cond.consts, [*cond_consts, *carry], path, stack)[0]):
        carry = interp.eval_jaxpr(body.jaxpr, body.consts, [*body_consts, *carry], path, stack)
    return carry


@higher_order("cond")
def _cond(interp: Interpreter, eqn, invals, path, stack):
    branches = eqn.params["branches"]
    index = int(np.clip(int(invals[0]), 0, len(branches) - 1))
    branch: jex_core.ClosedJaxpr = branches[index]
    return interp.eval_jaxpr(branch.jaxpr, branch.consts, invals[1:], path + (index,), stack)


def _join(outer: str, inner: str) -> str:
    """The name stack of an equation in a nested jaxpr (whose own stack may already start with the outer one)."""
    if not outer or inner.startswith(outer):
        return inner
    return "/".join(part for part in (outer, inner) if part)


def _is_float(value) -> bool:
    dtype = getattr(value, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.floating)


def _as_float(value) -> np.ndarray:
    array = np.asarray(value)
    return array.astype(np.float64) if array.dtype != np.float64 else array


def _all_finite(value) -> bool:
    if not _is_float(value):
        return True
    return bool(np.isfinite(np.asarray(value).astype(np.float32)).all())


def _widening_cast(name: str, operand, own: np.dtype) -> bool:
    """A cast from a float dtype to one at least as wide: exact, so nothing to check (its input was checked)."""
    return name in _CASTS and _is_float(operand) and np.dtype(operand.dtype).itemsize <= own.itemsize


def _upcast(value):
    if _is_float(value) and is_narrow(value.dtype):
        return jnp.asarray(value, jnp.float32)
    if isinstance(value, float):
        return np.float32(value)
    return value


def _dot_general(params, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = params["dimension_numbers"]
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    lhs_sub = [next(letters) for _ in range(lhs.ndim)]
    rhs_sub = [next(letters) for _ in range(rhs.ndim)]
    for l_dim, r_dim in [*zip(lhs_contract, rhs_contract), *zip(lhs_batch, rhs_batch)]:
        rhs_sub[r_dim] = lhs_sub[l_dim]
    free_l = [lhs_sub[d] for d in range(lhs.ndim) if d not in (*lhs_contract, *lhs_batch)]
    free_r = [rhs_sub[d] for d in range(rhs.ndim) if d not in (*rhs_contract, *rhs_batch)]
    out = [lhs_sub[d] for d in lhs_batch] + free_l + free_r
    return np.einsum(f"{''.join(lhs_sub)},{''.join(rhs_sub)}->{''.join(out)}", lhs, rhs)


_FLOAT64_RULES: dict[str, Callable[..., np.ndarray]] = {
    "add": lambda p, a, b: a + b,
    "add_any": lambda p, a, b: a + b,
    "sub": lambda p, a, b: a - b,
    "mul": lambda p, a, b: a * b,
    "div": lambda p, a, b: a / b,
    "pow": lambda p, a, b: np.power(a, b),
    "integer_pow": lambda p, a: a ** p["y"],
    "square": lambda p, a: a * a,
    "sqrt": lambda p, a: np.sqrt(a),
    "rsqrt": lambda p, a: 1 / np.sqrt(a),
    "exp": lambda p, a: np.exp(a),
    "exp2": lambda p, a: np.exp2(a),
    "expm1": lambda p, a: np.expm1(a),
    "log": lambda p, a: np.log(a),
    "log1p": lambda p, a: np.log1p(a),
    "tanh": lambda p, a: np.tanh(a),
    "logistic": lambda p, a: 1 / (1 + np.exp(-a)),
    "sin": lambda p, a: np.sin(a),
    "cos": lambda p, a: np.cos(a),
    "reduce_sum": lambda p, a: np.sum(a, axis=tuple(p["axes"])),
    "dot_general": _dot_general,
}
"""float64 NumPy versions of the commonest rounding primitives, for exact values beyond float32's range
(bfloat16's underflows are float32 subnormals, which XLA:CPU flushes to zero) and without compiling."""


def _exact_output(eqn, invals: Sequence[Any], output) -> np.ndarray:
    """The primitive applied to the inputs without rounding: in float64 NumPy for the primitives of
    ``_FLOAT64_RULES``, else re-run by JAX on float32-upcast inputs (for a cast: the input itself).

    Falls back to the rounded output itself when the primitive cannot be re-run in float32.
    """
    name = eqn.primitive.name
    if name in _CASTS:
        return _as_float(invals[0])
    rule = _FLOAT64_RULES.get(name)
    if rule is not None:
        with np.errstate(all="ignore"):
            return np.asarray(rule(eqn.params, *(_as_float(value) for value in invals)))
    params = dict(eqn.params)
    preferred = params.get("preferred_element_type")
    if preferred is not None and is_narrow(preferred):
        params["preferred_element_type"] = np.dtype(np.float32)
    try:
        exact = eqn.primitive.bind(*(_upcast(value) for value in invals), **params)
    except (TypeError, ValueError):
        return np.asarray(output).astype(np.float32)
    return np.asarray(exact[0] if eqn.primitive.multiple_results else exact)


def _constant_lost(var, fmt: NumberFormat) -> bool:
    """A literal that is 0 in a narrow dtype, or non-zero but below ``fmt``'s smallest normal.

    Tracing rounds a Python ``eps`` into the narrow dtype before the jaxpr exists, so an ``eps`` of 1e-8 added
    in float16 shows up as a literal 0, indistinguishable from a deliberate ``+ 0.0`` (which is flagged too).
    """
    if not isinstance(var, jex_core.Literal) or not jnp.issubdtype(var.aval.dtype, jnp.floating):
        return False
    magnitude = np.abs(np.asarray(var.val).astype(np.float64))
    if is_narrow(var.aval.dtype):
        return bool(np.all(magnitude == 0))
    return bool(np.any((magnitude > 0) & (magnitude < fmt.smallest_normal)))


def evaluate(fn: Callable, args: Sequence[Any], kwargs: dict, what_if: Any = None) -> tuple[Any, Interpreter]:
    """Traces ``fn(*args, **kwargs)``, interprets its jaxpr, and returns ``(outputs, interpreter)``."""
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args, **kwargs)
    interp = Interpreter(what_if)
    flat_args = jax.tree.leaves((args, kwargs))
    flat_out = interp.run(closed, flat_args)
    return jax.tree.unflatten(jax.tree.structure(out_shape), flat_out), interp
