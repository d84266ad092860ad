"""Run logging: config.json, the metrics CSV (growing columns, non-finite values, resume), TensorBoard events;
damaged files refused before anything is written, no half-written record on a full disk or a signal."""

import csv
import errno
import json
import math
import os
import re
import resource
import sys

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from lpjax.disk import DiskFull
from lpjax.run_logging import RunLogger, check_metrics, logged_rows, metrics_path, read_config, read_metrics
from tests.tensorboard_events import read_tensorboard_scalars


def _rows(run_dir):
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.reader(f))


def _config():
    config = ml_collections.ConfigDict()
    config.seed = 0
    config.agent = ml_collections.ConfigDict({"lr": 1e-4, "hidden": (256, 256), "dtype": jnp.float16})
    config.batch_size = ml_collections.FieldReference(256)
    config.eval_batch = config.get_ref("batch_size")
    return config


def test_config_json_is_the_resolved_config(tmp_path):
    config = _config()
    config.batch_size = 512  # the reference follows
    RunLogger(tmp_path / "run", config=config, tensorboard=False).close()
    written = json.loads((tmp_path / "run" / "config.json").read_text())
    assert written == {
        "seed": 0,
        "agent": {"lr": 1e-4, "hidden": [256, 256], "dtype": "float16"},
        "batch_size": 512,
        "eval_batch": 512,
    }


def test_csv_rows_grow_columns_and_convert_values(tmp_path):
    run = tmp_path / "run"
    with RunLogger(run, tensorboard=False) as logger:
        logger.log(1, {"loss": jnp.float32(0.5), "q": np.float64(2.0)}, prefix="train")
        logger.log(2, {"loss": jnp.asarray([0.25], jnp.float16)}, prefix="train")
        logger.log(2, {"return": 10}, prefix="eval")  # a new column: the header is rewritten
        logger.log(3, {"loss": 0.125, "alpha": jnp.bfloat16(0.1)}, prefix="train")
        assert logger.columns == ["step", "wall_time", "train/loss", "train/q", "eval/return", "train/alpha"]
    rows = _rows(run)
    assert rows[0] == ["step", "wall_time", "train/loss", "train/q", "eval/return", "train/alpha"]
    assert all(len(row) == len(rows[0]) for row in rows)
    table = [[row[0]] + row[2:] for row in rows[1:]]  # without wall_time
    assert table == [
        ["1", "0.5", "2.0", "", ""],
        ["2", "0.25", "", "", ""],
        ["2", "", "", "10.0", ""],
        ["3", "0.125", "", "", "0.10009765625"],
    ]
    metrics = read_metrics(run)
    np.testing.assert_array_equal(metrics["step"], [1, 2, 2, 3])
    np.testing.assert_array_equal(metrics["eval/return"], [np.nan, np.nan, 10, np.nan])
    assert np.all(metrics["wall_time"] > 1e9)


def test_non_finite_values_are_logged_as_nan_and_counted(tmp_path):
    run = tmp_path / "run"
    with RunLogger(run, tensorboard=False) as logger:
        logger.log(1, {"loss": float("inf"), "grad": jnp.float16(jnp.nan)}, prefix="train")
        logger.log(2, {"loss": -np.inf, "grad": 1.0}, prefix="train")
        assert logger.nonfinite_counts == {"train/loss": 2, "train/grad": 1} and logger.total_nonfinite == 3
    rows = _rows(run)
    assert [row[2:] for row in rows[1:]] == [["nan", "nan"], ["nan", "1.0"]]


@pytest.mark.parametrize("bad", ["text", jnp.ones(3), None, 1 + 2j])
def test_non_scalar_metrics_raise(tmp_path, bad):
    with RunLogger(tmp_path, tensorboard=False) as logger, pytest.raises(ValueError, match="metric 'x'"):
        logger.log(0, {"x": bad})


def test_bad_step_and_reserved_names_raise(tmp_path):
    with RunLogger(tmp_path, tensorboard=False) as logger:
        with pytest.raises(ValueError, match="step must be an integer"):
            logger.log(1.5, {"x": 1})
        with pytest.raises(ValueError, match="reserved"):
            logger.log(1, {"step": 1})
        logger.log(np.int64(3), {"x": 1})  # numpy / jax integer steps are fine
        logger.log(jnp.int32(4), {"x": 1})
    assert read_metrics(tmp_path)["step"].tolist() == [3, 4]


def test_tensorboard_events_contain_the_scalars(tmp_path):
    run = tmp_path / "run"
    with RunLogger(run) as logger:
        for step in range(3):
            logger.log(step, {"loss": 1.0 / (step + 1), "nan": float("nan")}, prefix="train")
        logger.log(2, {"return": 7.5}, prefix="eval")
    assert list(run.glob("events.out.tfevents.*"))
    scalars = read_tensorboard_scalars(run)
    assert scalars["train/loss"] == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
    assert scalars["eval/return"] == [(2, 7.5)]
    assert [s for s, _ in scalars["train/nan"]] == [0, 1, 2] and all(math.isnan(v) for _, v in scalars["train/nan"])


