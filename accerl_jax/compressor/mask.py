"""``mask:<sparsity>[,global][,ramp=<updates>]``: unstructured magnitude pruning.

Hidden-layer kernels keep their largest-magnitude weights; the rest are set to zero (Han et al. 2015,
https://arxiv.org/abs/1506.02626). Two scopes:

* per layer (default): each kernel keeps exactly ``round((1 - s) * size)`` weights;
* ``global``: one magnitude threshold over all hidden kernels together, so layers with many small
  weights are pruned harder; the total kept count is exact.

``ramp=<n>`` follows the gradual schedule of Zhu & Gupta 2017 (https://arxiv.org/abs/1710.01878, eq. 1)
over ``n`` compress calls (learner updates): ``s_t = s · (1 - (1 - t/n)^3)`` for ``t <= n``, then ``s``.
Biases and the policy/value heads are left dense. The actor runs the same dense network on the masked
weights: on dense hardware this gives *no* speedup, and the measured speedup shows that.

:func:`mask_updates` is the optax transformation that keeps masked weights at exactly zero in a
learner that is itself pruned: it zeroes the *update* after the optimizer (Adam or momentum), so
optimizer state cannot regrow a pruned weight (DESIGN.md, "Conventions").
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from accerl_jax.compressor.base import Compressor
from accerl_jax.compressor.select import is_compressible


class MaskState(NamedTuple):
    masks: Any  # pytree like params, float32 {0, 1}; all ones where nothing is masked
    sparsity: jax.Array  # [] float32 fraction of masked-kernel weights set to zero
    step: jax.Array  # [] int32 compress calls so far (the gradual schedule's t)


def magnitude_mask(w: jax.Array, sparsity: float) -> jax.Array:
    """float32 mask of ``w``'s shape keeping exactly the ``round((1-sparsity) * w.size)`` largest ``|w|``.

    Ties at the cut-off are broken by position (``lax.top_k``), so the kept count is exact even when
    many weights share a magnitude (e.g. after quantization, or already-zero weights).
    """
    k = int(round((1.0 - sparsity) * w.size))
    flat = jnp.zeros((w.size,), jnp.float32)
    if k > 0:
        flat = flat.at[jax.lax.top_k(jnp.abs(w).reshape(-1), k)[1]].set(1.0)
    return flat.reshape(w.shape)


def gradual_sparsity(final: float, step, ramp: int):
    """Zhu & Gupta 2017 cubic schedule: ``final · (1 - (1 - min(step/ramp, 1))^3)``; ``final`` if ``ramp == 0``."""
    if ramp <= 0:
        return jnp.asarray(final, jnp.float32)
    frac = jnp.clip(jnp.asarray(step, jnp.float32) / ramp, 0.0, 1.0)
    return final * (1.0 - (1.0 - frac) ** 3)


def _keep_top(scores: jax.Array, keep: jax.Array) -> jax.Array:
    """float32 ``{0,1}`` of ``scores``' shape keeping the ``keep`` (traced int) largest, ties by position."""
    flat = scores.reshape(-1)
    order = jnp.argsort(-flat, stable=True)
    rank = jnp.zeros_like(order).at[order].set(jnp.arange(flat.size))
    return (rank < keep).astype(jnp.float32).reshape(scores.shape)


def mask(sparsity: float, scope: str = "layer", ramp: int = 0) -> Compressor:
    """Magnitude-mask compressor.

    Args:
      sparsity: final fraction of hidden-kernel weights set to zero, in [0, 1).
      scope: ``"layer"`` (each kernel pruned to ``sparsity``) or ``"global"`` (one threshold).
      ramp: compress calls over which sparsity rises from 0 by the Zhu & Gupta schedule; 0 = at once.

    Raises:
      ValueError: for ``sparsity`` outside [0, 1), an unknown ``scope`` or a negative ``ramp``.
    """
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"mask sparsity {sparsity} is outside [0, 1); e.g. mask:0.9")
    if scope not in ("layer", "global"):
        raise ValueError(f"mask scope {scope!r} unknown; expected 'layer' (default) or 'global'")
    if ramp < 0:
        raise ValueError(f"mask ramp {ramp} must be >= 0 (compress calls); e.g. mask:0.9,ramp=100")

    def _masks(params, target):
        flat, treedef = jax.tree_util.tree_flatten_with_path(params)
        chosen = [i for i, (p, w) in enumerate(flat) if is_compressible(p, w)]
        masks = [jnp.ones(w.shape, jnp.float32) for _, w in flat]
        if scope == "layer" and ramp == 0:
            for i in chosen:  # exact, static counts (fast path)
                masks[i] = magnitude_mask(flat[i][1], sparsity)
        elif scope == "layer":
            for i in chosen:
                w = flat[i][1]
                keep = jnp.round((1.0 - target) * w.size).astype(jnp.int32)
                masks[i] = _keep_top(jnp.abs(w), keep)
        else:
            scores = jnp.concatenate([jnp.abs(flat[i][1]).reshape(-1) for i in chosen])
            keep = jnp.round((1.0 - target) * scores.size).astype(jnp.int32)
            kept = _keep_top(scores, keep)
            offset = 0
            for i in chosen:
                w = flat[i][1]
                masks[i] = kept[offset: offset + w.size].reshape(w.shape)
                offset += w.size
        total = sum(flat[i][1].size for i in chosen)
        zeros = sum(jnp.sum(1.0 - masks[i]) for i in chosen)
        return jax.tree.unflatten(treedef, masks), jnp.asarray(zeros / max(total, 1), jnp.float32)

    @jax.jit
    def _compress(params, step):
        masks, achieved = _masks(params, gradual_sparsity(sparsity, step, ramp))
        masked = jax.tree.map(lambda w, m: w * m.astype(w.dtype), params, masks)
        return masked, MaskState(masks, achieved, step + 1)

    zero = jnp.zeros((), jnp.int32)
    return Compressor(
        init=lambda params, key, obs=None: _compress(params, zero),
        compress=lambda params, state, obs: _compress(params, state.step),
        actor_apply=lambda apply: apply,
    )


def mask_updates(masks) -> optax.GradientTransformation:
    """optax transformation multiplying updates by ``masks`` (a params-shaped pytree of ``{0, 1}``).

    Chain it *after* the optimizer (``optax.chain(optax.adam(lr), mask_updates(m))``) and start from
    masked parameters: masked weights then stay exactly 0 whatever the optimizer's momentum holds.
    """

    def init(params):
        del params
        return optax.EmptyState()

    def update(updates, state, params=None):
        del params
        return jax.tree.map(lambda u, m: u * m.astype(u.dtype), updates, masks), state

    return optax.GradientTransformation(init, update)
