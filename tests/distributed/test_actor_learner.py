"""Actors, backends and the actor-learner loop, with a stand-in learner (no D4PG): pulls every K steps, n-step
transitions reach the learner, the rate limit holds, crashed actors are restarted without losing inserted data,
and bad inputs fail clearly. The Ray test starts real actor processes and SIGKILLs one."""

import os
import signal
import socket
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax.distributed import (
    ActorLearner,
    ActorSpec,
    ActorWorker,
    InProcessBackend,
    ParameterServer,
    SamplesPerInsertLimiter,
    encode_policy,
    exploration_sigmas,
    make_backend,
)
from lpjax.distributed.backends import check_ray_address
from lpjax.inference import Int8MLP
from lpjax.nn import MLP

ENV = "dmc:cartpole-balance"  # observation 5, action 1


class StubLearner:
    """Counts what it gets; its policy is a fixed small MLP, re-published as is."""

    def __init__(self, runtime="int8"):
        params = MLP((32, 32), 1).init(jax.random.key(0), jnp.zeros((1, 5)))
        self.blob = encode_policy(params, runtime)
        self.inserted, self.updates = 0, 0

    def insert(self, transitions):
        assert set(transitions) == {"obs", "action", "reward", "discount", "next_obs"}
        assert transitions["obs"].shape[1:] == (5,) and transitions["action"].shape[1:] == (1,)
        self.inserted += len(transitions["reward"])

    def update(self):
        self.updates += 1
        return {"loss": 0.0}

    def policy_blob(self):
        return self.blob


def _specs(n, **kwargs):
    return [
        ActorSpec(
            i,
            ENV,
            seed=0,
            sigma=s,
            n_step=3,
            pull_every=kwargs.get("pull_every", 50),
            runtime=kwargs.get("runtime", "int8"),
        )
        for i, s in enumerate(exploration_sigmas(n))
    ]


def test_actor_pulls_every_k_steps_and_emits_n_step_transitions():
    server = ParameterServer()
    server.publish(0, StubLearner().policy_blob())
    worker = ActorWorker(_specs(1, pull_every=40)[0], server.pull)
    result = worker.collect(100)
    assert result.env_steps == 100 and result.policy_version == 0
    assert server.pulls == 3  # at steps 0, 40 and 80
    assert result.pulls == 1  # the version did not change: deserialized and loaded once
    assert result.num_transitions == 100 - 2  # n = 3: the last two steps are still pending
    assert np.all(np.abs(result.transitions["action"]) <= 1.0)
    assert all(result.timings[k] >= 0 for k in ("env", "inference", "pull", "deserialize", "load"))
    assert result.timings["load"] > 0 and result.timings["env"] > 0
    assert isinstance(worker.policy, Int8MLP)  # the spec's default runtime


def test_sigmas_spread_over_0_to_max():
    assert exploration_sigmas(3) == pytest.approx([0.0, 0.1, 0.2])
    with pytest.raises(ValueError, match="num_actors"):
        exploration_sigmas(0)


def test_in_process_loop_keeps_the_ratio_and_survives_a_crashed_actor():
    backend = InProcessBackend(_specs(2))
    learner = StubLearner()
    limiter = SamplesPerInsertLimiter(samples_per_insert=2.0, batch_size=16, min_size=100, error_buffer=400)
    messages = []
    loop = ActorLearner(backend, learner, limiter, chunk_steps=50, publish_every=10, log=messages.append)
    loop.run(300)
    before = learner.inserted
    backend.kill(1)
    loop.run(600)
    assert loop.counters.restarts == 1 and backend.incarnations[1] == 1
    assert "actor 1" in messages[0] and "restarting" in messages[0]
    assert learner.inserted > before  # inserted data is kept; training went on after the crash
    assert loop.counters.inserts == learner.inserted
    # each insert is admitted while the credit stays within the buffer, but both actors' chunks can be in flight
    expected_samples = 2.0 * (learner.inserted - 100)
    assert abs(limiter.samples - expected_samples) <= 400 + 2.0 * 50 * 2
    assert limiter.samples > 0.5 * expected_samples
    stats = loop.throughput(wall_seconds=1.0)
    assert stats["actors"][0]["steps_per_s"] > 0 and stats["broadcast_bytes"] == len(learner.blob)
    assert stats["server"]["publishes"] >= 2


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(pull_every=0), "pull_every"), (dict(sigma=-1.0), "sigma"), (dict(runtime="int4"), "runtime must be one of")],
)
def test_bad_actor_specs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ActorSpec(0, ENV, 0, **({"sigma": 0.1} | kwargs))


def test_a_runtime_without_its_package_fails_when_the_spec_is_made(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if onnxruntime were not installed
    with pytest.raises(ImportError) as error:
        ActorSpec(0, ENV, 0, 0.1, runtime="int8")
    assert str(error.value) == "onnxruntime is not installed: pip install 'lpjax[int8]'"
    assert ActorSpec(0, ENV, 0, 0.1, runtime="fp32").runtime == "fp32"  # JAX's runtime needs no extra package


def test_bad_backends_raise():
    with pytest.raises(ValueError, match="at least one actor"):
        make_backend("inprocess", [])
    with pytest.raises(ValueError, match="backend must be one of"):
        make_backend("mpi", _specs(1))
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ValueError, match="Cannot reach the Ray cluster"):
        check_ray_address(f"127.0.0.1:{port}", timeout=1.0)
    with pytest.raises(ValueError, match="host:port"):
        check_ray_address("nowhere")


@pytest.mark.xdist_group("ray")
def test_ray_actors_train_and_a_killed_actor_is_restarted(ray_cluster):
    backend = make_backend("ray", _specs(2))
    try:
        learner = StubLearner()
        limiter = SamplesPerInsertLimiter(samples_per_insert=2.0, batch_size=16, min_size=100, error_buffer=400)
        loop = ActorLearner(backend, learner, limiter, chunk_steps=100, publish_every=10, log=lambda m: None)
        loop.run(400)
        before = learner.inserted
        os.kill(backend.actor_pid(0), signal.SIGKILL)
        loop.run(1200)
        assert loop.counters.restarts >= 1 and loop.restart_log[0]["actor"] == 0
        assert learner.inserted >= before + 600
        assert backend.actor_pid(0) != os.getpid()
        assert loop.throughput(1.0)["server"]["pulls"] >= 3
    finally:
        backend.shutdown()
