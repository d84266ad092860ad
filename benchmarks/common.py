"""What every benchmark shares: its command line (:func:`parser`), its result printed and written as
``<name>.json`` and ``<name>.png`` (:func:`write_results`, :func:`finish`, :func:`figure`), the record of where it
ran (:func:`run_environment`), plain-text tables (:func:`format_table`) and random input. Timing is
:mod:`benchmarks.timing` (CPU) and :mod:`benchmarks.steady_state` (GPU)."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import importlib.metadata
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
REPRODUCTION_RUNS = REPO / "runs" / "sac_reproduction" / "w256_b256_steps100000_seed5000_eval10000x10"
"""The SAC reproduction's run directories (``<config>/<task>/seed<k>``), which some benchmarks read."""


def parser(module: str, doc: str, quick: str | None = None, out: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks.<module>`` (described by ``doc``'s first paragraph): ``--out_dir``
    (or ``--out-dir``, or the names ``out``), ``--name``, ``--no_plot`` and, given its help text, ``--quick``."""
    cli = argparse.ArgumentParser(
        prog=f"python -m benchmarks.{module}",
        description=doc.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cli.add_argument("--out_dir", "--out-dir", *out, type=pathlib.Path, default=RESULTS, help="where the json/png go")
    cli.add_argument("--name", default=module, help="basename of the json/png")
    cli.add_argument("--no_plot", "--no-plot", action="store_true", help="write no png")
    if quick:
        cli.add_argument("--quick", action="store_true", help=quick)
    return cli


def finish(args: argparse.Namespace, result: dict, table: str, plot: Callable[[dict, pathlib.Path], None] | None):
    """:func:`write_results` to ``args.out_dir`` under ``args.name``, with the png unless ``args.no_plot``."""
    write_results(result, table, args.out_dir, args.name, None if args.no_plot else plot)
    return result


@contextlib.contextmanager
def figure(path: pathlib.Path, nrows: int = 1, ncols: int = 1, dpi: int = 120, rect=None, **subplots) -> Iterator:
    """``(fig, axes)`` of a matplotlib figure (no pyplot state), laid out (in ``rect``) and saved to ``path`` on
    exit; ``subplots`` go to ``Figure.subplots`` (``figsize`` to the figure)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=subplots.pop("figsize", None))
    yield fig, fig.subplots(nrows, ncols, **subplots)
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=dpi)


def port_parser(module: str, doc: str, variants: dict, quick: str) -> argparse.ArgumentParser:
    """:func:`parser` of a worked port's benchmark (``--results_dir`` is ``--out_dir``'s other name) with
    ``--variants`` and ``--seeds``; parse it with ``experiments.ports.parse_args``."""
    cli = parser(module, doc, quick, out=("--results_dir",))
    cli.add_argument("--variants", nargs="+", default=list(variants), choices=list(variants))
    cli.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    cli.set_defaults(benchmark=module)
    return cli


def port_finish(
    args, argv, program: str, variants: dict, config: dict, results: dict, summary: dict, notes, table, plot
):
    """:func:`finish` of a worked port's benchmark: what ran (``experiments.ports.result_header``: command, versions,
    each chosen variant's diff), its ``results``, ``summary`` and ``notes``."""
    from experiments import ports

    chosen = {name: variants[name] for name in args.variants}
    result = {**ports.result_header(args.benchmark, argv, program, chosen, config), "results": results}
    result.update(summary=summary, notes=notes)
    return finish(args, result, table(result), plot)


def format_table(
    header: Sequence[str], rows: Iterable[Sequence | str], formats: Sequence[str], indent: str = "", rule: bool = False
) -> list[str]:
    """The lines of a plain-text table: ``indent``, then each row's cells by ``formats`` (format specs such as
    ``"<12"`` or ``">9.3f"``) joined by single spaces, trailing blanks stripped; a row may have fewer cells than
    ``formats``, and a row that is a ``str`` is a line of its own (a note between rows). The header's cells take
    each spec's alignment and width (right-aligned where the spec names none), underlined by dashes if ``rule``.
    A cell that is a ``str`` under a numeric spec (``"-"`` for a missing number) takes the alignment and width."""
    heads = [re.match(r"[<>^]?\d*", f).group() for f in formats]
    heads = [h if h[:1] in "<>^" else ">" + h for h in heads]
    cells = lambda row: (format(c, h if isinstance(c, str) else f) for c, f, h in zip(row, formats, heads))
    line = lambda row: row if isinstance(row, str) else (indent + " ".join(cells(row))).rstrip()
    return [line(header)] + ["-" * len(line(header))] * rule + [line(row) for row in rows]


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """The command that reproduces this run, for the json."""
    return f"python -m {module} " + " ".join(argv if argv is not None else sys.argv[1:])


