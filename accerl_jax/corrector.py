"""Corrector: off-policy correction of a rollout for the gap between behaviour μ and target π.

The actor runs a *compressed*, possibly stale copy of the learner's policy (μ); the learner wants
targets for its own policy π. This module holds the correction math (pure functions, rlax naming,
one backward ``lax.scan`` per trajectory, batched over ``B`` once with ``vmap``):

* :func:`vtrace_single` / :func:`vtrace` -- V-trace (IMPALA, Espeholt et al. 2018,
  https://arxiv.org/abs/1802.01561, eq. 1 and section 4.2), extended with ``done_t`` so that a batch
  that concatenates episodes gives exactly the per-episode results.
* :func:`correct` -- the ``--corrector`` switch: ``vtrace`` or ``none`` (ρ = 1, the on-policy
  λ-return with no correction).

This module imports nothing else from the package (STYLE.md, rlax).
"""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

CORRECTORS = ("vtrace", "none")


class VTraceOutput(NamedTuple):
    """V-trace targets.

    Attributes:
      vs: ``[T]`` (or ``[T, B]``) float32 V-trace value targets v_s for the values ``v_tm1``.
      pg_advantage: same shape, the policy-gradient advantage
        ``min(ρ̄_pg, ρ_s) (r_s + γ_s q_{s+1} - V(x_s))`` of IMPALA section 4.2.
    """

    vs: jax.Array
    pg_advantage: jax.Array


def vtrace_single(
    v_tm1: jax.Array,
    v_t: jax.Array,
    r_t: jax.Array,
    discount_t: jax.Array,
    rho_tm1: jax.Array,
    done_t: jax.Array,
    *,
    lambda_: float = 1.0,
    clip_rho_threshold: float = 1.0,
    clip_pg_rho_threshold: float = 1.0,
) -> VTraceOutput:
    """V-trace for one trajectory of ``T`` transitions, cut at every ``done_t``.

    With ρ̄ = ``clip_rho_threshold``, c_s = λ min(1, ρ_s) and δ_s = min(ρ̄, ρ_s)(r_s + γ_s V(x_{s+1}) - V(x_s)):

        v_s - V(x_s) = δ_s + γ_s c_s (1 - done_s) (v_{s+1} - V(x_{s+1}))          (IMPALA eq. 1)
        A_s = min(ρ̄_pg, ρ_s) (r_s + γ_s q_{s+1} - V(x_s)),
        q_{s+1} = V(x_{s+1}) if done_s or s = T-1, else λ v_{s+1} + (1-λ) V(x_{s+1}).

    Args:
      v_tm1: ``[T]`` float, V(x_s) of the observation each transition started at, times [0, T-1].
      v_t: ``[T]`` float, V of the observation that followed transition s (the true final
        observation where the episode ended), times [1, T].
      r_t: ``[T]`` float reward of each transition.
      discount_t: ``[T]`` float γ_s; 0 only at a true termination (truncation keeps γ).
      rho_tm1: ``[T]`` float importance ratio π(a_s|x_s) / μ(a_s|x_s) (not clipped).
      done_t: ``[T]`` bool or float, 1 where transition s ended its episode (terminated or
        truncated); the trace is cut there, nothing from row s+1 reaches row s.
      lambda_: trace mixing λ in [0, 1].
      clip_rho_threshold: ρ̄, clip of the ratio in δ_s.
      clip_pg_rho_threshold: clip of the ratio in the policy-gradient advantage.

    Returns:
      :class:`VTraceOutput` with ``vs`` and ``pg_advantage``, each ``[T]``, with gradients stopped
      (they are targets).

    Raises:
      AssertionError (chex) if the inputs are not all rank 1 with equal shapes.

    With no ``done_t`` set this equals ``rlax.vtrace_td_error_and_advantage`` (``vs = errors + v_tm1``).
    """
    chex.assert_rank([v_tm1, v_t, r_t, discount_t, rho_tm1, done_t], 1)
    chex.assert_equal_shape([v_tm1, v_t, r_t, discount_t, rho_tm1, done_t])
    dtype = v_tm1.dtype
    not_done = 1.0 - done_t.astype(dtype)
    c_tm1 = lambda_ * jnp.minimum(1.0, rho_tm1)
    clipped_rho_tm1 = jnp.minimum(clip_rho_threshold, rho_tm1)
    td_error = clipped_rho_tm1 * (r_t + discount_t * v_t - v_tm1)

    def _body(acc, xs):
        td, discount, c, nd = xs
        acc = td + discount * c * nd * acc
        return acc, acc

    _, errors = jax.lax.scan(
        # zeros_like(td_error[-1]) keeps the carry's type (incl. shard_map's varying axes) equal to the body's.
        _body, jnp.zeros_like(td_error[-1]), (td_error, discount_t, c_tm1, not_done), reverse=True
    )
    vs = errors + v_tm1
    # Bootstrap of the pg advantage: the next row's target inside an episode, the value of the
    # true next observation at an episode end and at the last row.
    next_vs = jnp.concatenate([vs[1:], v_t[-1:]])
    next_v = jnp.concatenate([v_tm1[1:], v_t[-1:]])
    inside = jnp.concatenate([not_done[:-1], jnp.zeros((1,), dtype)])
    q_bootstrap = inside * (lambda_ * next_vs + (1.0 - lambda_) * next_v) + (1.0 - inside) * v_t
    q_estimate = r_t + discount_t * q_bootstrap
    pg_advantage = jnp.minimum(clip_pg_rho_threshold, rho_tm1) * (q_estimate - v_tm1)
    return VTraceOutput(jax.lax.stop_gradient(vs), jax.lax.stop_gradient(pg_advantage))


