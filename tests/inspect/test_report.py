"""precision_report on constructed functions with known overflow, underflow, absorption and nan at known lines.

Each function below marks its lines with ``# <name>``; the tests assert the exact rows reported there.
"""

import dataclasses
import inspect
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax.inspect import precision_report
from lpjax.inspect import report as report_module
from lpjax.methods import PrecisionMethods
from lpjax.optim import OPTIMIZER_SCOPE, compound_loss_scaling, hadam, loss_scale

THIS_FILE = os.path.relpath(__file__)


def line_of(marker: str) -> str:
    """``"tests/inspect/test_report.py:N"`` of the line ending with ``# marker``."""
    with open(__file__) as f:
        for number, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# {marker}"):
                return f"{THIS_FILE}:{number}"
    raise AssertionError(marker)


def only_row(report, source):
    rows = [row for row in report.rows if row.source == source]
    assert len(rows) == 1, [(r.primitive, r.source) for r in report.rows]
    return rows[0]


def exp_overflow(x):
    return jnp.exp(x)  # exp


def product(x, y):
    return x * y  # product


def accumulate(w, u):
    return w + u  # accumulate


def accumulate_in_optimizer(w, u):
    with jax.named_scope(OPTIMIZER_SCOPE):
        return w + u  # optimizer add


def test_fp16_exp_overflow_is_an_error_with_the_softplus_fix():
    x = jnp.array([1.0, 12.0, -3.0, 11.5], jnp.float16)  # exp(11.5) = 98715 and exp(12) > 65504
    report = precision_report(exp_overflow, x)
    row = only_row(report, line_of("exp"))
    assert (row.primitive, row.dtype, row.format, row.function) == ("exp", "float16", "float16", "exp_overflow")
    assert row.code == "return jnp.exp(x)  # exp"
    assert row.overflow_frac == 0.5 and row.nonfinite == 2 and row.underflow_frac == 0.0
    assert (row.severity, row.problem) == ("error", "nonfinite")
    assert row.dynamic_range == (float(jnp.exp(x)[2]), float(jnp.exp(x)[0]))  # finite outputs, in float16
    assert "softplus" in row.suggestion
    assert report.flagged() == [row]
    np.testing.assert_array_equal(report.outputs, jnp.exp(x))


def test_fp16_underflow_counts_subnormal_and_flushed_values():
    x = jnp.array([1e-4, 1e-3, 1.0, 0.0], jnp.float16)
    y = jnp.array([1e-4, 1e-2, 1.0, 5.0], jnp.float16)  # 1e-8 flushes to 0, 1e-5 is subnormal, 0 is exact
    row = only_row(precision_report(product, x, y), line_of("product"))
    assert row.underflow_frac == 0.5 and row.flushed_frac == 0.25 and row.overflow_frac == 0.0
    assert (row.severity, row.problem) == ("warning", "underflow")
    assert row.min_abs == pytest.approx(1.0002e-8, rel=1e-3)  # the exact product, not the rounded 0
    assert row.dynamic_range[0] == float(jnp.float16(1e-3) * jnp.float16(1e-2))  # the float16 subnormal
    assert row.dynamic_range[0] == pytest.approx(1e-5, rel=2e-2) and row.dynamic_range[1] == 1.0
    assert row.exponents == {-27: 1, -17: 1, 0: 1}  # floor(log2 |x|) of the non-zero exact values


def test_absorbed_additions_suggest_kahan_in_the_optimizer_and_are_info_elsewhere():
    w = jnp.ones(4, jnp.float16)  # ulp(1) = 2^-10: addends below 2^-11 = 4.9e-4 are lost
    u = jnp.array([1e-4, 4e-4, 6e-4, 1e-2], jnp.float16)
    plain = only_row(precision_report(accumulate, w, u), line_of("accumulate"))
    assert plain.absorbed_frac == 0.5 and plain.severity == "info" and plain.scope == ""
    optimizer = only_row(precision_report(accumulate_in_optimizer, w, u), line_of("optimizer add"))
    assert optimizer.absorbed_frac == 0.5 and optimizer.scope == OPTIMIZER_SCOPE
    assert (optimizer.severity, optimizer.problem) == ("warning", "absorbed")
    assert "lpjax.optim.kahan_summation" in optimizer.suggestion


