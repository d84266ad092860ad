"""lpjax.optim.fused and fused_target_update: the per-leaf transforms over one flat buffer per dtype give the
per-leaf transforms' bits, over the whole float16/bfloat16 range, with skipped steps, scale growth and back-off,
Kahan compensation, stochastic rounding and 8-bit moments; the layout round-trips; the random words depend on each
element's identity only."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.extend.random import threefry2x32_p

from lpjax import optim
from lpjax.methods import PrecisionMethods, method_optimizer
from lpjax.optim import flat
from lpjax.optim._rounding import element_bits, threefry2x32
from tests.optim.helpers import any_bit_patterns

SHAPES = ((7, 5), (3,), (), (300,), (2, 1, 4))


def _tree(seed: int, dtype, scale: float = 1.0):
    """A tree of SHAPES in ``dtype`` and one float32 leaf (a second dtype group)."""
    rng = np.random.default_rng(seed)
    tree = {f"w{i}": jnp.asarray(rng.normal(0, scale, shape), dtype) for i, shape in enumerate(SHAPES)}
    tree["extra"] = {"f32": jnp.asarray(rng.normal(0, scale, (4, 2)), jnp.float32)}
    return tree


def _range_tree(seed: int, dtype):
    """``_tree``'s structure filled with values drawn uniformly over the dtype's bit patterns (subnormals, near-max
    values, both zeros; infinities and nans too, which the loss scaler must skip)."""
    tree = _tree(seed, dtype)
    leaves, treedef = jax.tree.flatten(tree)
    out = []
    for i, leaf in enumerate(leaves):
        if leaf.dtype == jnp.float32:
            out.append(leaf)
        else:
            out.append(any_bit_patterns(dtype, leaf.size, seed * 31 + i).reshape(leaf.shape))
    return jax.tree.unflatten(treedef, out)


def _same_bits(a, b) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(
            np.atleast_1d(np.asarray(x)).view(np.uint8), np.atleast_1d(np.asarray(y)).view(np.uint8)
        )


def test_layout_round_trips_mixed_dtypes_with_padding():
    tree = _tree(0, jnp.float16)
    layout = flat.layout_of(tree, align=8)
    buffers = flat.flatten(tree, layout)
    assert set(buffers) == {"float16", "float32"}
    assert buffers["float16"].data.shape == (sum(-(-max(int(np.prod(s)), 0) // 8) * 8 for s in SHAPES),)
    _same_bits(flat.unflatten(buffers, layout), tree)
    padding = np.ones(buffers["float16"].data.shape, bool)
    for segment in buffers["float16"].segments:
        padding[segment.offset : segment.offset + segment.size] = False
    assert np.all(np.asarray(buffers["float16"].data)[padding] == 0)
    with pytest.raises(ValueError, match="align"):
        flat.layout_of(tree, align=0)


def _loss_scaled_run(tx, params, grads_seq):
    """``tx`` over ``grads_seq`` (each multiplied by the current loss scale in float32, or float64 for float64
    gradients, as a loss-scaled backward pass gives it), jitted; returns the final parameters and state."""
    state = tx.init(params)

    @jax.jit
    def step(params, state, grads):
        scale = optim.loss_scale_or_one(state)
        wide = lambda g: jnp.promote_types(g.dtype, jnp.float32)
        grads = jax.tree.map(lambda g: (g.astype(wide(g)) * scale.astype(wide(g))).astype(g.dtype), grads)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for grads in grads_seq:
        params, state = step(params, state, grads)
    return params, state


METHOD_CASES = {
    "paper": (PrecisionMethods.paper(init_scale=2.0**10, growth_interval=3), 1),
    "stochastic rounding": (
        PrecisionMethods.paper(
            kahan_gradients=False, kahan_momentum=False, stochastic_rounding=True, init_scale=2.0**10, growth_interval=3
        ),
        1,
    ),
    "8-bit moments": (
        PrecisionMethods.paper(
            kahan_gradients=False,
            kahan_momentum=False,
            stochastic_rounding=True,
            moment_dtype="int8",
            moment_block_size=16,
            growth_interval=3,
        ),
        16,
    ),
    "adam, no method": (PrecisionMethods(), 1),
}


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("case", METHOD_CASES)
def test_fused_gives_the_per_leaf_bits_over_the_whole_range(case, dtype):
    """Gradients over the dtype's whole bit range (a step holding an inf or nan is skipped and backs the scale
    off; growth every 3 finite steps), between steps of ordinary gradients: parameters, updates and every state
    counter are bit-identical."""
    methods, align = METHOD_CASES[case]
    tx = method_optimizer(1e-3, methods, rounding_seed=5)
    params = _tree(0, dtype)
    grads_seq = [_range_tree(10 + i, dtype) if i % 3 == 1 else _tree(10 + i, dtype, 1e-2) for i in range(12)]
    per_leaf, leaf_state = _loss_scaled_run(tx, params, grads_seq)
    fused, fused_state = _loss_scaled_run(optim.fused(tx, align), params, grads_seq)
    _same_bits(fused, per_leaf)
    for read in (optim.loss_scale_or_one, optim.skipped_steps):
        assert float(read(fused_state)) == float(read(leaf_state))
    if methods.loss_scaling:
        assert 0 < int(optim.skipped_steps(leaf_state)) < len(grads_seq)  # the range steps were skipped
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(per_leaf)))


def test_fused_is_the_identity_of_the_layout_in_float64():
    """In float64 every method is plain Adam's arithmetic, and the layout changes nothing: the fused chain gives the
    per-leaf chain's values and Adam's, to float64 rounding (a compiler may contract a product and a sum into one
    fused multiply-add in one program and not in the other; float16 and bfloat16 results are bit-identical, above)."""
    with jax.enable_x64(True):
        tx = method_optimizer(1e-3, PrecisionMethods.paper(), eps=1e-8)
        params = {k: v for k, v in _tree(1, jnp.float64).items() if k != "extra"}
        grads_seq = [{k: v for k, v in _tree(20 + i, jnp.float64).items() if k != "extra"} for i in range(5)]
        per_leaf, _ = _loss_scaled_run(tx, params, grads_seq)
        fused, _ = _loss_scaled_run(optim.fused(tx), params, grads_seq)
        adam, _ = _loss_scaled_run(optax.adam(1e-3), params, grads_seq)
        for a, b, c in zip(jax.tree.leaves(fused), jax.tree.leaves(per_leaf), jax.tree.leaves(adam)):
            assert a.dtype == jnp.float64
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-15, atol=1e-18)
            np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("kind", ["kahan", "stochastic"])
def test_fused_target_update_gives_the_per_leaf_bits(kind, dtype):
    update = optim.kahan_polyak(0.005, 1e4) if kind == "kahan" else optim.stochastic_rounding_polyak(0.005, seed=3)
    fused = optim.fused_target_update(update)
    target = _tree(2, dtype)
    state_leaf, state_fused = update.init(target), fused.init(target)
    leaf_target = fused_target = target
    step_leaf, step_fused = jax.jit(update.update), jax.jit(fused.update)
    for i in range(6):
        online = _range_tree(30 + i, dtype) if i % 2 else _tree(30 + i, dtype)
        leaf_target, state_leaf = step_leaf(online, leaf_target, state_leaf)
        fused_target, state_fused = step_fused(online, fused_target, state_fused)
        _same_bits(fused_target, leaf_target)


def test_fused_composes_with_chains_and_the_gradient_helper():
    """A fused optimizer in an optax chain: ``scaled_value_and_grad`` finds its loss scaler and its updates are the
    per-leaf optimizer's; a transform put before it in the chain is refused as before one that is not fused."""
    params = _tree(3, jnp.float16)
    inner = method_optimizer(1e-2, PrecisionMethods.paper())
    tx = optax.chain(optim.fused(inner))
    state = tx.init(params)

    def loss(p):
        return sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(p))

    value, grads = optim.scaled_value_and_grad(loss)(state, params)
    assert float(value) == pytest.approx(float(loss(params)))
    updates, state = tx.update(grads, state, params)
    assert jax.tree.structure(updates) == jax.tree.structure(params)
    assert isinstance(state[0], optim.FusedState)
    reference_state = inner.init(params)
    _, reference_grads = optim.scaled_value_and_grad(loss)(reference_state, params)
    reference, _ = inner.update(reference_grads, reference_state, params)
    _same_bits(updates, reference)
    misplaced = optax.chain(optax.clip(1.0), optim.fused(inner)).init(params)
    with pytest.raises(ValueError, match="follows other transforms"):
        optim.loss_scale(misplaced)


def test_element_bits_depend_on_identity_not_storage():
    tree = _tree(4, jnp.float16)
    key = jnp.asarray([7, 11], jnp.uint32)
    per_leaf = element_bits(key, tree)
    layout = flat.layout_of(tree, align=16)
    _same_bits(flat.unflatten(element_bits(key, flat.flatten(tree, layout)), layout), per_leaf)
    leaves = jax.tree.leaves(per_leaf)
    assert len({int(np.asarray(x).ravel()[0]) for x in leaves if x.size}) == len([x for x in leaves if x.size])


def test_threefry_is_jax_s():
    key = jnp.asarray([123, 456], jnp.uint32)
    x0, x1 = jnp.arange(64, dtype=jnp.uint32), jnp.arange(64, 128, dtype=jnp.uint32) * jnp.uint32(2654435761)
    ours = threefry2x32(key, x0, x1)
    theirs = threefry2x32_p.bind(jnp.full_like(x0, key[0]), jnp.full_like(x0, key[1]), x0, x1)
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
