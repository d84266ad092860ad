"""Conversion of configs and metadata to plain JSON types: :func:`to_jsonable`.

Used where lpjax writes JSON: a run's ``config.json`` (:class:`lpjax.run_logging.RunLogger`) and a checkpoint's
metadata (:class:`lpjax.checkpoint.Checkpointer`).
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping
from typing import Any

import numpy as np


def to_jsonable(obj: Any) -> Any:
    """Converts a config or metadata object to plain JSON types (dict, list, str, int, float, bool, None).

    ml_collections ``ConfigDict``/``FrozenConfigDict`` become dicts (field references resolved), mappings become
    dicts with string keys, tuples and sets become lists, numpy/jax scalars become Python numbers and arrays
    nested lists, dtypes (and dtype classes such as ``jnp.float16``) their name, paths and enums strings,
    dataclasses dicts. Anything else becomes ``str(obj)``. Non-finite floats stay ``nan``/``inf`` (written as
    ``NaN``/``Infinity`` by ``json``, which Python reads back).
    """
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if hasattr(obj, "to_dict") and callable(obj.to_dict):  # ml_collections.ConfigDict
        return to_jsonable(obj.to_dict())
    if hasattr(obj, "as_configdict") and callable(obj.as_configdict):  # ml_collections.FrozenConfigDict
        return to_jsonable(obj.as_configdict().to_dict())
    if isinstance(obj, Mapping):
        return {str(key): to_jsonable(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
        return [to_jsonable(item) for item in items]
    if isinstance(obj, np.dtype):
        return obj.name
    if isinstance(obj, type):
        try:
            return np.dtype(obj).name  # jnp.float16, np.uint8, float, ...
        except TypeError:
            return f"{obj.__module__}.{obj.__qualname__}"
    if isinstance(obj, (np.generic, np.ndarray)) or (hasattr(obj, "__array__") and hasattr(obj, "dtype")):
        return np.asarray(obj).tolist()  # numpy and jax scalars and arrays
    if isinstance(obj, enum.Enum):
        return str(obj.name)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    return str(obj)


__all__ = ["to_jsonable"]
