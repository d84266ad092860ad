"""What the SAC reproduction trains: its configs, the scale, the plan of (config, task, seed) runs, and each run's
config, directory and command line.

Configs: ``fp32``, ``fp16`` (the paper's methods on), ``fp16_naive`` (none) and the :data:`BEYOND_CONFIGS` and
:data:`ROUNDING_CONFIGS` from ``experiments/configs/sac/``, and for each method of :data:`METHODS` an ablation
``fp16_no_<method>``: ``fp16`` with ``agent.methods.<method>`` off. A run's config is its config file's with
:func:`overrides` applied; :func:`make_config` builds it in this process and :func:`command` is the
``python -m experiments.sac`` command line that builds the same config.
"""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
from collections.abc import Sequence
from typing import Any

from experiments import run_farm
from lpjax.methods import PrecisionMethods

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

MAIN_CONFIGS = ("fp32", "fp16", "fp16_naive")
BEYOND_CONFIGS = ("fp8", "fp16_sr", "fp16_sr_8bit", "fp8_bf16_ends", "fp16_sr_params")
"""Beyond the paper, compared with ``fp32`` on the main tasks: the W8A8 fp8 GEMM agent (also with its first and
last layers in bf16), and fp16 with stochastic rounding instead of the Kahan buffers (with hAdam's moments in
float16, or blockwise 8-bit; or for the parameters only, the target keeping its Kahan buffer)."""
METHODS = tuple(name for name in PrecisionMethods.switches() if getattr(PrecisionMethods.paper(), name))
"""The methods ``fp16`` turns on (:meth:`lpjax.methods.PrecisionMethods.paper`), in declaration order: each has an
ablation row. A switch the paper's agent leaves off (``stochastic_rounding``) has none."""
ABLATION_PREFIX = "fp16_no_"
ABLATION_CONFIGS = tuple(ABLATION_PREFIX + method for method in METHODS)
ROUNDING_CONFIGS = ("fp16_sr_params", "fp16_sr_target")
"""The rounding study, on ``--rounding_task`` only: fp16 with stochastic rounding for one of the two updates and
the Kahan buffer for the other (parameters / target). Between ``fp16`` (Kahan for both) and ``fp16_sr``
(stochastic rounding for both) they tell which update's rounding noise costs return."""
ROUNDING_ROWS = dict(fp16=("kahan", "kahan"), fp16_sr_target=("kahan", "stochastic"))
ROUNDING_ROWS.update(fp16_sr_params=("stochastic", "kahan"), fp16_sr=("stochastic", "stochastic"))
"""The rounding study's rows: (parameter update, target update) of each config."""
ALL_CONFIGS = tuple(dict.fromkeys(MAIN_CONFIGS + BEYOND_CONFIGS + ABLATION_CONFIGS + ROUNDING_CONFIGS))
CONFIG_GROUPS = dict(main=MAIN_CONFIGS, beyond=BEYOND_CONFIGS, ablation=ABLATION_CONFIGS, rounding=ROUNDING_CONFIGS)
DEFAULT_TASKS = ("cartpole-swingup", "reacher-easy", "walker-walk")
DEFAULT_ABLATION_TASK = "walker-walk"
DEFAULT_NUM_SEEDS = 3


@dataclasses.dataclass(frozen=True)
class Scale:
    """The flags that set what a run computes; ``tag`` names the directory holding all runs of this scale."""

    width: int = 256
    batch: int = 256
    steps: int = 100_000
    seed_steps: int = 5000
    eval_every: int = 10_000
    eval_episodes: int = 10
    action_repeat: int = 0  # 0: the task's default (1 from states)
    checkpoint_every: int = 10_000

    @property
    def tag(self) -> str:
        tag = "w{width}_b{batch}_steps{steps}_seed{seed_steps}_eval{eval_every}x{eval_episodes}".format(**vars(self))
        return tag + (f"_ar{self.action_repeat}" if self.action_repeat else "")

    def describe(self) -> dict:
        extra = {"hidden_layers": 2, "replay_capacity": replay_capacity(self.steps), "tag": self.tag}
        return dataclasses.asdict(self) | extra


@dataclasses.dataclass(frozen=True, order=True)
class RunSpec:
    config: str
    task: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.config}/{self.task}/seed{self.seed}"

    @classmethod
    def parse(cls, name: str) -> RunSpec:
        """The inverse of :attr:`name`; ``ValueError`` for anything else."""
        config, task, seed = name.split("/")
        if not seed.startswith("seed"):
            raise ValueError(f"run names look like 'fp16/walker-walk/seed0', got {name!r}")
        return cls(config, task, int(seed[4:]))


