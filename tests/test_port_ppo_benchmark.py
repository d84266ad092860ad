"""benchmarks/port_ppo.py: PureJaxRL's PPO (linen, TrainState, vmap over seeds in one jit) made fp16 by at most six
changed lines; a 4096-step run of the three variants on CartPole (the full run is the benchmark command)."""

import numpy as np
import pytest

pytest.importorskip("gymnax")

from benchmarks import port_ppo as bench
from tests.test_ports import quick_run


def test_quick_run_trains_every_variant_without_a_warning(tmp_path):
    saved = quick_run(bench, tmp_path)
    runs = saved["results"]["CartPole-v1"]
    assert set(runs) == set(bench.VARIANTS)
    for name, run in runs.items():
        assert run["all_finite"] and len(run["final_return"]) == 2, name
        assert all(np.isfinite(run["final_return"])) and min(run["final_return"]) > 9.0, (name, run)  # episodes end
        assert len(run["curve"]) == 2 and len(run["curve"][0]) == len(run["curve_updates"])
    assert runs["fp16_lpjax"]["final_loss_scale"][0] > 1.0 and runs["fp32"]["final_loss_scale"] == [1.0, 1.0]
