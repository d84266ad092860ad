"""One flat buffer per dtype: an optax chain, or a target update, run over a few long vectors instead of many leaves.

An optimizer written per leaf (``jax.tree.map`` over the parameters) compiles to a few kernels *per leaf*: a
network of ``L`` layers pays ``2L`` times the kernels of its optimizer's passes, and a small network's update is
dominated by launches, not arithmetic. :func:`fused` runs the same chain over the parameters concatenated into
one vector per dtype, so each pass of the chain (hAdam's moments, the loss scale's finite check, the Kahan
compensation, stochastic rounding) is one kernel whatever the number of leaves; :func:`fused_target_update` does
the same for a target network's Polyak update.

**Layout.** :func:`layout_of` orders the leaves of a tree as ``jax.tree.leaves`` does and groups them by dtype, in
order of first appearance. Within a group each leaf is raveled and padded with zeros to a multiple of ``align``
elements, so that a blockwise quantizer with blocks of ``align`` elements (8-bit moments) never puts two leaves in
one block. The concatenation of a group is a :class:`FlatBuffer`: its ``data`` (the only pytree leaf) and the
static :class:`Segment` of each leaf it holds.

**Same bits as per leaf.** The inner transforms see a tree of :class:`FlatBuffer` (one per dtype) where they would
see the parameters' tree. An elementwise transform (everything in :mod:`lpjax.optim`, optax's Adam, SGD, weight
decay, ...) computes element for element what it computes per leaf, so the updates are bit-identical; the
padding is zero in the gradients and the parameters, and stays zero in every moment and compensation. The random
bits of stochastic rounding and of 8-bit moments are functions of each element's identity (its leaf's index in
``jax.tree.leaves`` and its index in that leaf, :func:`element_positions`), not of where it is stored, so they are
bit-identical too. Reductions over all elements are the exception: they are computed once over the buffer, so
a global norm (``optax.clip_by_global_norm``) sums in another order and may differ in its last bits; the finite
check of a loss scaler is exact either way.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax


@dataclasses.dataclass(frozen=True)
class Segment:
    """Where one leaf lives in a :class:`FlatBuffer`.

    Attributes:
      leaf: the leaf's index in ``jax.tree.leaves`` of the original tree.
      shape: the leaf's shape.
      offset: the index of its first element in the buffer.
      length: the elements it occupies, its size padded to the layout's ``align``.
    """

    leaf: int
    shape: tuple[int, ...]
    offset: int
    length: int

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FlatBuffer:
    """The leaves of one dtype, raveled, padded and concatenated: ``data`` (1-D, the pytree's only leaf) and the
    static ``segments`` saying which leaf each stretch holds. ``jax.tree.map`` over a tree of them maps ``data``
    and keeps the segments."""

    data: jax.Array
    segments: tuple[Segment, ...] = dataclasses.field(metadata=dict(static=True))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def dtype(self):
        return self.data.dtype


def is_flat_buffer(x: Any) -> bool:
    return isinstance(x, FlatBuffer)


class FlatLayout(NamedTuple):
    """How a tree maps to flat buffers (static, hashable).

    Attributes:
      treedef: the tree's structure.
      dtypes: each leaf's dtype (by leaf index).
      groups: ``(dtype name, segments)`` of each buffer, in order of first appearance.
    """

    treedef: Any
    dtypes: tuple[np.dtype, ...]
    groups: tuple[tuple[str, tuple[Segment, ...]], ...]


def layout_of(tree: Any, align: int = 1) -> FlatLayout:
    """The :class:`FlatLayout` of ``tree``'s leaves, each padded to a multiple of ``align`` elements."""
    if not (isinstance(align, int) and align >= 1):
        raise ValueError(f"align must be an int >= 1, got {align!r}.")
    leaves, treedef = jax.tree.flatten(tree)
    dtypes = tuple(np.dtype(jnp.result_type(x)) for x in leaves)
    groups: dict[str, list[Segment]] = {}
    ends: dict[str, int] = {}
    for index, (leaf, dtype) in enumerate(zip(leaves, dtypes)):
        shape = tuple(jnp.shape(leaf))
        length = -(-math.prod(shape) // align) * align
        offset = ends.get(dtype.name, 0)
        groups.setdefault(dtype.name, []).append(Segment(index, shape, offset, length))
        ends[dtype.name] = offset + length
    return FlatLayout(treedef, dtypes, tuple((name, tuple(segments)) for name, segments in groups.items()))


def flatten(tree: Any, layout: FlatLayout) -> dict[str, FlatBuffer]:
    """``tree`` as ``{dtype name: FlatBuffer}`` (each leaf cast to its group's dtype, padding zero)."""
    leaves = layout.treedef.flatten_up_to(tree)
    out = {}
    for name, segments in layout.groups:
        pieces = []
        for segment in segments:
            piece = jnp.ravel(jnp.asarray(leaves[segment.leaf])).astype(name)
            pieces.append(piece)
            if segment.length > segment.size:
                pieces.append(jnp.zeros([segment.length - segment.size], name))
        out[name] = FlatBuffer(jnp.concatenate(pieces) if len(pieces) > 1 else pieces[0], segments)
    return out


def unflatten(buffers: dict[str, FlatBuffer], layout: FlatLayout) -> Any:
    """The tree of :func:`flatten`'s inverse: each leaf sliced out of its buffer and reshaped (in the buffer's
    dtype, which a transform may have changed)."""
    leaves = [None] * len(layout.dtypes)
    for name, segments in layout.groups:
        data = buffers[name].data
        for segment in segments:
            piece = (
                data
                if segment.offset == 0 and segment.size == data.size
                else data[segment.offset : segment.offset + segment.size]
            )
            leaves[segment.leaf] = piece.reshape(segment.shape)
    return layout.treedef.unflatten(leaves)


def element_positions(node: Any, leaf: int) -> tuple[jax.Array, jax.Array]:
    """``(leaf index, index within the leaf)`` of every element of ``node``, as two uint32 arrays of its shape.

    ``node`` is a :class:`FlatBuffer` (the positions come from its segments; padding is numbered past its leaf's
    end) or an array, the leaf of index ``leaf`` of its tree. Random bits drawn as a function of these positions
    are the same whether a tree is stored per leaf or flat.
    """
    if isinstance(node, FlatBuffer):
        leaves, indices = [], []
        for segment in node.segments:
            leaves.append(jnp.full([segment.length], segment.leaf, jnp.uint32))
            indices.append(jnp.arange(segment.length, dtype=jnp.uint32))
        return jnp.concatenate(leaves), jnp.concatenate(indices)
    shape = jnp.shape(node)
    index = jnp.arange(math.prod(shape), dtype=jnp.uint32).reshape(shape)
    return jnp.full(shape, leaf, jnp.uint32), index


class FusedState(NamedTuple):
    """State of :func:`fused`.

    Attributes:
      inner_state: the inner chain's state, over ``{dtype name: FlatBuffer}`` parameters.
    """

    inner_state: Any


def fused(inner: optax.GradientTransformation, align: int = 1) -> optax.GradientTransformationExtraArgs:
    """Runs ``inner`` over the parameters flattened into one :class:`FlatBuffer` per dtype (module docstring).

    The gradients and parameters are flattened on every update and the updates unflattened into the parameters'
    tree, so the transformation composes with ``optax.chain``, ``optax.apply_updates`` and
    :func:`lpjax.optim.scaled_value_and_grad` as ``inner`` does; its state holds ``inner``'s over flat buffers.

    Args:
      inner: any optax transformation; its elementwise passes give the same bits as per leaf.
      align: pad each leaf to a multiple of this many elements: the block size of 8-bit moments
        (``moment_block_size``), so that no block spans two leaves; 1 otherwise.

    Returns:
      An optax transformation with state :class:`FusedState`.
    """
    inner = optax.with_extra_args_support(inner)
    layout_of(jnp.zeros([]), align)  # checks align

    def init_fn(params):
        layout = layout_of(params, align)
        return FusedState(inner.init(flatten(params, layout)))

    def update_fn(updates, state, params=None, **extra_args):
        layout = layout_of(updates, align)
        flat_params = None if params is None else flatten(params, layout)
        flat_updates, inner_state = inner.update(flatten(updates, layout), state.inner_state, flat_params, **extra_args)
        return unflatten(flat_updates, layout), FusedState(inner_state)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


class TargetUpdate(NamedTuple):
    """A pure ``init``/``update`` pair for target networks (:func:`lpjax.optim.kahan_polyak`'s shape).

    Attributes:
      init: ``init(target_params) -> state``.
      update: ``update(online_params, target_params, state) -> (new_target_params, state)``.
    """

    init: Callable[[Any], Any]
    update: Callable[[Any, Any, Any], tuple[Any, Any]]


def fused_target_update(target_update: TargetUpdate) -> TargetUpdate:
    """``target_update`` (:func:`lpjax.optim.kahan_polyak`, :func:`lpjax.optim.stochastic_rounding_polyak`) run
    over one flat buffer per dtype; the same bits as per leaf (module docstring), in one pass per dtype."""

    def init(target_params):
        return target_update.init(flatten(target_params, layout_of(target_params)))

    def update(online_params, target_params, state):
        layout = layout_of(target_params)
        new_target, state = target_update.update(flatten(online_params, layout), flatten(target_params, layout), state)
        return unflatten(new_target, layout), state

    return TargetUpdate(init, update)


__all__ = [
    "FlatBuffer",
    "FlatLayout",
    "FusedState",
    "Segment",
    "TargetUpdate",
    "element_positions",
    "flatten",
    "fused",
    "fused_target_update",
    "is_flat_buffer",
    "layout_of",
    "unflatten",
]
