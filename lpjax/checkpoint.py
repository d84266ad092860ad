"""Checkpoints of a whole training state pytree plus JSON metadata, on orbax.

A :class:`Checkpointer` keeps the last ``max_to_keep`` checkpoints of a run in one directory::

    directory/<step>/state/       the state pytree (orbax StandardCheckpointHandler: tensorstore/OCDBT)
    directory/<step>/metadata/    a JSON dict: ``step`` plus whatever was passed (config, env steps, ...)

Usage in a learner::

    ckpt = Checkpointer(run_dir / "checkpoints", max_to_keep=3)
    if ckpt.latest_step() is not None:                          # resume
        step, state, meta = ckpt.restore_latest_good(state)     # dtypes and NamedTuple types from `state`;
        logger.truncate_after(step)                             # skips (and deletes) newer corrupt checkpoints
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

Checkpoints beyond ``max_to_keep`` are deleted atomically: orbax renames a step's directory into ``deleted/``, which
the next save, wait or close empties (a process killed meanwhile leaves only the trash, emptied at the next
process's first save).

Steps must increase: saving a step at or below the latest one raises (orbax would silently skip it); after
resuming from an older checkpoint, drop the newer ones with :meth:`Checkpointer.delete_after`.

**Corrupt checkpoints.** A finalized checkpoint can still be damaged later (a full disk, a partial copy, a flaky
network file system). :meth:`Checkpointer.restore` checks a step before orbax reads it:

* orbax's JSON files (``state/_METADATA`` and ``metadata/metadata``, which restore needs, and
  ``_CHECKPOINT_METADATA``, ``state/_sharding`` and ``state/array_metadatas/*`` where present) parse as JSON
  objects;
* the state's OCDBT store opens and lists (reading every b-tree node, whose CRC-32C OCDBT verifies), its zarr
  metadata values parse, and the last byte of every chunk reads back: that fails with ``OUT_OF_RANGE`` when the
  data file holding the chunk is truncated, and reads as empty when the file is missing.

A failed check, or any error orbax raises while reading the step, raises :class:`CorruptCheckpoint`, a
``ValueError`` with one line naming the step and the bad file or array. A target that does not match the stored
tree is not corruption and keeps raising the plain ``ValueError`` above. :meth:`Checkpointer.restore_latest_good`
falls back to the newest readable step. Not detected: a changed byte inside a chunk. Chunks are zstd frames
without a checksum and OCDBT keeps none for values, so most such flips restore silently different numbers.

**A full disk.** Before a save, :meth:`Checkpointer.save` compares the state's size in memory (its arrays' bytes:
compression makes the data smaller on disk, orbax's metadata adds some) with the space left (``statvfs``, cheap),
and raises :class:`lpjax.disk.DiskFull` without writing when less is left. When the disk fills up anyway (another writer
took the space), orbax's background threads fail: the error is raised by the next save, :meth:`Checkpointer.wait`
or :meth:`Checkpointer.close`, as a ``DiskFull`` naming the step, the directory and the space left. Orbax's own
reports of that failure (its error logs, with tracebacks, and the writes it abandons reporting into a closed
event loop) are dropped, the failed step's temporary directory is removed to give its space back, and the
complete checkpoints before it stay as they were: the next process resumes from the latest one.

The checks read synchronously and wait for every read, before orbax starts. Orbax reads all arrays concurrently
on a private asyncio loop, stops at the first error and closes the loop: the reads still in flight then report
into the closed loop, each as an unraisable ``RuntimeError: Event loop is closed`` or a closed orbax coroutine
re-raising its error with a full tensorstore spec (a screen of tracebacks on stderr). For the errors the checks
cannot see (a chunk zstd fails to decode), :meth:`Checkpointer._read_with_orbax` drops exactly those reports.
"""

from __future__ import annotations

import errno
import gc
import json
import logging
import os
import pathlib
import re
import shutil
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

from lpjax import disk
from lpjax.jsonable import to_jsonable

