"""Running test code on several (forced) CPU devices, or as several processes of one JAX run.

JAX reads ``XLA_FLAGS`` once, when its CPU backend starts, so a test that needs N devices runs its code in a fresh
Python subprocess with ``--xla_force_host_platform_device_count=N``. The code prints one JSON line last; that is
what :func:`run_on_devices` returns. :func:`run_processes` starts several such processes joined by
``jax.distributed`` on localhost (each with its own forced devices) and returns every process's JSON.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import textwrap

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def _environment(devices: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_") or k == "JAX_PLATFORMS"}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.update(extra or {})
    return env


def _result(proc: subprocess.CompletedProcess | tuple[int, str, str], what: str) -> dict:
    returncode, stdout, stderr = proc if isinstance(proc, tuple) else (proc.returncode, proc.stdout, proc.stderr)
    if returncode != 0:
        raise AssertionError(f"{what} failed ({returncode}):\n{stdout[-3000:]}\n{stderr[-6000:]}")
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise AssertionError(f"{what} printed no JSON line:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    return json.loads(lines[-1])


def run_on_devices(code: str, devices: int, timeout: float = 300, env: dict[str, str] | None = None) -> dict:
    """Runs ``code`` (dedented) in a subprocess with ``devices`` forced CPU devices (and the variables ``env``);
    returns its last JSON line."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=_environment(devices, env),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return _result(proc, f"code on {devices} devices")


def free_port() -> int:
    """A TCP port free on localhost now (for the coordinator of :func:`run_processes`)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_processes(
    code: str, processes: int, devices_per_process: int, timeout: float = 300, env: dict[str, str] | None = None
) -> list[dict]:
    """Runs ``code`` as ``processes`` processes of one JAX run on localhost (``JAX_COORDINATOR_ADDRESS``,
    ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``, read by :func:`lpjax.sharding.initialize_distributed`), each with
    ``devices_per_process`` forced CPU devices and the variables ``env``; returns each process's last JSON line,
    in process order. A process that fails or outlives ``timeout`` fails the call (and the others are killed)."""
    address = f"127.0.0.1:{free_port()}"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            env=_environment(
                devices_per_process,
                {
                    **(env or {}),
                    "JAX_COORDINATOR_ADDRESS": address,
                    "JAX_NUM_PROCESSES": str(processes),
                    "JAX_PROCESS_ID": str(index),
                },
            ),
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(processes)
    ]
    outputs = []
    try:
        for child in children:
            stdout, stderr = child.communicate(timeout=timeout)
            outputs.append((child.returncode, stdout, stderr))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.communicate()
    return [_result(output, f"process {index} of {processes}") for index, output in enumerate(outputs)]