def write_results(
    result: dict, table: str, out_dir: pathlib.Path, name: str, plot: Callable[[dict, pathlib.Path], None] | None = None
) -> None:
    """Prints ``table``, writes ``out_dir/name.json`` and, unless ``plot`` is None, ``out_dir/name.png``."""
    print(f"\n{table}")
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{name}.json"
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {json_path}")
    if plot is not None:
        png_path = out_dir / f"{name}.png"
        plot(result, png_path)
        print(f"wrote {png_path}")


def random_transitions(rng: np.random.Generator, rows: int, obs_dim: int, action_dim: int) -> dict[str, np.ndarray]:
    """A batch of ``rows`` random float32 transitions (normal observations, uniform actions in [-1, 1] and rewards
    in [0, 1), discount 1), shaped as the off-policy learners sample them: input for timing an update."""
    batch = dict(obs=rng.standard_normal((rows, obs_dim), np.float32))
    batch.update(action=rng.uniform(-1, 1, (rows, action_dim)).astype(np.float32))
    batch.update(reward=rng.uniform(0, 1, rows).astype(np.float32), discount=np.ones(rows, np.float32))
    return batch | dict(next_obs=rng.standard_normal((rows, obs_dim), np.float32))


def package_versions(packages: Sequence[str]) -> dict[str, str | None]:
    """Installed version of each distribution (``None`` when it is not installed), read without importing it."""
    versions = dict.fromkeys(packages)
    for name in packages:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    return versions


def source_record(folders: Sequence[str] = ("lpjax", "kernels", "benchmarks", "experiments")) -> dict[str, str | None]:
    """Which lpjax ran: the version in setup.cfg, the git commit when the checkout has one, and a sha256 over the
    Python sources of ``folders`` (it names the code also where the working tree travelled without its .git)."""
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted((REPO / folder).rglob("*.py")):
            digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    version = re.search(r"^version = (\S+)", (REPO / "setup.cfg").read_text(), re.M)
    command = ["git", "-C", str(REPO), "rev-parse", "HEAD"]
    try:
        commit = subprocess.run(command, capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "version": version.group(1) if version else None,
        "git_commit": commit,
        "sources_sha256": digest.hexdigest(),
    }


def nvidia_smi() -> list[dict[str, str]] | str:
    """The GPUs ``nvidia-smi`` lists (name, driver version, memory, compute capability), without initializing CUDA
    in this process; a string saying why when it cannot run."""
    fields = ("name", "driver_version", "memory.total", "compute_cap")
    command = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as error:
        return f"nvidia-smi unavailable: {type(error).__name__}"
    return [dict(zip(fields, (v.strip() for v in line.split(",")))) for line in out.strip().splitlines()]


def cpu_info(prefix: str) -> str | None:
    """The value of the first ``/proc/cpuinfo`` line starting with ``prefix`` (``None`` where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(prefix)), None)
    except OSError:
        return None


def machine_info() -> dict:
    """This machine and JAX's devices: CPU count, affinity and model, platform, libc, Python, backend."""
    import jax

    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    info = dict(cpu_count=os.cpu_count(), cpu_affinity=affinity, platform=platform.platform())
    info.update(machine=platform.machine(), cpu_model=cpu_info("model name") or platform.processor() or None)
    info.update(libc=" ".join(platform.libc_ver()) or None, python=platform.python_version())
    return info | dict(jax_backend=jax.default_backend(), devices=[str(d) for d in jax.devices()])


RUN_PACKAGES = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin", "jax-cuda12-pjrt")
RUN_PACKAGES += ("flax", "optax", "orbax-checkpoint", "chex", "numpy", "mujoco", "mujoco-mjx", "playground", "brax")
RUN_PACKAGES += ("ml_collections",)
"""The distributions :func:`run_environment` records."""


def run_environment() -> dict:
    """Where and with what a benchmark ran, read without initializing JAX's backends."""
    env = dict(date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), python=platform.python_version())
    env.update(platform=platform.platform(), cpu_count=os.cpu_count(), gpus=nvidia_smi())
    return env | dict(versions=package_versions(RUN_PACKAGES), lpjax=source_record())
