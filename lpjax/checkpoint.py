"""Checkpoints of a whole training state pytree plus JSON metadata, on orbax.

A :class:`Checkpointer` keeps the last ``max_to_keep`` checkpoints of a run in one directory::

    directory/<step>/state/       the state pytree (orbax StandardCheckpointHandler: tensorstore/OCDBT)
    directory/<step>/metadata/    a JSON dict: ``step`` plus whatever was passed (config, env steps, ...)

Usage in a learner::

    ckpt = Checkpointer(run_dir / "checkpoints", max_to_keep=3)
    if ckpt.latest_step() is not None:                          # resume
        state, meta = ckpt.restore(target=state)                # dtypes and NamedTuple types from `state`
        logger.truncate_after(meta["step"])
    ...
    ckpt.save(step, state, metadata={"config": config, "env_steps": env_steps})
    ...
    ckpt.close()                                                # waits for the last save

**What is saved.** Any pytree of arrays: NamedTuples, dicts, lists, optax states (``EmptyState`` and ``None``
nodes hold no data), numpy/jax arrays of any dtype (float16, bfloat16, float32, int32, uint8, ...) and typed PRNG
keys from ``jax.random.key`` (orbax saves their ``key_data`` and implementation and restores typed keys of the
same implementation; the tests check the round trip). Arrays are restored bit for bit.

**Restoring into a target.** Checkpoints store dicts and lists, not Python types: pass ``target`` (the freshly
initialized state, or its ``jax.eval_shape``) to get NamedTuples and the exact dtypes back. The target is checked
against what is stored first: a missing or unexpected leaf, or a different shape or dtype, raises a
``ValueError`` naming the leaf. (Orbax alone would silently cast dtypes and report shape mismatches without the
leaf's name.) Without a target the raw tree of dicts and lists is returned.

**Atomicity.** Orbax writes a checkpoint into ``<step>.orbax-checkpoint-tmp`` and renames it to ``<step>``
once both items are complete; the rename is atomic on a local file system. :meth:`Checkpointer.all_steps` and
:meth:`Checkpointer.latest_step` list only renamed (finalized) directories, so a process killed mid-save leaves
a temporary directory that restore never picks. (Orbax's own ``latest_step()`` already reports a step whose
asynchronous save is still running.) Stale temporary directories are removed at this process's first save.

**Asynchronous saves.** With ``async_save=True`` (default) :meth:`Checkpointer.save` returns once the write has
started; it continues in a background thread and training goes on. Orbax holds the saved arrays until the
write is done: a jitted step that donates them meanwhile gets a copy instead (JAX falls back silently; results
are unaffected, the tests check it). The next save, :meth:`Checkpointer.restore`, :meth:`Checkpointer.wait`
and :meth:`Checkpointer.close` wait for it. Call ``close()`` (or use the checkpointer as a context manager)
before the process exits, or the last checkpoint may be lost.

Steps must increase: saving a step at or below the latest one raises (orbax would silently skip it); after
resuming from an older checkpoint, drop the newer ones with :meth:`Checkpointer.delete_after`.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from lpjax.jsonable import to_jsonable

STATE_ITEM = "state"
METADATA_ITEM = "metadata"
_TMP_DIR = re.compile(r"^\d+\.orbax-checkpoint-tmp")


def _key_name(key) -> str:
    for attribute in ("key", "name", "idx"):  # DictKey / FlattenedIndexKey, GetAttrKey, SequenceKey
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def _leaf_specs(tree) -> dict[str, tuple[str, Any]]:
    """``{normalized path: (display path, leaf)}``; paths are ``.``-joined names as orbax stores them."""
    specs = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        specs[".".join(_key_name(k) for k in path)] = ("state" + jax.tree_util.keystr(path), leaf)
    return specs


def _stored_shape_dtype(leaf) -> tuple[tuple[int, ...], np.dtype | None]:
    """Shape and dtype of a target leaf as stored: typed PRNG keys are stored as their ``key_data``."""
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        data = jax.eval_shape(jax.random.key_data, leaf)
        return tuple(data.shape), np.dtype(data.dtype)
    return tuple(np.shape(leaf)), None if dtype is None else np.dtype(dtype)


def _describe(shape, dtype) -> str:
    return f"{'?' if dtype is None else np.dtype(dtype).name}{list(shape)}"


def _check_target(stored_tree, target, step: int) -> None:
    """Raises a ``ValueError`` naming the first leaves where ``target`` differs from the stored tree."""
    stored, wanted = _leaf_specs(stored_tree), _leaf_specs(target)
    missing = [wanted[k][0] for k in wanted if k not in stored]
    unexpected = [k for k in stored if k not in wanted]
    problems = []
    if missing:
        problems.append(
            f"target leaves not in the checkpoint: {', '.join(missing[:5])}"
            + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else "")
        )
    if unexpected:
        problems.append(
            f"checkpoint leaves not in the target: {', '.join(unexpected[:5])}"
            + (f" (+{len(unexpected) - 5} more)" if len(unexpected) > 5 else "")
        )
    for key, (name, leaf) in wanted.items():
        if key not in stored:
            continue
        shape, dtype = _stored_shape_dtype(leaf)
        meta = stored[key][1]
        stored_shape = tuple(getattr(meta, "shape", None) or ())
        stored_dtype = getattr(meta, "dtype", None)
        if shape != stored_shape or (
            dtype is not None and stored_dtype is not None and np.dtype(stored_dtype) != dtype
        ):
            problems.append(
                f"{name}: checkpoint has {_describe(stored_shape, stored_dtype)}, target has {_describe(shape, dtype)}"
            )
    if problems:
        raise ValueError(
            f"checkpoint step {step} does not match the restore target:\n  "
            + "\n  ".join(problems)
            + "\nRestore with target=None to get the stored tree as is (e.g. to convert it)."
        )


class Checkpointer:
    """Saves and restores ``(state, metadata)`` checkpoints in ``directory``; see the module docstring.

    Args:
      directory: where checkpoints go, created if missing (one directory per run).
      max_to_keep: number of most recent checkpoints kept; older ones are deleted after each save. ``None``
        keeps all.
      async_save: write in a background thread (see the module docstring).
    """

    def __init__(self, directory: str | os.PathLike, max_to_keep: int | None = 3, async_save: bool = True):
        if max_to_keep is not None and (
            isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep < 1
        ):
            raise ValueError(f"max_to_keep must be a positive integer or None, got {max_to_keep!r}.")
        self.directory = pathlib.Path(directory).absolute()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._saved_once = False
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True
        )
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=options,
            item_handlers={STATE_ITEM: ocp.StandardCheckpointHandler(), METADATA_ITEM: ocp.JsonCheckpointHandler()},
        )

    def all_steps(self) -> list[int]:
        """Steps of the complete (finalized) checkpoints on disk, ascending. Never blocks on a running save."""
        return sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit() and p.is_dir())

    def latest_step(self) -> int | None:
        """The step of the newest complete checkpoint, or ``None`` if there is none."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def save(self, step: int, state: Any, metadata: Mapping[str, Any] | None = None) -> None:
        """Saves ``state`` and ``metadata`` as checkpoint ``step`` (asynchronously unless ``async_save=False``).

        Args:
          step: a non-negative integer larger than every saved step.
          state: the training state, any pytree of arrays (see the module docstring).
          metadata: a JSON-able dict (converted with :func:`lpjax.jsonable.to_jsonable`, so ConfigDicts and
            numpy scalars are fine); ``"step"`` is added if absent.

        Raises:
          ValueError: on a negative or non-integer step, a step at or below one already saved, or metadata that
            is not a mapping.
        """
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}.")
        step = int(step)
        if metadata is not None and not isinstance(metadata, Mapping):
            raise ValueError(f"metadata must be a dict, got {type(metadata).__name__}.")
        metadata = {"step": step, **to_jsonable(dict(metadata or {}))}
        self._manager.wait_until_finished()
        latest = self.latest_step()
        if latest is not None and step <= latest:
            raise ValueError(
                f"cannot save step {step} in {self.directory}: checkpoint step {latest} exists and steps "
                "must increase. When resuming from an older step, call delete_after(step) first."
            )
        if not self._saved_once:
            self._remove_stale_tmp_dirs()
            self._saved_once = True
        self._manager.reload()
        saved = self._manager.save(
            step,
            args=ocp.args.Composite(
                **{STATE_ITEM: ocp.args.StandardSave(state), METADATA_ITEM: ocp.args.JsonSave(metadata)}
            ),
        )
        if not saved:
            raise RuntimeError(f"orbax declined to save step {step} in {self.directory}.")

    def _remove_stale_tmp_dirs(self) -> None:
        """Removes ``<step>.orbax-checkpoint-tmp*`` left by a crashed writer (one writer per directory)."""
        for path in self.directory.iterdir():
            if _TMP_DIR.match(path.name) and path.is_dir():
                shutil.rmtree(path, ignore_errors=True)

    def restore(self, step: int | None = None, target: Any = None) -> tuple[Any, dict]:
        """Restores checkpoint ``step`` (default: the latest complete one). Waits for a running save first.

        Args:
          step: the step to restore, or ``None`` for the latest.
          target: a pytree like the saved state (e.g. the freshly initialized state, or ``jax.eval_shape`` of
            it): the restored state takes its structure (NamedTuple types) and must match its shapes and dtypes.
            ``None`` returns the stored tree of dicts and lists.

        Returns:
          ``(state, metadata)``: the restored pytree and the metadata dict saved with it (with ``"step"``).

        Raises:
          FileNotFoundError: if there is no (such) complete checkpoint.
          ValueError: if ``target`` does not match the stored tree; the message names the leaves.
        """
        self.wait()
        steps = self.all_steps()
        if not steps:
            raise FileNotFoundError(f"no complete checkpoint in {self.directory}.")
        if step is None:
            step = steps[-1]
        elif int(step) not in steps:
            raise FileNotFoundError(
                f"no complete checkpoint for step {step} in {self.directory}; available steps: {steps}."
            )
        step = int(step)
        self._manager.reload()
        if target is not None:
            stored = self._manager.item_metadata(step)[STATE_ITEM]
            _check_target(stored.tree if hasattr(stored, "tree") else stored, target, step)
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                **{STATE_ITEM: ocp.args.StandardRestore(target), METADATA_ITEM: ocp.args.JsonRestore()}
            ),
        )
        metadata = restored[METADATA_ITEM]
        return restored[STATE_ITEM], dict(metadata) if metadata is not None else {"step": step}

    def delete_after(self, step: int) -> list[int]:
        """Deletes the checkpoints with a step larger than ``step`` (after resuming from ``step``); returns them."""
        self.wait()
        self._manager.reload()
        deleted = [s for s in self.all_steps() if s > int(step)]
        for s in deleted:
            self._manager.delete(s)
        self._manager.reload()
        return deleted

    def wait(self) -> None:
        """Blocks until a running asynchronous save is complete on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for a running save and releases orbax's resources."""
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
