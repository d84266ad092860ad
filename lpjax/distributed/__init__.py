"""ActorQ's distributed actor-learner: quantized actors, a rate-limited learner, a parameter server.

* :class:`ActorWorker` (:mod:`~lpjax.distributed.actor`): a dm_control environment, an int8 (ONNX Runtime) or fp32
  copy of the policy pulled every ``pull_every`` steps, Gaussian exploration with its own sigma, n-step transitions;
* backends (:mod:`~lpjax.distributed.backends`): :class:`RayBackend` (actor processes on a local or remote Ray
  cluster; crashed actors are restarted) and :class:`InProcessBackend` (same interface, no Ray);
* :class:`ParameterServer` and the parameter quantizer :func:`encode_policy` / :func:`decode_policy` /
  :func:`build_policy` (:mod:`~lpjax.distributed.broadcast`);
* :class:`SamplesPerInsertLimiter`: the learner samples each inserted transition ``samples_per_insert`` times;
* :class:`ActorLearner`: the loop tying them to a learner, with throughput and time-split metrics.

``experiments/d4pg_loop.py`` runs D4PG with it.
"""

from lpjax.distributed.actor import ActorResult, ActorSpec, ActorWorker, exploration_sigmas
from lpjax.distributed.backends import ActorFailure, InProcessBackend, RayBackend, make_backend
from lpjax.distributed.broadcast import build_policy, decode_policy, encode_policy
from lpjax.distributed.coordinator import ActorLearner, Counters
from lpjax.distributed.parameter_server import ParameterServer
from lpjax.distributed.rate_limiter import SamplesPerInsertLimiter

__all__ = [
    "ActorFailure",
    "ActorLearner",
    "ActorResult",
    "ActorSpec",
    "ActorWorker",
    "Counters",
    "InProcessBackend",
    "ParameterServer",
    "RayBackend",
    "SamplesPerInsertLimiter",
    "build_policy",
    "decode_policy",
    "encode_policy",
    "exploration_sigmas",
    "make_backend",
]
