"""SamplesPerInsertLimiter: warm-up, the ratio in steady state, blocking both ways, bad settings."""

import pytest

from lpjax.distributed import SamplesPerInsertLimiter


def test_warm_up_then_each_insert_is_sampled_samples_per_insert_times():
    limiter = SamplesPerInsertLimiter(samples_per_insert=4.0, batch_size=8, min_size=10, error_buffer=16)
    assert not limiter.can_update() and limiter.can_insert(10_000)  # warm-up: inserts are never blocked
    limiter.record_insert(10)
    assert not limiter.can_update() or limiter.credit - 8 >= -16
    inserted = 10
    for _ in range(200):  # alternate: insert whenever allowed, else update
        if limiter.can_insert(2):
            limiter.record_insert(2)
            inserted += 2
        else:
            assert limiter.can_update()
            limiter.record_update()
    ratio = limiter.samples / (inserted - 10)
    assert abs(ratio - 4.0) <= 16 / (inserted - 10) + 1e-9


def test_blocks_inserts_when_the_learner_lags_and_updates_when_actors_lag():
    limiter = SamplesPerInsertLimiter(samples_per_insert=16.0, batch_size=256, min_size=256, error_buffer=2048)
    limiter.record_insert(256)
    assert limiter.can_update()
    limiter.record_insert(128)  # credit 2048: the next insert of any size would exceed the buffer
    assert not limiter.can_insert(1)
    while limiter.can_update():
        limiter.record_update()
    assert limiter.credit - 256 < -2048 and limiter.can_insert(1)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(samples_per_insert=0.0), "samples_per_insert"),
        (dict(batch_size=0), "batch_size"),
        (dict(error_buffer=10), "error_buffer"),
    ],
)
def test_bad_settings_raise(kwargs, match):
    settings = dict(samples_per_insert=16.0, batch_size=32, min_size=100, error_buffer=64) | kwargs
    with pytest.raises(ValueError, match=match):
        SamplesPerInsertLimiter(**settings)
