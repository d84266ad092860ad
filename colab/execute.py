"""Executes the notebooks of colab/ top to bottom and saves them with their outputs.

    python colab/execute.py                          # every notebook, normal size, saved in place
    python colab/execute.py colab/02_sac_fp16.ipynb  # one notebook
    python colab/execute.py --steps 200 --output-dir /tmp/out --cwd /tmp/content   # reduced, saved elsewhere

Each notebook runs in a fresh ``python3`` kernel of the interpreter running this script (nbclient), started in the
repository root (lpjax's own source paths then print relative to it) or in ``--cwd``, with this process's
environment: ``--steps N`` sets ``LPJAX_NOTEBOOK_STEPS=N``, the notebooks' reduced-size switch, and ``LPJAX_SOURCE``
is passed on to the install cell. The committed notebooks are run with the repository's ``.venv``
(``.venv/bin/python colab/execute.py``), where lpjax is already installed, so their install cell keeps it and only
puts the checkout on ``sys.path`` (for its ``experiments/``, which is not installed).

A cell that raises stops its notebook; the notebook is saved up to that cell and the script exits with status 1
after the remaining notebooks ran. A saved notebook records the SHA-256 of its code cells' sources
(``metadata.lpjax.code_sha256``, see :func:`code_sha256`) and the size it ran at; ``tests/test_notebooks.py``
compares the hash with the sources, so an edit to a cell without re-running the notebook is caught.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import nbclient
import nbformat

COLAB = Path(__file__).resolve().parent
REPO_ROOT = COLAB.parent


def code_sha256(nb) -> str:
    """SHA-256 of the notebook's code cell sources, in order."""
    sources = [cell.source for cell in nb.cells if cell.cell_type == "code"]
    return hashlib.sha256(json.dumps(sources).encode()).hexdigest()


def execute(path: Path, output: Path, cwd: Path | None, cell_timeout: int) -> bool:
    """Runs ``path`` in a fresh kernel and writes it with its outputs to ``output``; True if no cell failed."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            cell.metadata.pop("execution", None)
    client = nbclient.NotebookClient(
        nb,
        kernel_name="python3",
        timeout=cell_timeout,
        record_timing=False,
        resources={"metadata": {"path": str(cwd or REPO_ROOT)}},
    )
    started, ok = time.perf_counter(), True
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as error:
        print(f"{path.name}: a cell failed:\n{error}", file=sys.stderr)
        ok = False
    seconds = time.perf_counter() - started
    nb.metadata["lpjax"] = {"code_sha256": code_sha256(nb), "notebook_steps": os.environ.get("LPJAX_NOTEBOOK_STEPS")}
    output.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, output)
    print(f"{path.name}: {'ran' if ok else 'FAILED'} in {seconds:.0f} s -> {output}", flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every colab/*.ipynb")
    parser.add_argument("--steps", type=int, help="set LPJAX_NOTEBOOK_STEPS (reduced size); default: normal size")
    parser.add_argument("--output-dir", type=Path, help="write the executed notebooks here; default: in place")
    parser.add_argument("--cwd", type=Path, help="the kernels' working directory; default: the repository root")
    parser.add_argument("--cell-timeout", type=int, default=3600, help="seconds per cell (default 3600)")
    args = parser.parse_args(argv)
    if args.steps is not None:
        os.environ["LPJAX_NOTEBOOK_STEPS"] = str(args.steps)
    notebooks = [p.resolve() for p in args.notebooks] or sorted(COLAB.glob("*.ipynb"))
    failed = [
        path.name
        for path in notebooks
        if not execute(path, (args.output_dir or path.parent) / path.name, args.cwd, args.cell_timeout)
    ]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
