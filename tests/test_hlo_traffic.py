"""benchmarks/hlo_traffic.py: bytes read and written by the passes of a compiled program."""

import jax
import jax.numpy as jnp
import pytest

from benchmarks import hlo_traffic


def test_shape_bytes():
    assert hlo_traffic.shape_bytes("f32[1024,64]{1,0}") == 1024 * 64 * 4
    assert hlo_traffic.shape_bytes("(f16[10], bf16[3,2], pred[])") == 20 + 12 + 1
    assert hlo_traffic.shape_bytes("f32[]") == 4


def test_one_elementwise_pass_reads_its_inputs_and_writes_its_output():
    x = jnp.ones((1000,), jnp.float32)
    text = jax.jit(lambda a, b: jnp.tanh(a) * b + 1).lower(x, x).compile().as_text()
    summary = hlo_traffic.summary(text, tree_bytes=4000)
    assert summary["read_trees"] == pytest.approx(2.0) and summary["written_trees"] == pytest.approx(1.0)
    assert summary["copies"] == 0


def test_an_in_place_update_moves_the_update_not_the_buffer():
    """A scatter into a donated buffer (a KV-cache write) moves its update and indices, not the 4 MB buffer."""
    buffer, update = jnp.zeros((1024, 1024), jnp.float32), jnp.ones((4, 1024), jnp.float32)
    write = jax.jit(lambda c, u, i: c.at[i + jnp.arange(4)].set(u), donate_argnums=0)
    text = write.lower(buffer, update, jnp.int32(7)).compile().as_text()
    found = hlo_traffic.passes(text)
    (scatter,) = [p for p in found if "scatter" in p.name]
    assert scatter.written == update.nbytes and update.nbytes <= scatter.read < 2 * update.nbytes
    assert sum(p.read + p.written for p in found) < 3 * update.nbytes < buffer.nbytes


def test_by_output_names_each_output_and_the_temporaries():
    x = jnp.ones((1000,), jnp.float32)

    def step(a, b):
        shared = jnp.sqrt(a) / b  # expensive and used twice: materialized once
        return shared + a, shared * b

    text = jax.jit(step).lower(x, x).compile().as_text()
    table = hlo_traffic.by_output(text, ["first", "second"], tree_bytes=4000)
    assert set(table) <= {"first", "second", "temporary"}
    assert table["first"]["written_trees"] == pytest.approx(1.0)
    assert table["second"]["written_trees"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="2 outputs, 1 labels"):
        hlo_traffic.by_output(text, ["first"], tree_bytes=4000)


def test_kernel_count_counts_work_in_the_entry_and_once_per_loop_body():
    x = jnp.ones((64, 64), jnp.float32)
    one = jax.jit(lambda a: jnp.tanh(a) * 2 + 1).lower(x).compile().as_text()
    assert hlo_traffic.kernel_count(one) == 1  # one fusion

    def loop(a):
        body = lambda i, c: jnp.sin(c @ c) + i  # a dot and a fusion per trip
        return jax.lax.fori_loop(0, 7, body, a) * 3

    text = jax.jit(loop).lower(x).compile().as_text()
    computations, entry = hlo_traffic._computations(text)
    bodies = hlo_traffic.loop_bodies(text)
    assert len(bodies) == 1
    body_work = sum(op not in hlo_traffic._NO_KERNEL for _, _, op, _ in computations[bodies[0]])
    body_passes = hlo_traffic.passes(text, bodies[0])
    assert len(body_passes) == body_work  # a trip's passes: every work instruction of the body
    assert max(p.written for p in body_passes) == 64 * 64 * 4  # the carried matrix, written per trip
    assert body_work >= 2 and hlo_traffic.kernel_count(text) > body_work  # the body once, plus the entry's work
    assert hlo_traffic.kernel_count(text) < 7 * body_work
    with pytest.raises(ValueError, match="no ENTRY"):
        hlo_traffic.kernel_count("HloModule m")
