"""experiments/ports: a variant is its fp32 program's text with a few lines replaced, that diff is what runs, and no
port variant changes more than six lines."""

import json
import pathlib
import re
import warnings

import pytest

from benchmarks import port_cnn, port_ppo
from experiments import ports
from lpjax.optim import UnscaledLossWarning

PROGRAM = "experiments.ports.flax_mnist"


def test_apply_edits_replaces_whole_lines_keeping_their_indentation():
    text = "def f():\n    x = 1\n    return x\n"
    assert ports.apply_edits(text, (("x = 1", "x = 2\ny = 3"),)) == "def f():\n    x = 2\n    y = 3\n    return x\n"


@pytest.mark.parametrize("line, count", [("z = 1", 0), ("x = 1", 2)])
def test_apply_edits_refuses_a_line_that_is_not_there_exactly_once(line, count):
    with pytest.raises(ValueError, match=f"occurs {count} times"):
        ports.apply_edits("x = 1\nif True:\n    x = 1\n", ((line, "y"),))


def test_load_runs_the_edited_text_and_diff_counts_its_lines():
    variant = ports.Variant("probe", (("from flax import nnx", "from flax import nnx\nPROBE = 'edited'"),))
    module = ports.load(PROGRAM, variant)
    assert module.PROBE == "edited" and hasattr(module, "CNN")
    assert ports.changed_lines(PROGRAM, variant) == (1, 0)
    assert "+PROBE = 'edited'" in ports.diff(PROGRAM, variant)
    assert ports.changed_lines(PROGRAM, ports.Variant("fp32")) == (0, 0)


def test_over_baseline_is_the_progress_above_the_floor_seed_by_seed():
    summary = ports.over_baseline({"fp32": [-100.0, -80.0], "fp16": [-300.0, -80.0]}, floor=-500.0)
    assert summary["fp16"]["over_baseline_per_seed"] == [0.5, 1.0]
    assert summary["fp16"]["over_baseline_of_means"] == round(310 / 410, 4)
    assert summary["fp32"]["mean"] == -90.0


@pytest.mark.parametrize(
    "bench, name",
    [(bench, name) for bench in (port_cnn, port_ppo) for name in bench.VARIANTS],
    ids=[f"{bench.RESULT_NAME}-{name}" for bench in (port_cnn, port_ppo) for name in bench.VARIANTS],
)
def test_every_port_variant_is_its_fp32_program_with_at_most_six_lines_changed(bench, name):
    added, removed = ports.changed_lines(bench.MODULE, bench.VARIANTS[name])  # raises unless every edit applies
    assert added <= ports.MAX_CHANGED_LINES and removed <= ports.MAX_CHANGED_LINES, (added, removed)
    assert (added > 0) == (name != "fp32")


def quick_run(bench, tmp_path) -> dict:
    """``bench.main(["--quick"])`` into ``tmp_path`` with dtype-promotion and unscaled-loss warnings as errors; checks
    that the json holds what main returned and that the png is one; returns the json."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # dtype promotion
        warnings.simplefilter("error", UnscaledLossWarning)
        result = bench.main(["--quick", "--results_dir", str(tmp_path)])
    saved = json.loads((tmp_path / f"{bench.RESULT_NAME}.json").read_text())
    assert saved["summary"] == json.loads(json.dumps(result["summary"]))
    assert (tmp_path / f"{bench.RESULT_NAME}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert saved["variants"]["fp16_lpjax"]["lines_added"] <= ports.MAX_CHANGED_LINES
    return saved


def test_the_guide_shows_each_ports_lpjax_diff_as_it_runs():
    guide = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "guide.md").read_text()  # the README links it
    shown = re.findall(r"^```diff\n(.*?)^```", guide, flags=re.S | re.M)
    for bench in (port_ppo, port_cnn):
        assert ports.diff(bench.MODULE, bench.VARIANTS["fp16_lpjax"]) in shown, bench.RESULT_NAME
