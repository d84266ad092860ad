"""Where actors run: in this process (tests, notebooks) or as Ray actor processes (one machine or a cluster).

Both backends have one interface, used by :class:`lpjax.distributed.ActorLearner`:

* ``publish(version, blob)``: store the packed policy in the parameter server;
* ``submit(index, num_steps)``: ask actor ``index`` for ``num_steps`` more environment steps;
* ``wait(timeout)``: the finished jobs as ``(index, ActorResult | ActorFailure)`` pairs (at least one, unless
  ``timeout`` passes first);
* ``restart(index)``: replace a failed actor with a fresh one (``incarnation + 1``);
* ``pending``: the indices with a job in flight; ``server_stats()``; ``shutdown()``.

A crashed actor process surfaces as an :class:`ActorFailure` from ``wait``; the learner restarts it and keeps
training (the transitions it had already returned are in the replay buffer; only its job in flight is lost).

The local Ray cluster that :class:`RayBackend` starts (:func:`init_local_ray`) listens on 127.0.0.1 only and
runs no dashboard: nothing on the network can reach it. A cluster joined by address is configured by whoever
started it.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

from lpjax._optional import require
from lpjax.distributed.actor import ActorResult, ActorSpec, ActorWorker
from lpjax.distributed.parameter_server import ParameterServer


@dataclasses.dataclass
class ActorFailure:
    """An actor's job failed: its process died (Ray) or ``collect`` raised."""

    index: int
    incarnation: int
    error: str


class InProcessBackend:
    """Runs the actors one after another in this process; ``wait`` runs the oldest pending job.

    ``kill(index)`` simulates a crash: the actor's next job fails, as a dead Ray actor's would.
    """

    def __init__(self, specs: list[ActorSpec]):
        self.specs = list(specs)
        self.server = ParameterServer()
        self.incarnations = [0] * len(self.specs)
        self._workers = [self._make(i) for i in range(len(self.specs))]
        self._queue: list[tuple[int, int]] = []
        self._killed: set[int] = set()

    def _make(self, index: int) -> ActorWorker:
        return ActorWorker(self.specs[index], self.server.pull, self.incarnations[index])

    @property
    def pending(self) -> set[int]:
        return {index for index, _ in self._queue}

    def publish(self, version: int, blob: bytes) -> None:
        self.server.publish(version, blob)

    def submit(self, index: int, num_steps: int) -> None:
        if index in self.pending:
            raise ValueError(f"actor {index} already has a job in flight.")
        self._queue.append((index, num_steps))

    def wait(self, timeout: float | None = None) -> list[tuple[int, ActorResult | ActorFailure]]:
        del timeout  # jobs run synchronously
        if not self._queue:
            return []
        index, num_steps = self._queue.pop(0)
        if index in self._killed:
            return [(index, ActorFailure(index, self.incarnations[index], "killed"))]
        try:
            return [(index, self._workers[index].collect(num_steps))]
        except Exception as error:  # an actor's bug must not take the learner down; it is reported and restarted
            return [(index, ActorFailure(index, self.incarnations[index], f"{type(error).__name__}: {error}"))]

    def kill(self, index: int) -> None:
        self._killed.add(index)

    def restart(self, index: int) -> None:
        self._killed.discard(index)
        self._queue = [(i, n) for i, n in self._queue if i != index]
        self.incarnations[index] += 1
        self._workers[index] = self._make(index)

    def server_stats(self) -> dict[str, int]:
        return self.server.stats()

    def shutdown(self) -> None:
        self._queue.clear()


def check_ray_address(address: str, timeout: float = 5.0) -> None:
    """Raises ``ValueError`` unless ``host:port`` accepts a TCP connection (``"auto"``/``"local"`` pass)."""
    if address in ("auto", "local"):
        return
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"ray_address must be 'host:port' (or 'auto'), got {address!r}.")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as error:
        raise ValueError(
            f"Cannot reach the Ray cluster at {address!r}: {error}. Start one with `ray start --head` "
            "or leave ray_address empty to start a local cluster."
        ) from error


