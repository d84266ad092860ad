"""Per-operation counts the precision inspector accumulates (over calls, loop iterations and merged equations).

For one output of an operation, with ``x`` the exact value (the operation on its actual inputs, before rounding
to its own dtype) and ``F`` the checked :class:`~lpjax.inspect.formats.NumberFormat`:

* ``overflow``: ``x`` rounds out of ``F``'s range;
* ``underflow``: ``0 < |x| < smallest_normal(F)`` (the result is subnormal or zero), of which ``flushed``:
  ``|x| <= smallest_subnormal(F) / 2`` (the result is zero);
* ``absorbed`` (additions only): the smaller non-zero operand is below half an ulp of the larger one in ``F``,
  of which ``absorbed_scalar``: the absorbed operand is a scalar broadcast over the other (an ``eps`` or offset);
* ``nonfinite``: nan/inf in the actual output while every input was finite (produced here, not propagated);
* ``exponents``: histogram of ``floor(log2 |x|)`` over the non-zero finite ``x``.
"""

from __future__ import annotations

import collections
import dataclasses
import math

import numpy as np

from lpjax.inspect.formats import NumberFormat

_EXPONENT_OFFSET = 1100  # float64's exponents are >= -1075


@dataclasses.dataclass
class OpStatistics:
    """Counts of one operation's output values (see the module docstring for each count's definition).

    Attributes:
      calls: evaluations recorded (more than one inside loops, or for merged equations).
      elements: output elements checked.
      overflow, underflow, flushed, absorbed, absorbed_scalar, nonfinite: element counts.
      zero_constant: the operation adds a literal that is 0 in its dtype (an ``eps`` that rounded to 0 looks so),
        or a literal that underflows the checked format.
      min_abs, max_abs: smallest non-zero and largest finite exact ``|x|`` (``inf`` and 0 before any value).
      own_min_abs, own_max_abs: the same of the actual output, in the operation's own dtype (its dynamic range).
      exponents: ``{floor(log2 |x|): count}``.
    """

    calls: int = 0
    elements: int = 0
    overflow: int = 0
    underflow: int = 0
    flushed: int = 0
    absorbed: int = 0
    absorbed_scalar: int = 0
    nonfinite: int = 0
    zero_constant: bool = False
    min_abs: float = math.inf
    max_abs: float = 0.0
    own_min_abs: float = math.inf
    own_max_abs: float = 0.0
    exponents: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def add_values(self, exact: np.ndarray, fmt: NumberFormat, inputs_finite: bool) -> None:
        """Counts overflow/underflow of ``exact`` rounded into ``fmt``.

        Infinite exact values count as overflow only when ``inputs_finite`` (otherwise they were propagated).
        """
        magnitude = np.abs(np.asarray(exact).ravel())
        self.elements += magnitude.size
        finite = np.isfinite(magnitude)
        finite_magnitude = magnitude[finite]
        self.overflow += int(np.count_nonzero(fmt.overflows(finite_magnitude)))
        if inputs_finite:
            self.overflow += int(np.count_nonzero(np.isinf(magnitude)))
        nonzero = finite_magnitude[finite_magnitude > 0]
        self.underflow += int(np.count_nonzero(nonzero < fmt.smallest_normal))
        self.flushed += int(np.count_nonzero(nonzero <= fmt.smallest_subnormal / 2))
        if nonzero.size:
            self.min_abs = min(self.min_abs, float(nonzero.min()))
            self.max_abs = max(self.max_abs, float(nonzero.max()))
            _, exponent = np.frexp(nonzero.astype(np.float64))
            counts = np.bincount(exponent - 1 + _EXPONENT_OFFSET)
            for index in np.flatnonzero(counts):
                self.exponents[int(index) - _EXPONENT_OFFSET] += int(counts[index])

    def add_absorbed(self, a: np.ndarray, b: np.ndarray, fmt: NumberFormat) -> None:
        """Counts the elements of ``a + b`` (or ``a - b``) whose smaller non-zero operand is absorbed in ``fmt``."""
        a, b = np.abs(np.asarray(a, np.float64)), np.abs(np.asarray(b, np.float64))
        scalar_a, scalar_b = a.size == 1 < b.size, b.size == 1 < a.size
        a, b = np.broadcast_arrays(a, b)
        both = (a > 0) & (b > 0) & np.isfinite(a) & np.isfinite(b)
        a, b = a[both], b[both]
        lost_a, lost_b = (a < b) & (a < fmt.ulp(b) / 2), (b <= a) & (b < fmt.ulp(a) / 2)
        self.absorbed += int(np.count_nonzero(lost_a | lost_b))
        self.absorbed_scalar += int(np.count_nonzero(lost_a)) * scalar_a + int(np.count_nonzero(lost_b)) * scalar_b

    def add_nonfinite(self, count: int) -> None:
        self.nonfinite += count

    def add_range(self, actual: np.ndarray) -> None:
        """Widens the dynamic range ``[own_min_abs, own_max_abs]`` with the actual output's non-zero finite values."""
        magnitude = np.abs(actual[np.isfinite(actual)])
        magnitude = magnitude[magnitude > 0]
        if magnitude.size:
            self.own_min_abs = min(self.own_min_abs, float(magnitude.min()))
            self.own_max_abs = max(self.own_max_abs, float(magnitude.max()))

    def merge(self, other: OpStatistics) -> None:
        """Adds ``other``'s counts into this one."""
        for name in (
            "calls",
            "elements",
            "overflow",
            "underflow",
            "flushed",
            "absorbed",
            "absorbed_scalar",
            "nonfinite",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.zero_constant |= other.zero_constant
        self.min_abs = min(self.min_abs, other.min_abs)
        self.max_abs = max(self.max_abs, other.max_abs)
        self.own_min_abs = min(self.own_min_abs, other.own_min_abs)
        self.own_max_abs = max(self.own_max_abs, other.own_max_abs)
        self.exponents.update(other.exponents)

    def fraction(self, count: int) -> float:
        return count / self.elements if self.elements else 0.0
