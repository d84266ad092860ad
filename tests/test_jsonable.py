"""lpjax.jsonable.to_jsonable: configs and metadata as plain JSON types."""

import dataclasses
import enum
import json
import math
import pathlib

import jax.numpy as jnp
import ml_collections
import numpy as np

from lpjax.jsonable import to_jsonable


def test_to_jsonable_handles_numpy_jax_and_nested_values():
    value = {
        "a": np.float32(0.5),
        "b": jnp.arange(3),
        1: (np.int64(2), None),
        "c": {"d": jnp.bfloat16(1.5)},
        "e": float("nan"),
    }
    out = to_jsonable(value)
    assert out["a"] == 0.5 and out["b"] == [0, 1, 2] and out["1"] == [2, None] and out["c"] == {"d": 1.5}
    assert math.isnan(json.loads(json.dumps(out))["e"])


class _Color(enum.Enum):
    RED = 1


@dataclasses.dataclass
class _Point:
    x: float
    tags: tuple


def test_to_jsonable_handles_configs_dtypes_paths_enums_and_dataclasses():
    config = ml_collections.ConfigDict({"lr": 1e-4, "hidden": (256, 256)})
    config.batch = ml_collections.FieldReference(32)
    value = {
        "config": config,
        "frozen": ml_collections.FrozenConfigDict({"a": 1}),
        "dtype": jnp.float16,
        "np_dtype": np.dtype("bfloat16") if hasattr(np, "bfloat16") else np.dtype("float32"),
        "path": pathlib.Path("runs/x"),
        "color": _Color.RED,
        "point": _Point(1.5, ("a",)),
        "set": {3, 1},
    }
    out = to_jsonable(value)
    assert json.loads(json.dumps(out)) == out
    assert out["config"] == {"lr": 1e-4, "hidden": [256, 256], "batch": 32} and out["frozen"] == {"a": 1}
    assert out["dtype"] == "float16" and out["path"] == "runs/x" and out["color"] == "RED"
    assert out["point"] == {"x": 1.5, "tags": ["a"]} and out["set"] == [1, 3]
