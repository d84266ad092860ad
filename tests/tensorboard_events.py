"""Reads the TensorBoard event files of a run directory, for the tests of :class:`lpjax.run_logging.RunLogger`.

:func:`read_tensorboard_scalars` parses the event files with tensorboardX's own protobufs and record checksums
(no TensorFlow or TensorBoard needed). It lives with the tests: the library writes events, only tests read them.
"""

from __future__ import annotations

import os
import pathlib
import struct
from collections.abc import Iterable

from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c


def _records(data: bytes) -> Iterable[bytes]:
    """Payloads of a TFRecord file (length, crc, payload, crc); stops at a truncated or corrupt record."""
    offset = 0
    while offset + 12 <= len(data):
        header = data[offset : offset + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[offset + 8 : offset + 12])
        end = offset + 12 + length + 4
        if header_crc != masked_crc32c(header) or end > len(data):
            return
        payload = data[offset + 12 : offset + 12 + length]
        if struct.unpack("<I", data[end - 4 : end])[0] != masked_crc32c(payload):
            return
        yield payload
        offset = end


def read_tensorboard_scalars(run_dir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Reads the scalars of every TensorBoard event file in ``run_dir`` into ``{tag: [(step, value), ...]}``.

    No TensorFlow or TensorBoard needed: event files are parsed with tensorboardX's protobufs. Files are read in
    the order they were started (their first event's wall time) and a purge (a ``SessionLog.START`` event at step
    ``s``, written after :meth:`lpjax.run_logging.RunLogger.truncate_after`) drops earlier scalars with
    ``step >= s``, as TensorBoard does.
    """
    files = []
    for path in pathlib.Path(run_dir).glob("events.out.tfevents.*"):
        events = []
        for payload in _records(path.read_bytes()):
            event = event_pb2.Event()
            event.ParseFromString(payload)
            events.append(event)
        if events:
            files.append((events[0].wall_time, path.name, events))
    scalars: dict[str, list[tuple[int, float]]] = {}
    for _, _, events in sorted(files, key=lambda f: (f[0], f[1])):
        for event in events:
            if event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
                scalars = {tag: [(s, v) for s, v in points if s < event.step] for tag, points in scalars.items()}
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars.setdefault(value.tag, []).append((int(event.step), float(value.simple_value)))
    return scalars
