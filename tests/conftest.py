"""Shared pytest set-up of the lpjax test suite.

* ``x64`` fixture: runs a whole (non-hypothesis) test with float64 enabled.
* ``run_x64`` fixture: ``run_x64(fn, *args, **kwargs)`` calls ``fn`` with float64 enabled and returns its result.
  It is session-scoped, so it may be used in ``@hypothesis.given`` tests (hypothesis rejects function-scoped
  fixtures there). Equivalent to ``with jax.enable_x64(True): fn(...)``, which tests may also write directly.
* ``ray_cluster`` fixture: one local Ray cluster (2 CPUs) per test process, started on first use and shut down
  at the end. Tests that use it are marked ``@pytest.mark.xdist_group("ray")`` and ``make test`` runs
  ``--dist loadgroup``, so they share one pytest-xdist worker and one cluster: two clusters starting at the same
  time on 2 cores can time out (the raylet's startup deadline).
* hypothesis profiles: ``"lpjax"`` has no per-example deadline, since the first example of a test usually pays
  for a ``jax.jit`` compilation; ``"ci"`` also derandomizes the examples and is loaded when ``CI`` is set, so a
  CI run is reproducible. Pick another with ``--hypothesis-profile=NAME``.
"""

from __future__ import annotations

import os

import jax
import pytest
from hypothesis import settings

settings.register_profile("lpjax", deadline=None, print_blob=True)
settings.register_profile("ci", parent=settings.get_profile("lpjax"), derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "lpjax")


@pytest.fixture
def x64():
    """Enables float64 (``jax.enable_x64(True)``) for the duration of the test. Not for ``@given`` tests."""
    with jax.enable_x64(True):
        yield


def _run_x64(fn, *args, **kwargs):
    with jax.enable_x64(True):
        return fn(*args, **kwargs)


@pytest.fixture(scope="session")
def run_x64():
    """Returns ``run(fn, *args, **kwargs)``: ``fn(*args, **kwargs)`` evaluated with float64 enabled."""
    return _run_x64


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster shared by the tests of this process (see the module docstring)."""
    import ray

    if not ray.is_initialized():  # the local cluster lpjax starts: loopback only, no dashboard
        from lpjax.distributed.backends import init_local_ray

        init_local_ray(num_cpus=2)
    yield ray
    ray.shutdown()