LOCAL_ONLY_ENV_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch for its single-machine mode (the default on macOS and Windows): ``"0"`` puts the node on 127.0.0.1."""


def init_local_ray(num_cpus: int | None = None) -> None:
    """Starts a new Ray cluster on this machine whose processes listen on the loopback interface only.

    Ray binds its servers (GCS, raylet, object manager, every worker's gRPC server, the dashboard and runtime-env
    agents, the autoscaler monitor's metrics) to all interfaces unless the node's IP address is a loopback one, and
    ``ray.init(_node_ip_address="127.0.0.1")`` replaces a loopback address with the machine's reachable one. The
    one setting that keeps the node on 127.0.0.1 is Ray's single-machine mode, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
    (:data:`LOCAL_ONLY_ENV_VAR`). Ray reads it when ``ray`` is imported, so it is set in the environment for the
    processes that ``ray.init`` spawns and on Ray's already imported constants for this one, then both are restored:
    the spawned processes keep it, and workers started later inherit it from the raylet.

    The dashboard is off (``include_dashboard=False``); Ray's token authentication, on by default for a new local
    cluster in the Ray versions of the ``distributed`` extra, stays as Ray sets it (``RAY_AUTH_MODE``). The cluster
    is always a new one (``address="local"``): neither ``RAY_ADDRESS`` nor a cluster started with ``ray start``
    on this machine is joined.

    Raises:
      RuntimeError: Ray put the node on a non-loopback address all the same (the cluster is shut down first).
    """
    saved_env = os.environ.get(LOCAL_ONLY_ENV_VAR)
    os.environ[LOCAL_ONLY_ENV_VAR] = "0"
    try:
        ray = require("ray", "distributed")
        constants = sys.modules.get("ray._private.ray_constants")  # imported with ray, possibly before this call
        saved_flag = getattr(constants, "ENABLE_RAY_CLUSTER", None)
        if saved_flag is not None:
            constants.ENABLE_RAY_CLUSTER = False
        try:
            ray.init(
                address="local",
                num_cpus=num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        finally:
            if saved_flag is not None:
                constants.ENABLE_RAY_CLUSTER = saved_flag
    finally:
        if saved_env is None:
            del os.environ[LOCAL_ONLY_ENV_VAR]
        else:
            os.environ[LOCAL_ONLY_ENV_VAR] = saved_env
    node_ip = ray.util.get_node_ip_address()
    if not ipaddress.ip_address(node_ip).is_loopback:
        ray.shutdown()
        raise RuntimeError(
            f"The local Ray cluster came up on {node_ip}, not on a loopback address: this Ray version ignores "
            f"{LOCAL_ONLY_ENV_VAR}=0, so its processes would listen on all interfaces. It was shut down; start "
            "a cluster you have secured with `ray start --head` and pass its address (ray_address) instead."
        )


class _RayActorProcess:
    """The Ray actor wrapping an :class:`ActorWorker`; it pulls from the parameter-server actor."""

    def __init__(self, spec: ActorSpec, server: Any, incarnation: int):
        ray = require("ray", "distributed")

        self.worker = ActorWorker(spec, lambda: ray.get(server.pull.remote()), incarnation)

    def collect(self, num_steps: int) -> ActorResult:
        return self.worker.collect(num_steps)

    def pid(self) -> int:
        return self.worker.pid()


class RayBackend:
    """Actors as Ray actor processes (one CPU each), the parameter server as a Ray actor.

    ``address=None`` (or ``"local"``) starts a local Ray cluster on this machine that listens on 127.0.0.1 only
    (:func:`init_local_ray`); ``"host:port"`` joins a running one (checked for reachability first, so a wrong
    address is a clear error, not a hang). A Ray session this process already started is used as it is.
    """

    def __init__(
        self,
        specs: list[ActorSpec],
        address: str | None = None,
        num_cpus: int | None = None,
        actor_env: dict[str, str] | None = None,
    ):
        ray = require("ray", "distributed")

        local = address in (None, "", "local")
        if not local:
            check_ray_address(address)
        self._ray = ray
        if not ray.is_initialized():
            if local:
                init_local_ray(num_cpus=num_cpus or max(2, len(specs)))
            else:
                ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        self.specs = list(specs)
        self.incarnations = [0] * len(self.specs)
        env_vars = {"JAX_PLATFORMS": "cpu", "MUJOCO_GL": "egl"} | dict(actor_env or {})
        self._actor_cls = ray.remote(num_cpus=1, max_restarts=0)(_RayActorProcess).options(
            runtime_env={"env_vars": env_vars}
        )
        self.server = ray.remote(num_cpus=0)(ParameterServer).remote()
        self._actors = [self._make(i) for i in range(len(self.specs))]
        self._futures: dict[Any, int] = {}

    def _make(self, index: int) -> Any:
        return self._actor_cls.remote(self.specs[index], self.server, self.incarnations[index])

    @property
    def pending(self) -> set[int]:
        return set(self._futures.values())

    def publish(self, version: int, blob: bytes) -> None:
        self._ray.get(self.server.publish.remote(version, blob))

    def submit(self, index: int, num_steps: int) -> None:
        if index in self.pending:
            raise ValueError(f"actor {index} already has a job in flight.")
        self._futures[self._actors[index].collect.remote(num_steps)] = index

    def wait(self, timeout: float | None = None) -> list[tuple[int, ActorResult | ActorFailure]]:
        if not self._futures:
            return []
        ready, _ = self._ray.wait(list(self._futures), num_returns=1, timeout=timeout)
        done = []
        for ref in ready:
            index = self._futures.pop(ref)
            try:
                done.append((index, self._ray.get(ref)))
            except (self._ray.exceptions.RayActorError, self._ray.exceptions.RayTaskError) as error:
                done.append(
                    (
                        index,
                        ActorFailure(
                            index, self.incarnations[index], f"{type(error).__name__}: {str(error).splitlines()[0]}"
                        ),
                    )
                )
        return done

    def actor_pid(self, index: int) -> int:
        return self._ray.get(self._actors[index].pid.remote())

    def restart(self, index: int) -> None:
        self._futures = {ref: i for ref, i in self._futures.items() if i != index}
        self._ray.kill(self._actors[index], no_restart=True)
        self.incarnations[index] += 1
        self._actors[index] = self._make(index)

    def server_stats(self) -> dict[str, int]:
        return self._ray.get(self.server.stats.remote())

    def shutdown(self) -> None:
        for actor in self._actors:
            self._ray.kill(actor, no_restart=True)
        self._ray.kill(self.server, no_restart=True)
        self._futures.clear()


BACKENDS: dict[str, Callable[..., Any]] = {"inprocess": InProcessBackend, "ray": RayBackend}
"""Backend names accepted by :func:`make_backend` and the configs."""


def make_backend(name: str, specs: list[ActorSpec], **options: Any) -> InProcessBackend | RayBackend:
    """``"inprocess"`` or ``"ray"`` (``options``: ``address``, ``num_cpus``, ``actor_env``; Ray only, the
    in-process backend needs none and ignores them)."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {sorted(BACKENDS)}, got {name!r}.")
    if not specs:
        raise ValueError("The actor-learner needs at least one actor (num_actors >= 1).")
    if name == "inprocess":
        return InProcessBackend(specs)
    return RayBackend(specs, **options)
