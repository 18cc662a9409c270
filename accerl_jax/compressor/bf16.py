"""``bf16``: a bfloat16 actor -- bf16 weights and bf16 compute in the hidden layers.

Hidden-layer kernels and biases are stored in bfloat16 (half the bytes); each hidden ``nn.Dense`` /
``nn.Conv`` gets its input cast to bfloat16, so flax computes the layer in bfloat16 (XLA may accumulate
in float32 internally). The policy, value and Q heads, and parameters outside the hidden layers (the
Gaussian policy's ``log_std``), keep float32 weights (DESIGN.md, "Conventions"): their
bf16 input is promoted to float32, so logits and values are float32. Useful on accelerators with bf16
units; on CPUs without them it is usually *slower* (the benchmark reports what it gives).
"""
from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from accerl_jax.compressor.base import Compressor
from accerl_jax.compressor.select import HEADS


class Bf16State(NamedTuple):
    """``bf16`` has no state."""


def _hidden_weight(path) -> bool:
    """True for a ``kernel`` or ``bias`` of a layer outside the heads: ``params/<layer>/<kernel|bias>``.

    Parameters owned by the network module itself (the Gaussian policy's ``params/log_std``) are not
    hidden-layer weights and stay float32.
    """
    names = [str(getattr(k, "key", k)) for k in path]
    return len(names) >= 3 and names[-1] in ("kernel", "bias") and not any(n in HEADS for n in names)


def to_bf16(params):
    """Cast every floating hidden-layer kernel and bias (heads and ``log_std`` excluded) to bfloat16.

    Args:
      params: flax variables ``{"params": {...}}`` of any network :func:`accerl_jax.networks.build` makes.
    Returns:
      The same tree, hidden-layer weights as bfloat16, every other leaf unchanged.
    """
    return jax.tree_util.tree_map_with_path(
        lambda p, w: w.astype(jnp.bfloat16) if _hidden_weight(p) and jnp.issubdtype(w.dtype, jnp.floating) else w,
        params,
    )


def _bf16_inputs(next_fun, args, kwargs, context):
    module = context.module
    if (isinstance(module, (nn.Dense, nn.Conv)) and context.method_name == "__call__"
            and module.name not in HEADS):
        args = (args[0].astype(jnp.bfloat16),) + tuple(args[1:])
    return next_fun(*args, **kwargs)


def bf16_apply(apply):
    """``apply`` with every hidden dense/conv layer computed in bfloat16 (flax method interception)."""

    def run(params, obs):
        with nn.intercept_methods(_bf16_inputs):
            logits, value = apply(params, obs)
        return logits.astype(jnp.float32), value.astype(jnp.float32)

    return run


def bf16() -> Compressor:
    """bfloat16 compressor (no arguments)."""
    cast = jax.jit(to_bf16)
    return Compressor(
        init=lambda params, key, obs=None: (cast(params), Bf16State()),
        compress=lambda params, state, obs: (cast(params), state),
        actor_apply=bf16_apply,
    )
