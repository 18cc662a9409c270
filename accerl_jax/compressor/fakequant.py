"""``fakequant:<bits>``: simulated (quantize-dequantize) symmetric weight quantization.

Each hidden-layer kernel is rounded to a signed ``bits``-bit grid with one scale per output
channel (the last kernel axis), ``scale = max|w| / (2^(bits-1) - 1)``, and stored back in float32
(Jacob et al. 2018, https://arxiv.org/abs/1712.05877, eq. 1 with zero-point 0). It measures the
*fidelity* cost of quantization; it runs in float, so it is not faster (real int8 arithmetic, through
qwix, is a separate compressor still to come).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from accerl_jax.compressor.base import Compressor
from accerl_jax.compressor.select import is_compressible


class FakeQuantState(NamedTuple):
    max_abs_error: jax.Array  # [] float32, largest |w - fakequant(w)| over compressed kernels


def fake_quantize(w: jax.Array, bits: int) -> jax.Array:
    """Quantize-dequantize ``w`` (``[..., out]``) per output channel to ``bits`` signed bits."""
    qmax = 2.0 ** (bits - 1) - 1.0
    reduce_axes = tuple(range(w.ndim - 1))
    scale = jnp.max(jnp.abs(w), axis=reduce_axes, keepdims=True) / qmax
    scale = jnp.where(scale == 0.0, 1.0, scale)
    return jnp.clip(jnp.round(w / scale), -qmax, qmax) * scale


def fakequant(bits: int) -> Compressor:
    """Fake-quantization compressor.

    Args:
      bits: integer bit width in [2, 8].

    Raises:
      ValueError: if ``bits`` is not an integer in [2, 8].
    """
    if int(bits) != bits or not 2 <= bits <= 8:
        raise ValueError(f"fakequant bits {bits} must be an integer in [2, 8]; e.g. fakequant:8")
    bits = int(bits)

    @jax.jit
    def _compress(params):
        quantized = jax.tree_util.tree_map_with_path(
            lambda p, w: fake_quantize(w, bits) if is_compressible(p, w) else w, params
        )
        errors = [jnp.max(jnp.abs(a - b)) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(quantized))]
        return quantized, FakeQuantState(jnp.max(jnp.stack(errors)).astype(jnp.float32))

    return Compressor(
        init=lambda params, key, obs=None: _compress(params),
        compress=lambda params, state, obs: _compress(params),
        actor_apply=lambda apply: apply,
    )
