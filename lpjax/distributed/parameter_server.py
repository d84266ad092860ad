"""The parameter server: the learner publishes packed policy weights, actors pull them every K steps.

It stores one ``(version, blob)`` pair: ``blob`` is the bytes of :func:`lpjax.quant.pack_params` (int8 codes
and scales for an int8 actor, 4x smaller than fp32), ``version`` the learner's update count when it was packed.
The same class serves in-process and, wrapped by ``ray.remote``, as a Ray actor.
"""

from __future__ import annotations


class ParameterServer:
    """Holds the latest packed policy and counts what was broadcast."""

    def __init__(self):
        self._version, self._blob = -1, b""
        self.publishes = 0
        self.pulls = 0
        self.bytes_pulled = 0

    def publish(self, version: int, blob: bytes) -> None:
        """Replaces the stored policy (versions must not go backwards)."""
        if version < self._version:
            raise ValueError(f"version {version} is older than the stored {self._version}.")
        self._version, self._blob = int(version), bytes(blob)
        self.publishes += 1

    def pull(self) -> tuple[int, bytes]:
        """The latest ``(version, blob)``; ``(-1, b"")`` before the first publish."""
        self.pulls += 1
        self.bytes_pulled += len(self._blob)
        return self._version, self._blob

    def stats(self) -> dict[str, int]:
        return {
            "version": self._version,
            "blob_bytes": len(self._blob),
            "publishes": self.publishes,
            "pulls": self.pulls,
            "bytes_pulled": self.bytes_pulled,
        }
