"""Precision inspector: where a JAX computation overflows, underflows or loses precision in float16, bfloat16
or float8, found by interpreting its jaxpr, before training breaks.

    report = lpjax.inspect.precision_report(jax.grad(loss), params, batch, dtype=jnp.float16)
    print(report)

Command line, for a learner built from an experiment config, in a checkout of the repository (see
``experiments/inspect.py``):

    python -m experiments.inspect --config=fp16_naive.py --algo=sac
"""

from lpjax.inspect.formats import NumberFormat, number_format
from lpjax.inspect.report import PrecisionReport, Row, precision_report
from lpjax.inspect.statistics import OpStatistics

__all__ = ["NumberFormat", "OpStatistics", "PrecisionReport", "Row", "number_format", "precision_report"]