def removed_method(config: str) -> str | None:
    """``"fp16_no_hadam" -> "hadam"``; ``None`` for the main configs."""
    return config[len(ABLATION_PREFIX) :] if config.startswith(ABLATION_PREFIX) else None


def replay_capacity(steps: int) -> int:
    """The whole run fits (as the paper's 1M buffer does); smaller checkpoints than a 1M buffer."""
    return min(1_000_000, steps)


def config_file(config: str) -> pathlib.Path:
    """The file under ``experiments/configs/sac/`` a config starts from (``fp16.py`` for the ablations)."""
    if config not in ALL_CONFIGS:
        raise ValueError(f"unknown config {config!r}; valid: {', '.join(ALL_CONFIGS)}")
    return REPO_ROOT / "experiments" / "configs" / "sac" / f"{'fp16' if removed_method(config) else config}.py"


def overrides(spec: RunSpec, scale: Scale) -> dict[str, Any]:
    """The dotted config fields a run sets over its config file's, with their values."""
    fields: dict[str, Any] = dict(env=f"dmc:{spec.task}", seed=spec.seed, total_steps=scale.steps)
    fields.update(seed_steps=scale.seed_steps, replay_capacity=replay_capacity(scale.steps))
    fields.update(eval_every=scale.eval_every, eval_episodes=scale.eval_episodes, log_every=min(1000, scale.eval_every))
    fields.update(checkpoint_every=scale.checkpoint_every, action_repeat=scale.action_repeat)
    fields.update({"agent.hidden_dims": (scale.width, scale.width), "agent.batch_size": scale.batch})
    if method := removed_method(spec.config):
        fields[f"agent.methods.{method}"] = False
    return fields


def make_config(spec: RunSpec, scale: Scale):
    """The ``ml_collections`` config of one run: the config file's, with :func:`overrides` applied."""
    path = config_file(spec.config)
    config = importlib.import_module(f"experiments.configs.sac.{path.stem}").get_config()
    if (method := removed_method(spec.config)) and not config.agent.methods[method]:
        raise ValueError(f"{path.name} does not enable {method!r}; cannot ablate it")
    config.update_from_flattened_dict(overrides(spec, scale))
    return config


def command(spec: RunSpec, scale: Scale, run_dir: pathlib.Path, resume: bool) -> list[str]:
    """``python -m experiments.sac`` training one session of the run in ``run_dir`` (the config of
    :func:`make_config`: ``--config.agent.methods.hadam=False`` etc.), printing its summary last."""
    text = lambda value: repr(value) if isinstance(value, tuple) else str(value)
    overridden = [f"--config.{key}={text(value)}" for key, value in overrides(spec, scale).items()]
    flags = [f"--config={config_file(spec.config)}", *overridden, f"--run_dir={run_dir}", "--noprogress"]
    return run_farm.python_module("experiments.sac", *flags, *(["--resume"] if resume else []))


def build_plan(
    tasks: Sequence[str], seeds: Sequence[int], ablation_tasks: Sequence[str], rounding_tasks: Sequence[str] = ()
) -> list[RunSpec]:
    """All runs, in the order a session takes them: seed by seed, task by task, main configs, then ablations, then
    the rounding study."""
    plan = []
    for seed in seeds:
        for task in dict.fromkeys([*tasks, *ablation_tasks, *rounding_tasks]):
            rounding = task in rounding_tasks
            # outside the main tasks, the references: fp16 for an ablation, fp16 and fp16_sr for the rounding study
            configs = MAIN_CONFIGS + BEYOND_CONFIGS if task in tasks else ("fp16",) + (("fp16_sr",) if rounding else ())
            configs += (ABLATION_CONFIGS if task in ablation_tasks else ()) + (ROUNDING_CONFIGS if rounding else ())
            plan.extend(RunSpec(config, task, seed) for config in dict.fromkeys(configs))
    return plan


def run_dir_of(runs_dir: pathlib.Path, scale: Scale, spec: RunSpec) -> pathlib.Path:
    return pathlib.Path(runs_dir) / scale.tag / spec.config / spec.task / f"seed{spec.seed}"


def discover_runs(runs_dir: pathlib.Path, scale: Scale) -> list[RunSpec]:
    """Runs of this scale that have a directory (planned or not)."""
    paths = sorted((pathlib.Path(runs_dir) / scale.tag).glob("*/*/seed*"))
    found = [(p.parent.parent.name, p.parent.name, p.name[4:]) for p in paths if p.is_dir()]
    return [
        RunSpec(config, task, int(seed)) for config, task, seed in found if seed.isdigit() and config in ALL_CONFIGS
    ]