def test_bf16_overflow_underflow_and_absorption():
    big = jnp.array([1e38, 1e-36, 2.0, 1.0], jnp.bfloat16)
    factor = jnp.array([10.0, 1e-3, 3.0, 1.0], jnp.bfloat16)  # 1e39 > bf16 max; 1e-39 < 2^-126
    row = only_row(precision_report(product, big, factor), line_of("product"))
    assert row.format == "bfloat16" and row.overflow_frac == 0.25 and row.underflow_frac == 0.25
    assert row.problem == "nonfinite" and row.nonfinite == 1
    one = jnp.ones(2, jnp.bfloat16)  # ulp(1) = 2^-7 in bfloat16
    row = only_row(
        precision_report(accumulate_in_optimizer, one, jnp.array([1e-3, 1e-2], jnp.bfloat16)), line_of("optimizer add")
    )
    assert row.absorbed_frac == 0.5 and row.problem == "absorbed"


def test_float8_what_if_on_a_float32_function():
    x = jnp.array([1.0, 5.0, 1e-4, 2.0], jnp.float32)
    scale = jnp.full(4, 100.0, jnp.float32)  # runtime arrays: 100, 500 (> 464), 0.01 (< 2^-6), 200
    row = only_row(precision_report(product, x, scale, dtype=jnp.float8_e4m3fn), line_of("product"))
    assert (row.dtype, row.format) == ("float32", "float8_e4m3fn")
    assert row.overflow_frac == 0.25 and row.underflow_frac == 0.25 and row.flushed_frac == 0.0
    assert row.nonfinite == 0  # float32 itself computed it fine
    assert precision_report(product, x, scale, dtype=None).flagged() == []  # float32 ops are not checked


def cast_to_e4m3(x):
    return x.astype(jnp.float8_e4m3fn)  # cast


def test_float8_cast_checks_the_value_before_rounding():
    row = only_row(precision_report(cast_to_e4m3, jnp.array([500.0, 1.0, 1e-4, 460.0], jnp.float32)), line_of("cast"))
    assert (row.primitive, row.format) == ("convert_element_type", "float8_e4m3fn")
    assert row.overflow_frac == 0.25 and row.nonfinite == 1  # e4m3fn has no inf: 500 -> nan; 460 -> 448
    assert row.underflow_frac == 0.25 and row.flushed_frac == 0.25  # 1e-4 <= 2^-9 / 2 rounds to 0


def add_eps(x):
    return x + 1e-8  # eps


def test_an_eps_that_rounds_to_zero_is_flagged_in_fp16_and_in_a_float32_what_if():
    row = only_row(precision_report(add_eps, jnp.ones(3, jnp.float16)), line_of("eps"))
    assert row.zero_constant and (row.severity, row.problem) == ("warning", "zero constant")
    assert "compound_loss_scaling" in row.suggestion
    row = only_row(precision_report(add_eps, jnp.ones(3, jnp.float32), dtype=jnp.float16), line_of("eps"))
    assert row.zero_constant and row.format == "float16"
    assert not precision_report(add_eps, jnp.ones(3, jnp.float32), dtype=None).flagged()


@jax.jit
def jitted_square(x):
    return jnp.square(x)  # jitted square


@jax.custom_jvp
def custom_exp(x):
    return jnp.exp(x)  # custom_jvp body


custom_exp.defjvp(lambda primals, tangents: (custom_exp(primals[0]), tangents[0] * custom_exp(primals[0])))


@jax.custom_vjp
def custom_vjp_exp(x):
    return jnp.exp(x)  # custom_vjp body


custom_vjp_exp.defvjp(lambda x: (custom_vjp_exp(x), x), lambda x, g: (g * jnp.exp(x),))


def loops(x):
    def body(carry, xi):
        return carry * xi, None  # scan body

    product_, _ = jax.lax.scan(body, jnp.ones_like(x[0]), x)
    count = jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 1e-3), (0, x[0]))  # while body
    branch = jax.lax.cond(x[0, 0] > 0, lambda v: v * 1e4, lambda v: v * 1e-4, x[0])  # cond branches
    return product_, count, branch


