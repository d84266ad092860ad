"""The pixel encoder of Björck et al. (2021), appendix G, made safe for float16."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from lpjax.nn.dense import relu
from lpjax.numerics import weight_standardize
from lpjax.precision import Policy, get_policy


class StandardizedDense(nn.Module):
    """``Dense`` whose kernel is weight-standardized (:func:`lpjax.numerics.weight_standardize`) at every call."""

    features: int
    policy: Policy | str = "fp32"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        policy = get_policy(self.policy)
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (x.shape[-1], self.features), policy.param_dtype)
        bias = self.param("bias", nn.initializers.zeros, (self.features,), policy.param_dtype)
        kernel = weight_standardize(kernel).astype(policy.compute_dtype)
        return jnp.dot(x.astype(policy.compute_dtype), kernel) + bias.astype(policy.compute_dtype)


class PixelEncoder(nn.Module):
    """Four 3x3 convolutions (32 filters, ReLU; the first with stride 2), then Linear -> 50 -> LayerNorm.

    Input: uint8 images ``(batch, H, W, C)`` (C = 3 x frame stack), scaled to [0, 1]. The fp16 fixes of the
    paper are switches: ``standardize`` puts weight standardization on the linear layer, ``clip`` caps its
    outputs at 10 before the LayerNorm (both leave LayerNorm unchanged in exact arithmetic: it is invariant to
    rescaling and shifting its input, and the cap only binds where float16's variance would overflow).
    LayerNorm statistics are computed in float32, as flax does for half-precision inputs.
    """

    features: int = 50
    filters: int = 32
    policy: Policy | str = "fp32"
    standardize: bool = True
    clip: float | None = 10.0

    @nn.compact
    def __call__(self, images: jax.Array) -> jax.Array:
        policy = get_policy(self.policy)
        x = images.astype(policy.compute_dtype) / jnp.asarray(255.0, policy.compute_dtype)
        for i, stride in enumerate((2, 1, 1, 1)):
            x = nn.Conv(
                self.filters,
                (3, 3),
                strides=stride,
                padding="VALID",
                dtype=policy.compute_dtype,
                param_dtype=policy.param_dtype,
                name=f"conv{i}",
            )(x)
            x = relu(x)
        x = x.reshape(x.shape[:-3] + (-1,))
        if self.standardize:
            x = StandardizedDense(self.features, self.policy, name="linear")(x)
        else:
            x = nn.Dense(self.features, dtype=policy.compute_dtype, param_dtype=policy.param_dtype, name="linear")(x)
        if self.clip is not None:
            x = jnp.minimum(x, jnp.asarray(self.clip, x.dtype))
        return nn.LayerNorm(dtype=policy.compute_dtype, param_dtype=policy.param_dtype)(x)