STATE_ITEM = "state"
METADATA_ITEM = "metadata"
_TMP_DIR = re.compile(r"^\d+\.orbax-checkpoint-tmp")
# Where orbax moves a step it deletes (old ones beyond max_to_keep, delete_after), by one rename, before this module
# removes it: deleting a step's files one by one, as orbax otherwise does, leaves a step directory without its
# metadata when the process is killed meanwhile, which every later CheckpointManager warns about.
_TRASH_DIR = "deleted"
# Orbax's JSON files in a step directory, and whether restoring needs them (orbax tolerates the others missing).
_JSON_FILES = (
    ("_CHECKPOINT_METADATA", False),
    (f"{STATE_ITEM}/_METADATA", True),
    (f"{STATE_ITEM}/_sharding", False),
    (f"{METADATA_ITEM}/metadata", True),
)
_OCDBT_MANIFEST = f"{STATE_ITEM}/manifest.ocdbt"
_ZARR_METADATA_KEYS = (".zarray", ".zattrs", "zarr.json")
_TS_STATUS = re.compile(r"^[A-Z][A-Z_]+: ")  # tensorstore errors start with an absl status code
_LOCAL_FILE = re.compile(r'local file "([^"]+)"')
_TS_DETAILS = re.compile(r"\s*\[(?:tensorstore_spec|source locations)=.*", re.DOTALL)


class CorruptCheckpoint(ValueError):
    """A finalized checkpoint whose data or metadata cannot be read (truncated, garbled or missing files).

    The message is one line naming the step, the directory and the bad file or array. ``step`` is the corrupt
    step, or ``None`` when :meth:`Checkpointer.restore_latest_good` found no readable step.
    """

    def __init__(self, message: str, step: int | None = None):
        super().__init__(message)
        self.step = step


def _short(message: str, step_dir: pathlib.Path, limit: int = 300) -> str:
    """One line of at most ``limit`` characters, without tensorstore's spec dump, paths relative to the step."""
    message = _TS_DETAILS.sub("", message)
    message = " ".join(message.split()).replace(f"{step_dir}{os.sep}", "").replace(str(step_dir), ".")
    return message if len(message) <= limit else message[: limit - 3] + "..."


def _describe_failure(error: BaseException, step_dir: pathlib.Path) -> str:
    """``"<file>: <reason>"`` (or just the reason) for an error raised while reading ``step_dir``.

    Orbax wraps tensorstore's errors (in messages that dump whole specs over many lines): the innermost error
    with a tensorstore status code in the ``__cause__``/``__context__`` chain is the informative one.
    """
    chain, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append(error)
        error = error.__cause__ or error.__context__
    for candidate in reversed(chain):
        if _TS_STATUS.match(str(candidate)):
            error = candidate
            break
    else:
        error = chain[0]
    message = str(error) if _TS_STATUS.match(str(error)) else f"{type(error).__name__}: {error}"
    files = [pathlib.Path(f) for f in _LOCAL_FILE.findall(message)]
    files = [f for f in files if f.is_relative_to(step_dir) and f != step_dir / STATE_ITEM]
    if files:
        return f"{files[-1].relative_to(step_dir)}: {_short(message, step_dir)}"
    return _short(message, step_dir)


def _check_json_files(step_dir: pathlib.Path) -> str | None:
    """The first of orbax's JSON files that is missing (if required), unreadable or not a JSON object."""
    array_metadatas = step_dir / STATE_ITEM / "array_metadatas"
    extra = sorted(array_metadatas.iterdir()) if array_metadatas.is_dir() else []
    files = [(step_dir / name, required) for name, required in _JSON_FILES] + [(p, False) for p in extra]
    for path, required in files:
        name = path.relative_to(step_dir)
        if not path.exists():
            if required:
                return f"{name}: missing"
            continue
        try:
            text = path.read_text()
            if not text.strip():
                return f"{name}: empty file"
            value = json.loads(text)
        except (OSError, UnicodeDecodeError) as error:
            return f"{name}: unreadable ({_short(str(error), step_dir)})"
        except ValueError as error:
            return f"{name}: not valid JSON ({error})"
        if not isinstance(value, dict):
            return f"{name}: not a JSON object"
    return None


