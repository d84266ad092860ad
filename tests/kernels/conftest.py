"""Set-up of the kernel tests: float32 matmuls in the tests' references are exact float32 on every backend.

A GPU computes a float32 ``jnp.dot`` in TF32 by default (10-bit significands), which would put the references'
own error above the bounds the tests derive for float32 accumulation. The Pallas kernels under test do not read
this setting: their operands are 16- or 8-bit and their accumulators float32 or int32.
"""

from __future__ import annotations

import jax
import pytest


@pytest.fixture(autouse=True)
def exact_float32_matmuls():
    """Runs each kernel test with ``jax.default_matmul_precision("highest")``."""
    with jax.default_matmul_precision("highest"):
        yield
