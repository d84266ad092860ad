"""Learners as pure state + update functions: :mod:`lpjax.agents.sac`, :mod:`lpjax.agents.d4pg`.

Each learner's config nests its low-precision methods as a :class:`PrecisionMethods` (defined in
:mod:`lpjax.methods`, re-exported here).
"""

from lpjax.methods import PrecisionMethods

__all__ = ["PrecisionMethods"]
