"""``mask:<sparsity>``: unstructured magnitude pruning (per layer).

Each hidden-layer kernel keeps its ``1 - sparsity`` fraction of largest-magnitude weights; the rest
are set to zero (Han et al. 2015, https://arxiv.org/abs/1506.02626; Zhu & Gupta 2017,
https://arxiv.org/abs/1710.01878). Biases and the policy/value heads are left dense. The actor runs
the same dense network on the masked weights: on dense hardware this gives *no* speedup, and the
measured ``actor_policy_speedup`` shows that rather than hiding it.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from accerl_jax.compressor.base import Compressor
from accerl_jax.compressor.select import is_compressible


class MaskState(NamedTuple):
    masks: Any  # pytree like params, float32 {0, 1}; all ones where nothing is masked
    sparsity: jax.Array  # [] float32 fraction of masked-kernel weights set to zero


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


def mask(sparsity: float) -> Compressor:
    """Magnitude-mask compressor.

    Args:
      sparsity: fraction of each hidden kernel's weights set to zero, in [0, 1).

    Raises:
      ValueError: if ``sparsity`` is outside [0, 1).
    """
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"mask sparsity {sparsity} is outside [0, 1); e.g. mask:0.9")

    @jax.jit
    def _compress(params):
        masks = jax.tree_util.tree_map_with_path(
            lambda p, w: magnitude_mask(w, sparsity) if is_compressible(p, w) else jnp.ones(w.shape, jnp.float32),
            params,
        )
        masked = jax.tree.map(lambda w, m: w * m.astype(w.dtype), params, masks)
        counted = jax.tree_util.tree_map_with_path(
            lambda p, w, m: (jnp.sum(1.0 - m), m.size) if is_compressible(p, w) else (0.0, 0), params, masks
        )
        pairs = jax.tree.leaves(counted, is_leaf=lambda x: isinstance(x, tuple))
        zeros = sum(z for z, _ in pairs)
        total = max(sum(n for _, n in pairs), 1)
        return masked, MaskState(masks, jnp.asarray(zeros / total, jnp.float32))

    return Compressor(
        init=lambda params, key: _compress(params),
        compress=lambda params, state, obs: _compress(params),
        actor_apply=lambda apply: apply,
    )