def test_nested_jaxprs_are_interpreted_with_loop_statistics_aggregated():
    x = jnp.array([300.0, 1.0], jnp.float16)
    report = precision_report(lambda v: (jitted_square(v), custom_exp(v * 0.1), custom_vjp_exp(v * 0.1)), x)
    square = only_row(report, line_of("jitted square"))  # 300^2 = 90000 > 65504
    assert square.overflow_frac == 0.5 and square.nonfinite == 1
    assert only_row(report, line_of("custom_jvp body")).overflow_frac == 0.5  # exp(30)
    assert only_row(report, line_of("custom_vjp body")).overflow_frac == 0.5
    grads = precision_report(
        jax.grad(lambda v: jnp.sum(custom_vjp_exp(v)).astype(jnp.float32)), jnp.array([12.0], jnp.float16)
    )
    assert grads.find(primitive="exp", source=line_of("custom_vjp body"))  # the primal inside the vjp call

    xs = jnp.full((4, 2), 0.01, jnp.float16)  # scan: 0.01^k, k = 1..4 -> 1e-8 flushes at k = 4
    report = precision_report(loops, xs)
    scan = only_row(report, line_of("scan body"))
    assert scan.calls == 4 and scan.elements == 8
    assert scan.underflow_frac == pytest.approx(4 / 8) and scan.flushed_frac == pytest.approx(2 / 8)
    while_rows = [row for row in report.rows if row.source == line_of("while body") and row.primitive == "mul"]
    assert len(while_rows) == 1 and while_rows[0].calls == 3  # 0.01e-3 = 1e-5 (subnormal), 1e-8 (-> 0), 0
    assert while_rows[0].underflow_frac == pytest.approx(4 / 6) and while_rows[0].flushed_frac == pytest.approx(2 / 6)
    cond = [row for row in report.rows if row.source == line_of("cond branches") and row.primitive == "mul"]
    assert len(cond) == 1 and cond[0].calls == 1 and cond[0].overflow_frac == 0.0  # 0.01 * 1e4: only that branch


def mixed(x, w):
    y = jnp.exp(x)  # first error
    z = jnp.log(x - x)  # second error
    return y, z, w + 1e-8 * w  # small warning


def test_rows_sort_by_severity_then_score_then_program_order_and_serialise():
    x = jnp.array([12.0, 1.0], jnp.float16)
    report = precision_report(mixed, x, jnp.ones(2, jnp.float16))
    flagged = report.flagged()
    assert [row.severity for row in flagged] == sorted(
        (r.severity for r in flagged), key=["error", "warning", "info", "ok"].index
    )
    errors = [row.source for row in flagged if row.severity == "error"]
    assert errors[:2] == [line_of("first error"), line_of("second error")]
    assert "log of 0" in report.find(primitive="log")[0].suggestion
    text = str(report)
    assert "exp" in text and "softplus" in text and "by scope:" in text
    json.dumps(report.to_dict())
    assert set(report.to_dict()) == {"dtype", "equations", "seconds", "rows", "flagged"}


def test_a_clean_function_reports_nothing_and_bad_dtypes_raise():
    report = precision_report(lambda a, b: a * b + a, jnp.ones(3, jnp.float16), jnp.ones(3, jnp.float16))
    assert report.flagged() == [] and "nothing overflows" in report.table()
    keywords = precision_report(
        lambda x, *, y: {"p": x * y}, jnp.ones(2, jnp.float16), y=jnp.full(2, 1e-5, jnp.float16)
    )  # pytrees and keyword arguments
    assert keywords.rows[0].underflow_frac == 1.0 and set(keywords.outputs) == {"p"}
    with pytest.raises(ValueError, match="floating"):
        precision_report(product, jnp.ones(2), jnp.ones(2), dtype=jnp.int8)


def big_loss(w, x):
    return jnp.sum(jnp.square(x @ w)).astype(jnp.float32)


def scaled_step(w, x, opt_state, tx):
    grads = jax.grad(lambda p: big_loss(p, x) * loss_scale(opt_state))(w)  # scaled gradient
    return tx.update(grads, opt_state, w)


