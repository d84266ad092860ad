"""lpjax: low-precision reinforcement learning in JAX/Flax.

Submodules: :mod:`lpjax.precision` (precision policies), :mod:`lpjax.numerics` (fp16-safe primitives) and
:mod:`lpjax.optim` (hAdam, compound loss scaling, Kahan summation, Kahan Polyak averaging as optax transforms).
"""

from lpjax import numerics, optim, precision
from lpjax.precision import Policy, get_policy

__version__ = "0.1.0"
__all__ = ["Policy", "get_policy", "numerics", "optim", "precision", "__version__"]
