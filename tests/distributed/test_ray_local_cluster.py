"""The local Ray cluster that the Ray backend starts is reachable from this machine only: every listening socket
of every Ray process (GCS, raylet, agents, monitor, dashboard head, the actor and parameter-server workers, the
driver) is bound to a loopback address, none to 0.0.0.0 or ::.

The cluster runs in a fresh Python process, so that it is the backend that starts it (the ``ray_cluster``
fixture's session is not reused) and so that ``ray`` is imported before the backend runs, as in a notebook that
imported it first: Ray reads its single-machine switch when it is imported (see
:func:`lpjax.distributed.backends.init_local_ray`).
"""

import ipaddress
import json
import subprocess
import sys
import textwrap

import pytest

# Runs in the child: starts the backend's local cluster with two actors, waits until the processes below listen
# (the agents open their servers after ray.init returns), then prints the node's IP address and every listening
# TCP socket and bound UDP socket of its own process tree as one JSON line.
_CHILD = textwrap.dedent(
    """
    import json, socket, time
    import ray
    import psutil
    from lpjax.distributed import ActorSpec, make_backend

    REQUIRED = ["gcs_server", "raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent"]
    specs = [ActorSpec(i, "dmc:cartpole-balance", seed=0, sigma=0.1) for i in range(2)]
    backend = make_backend("ray", specs)
    actor_pids = [backend.actor_pid(i) for i in range(len(specs))]

    def sockets():
        me = psutil.Process()
        procs = {p.pid: p for p in [me, *me.children(recursive=True)]}
        found = set()
        for c in psutil.net_connections(kind="inet"):
            if c.pid in procs and c.laddr and (c.status == psutil.CONN_LISTEN or c.type == socket.SOCK_DGRAM):
                name = procs[c.pid].name()
                found.add((c.laddr.ip, c.laddr.port, "udp" if c.type == socket.SOCK_DGRAM else "tcp", c.pid, name))
        return found

    seen, deadline = set(), time.monotonic() + 120
    while True:
        seen |= sockets()
        listening = {name for *_, name in seen} | {pid for *_, pid, _ in seen}
        if all(r in listening for r in REQUIRED + actor_pids) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    time.sleep(2)
    seen |= sockets()
    print("RESULT " + json.dumps({
        "node_ip": ray.util.get_node_ip_address(),
        "actor_pids": actor_pids,
        "required": REQUIRED,
        "sockets": sorted(seen),
    }))
    backend.shutdown()
    ray.shutdown()
    """
)


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if ip.version == 6 and ip.ipv4_mapped is not None:  # ::ffff:127.0.0.1, how dual-stack sockets show IPv4
        ip = ip.ipv4_mapped
    return ip.is_loopback


@pytest.mark.xdist_group("ray")
def test_local_cluster_listens_on_loopback_only():
    child = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=600)
    lines = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
    assert child.returncode == 0 and lines, child.stdout[-3000:] + child.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    sockets = [tuple(s) for s in result["sockets"]]
    table = "\n".join(f"{ip}:{port}/{kind} pid {pid} {name}" for ip, port, kind, pid, name in sockets)

    assert _is_loopback(result["node_ip"]), result["node_ip"]
    names, pids = {s[4] for s in sockets}, {s[3] for s in sockets}
    missing = [n for n in result["required"] if n not in names] + [p for p in result["actor_pids"] if p not in pids]
    assert not missing, f"no listening socket seen for {missing}; seen:\n{table}"
    wildcard = [s for s in sockets if ipaddress.ip_address(s[0].split("%")[0]).is_unspecified]
    assert not wildcard, f"Ray sockets bound to all interfaces:\n{table}"
    exposed = [s for s in sockets if not _is_loopback(s[0])]
    assert not exposed, f"Ray sockets bound to a non-loopback address:\n{table}"