def test_backward_overflow_under_compound_loss_scaling_is_flagged_harmless():
    w, x = jnp.full((4, 2), 2.0, jnp.float16), jnp.full((3, 4), 2.0, jnp.float16)  # dL/dw = 2 x^T (x w) = 192
    tx = compound_loss_scaling(hadam(1e-3), init_scale=2.0**15)  # 192 * 2^15 overflows float16
    report = precision_report(lambda w, x, s: scaled_step(w, x, s, tx), w, x, tx.init(w), dtype=None)
    backward = [row for row in report.rows if row.backward and row.problem in ("overflow", "nonfinite")]
    assert backward and all(row.harmless and "loss scaling" in row.harmless for row in backward)
    assert all(row.severity != "error" for row in report.flagged(include_harmless=False))
    unguarded = precision_report(lambda w, x: jax.grad(lambda p: big_loss(p, x) * 2.0**15)(w), w, x, dtype=None)
    assert [row for row in unguarded.flagged(include_harmless=False) if row.backward and row.severity == "error"]


def naive_fp8_matmul(x, w):
    x8 = x.astype(jnp.float8_e4m3fn)  # naive x cast
    w8 = w.astype(jnp.float8_e4m3fn)  # naive w cast
    return jnp.dot(x8, w8, preferred_element_type=jnp.float32)


@pytest.mark.parametrize("impl", ["reference", "pallas"])
def test_blockwise_fp8_scaling_keeps_e4m3_casts_in_range_where_a_naive_cast_overflows(impl):
    import lpjax.kernels as kernels

    keys = jax.random.split(jax.random.key(0), 2)
    x = jax.random.normal(keys[0], (16, 256)) * 1000.0  # activations far beyond e4m3's 448
    w = jax.random.normal(keys[1], (256, 128)) * 1e-3  # weights mostly below e4m3's smallest normal 2^-6
    naive = precision_report(naive_fp8_matmul, x, w)
    casts = {row.source: row for row in naive.find(primitive="convert_element_type")}
    assert casts[line_of("naive x cast")].overflow_frac > 0.5  # about 64% of |N(0, 1000)| > 464
    assert casts[line_of("naive w cast")].underflow_frac > 0.9  # about 99% of |N(0, 1e-3)| < 2^-6
    blockwise = precision_report(lambda x, w: kernels.fp8_blockwise_matmul(x, w, impl=impl), x, w)
    to_e4m3 = [row for row in blockwise.rows if row.format == "float8_e4m3fn"]
    assert to_e4m3 and all(row.overflow_frac == 0 and row.nonfinite == 0 for row in to_e4m3)
    assert all(row.underflow_frac < 0.02 for row in to_e4m3)  # amax/448 scales put values in e4m3's normal range


def test_parameter_updates_absorbed_need_kahan_and_subnormal_parameters_are_harmless():
    import optax

    params = jnp.array([1.0, 1.0, 1e-4, 2e-5], jnp.float16)
    updates = jnp.array([1e-4, 1e-2, -9e-5, 1e-6], jnp.float16)  # absorbed, applied, -> subnormal 1e-5, 2.1e-5
    rows = precision_report(optax.apply_updates, params, updates).find(source="optax/_src/update.py")
    assert len(rows) == 1 and rows[0].absorbed_frac == 0.25 and rows[0].underflow_frac == 0.5
    assert (rows[0].problem, rows[0].severity, rows[0].harmless) == ("absorbed", "warning", None)  # lost steps
    assert "kahan_summation" in rows[0].suggestion
    subnormal = precision_report(optax.apply_updates, params[2:], updates[2:])  # no step lost, no flush to 0
    row = subnormal.find(source="optax/_src/update.py", flagged=False)[0]
    assert row.problem == "underflow" and row.harmless and "subnormal" in row.harmless


@pytest.mark.parametrize("install_dir", ["site-packages", "dist-packages"])
def test_source_paths_are_shown_relative_to_the_install_directory(install_dir):
    path = os.path.join(os.sep, "usr", "lib", "python3", install_dir, "lpjax", "nn", "dense.py")
    assert report_module._short_path(path) == os.path.join("lpjax", "nn", "dense.py")
    outside = os.path.join(os.sep, "elsewhere", "x.py")
    assert report_module._short_path(outside) == outside


def test_suggestions_name_fields_of_the_learners_precision_methods():
    """A suggestion's ``methods.<field>`` is a field a learner config's ``methods`` has."""
    named = set(re.findall(r"(?<![\w.])methods\.(\w+)", inspect.getsource(report_module)))
    assert {"hadam", "loss_scaling", "kahan_gradients", "kahan_momentum", "softplus_fix", "normal_fix"} <= named
    assert named <= {field.name for field in dataclasses.fields(PrecisionMethods)}