def _check_state_store(step_dir: pathlib.Path) -> str | None:
    """The first unreadable value of the state's OCDBT store (see the module docstring), read synchronously.

    All reads are started, then every one is waited for, so none is left running into a closed event loop.
    Zarr metadata values are read whole and parsed; of the chunks only the last byte is read (a truncated data
    file fails that read), so the check costs one small read per chunk, not a second restore.
    """
    if not (step_dir / _OCDBT_MANIFEST).is_file():
        return f"{_OCDBT_MANIFEST}: missing"
    spec = {"driver": "ocdbt", "base": {"driver": "file", "path": f"{step_dir / STATE_ITEM}/"}}
    try:
        store = ts.KvStore.open(spec).result()
        keys = sorted(store.list().result())
    except Exception as error:  # tensorstore raises ValueError carrying a status code
        return _describe_failure(error, step_dir)
    if not keys:
        return f"{_OCDBT_MANIFEST}: the store holds no arrays"
    reads = []
    for key in keys:
        is_metadata = key.decode(errors="replace").endswith(_ZARR_METADATA_KEYS)
        reads.append((key, is_metadata, store.read(key, byte_range=None if is_metadata else slice(-1, None))))
    problems = []
    for key, is_metadata, read in reads:
        try:
            result = read.result()
            if result.state != "value":
                raise ValueError(f"NOT_FOUND: value is {result.state}")
            if not result.value:  # OCDBT reads a value whose data file is missing as empty; chunks never are
                raise ValueError("DATA_LOSS: value reads as empty (its data file is missing)")
            if is_metadata:
                json.loads(result.value)
        except Exception as error:
            problems.append((key.decode(errors="replace"), error))
    if not problems:
        return None
    key, error = problems[0]
    where = _data_file_of_size(step_dir, str(error))
    more = f" (+{len(problems) - 1} more unreadable values)" if len(problems) > 1 else ""
    return f"{STATE_ITEM}/{key}{where}: {_describe_failure(error, step_dir)}{more}"


def _data_file_of_size(step_dir: pathlib.Path, message: str) -> str:
    """``" in <file>"`` for a chunk read past the end of a truncated data file, if that file is unambiguous.

    OCDBT's error names the data file's actual size (``... not valid for value of size N``), not its name.
    """
    size = re.search(r"not valid for value of size (\d+)", message)
    if not size:
        return ""
    files = [p for p in (step_dir / STATE_ITEM).rglob("*") if p.is_file() and p.stat().st_size == int(size[1])]
    return f" in {files[0].relative_to(step_dir)}" if len(files) == 1 else ""


def _is_abandoned_read_report(unraisable: Any) -> bool:
    """Whether an unraisable exception comes from the reads a failed orbax restore left behind.

    Two kinds: tensorstore's completion callback of a read that finished after orbax closed its event loop
    (``RuntimeError: Event loop is closed``), and an orbax coroutine that raises its read error when the
    abandoned coroutine is closed (``Exception ignored in: <coroutine object _read_array_index_and_device_put>``,
    with a full tensorstore spec). Both repeat an error that restore already raised.
    """
    error, source = unraisable.exc_value, unraisable.object
    if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
        return True
    code = getattr(source, "cr_code", None)
    return code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename


_previous_unraisablehook = sys.unraisablehook


def _drop_abandoned_read_reports(unraisable: Any) -> None:
    if not _is_abandoned_read_report(unraisable):
        _previous_unraisablehook(unraisable)


_keep_filter = False  # set once orbax abandoned work: its reports may come at any later time


def _install_unraisable_filter() -> bool:
    """Makes :func:`_drop_abandoned_read_reports` the unraisable hook; whether it was not already."""
    global _previous_unraisablehook
    if sys.unraisablehook is _drop_abandoned_read_reports:
        return False
    _previous_unraisablehook = sys.unraisablehook
    sys.unraisablehook = _drop_abandoned_read_reports
    return True


def _remove_unraisable_filter() -> None:
    """Puts back the hook :func:`_install_unraisable_filter` replaced, unless something replaced the filter or
    orbax abandoned work since (:func:`_abandoned`: the filter then stays for the rest of the process)."""
    if sys.unraisablehook is _drop_abandoned_read_reports and not _keep_filter:
        sys.unraisablehook = _previous_unraisablehook


def _abandoned() -> None:
    """Keeps the filter installed for good and closes what a failed orbax call left (see ``_read_with_orbax``)."""
    global _keep_filter
    _install_unraisable_filter()
    _keep_filter = True
    gc.collect()