def test_resume_truncates_rows_and_purges_tensorboard_after_the_checkpoint_step(tmp_path):
    run = tmp_path / "run"
    with RunLogger(run, config={"seed": 1}) as logger:
        for step in range(1, 8):
            logger.log(step, {"loss": float(step)}, prefix="train")
            if step % 3 == 0:
                logger.log(step, {"return": 10.0 * step}, prefix="eval")
    # The process crashed mid-row after step 7; the last checkpoint was step 4.
    with open(run / "metrics.csv", "a") as f:
        f.write("8,1700000000.0,8.")
    with RunLogger(run, config={"seed": 1}) as logger:
        assert logger.columns == ["step", "wall_time", "train/loss", "eval/return"]
        assert logger.truncate_after(4) == 4  # steps 5, 6 (train and eval) and 7
        for step in range(5, 7):
            logger.log(step, {"loss": step + 0.5}, prefix="train")
        logger.log(6, {"return": 61.0, "length": 1000}, prefix="eval")  # and a new column on resume
    rows = _rows(run)
    assert rows[0] == ["step", "wall_time", "train/loss", "eval/return", "eval/length"]
    table = [[row[0]] + row[2:] for row in rows[1:]]
    assert table == [
        ["1", "1.0", "", ""],
        ["2", "2.0", "", ""],
        ["3", "3.0", "", ""],
        ["3", "", "30.0", ""],
        ["4", "4.0", "", ""],
        ["5", "5.5", "", ""],
        ["6", "6.5", "", ""],
        ["6", "", "61.0", "1000.0"],
    ]
    scalars = read_tensorboard_scalars(run)
    assert scalars["train/loss"] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 5.5), (6, 6.5)]
    assert scalars["eval/return"] == [(3, 30.0), (6, 61.0)]
    assert len(list(run.glob("events.out.tfevents.*"))) == 2  # one per writer, the first not overwritten


def test_logged_rows_tell_empty_cells_from_non_finite_values(tmp_path):
    with RunLogger(tmp_path, tensorboard=False) as logger:
        logger.log(1, {"loss": 1.0}, prefix="train")
        logger.log(1, {"return": float("nan")}, prefix="eval")
        logger.log(2, {"return": 5.0}, prefix="eval")
    assert metrics_path(tmp_path) == tmp_path / "metrics.csv" == metrics_path(tmp_path / "metrics.csv")
    assert logged_rows(tmp_path, "eval/return").tolist() == [False, True, True]
    assert np.isnan(read_metrics(tmp_path)["eval/return"][:2]).all()
    with pytest.raises(ValueError, match="no column 'eval/missing'"):
        logged_rows(tmp_path, "eval/missing")


def test_without_tensorboardx_only_the_csv_logger_works(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(ModuleNotFoundError, match=r"^tensorboardX is not installed: pip install 'lpjax\[runs\]'$"):
        RunLogger(tmp_path / "tb")
    with RunLogger(tmp_path / "csv", tensorboard=False) as logger:
        logger.log(1, {"loss": 1.0})
    assert read_metrics(tmp_path / "csv")["loss"].tolist() == [1.0]


# Damaged files are refused before anything is written; a full disk never leaves half a record.


def _files(directory):
    return {p.name: p.read_bytes() for p in directory.iterdir()}


@pytest.mark.parametrize(
    "lines, message",
    [
        (["step,wall_time,train/loss", "1,1.5,0.5", "abc,1.6,0.25"], r"line 3: step 'abc' is not an integer\.$"),
        (["step,wall_time,train/loss", "1,1.5,0.5", "2,1.6,x"], r"line 3: column 'train/loss' holds 'x', which is not"),
        (["step,wall_time,train/loss", "1,1.5"], r"line 2: 2 cells, but the header has 3 columns\.$"),
        (["step,wall_time,a", "", "1,1.5,0.5"], r"line 2: an empty line\.$"),
        (
            ["wall_time,step", "1,2"],
            r"line 1: not a RunLogger metrics file: its header starts with \['wall_time', 'step'\]",
        ),
        (["step,wall_time,a,a"], r"line 1: the header repeats the columns \['a'\]\.$"),
    ],
)
def test_a_damaged_metrics_file_is_refused_naming_the_line_before_the_config_is_replaced(tmp_path, lines, message):
    (tmp_path / "config.json").write_text('{"total_steps": 250}\n')
    (tmp_path / "metrics.csv").write_text("\n".join(lines) + "\n")
    before = _files(tmp_path)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path / 'metrics.csv'))}, {message}") as refused:
        RunLogger(tmp_path, config={"total_steps": 500}, tensorboard=False)
    assert "\n" not in str(refused.value)
    assert _files(tmp_path) == before  # config.json was not rewritten first


def test_undecodable_metrics_and_config_files_name_their_line(tmp_path):
    (tmp_path / "metrics.csv").write_bytes(b"step,wall_time\n1,1.5\n2,\xff\n")
    with pytest.raises(ValueError, match=r"metrics\.csv, line 3: not UTF-8 text \(byte 23 of the file\)\.$"):
        check_metrics(tmp_path / "metrics.csv")
    (tmp_path / "config.json").write_bytes(b'{"a":\n\xfe}')
    with pytest.raises(ValueError, match=r"config\.json, line 2: not UTF-8 text"):
        read_config(tmp_path / "config.json")


