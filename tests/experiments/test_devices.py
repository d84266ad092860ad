"""experiments.devices: the mesh from a learner's config and the replay buffer's strata."""

import ml_collections
import pytest

from experiments.configs.sac import fp32
from experiments.devices import learner_mesh, replay_strata


def _config(**fields):
    config = fp32.get_config()
    config.update(replay_capacity=1000, **fields)
    return config


def test_a_one_by_one_mesh_is_no_mesh_and_a_mesh_beyond_the_devices_is_refused():
    assert learner_mesh(_config()) is None
    config = _config()
    config.mesh.data = 2
    with pytest.raises(ValueError, match="2 devices, but there are 1"):
        learner_mesh(config)
    assert learner_mesh(ml_collections.ConfigDict({"seed": 0})) is None  # an old run's config: no mesh field


def test_replay_strata_come_from_the_config_then_the_checkpoint_then_the_devices():
    assert replay_strata(_config(), None, batch_size=8) == 1
    assert replay_strata(_config(), None, batch_size=8, stored=4) == 4  # a resumed buffer keeps its layout
    assert replay_strata(_config(replay_shards=2), None, batch_size=8) == 2
    assert replay_strata(_config(replay_shards=4), None, batch_size=8, stored=4) == 4


def test_replay_strata_that_contradict_the_checkpoint_or_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="laid out in 4 strata"):
        replay_strata(_config(replay_shards=2), None, batch_size=8, stored=4)
    with pytest.raises(ValueError, match=r"replay_shards \(3\)"):
        replay_strata(_config(replay_shards=3), None, batch_size=8)
    with pytest.raises(ValueError, match="positive integer"):
        replay_strata(_config(replay_shards=0), None, batch_size=8)