def vtrace(
    v_tm1: jax.Array,
    v_t: jax.Array,
    r_t: jax.Array,
    discount_t: jax.Array,
    rho_tm1: jax.Array,
    done_t: jax.Array,
    *,
    lambda_: float = 1.0,
    clip_rho_threshold: float = 1.0,
    clip_pg_rho_threshold: float = 1.0,
) -> VTraceOutput:
    """V-trace on time-major ``[T, B]`` inputs: :func:`vtrace_single` vmapped over ``B``.

    Args and returns as :func:`vtrace_single`, with every array ``[T, B]``.

    Raises:
      AssertionError (chex) if the inputs are not all rank 2 with equal shapes.

    Source: IMPALA (Espeholt et al. 2018, https://arxiv.org/abs/1802.01561), eq. 1 and section 4.2.
    """
    chex.assert_rank([v_tm1, v_t, r_t, discount_t, rho_tm1, done_t], 2)
    chex.assert_equal_shape([v_tm1, v_t, r_t, discount_t, rho_tm1, done_t])
    fn = lambda *xs: vtrace_single(  # noqa: E731
        *xs,
        lambda_=lambda_,
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
    )
    return jax.vmap(fn, in_axes=1, out_axes=1)(v_tm1, v_t, r_t, discount_t, rho_tm1, done_t)


def correct(
    name: str,
    v_tm1: jax.Array,
    v_t: jax.Array,
    r_t: jax.Array,
    discount_t: jax.Array,
    log_rho_tm1: jax.Array,
    done_t: jax.Array,
    *,
    lambda_: float = 1.0,
    clip_rho_threshold: float = 1.0,
    clip_pg_rho_threshold: float = 1.0,
) -> VTraceOutput:
    """Apply the corrector ``name`` to a ``[T, B]`` rollout.

    Args:
      name: ``"vtrace"`` (ratios ρ = exp(log π - log μ)) or ``"none"`` (ρ = 1: the on-policy λ-return
        and advantage, no correction for the behaviour policy).
      log_rho_tm1: ``[T, B]`` float log π(a|x) - log μ(a|x), summed over action dimensions.
      Other arguments as :func:`vtrace`.

    Returns:
      :class:`VTraceOutput`, each field ``[T, B]``.

    Raises:
      ValueError: if ``name`` is not one of :data:`CORRECTORS`.
    """
    if name == "vtrace":
        rho_tm1 = jnp.exp(log_rho_tm1)
    elif name == "none":
        rho_tm1 = jnp.ones_like(log_rho_tm1)
    else:
        raise ValueError(f"unknown corrector {name!r}; expected one of {', '.join(CORRECTORS)}")
    return vtrace(
        v_tm1,
        v_t,
        r_t,
        discount_t,
        jax.lax.stop_gradient(rho_tm1),
        done_t,
        lambda_=lambda_,
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
    )
