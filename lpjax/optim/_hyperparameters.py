"""Hyperparameter checks shared by lpjax's optax factories.

``optax.inject_hyperparams`` calls a factory with its hyperparameters as arrays: concrete in ``init``, traced in a
jitted ``update``. By default it stores them in the parameters' dtype, so with float16 parameters ``eps=1e-8``
becomes 0, a learning rate loses all but three digits and ``init_scale=2**16`` becomes inf. lpjax's factories
refuse such values where they are concrete (in ``init``) with the fix, and check nothing when traced.
"""

from __future__ import annotations

import jax
import numpy as np

INJECT_FIX = (
    "optax.inject_hyperparams stores hyperparameters in the parameters' dtype: use "
    "lpjax.optim.inject_hyperparams (float32 hyperparameters) or pass hyperparam_dtype=jnp.float32"
)


def concrete(value) -> np.ndarray | None:
    """``value`` as a numpy array if it is known at trace time, else ``None`` (a traced hyperparameter)."""
    try:
        return np.asarray(value)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def require_wide(factory: str, name: str, value) -> None:
    """Raises ``ValueError`` if ``value`` is a concrete floating-point array narrower than 32 bits."""
    array = concrete(value)
    if array is not None and array.dtype.kind == "f" and array.dtype.itemsize < 4:
        raise ValueError(f"{factory}: {name} is a {array.dtype} array ({float(array)!r}); {INJECT_FIX}.")