class _DropOutOfSpaceReports(logging.Filter):
    """Drops orbax's error logs about a write that found no space: :class:`Checkpointer` raises that error itself,
    as one :class:`lpjax.disk.DiskFull`, and orbax logs it from each failed thread with a full traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or f"{os.sep}orbax{os.sep}" not in record.pathname:
            return True
        error = record.exc_info[1] if record.exc_info else None
        return not (disk.is_out_of_space(error) or disk.out_of_space_errno(RuntimeError(record.getMessage())))


_OUT_OF_SPACE_FILTER = _DropOutOfSpaceReports()


def _state_bytes(state: Any) -> int:
    """Bytes of the arrays of ``state`` in memory (typed PRNG keys: their key data)."""
    return sum(int(getattr(leaf, "nbytes", 0) or 0) for leaf in jax.tree.leaves(state))


def _warn_corrupt(step: int, error: CorruptCheckpoint) -> None:
    warnings.warn(f"{error}; falling back to an older checkpoint", RuntimeWarning, stacklevel=3)


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
        self._pending: int | None = None  # the step of an asynchronous save not waited for yet
        logging.getLogger("absl").addFilter(_OUT_OF_SPACE_FILTER)  # orbax logs through absl (idempotent)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            enable_async_checkpointing=async_save,
            create=True,
            todelete_subdir=_TRASH_DIR,  # a step is deleted by one rename, then the trash is emptied
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
        self.wait()
        latest = self.latest_step()
        if latest is not None and step <= latest:
            raise ValueError(
                f"cannot save step {step} in {self.directory}: checkpoint step {latest} exists and steps "
                "must increase. When resuming from an older step, call delete_after(step) first."
            )
        needed = _state_bytes(state) + len(json.dumps(metadata))
        if disk.free_bytes(self.directory) < needed:
            raise disk.DiskFull(
                f"checkpoint {step}", self.directory, errno.ENOSPC, f"it needs up to {disk.format_bytes(needed)}"
            )
        if not self._saved_once:
            self._remove_stale_tmp_dirs()
            self._saved_once = True
        self._manager.reload()
        _install_unraisable_filter()  # until the save is waited for: a failed one abandons writes
        args = ocp.args.Composite(
            **{STATE_ITEM: ocp.args.StandardSave(state), METADATA_ITEM: ocp.args.JsonSave(metadata)}
        )
        saved = self._writing(step, lambda: self._manager.save(step, args=args))
        if not saved:
            raise RuntimeError(f"orbax declined to save step {step} in {self.directory}.")
        self._pending = step

    def _writing(self, step: int | None, call: Callable[[], Any]) -> Any:
        """``call()``, an orbax call that writes checkpoint ``step`` or waits for it; a full disk raises
        :class:`lpjax.disk.DiskFull` (see :meth:`_give_back`), any other error propagates."""
        try:
            return call()
        except Exception as error:
            failure = self._out_of_space(step, error)
        self._give_back(step, failure)  # outside the except block: nothing holds orbax's error any more

    def _out_of_space(self, step: int | None, error: Exception) -> disk.DiskFull:
        """``error`` of the save of ``step`` as a :class:`lpjax.disk.DiskFull`; re-raises any other error."""
        if not disk.is_out_of_space(error):
            raise error
        what = "a checkpoint" if step is None else f"checkpoint {step}"
        return disk.DiskFull(what, self.directory, disk.out_of_space_errno(error))

    def _give_back(self, step: int | None, failure: disk.DiskFull) -> None:
        """Raises ``failure`` after closing the writes orbax abandoned (their reports dropped) and removing the
        failed save's temporary directory (its space given back). Called outside the ``except`` block of orbax's
        error, so that nothing holds its traceback, and with it the abandoned coroutines, any more."""
        _abandoned()
        for path in self.directory.iterdir():
            if _TMP_DIR.match(path.name) and path.name.split(".")[0] == str(step) and path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
        raise failure

    def _remove_stale_tmp_dirs(self) -> None:
        """Removes ``<step>.orbax-checkpoint-tmp*`` left by a crashed writer (one writer per directory), and what a
        crashed writer left in the trash."""
        for path in self.directory.iterdir():
            if _TMP_DIR.match(path.name) and path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
        self._empty_trash()

    def _empty_trash(self) -> None:
        """Removes the steps orbax deleted (moved to ``_TRASH_DIR``)."""
        shutil.rmtree(self.directory / _TRASH_DIR, ignore_errors=True)

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
          CorruptCheckpoint: if the checkpoint's data or metadata cannot be read (see the module docstring).
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
        step_dir = self.directory / str(step)
        problem = _check_json_files(step_dir) or _check_state_store(step_dir)
        if problem:
            raise self._corrupt(step, problem)
        self._manager.reload()
        if target is not None:
            stored = self._read_with_orbax(step, lambda: self._manager.item_metadata(step)[STATE_ITEM])
            _check_target(stored.tree if hasattr(stored, "tree") else stored, target, step)  # not corruption
        args = {STATE_ITEM: ocp.args.StandardRestore(target), METADATA_ITEM: ocp.args.JsonRestore()}
        restored = self._read_with_orbax(step, lambda: self._manager.restore(step, args=ocp.args.Composite(**args)))
        metadata = restored[METADATA_ITEM]
        return restored[STATE_ITEM], dict(metadata) if metadata is not None else {"step": step}

    def _read_with_orbax(self, step: int, read: Callable[[], Any]) -> Any:
        """Returns ``read()``, an orbax read of checked ``step``; any error it raises becomes a CorruptCheckpoint.

        While ``read`` runs, ``sys.unraisablehook`` is a filter that drops the reports of reads a failed orbax
        call abandons (see :func:`_is_abandoned_read_report`) and passes all others to the hook it replaced. On
        success nothing was abandoned and the previous hook is put back (unless something replaced the filter
        meanwhile). On failure the orbax error is reduced to its one-line description and dropped, not chained:
        its traceback holds the abandoned coroutines, which ``gc.collect()`` then closes while their reports are
        dropped. The filter stays installed for the rest of the process for the tensorstore reads still in
        flight, which report whenever they finish.
        """
        installed = _install_unraisable_filter()
        try:
            result = read()
        except Exception as error:
            problem = _describe_failure(error, self.directory / str(step))
        else:
            if installed:
                _remove_unraisable_filter()
            return result
        _abandoned()
        raise self._corrupt(step, problem)

    def _corrupt(self, step: int, problem: str) -> CorruptCheckpoint:
        return CorruptCheckpoint(f"checkpoint {step} in {self.directory} is corrupt: {problem}", step=step)

    def restore_latest_good(
        self,
        target: Any = None,
        on_corrupt: Callable[[int, CorruptCheckpoint], None] | None = None,
        restore: Callable[[int], tuple[Any, dict]] | None = None,
    ) -> tuple[int, Any, dict]:
        """Restores the newest readable checkpoint, skipping (and then deleting) newer corrupt ones.

        Tries the complete steps newest first. For each corrupt one, ``on_corrupt(step, error)`` is called (by
        default a ``RuntimeWarning`` with the error's message; raising from it stops the fallback) and the
        previous step is tried. Once step ``s`` restores, ``delete_after(s)`` deletes the newer, corrupt
        checkpoints: they hold nothing readable, and saves must go above the newest step on disk, so training
        resumed from ``s`` could not save again while they exist. Nothing is deleted when no step restores.

        Args:
          target: as for :meth:`restore`.
          on_corrupt: called with each corrupt step and its :class:`CorruptCheckpoint` before falling back.
          restore: ``restore(step) -> (state, metadata)`` in place of ``self.restore(step, target=target)``, e.g. a
            learner that restores itself from this checkpointer; it signals damage by raising
            :class:`CorruptCheckpoint`.

        Returns:
          ``(step, state, metadata)`` of the restored checkpoint.

        Raises:
          FileNotFoundError: if there is no complete checkpoint at all.
          CorruptCheckpoint: if every complete checkpoint is corrupt; the message lists the steps tried.
          ValueError: if ``target`` does not match the newest readable checkpoint (no fallback: that is a
            mismatch of the run's configuration, not damage).
        """
        self.wait()
        steps = self.all_steps()
        if not steps:
            raise FileNotFoundError(f"no complete checkpoint in {self.directory}.")
        on_corrupt = on_corrupt or _warn_corrupt
        restore = restore or (lambda step: self.restore(step, target=target))
        for step in reversed(steps):
            try:
                state, metadata = restore(step)
            except CorruptCheckpoint as error:
                on_corrupt(step, error)
                continue
            self.delete_after(step)
            return step, state, metadata
        raise CorruptCheckpoint(
            f"no readable checkpoint in {self.directory}: steps {steps[::-1]} are all corrupt "
            "(each was reported to on_corrupt)."
        )

    def delete_after(self, step: int) -> list[int]:
        """Deletes the checkpoints with a step larger than ``step`` (after resuming from ``step``); returns them."""
        self.wait()
        self._manager.reload()
        deleted = [s for s in self.all_steps() if s > int(step)]
        self._empty_trash()
        for s in deleted:
            self._manager.delete(s)
        self._empty_trash()
        self._manager.reload()
        return deleted

    def wait(self) -> None:
        """Blocks until a running asynchronous save is complete on disk.

        Raises:
          lpjax.disk.DiskFull: the save found no space (its step's temporary directory is removed; the complete
            checkpoints before it are untouched).
        """
        step, self._pending = self._pending, None
        self._writing(step, self._manager.wait_until_finished)
        if step is not None:
            self._empty_trash()  # the steps the save made old
            _remove_unraisable_filter()  # nothing was abandoned

    def close(self) -> None:
        """Waits for a running save and releases orbax's resources (also when the save failed: see :meth:`wait`)."""
        try:
            self.wait()
        finally:
            self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
