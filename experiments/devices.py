"""The devices of a learner's run: joining a multi-process run and building the mesh, from the config.

Every learner config has ``config.mesh`` (``data``, ``fsdp``; see :mod:`lpjax.sharding`) and
``config.distributed`` (``coordinator_address``, ``num_processes``, ``process_id``: unset fields come from the
environment, see :func:`lpjax.sharding.initialize_distributed`). A config without them (an old run's) runs on one
device.
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
from jax.sharding import Mesh
from ml_collections import config_dict

from lpjax.sharding import check_replay_layout, initialize_distributed, mesh_from_config


def join_processes(config: Any) -> None:
    """Joins the multi-process run the config (or the environment) describes, unless this Python process has
    joined one already (a second run in the same process, or a caller that initialized ``jax.distributed``)."""
    if not jax.distributed.is_initialized():
        initialize_distributed(**dict(config.get("distributed") or {}))


def mesh_devices(config: Any) -> int:
    """The number of devices ``config.mesh`` asks for, ``data * fsdp`` (1 for a config without a mesh)."""
    mesh = config.get("mesh") or {}
    return mesh.get("data", 1) * mesh.get("fsdp", 1)


def learner_mesh(config: Any) -> Mesh | None:
    """The learner's mesh, after :func:`join_processes`: ``None`` (plain single-device arrays, as before meshes
    existed) for a 1 x 1 mesh of a single process, else :func:`lpjax.sharding.mesh_from_config`. Raises
    ``ValueError`` (one line) for a mesh the devices cannot form."""
    join_processes(config)
    mesh = mesh_from_config(config.get("mesh"))  # checks the fields
    return None if mesh_devices(config) == 1 and jax.process_count() == 1 else mesh


def check_state_layout(config: Any, agent: Any) -> None:
    """Raises ``ValueError`` (one line) for a mesh with ``fsdp > 1`` and a learner whose optimizer keeps its state
    in one flat buffer per dtype (``agent.fused_optimizer``): FSDP splits the state leaf by leaf, and would
    replicate the flat buffers whole on every device."""
    fsdp = (config.get("mesh") or {}).get("fsdp", 1)
    if fsdp > 1 and agent.fused_optimizer:
        raise ValueError(
            f"mesh.fsdp={fsdp} shards the learner's state leaf by leaf, but agent.fused_optimizer=True keeps the "
            "optimizer state in one flat buffer per dtype, which every device would hold whole: add "
            "--config.agent.fused_optimizer=False."
        )


def mesh_config_fields(config: Any) -> None:
    """Adds ``config.mesh`` (1 x 1) and ``config.distributed`` (unset) to a learner's base config."""
    config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=1))
    config.distributed = ml_collections.ConfigDict(
        dict(
            coordinator_address=config_dict.placeholder(str),
            num_processes=config_dict.placeholder(int),
            process_id=config_dict.placeholder(int),
        )
    )


REPLAY_SHARDS_METADATA = "replay_shards"
"""The checkpoint metadata entry holding the number of strata the saved replay buffer was laid out with."""


def replay_strata(config: Any, mesh: Mesh | None, batch_size: int, stored: int | None = None) -> int:
    """The number of strata of an off-policy learner's replay buffer (see :func:`lpjax.replay.replay_sample`).

    ``config.replay_shards`` if set, else ``stored`` (the number a resumed checkpoint's buffer was laid out with),
    else the mesh's device count (1 without a mesh). The strata fix which transitions a batch holds, so a run
    resumes with its checkpoint's number on any mesh whose device count divides it. Raises ``ValueError`` (one
    line) when the config contradicts the checkpoint, or the number does not fit the mesh, the replay capacity
    and the batch (:func:`lpjax.sharding.check_replay_layout`).
    """
    requested = config.get("replay_shards")
    if requested is not None and stored is not None and requested != stored:
        raise ValueError(
            f"replay_shards={requested}, but the checkpoint's replay buffer is laid out in {stored} strata; "
            "leave replay_shards unset to keep it."
        )
    devices = 1 if mesh is None else mesh.devices.size
    strata = requested if requested is not None else stored if stored is not None else devices
    if isinstance(strata, bool) or not isinstance(strata, int) or strata < 1:
        raise ValueError(f"replay_shards must be a positive integer, got {strata!r}.")
    check_replay_layout(config.replay_capacity, batch_size, strata, mesh)
    return strata
