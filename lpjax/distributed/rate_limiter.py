"""Samples-per-insert rate limiting between a learner and its actors (Acme/Reverb's ``SampleToInsertRatio``).

With ``I`` items inserted, ``S`` items sampled (``batch_size`` per update), a ratio ``r`` (samples per insert),
a warm-up ``min_size`` and a tolerance ``error_buffer`` (in samples), define the credit

    c = r * (I - min_size) - S.

* The learner may sample a batch of ``b`` when ``I >= min_size`` and ``c - b >= -error_buffer``.
* Actors may insert ``n`` more items when ``I < min_size`` or ``c + r * n <= error_buffer``.

So in steady state every inserted transition is sampled ``r`` times on average (16 by default in ActorQ's
D4PG); a learner faster than its actors waits for data, and actors faster than their learner wait for updates.
The limiter only counts: the coordinator asks it before each update and before giving an actor more work.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class SamplesPerInsertLimiter:
    """Counts inserts and samples and says whether one more update or one more insert keeps the ratio.

    Attributes:
      samples_per_insert: ``r``, average times each inserted item is sampled (> 0).
      batch_size: items sampled per update.
      min_size: inserts before the first update.
      error_buffer: tolerance of the credit, in samples (>= ``batch_size`` so that an update can always fit).
      inserts, samples: the counters (restored from checkpoints).
    """

    samples_per_insert: float
    batch_size: int
    min_size: int
    error_buffer: float
    inserts: int = 0
    samples: int = 0

    def __post_init__(self):
        if self.samples_per_insert <= 0:
            raise ValueError(f"samples_per_insert must be > 0, got {self.samples_per_insert}.")
        if self.batch_size < 1 or self.min_size < 0:
            raise ValueError(f"batch_size must be >= 1 and min_size >= 0, got {self.batch_size}, {self.min_size}.")
        if self.error_buffer < self.batch_size:
            raise ValueError(
                f"error_buffer ({self.error_buffer}) must be >= batch_size ({self.batch_size}), or no "
                "update could ever fit the ratio."
            )

    @property
    def credit(self) -> float:
        """``r * (inserts - min_size) - samples``."""
        return self.samples_per_insert * (self.inserts - self.min_size) - self.samples

    def can_update(self) -> bool:
        return self.inserts >= self.min_size and self.credit - self.batch_size >= -self.error_buffer

    def can_insert(self, n: int) -> bool:
        return self.inserts < self.min_size or self.credit + self.samples_per_insert * n <= self.error_buffer

    def record_insert(self, n: int) -> None:
        self.inserts += int(n)

    def record_update(self) -> None:
        self.samples += self.batch_size
