"""``prune:<fraction>``: structured pruning -- a physically smaller network with smaller arrays.

For every hidden layer (dense neurons and conv output channels, :func:`accerl_jax.networks.hidden_layers`)
the ``fraction`` of output units with the lowest importance is removed, together with the matching input
rows of the layers that read them (the next layer or the heads). Where several layers write one unit set
(the IMPALA ResNet's residual streams: the stack's conv and every block's second conv) their importances
add up and the same units are kept in each. Importance is the L1 norm of a unit's
incoming kernel weights plus ``|bias|`` (Li et al. 2017, "Pruning Filters for Efficient ConvNets",
https://arxiv.org/abs/1608.08710; AcceRL arXiv 2211.15023 section 3 removes feature maps and neurons
the same way). The bias is counted so that a unit whose weights *and* bias are zero -- and only such a
unit -- has importance 0: removing it leaves the function unchanged (ReLU(0) = 0 contributes nothing).

The pruned network is ``networks.with_widths(spec, kept)`` built by :func:`accerl_jax.networks.build`,
so its flax parameter shapes match; its widths are fixed by ``fraction`` (``max(1, round((1 - f) w))``
units of a layer of width ``w``), so the actor's program is static. ``prune:0`` keeps every unit in
its original order and reproduces the network exactly. Unlike a mask, fewer FLOPs are really run.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from accerl_jax import networks
from accerl_jax.compressor.base import Compressor


class PruneState(NamedTuple):
    kept: Any  # {layer name: [k] int32 indices of the kept output units, ascending}


def pruned_widths(spec: networks.NetworkSpec, fraction: float) -> tuple[int, ...]:
    """Widths of the network ``prune:<fraction>`` keeps: ``max(1, round((1 - fraction) * w))`` each."""
    return tuple(max(1, int(round((1.0 - fraction) * w))) for w in spec.widths)


def unit_importance(kernel: jax.Array, bias: jax.Array) -> jax.Array:
    """L1 norm per output unit: ``sum |kernel[..., j]| + |bias[j]|``; ``kernel [..., out]`` -> ``[out]``."""
    return jnp.sum(jnp.abs(kernel.reshape(-1, kernel.shape[-1])), axis=0) + jnp.abs(bias)


def _take_inputs(kernel: jax.Array, idx: jax.Array, n_in: int) -> jax.Array:
    """Rows of a consumer ``kernel`` that read the kept units ``idx`` of a producer with ``n_in`` outputs.

    Conv kernels ``[kh, kw, C_in, C_out]`` select on ``C_in``; dense kernels ``[D_in, D_out]`` on ``D_in``,
    where ``D_in = P * n_in`` when the dense layer reads a flattened ``[..., P, n_in]`` conv map.
    """
    if kernel.ndim == 4:
        return jnp.take(kernel, idx, axis=2)
    flat = kernel.reshape(-1, n_in, kernel.shape[-1])  # (positions, channels, out): NHWC flatten order
    return jnp.take(flat, idx, axis=1).reshape(-1, kernel.shape[-1])


def prune_params(params, spec: networks.NetworkSpec, fraction: float):
    """Structured pruning of ``params`` of ``build(spec)``; returns ``(pruned params, kept indices)``.

    The pruned params fit ``build(networks.with_widths(spec, pruned_widths(spec, fraction)))``. Every network
    family :func:`accerl_jax.networks.build` makes is accepted: MLP categorical, MLP Gaussian (its ``log_std``
    ``[D]`` is kept as is), CNN, MinAtar, IMPALA ResNet, each with or without the Q head. ``kept`` maps every
    producer module of :func:`accerl_jax.networks.hidden_layers` to its kept output units.
    """
    widths = pruned_widths(spec, fraction)
    # Copies, so the learner's params are not written; top-level arrays that are not layers (the Gaussian
    # policy's state-independent ``log_std``) are passed through unchanged.
    p = {k: dict(v) if isinstance(v, Mapping) else v for k, v in params["params"].items()}
    kept = {}
    for layer in networks.hidden_layers(spec):
        # One unit set for all producers (a residual stream's writers): their importances add up.
        n = p[layer.producers[0]]["kernel"].shape[-1]
        importance = sum(unit_importance(p[m]["kernel"], p[m]["bias"]) for m in layer.producers)
        idx = jnp.sort(jax.lax.top_k(importance, widths[layer.width])[1]).astype(jnp.int32)
        for m in layer.producers:
            kept[m] = idx
            p[m]["kernel"] = jnp.take(p[m]["kernel"], idx, axis=-1)
            p[m]["bias"] = jnp.take(p[m]["bias"], idx, axis=0)
        for c in layer.consumers:
            p[c]["kernel"] = _take_inputs(p[c]["kernel"], idx, n)
    return {"params": p}, kept


def prune(spec: networks.NetworkSpec, fraction: float) -> Compressor:
    """Structured-pruning compressor for a learner network ``spec``.

    Args:
      spec: the learner's network.
      fraction: share of each hidden layer's units removed, in [0, 1).

    Raises:
      ValueError: if ``fraction`` is outside [0, 1).
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"prune fraction {fraction} is outside [0, 1); e.g. prune:0.5")
    pruned_spec = networks.with_widths(spec, pruned_widths(spec, fraction))
    pruned_apply = networks.make_apply(pruned_spec)

    @jax.jit
    def _compress(params):
        pruned, kept = prune_params(params, spec, fraction)
        return pruned, PruneState(kept)

    return Compressor(
        init=lambda params, key, obs=None: _compress(params),
        compress=lambda params, state, obs: _compress(params),
        actor_apply=lambda apply: pruned_apply,
    )