def test_read_config_names_the_file_the_line_and_the_problem(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n  "seed": 0,\n  agent: {}\n}\n')
    with pytest.raises(ValueError) as raised:
        read_config(path)
    assert str(raised.value) == (
        f"{path}, line 3 column 3: not valid JSON: Expecting property name enclosed in double quotes."
    )
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}, line 1: not a config: a JSON list, not an object"):
        read_config(path)
    path.write_text('{"seed": 0}')
    assert read_config(path) == {"seed": 0}


def _fail_writes_to(monkeypatch, names, after_bytes=0, error=None):
    """Makes ``os.write`` to files whose name starts with one of ``names`` write ``after_bytes`` more bytes in
    all, then raise ``error`` (default: ENOSPC), as a file system that fills up mid-write does."""
    real_write, left = os.write, [after_bytes]

    def write(fd, data):
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if not name.startswith(names):
            return real_write(fd, data)
        if left[0] == 0:
            raise error or OSError(errno.ENOSPC, "No space left on device")
        n = min(len(data), left[0])
        left[0] -= n
        return real_write(fd, bytes(data[:n]))

    monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize("error", [None, KeyboardInterrupt()], ids=["disk_full", "signal"])
def test_a_row_cut_short_by_a_full_disk_or_a_signal_is_removed(tmp_path, monkeypatch, error):
    logger = RunLogger(tmp_path, tensorboard=False)
    logger.log(1, {"loss": 0.5}, prefix="train")
    before = (tmp_path / "metrics.csv").read_bytes()
    with monkeypatch.context() as patch:
        _fail_writes_to(patch, ("metrics.csv",), after_bytes=7, error=error)
        with pytest.raises(DiskFull if error is None else KeyboardInterrupt) as raised:
            logger.log(2, {"loss": 0.25}, prefix="train")
    assert (tmp_path / "metrics.csv").read_bytes() == before  # 7 bytes of the row were written, then removed
    if error is None:
        assert str(raised.value).startswith(
            f"cannot write a metrics row at step 2 to {tmp_path / 'metrics.csv'}: No space left on device ("
        )
    logger.log(2, {"loss": 0.25}, prefix="train")  # with space again, the row goes in whole
    logger.close()
    assert read_metrics(tmp_path)["train/loss"].tolist() == [0.5, 0.25]


def test_a_file_size_limit_hit_mid_row_leaves_no_partial_row(tmp_path):
    """A real short write: the kernel writes the part of the row below RLIMIT_FSIZE, then fails with EFBIG (Python
    ignores SIGXFSZ), as a full disk writes what fits."""
    logger = RunLogger(tmp_path, tensorboard=False)
    for step in range(3):
        logger.log(step, {"loss": 0.1 * step, "q": 1.0}, prefix="train")
    path = tmp_path / "metrics.csv"
    before = path.read_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) + 10, hard))
    try:
        with pytest.raises(DiskFull, match=r"^cannot write a metrics row at step 3 to .*: File too large \(") as raised:
            logger.log(3, {"loss": 0.3, "q": 1.0}, prefix="train")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert raised.value.errno == errno.EFBIG
    assert path.read_bytes() == before
    logger.close()
    assert read_metrics(tmp_path)["step"].tolist() == [0, 1, 2]


def test_a_full_disk_while_widening_or_writing_events_keeps_every_file_whole(tmp_path, monkeypatch):
    logger = RunLogger(tmp_path)
    logger.log(1, {"loss": 0.5}, prefix="train")
    logger.flush()
    csv_before = (tmp_path / "metrics.csv").read_bytes()
    (event_file,) = tmp_path.glob("events.out.tfevents.*")
    events_before = event_file.read_bytes()
    with monkeypatch.context() as patch:
        _fail_writes_to(patch, ("metrics.csv.tmp",), after_bytes=20)  # the CSV rewritten with a new column
        with pytest.raises(DiskFull, match=r"cannot write the metrics with the new columns \['eval/return'\] to "):
            logger.log(1, {"return": 3.0}, prefix="eval")
    assert (tmp_path / "metrics.csv").read_bytes() == csv_before
    assert sorted(p.name for p in tmp_path.iterdir() if "tmp" in p.name) == []
    logger.log(2, {"loss": 0.25}, prefix="train")
    with monkeypatch.context() as patch:
        _fail_writes_to(patch, ("events.out.tfevents.",), after_bytes=30)
        with pytest.raises(DiskFull, match=rf"cannot write TensorBoard events to {re.escape(str(event_file))}: No sp"):
            logger.flush()
    assert event_file.read_bytes() == events_before  # half a record was written, then removed
    logger.close()  # after a failed write, closing raises nothing (no writer thread, nothing at exit)
    assert read_tensorboard_scalars(tmp_path)["train/loss"] == [(1, 0.5)]
