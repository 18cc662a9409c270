"""Corrector: off-policy correction of a rollout for the gap between behaviour μ and target π.

The actor runs a *compressed*, possibly stale copy of the learner's policy (μ); the learner wants
targets for its own policy π. This module holds the correction math (pure functions, rlax naming,
one backward ``lax.scan`` per trajectory, batched over ``B`` once with ``vmap``):

* :func:`vtrace_single` / :func:`vtrace` -- V-trace (IMPALA, Espeholt et al. 2018,
  https://arxiv.org/abs/1802.01561, eq. 1 and section 4.2), extended with ``done_t`` so that a batch
  that concatenates episodes gives exactly the per-episode results.
* :func:`retrace_single` / :func:`retrace` -- Retrace(λ) targets for Q(x_{t-1}, a_{t-1}) (Munos et al.
  2016, https://arxiv.org/abs/1606.02647), cut at every ``done_t``.
* :func:`importance_sampling_single` / :func:`importance_sampling` -- truncated per-decision importance
  sampling of state-value λ-returns (Precup et al. 2000; rlax ``importance_corrected_td_errors``), with
  the ratio clipped at ρ̄, cut at every ``done_t``.
* :func:`correct` -- the ``--corrector`` switch for the state-value correctors: ``vtrace``, ``is`` or
  ``none`` (ρ = 1, the on-policy λ-return with no correction). ``retrace`` needs Q-values: the learner
  calls :func:`retrace` directly.

This module imports nothing else from the package (STYLE.md, rlax).
"""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

CORRECTORS = ("vtrace", "retrace", "is", "none")
# The correctors that produce state-value targets and advantages (:func:`correct`); retrace needs a Q head.
VALUE_CORRECTORS = ("vtrace", "is", "none")
# c̄: V-trace and Retrace clip their trace coefficients c_s = λ min(c̄, ρ_s) at 1 (IMPALA eq. 1, Retrace).
CLIP_C_THRESHOLD = 1.0
# What clipping at ρ̄ removes is reported as the share of ratios beyond ρ̄ · CLIP_MARGIN: at the usual ρ̄ = 1
# about half of all ratios exceed ρ̄ by a hair whenever π and μ differ at all (measured: 43-53% of ρ > 1
# with KL ~1e-5 on CartPole, 4% with identical parameters, from float rounding), which says nothing about
# the correction's bias; ratios 10% above ρ̄ do.
CLIP_MARGIN = 1.1


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
    c_tm1 = lambda_ * jnp.minimum(CLIP_C_THRESHOLD, rho_tm1)
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
    pg_advantage = _pg_advantage(vs, v_tm1, v_t, r_t, discount_t, rho_tm1, not_done, lambda_, clip_pg_rho_threshold)
    return VTraceOutput(jax.lax.stop_gradient(vs), jax.lax.stop_gradient(pg_advantage))


def _pg_advantage(vs, v_tm1, v_t, r_t, discount_t, rho_tm1, not_done, lambda_, clip_pg_rho_threshold):
    """min(ρ̄_pg, ρ_s) (r_s + γ_s q_{s+1} - V(x_s)) with q_{s+1} as in :func:`vtrace_single`'s docstring."""
    dtype = vs.dtype
    # Bootstrap of the pg advantage: the next row's target inside an episode, the value of the
    # true next observation at an episode end and at the last row.
    next_vs = jnp.concatenate([vs[1:], v_t[-1:]])
    next_v = jnp.concatenate([v_tm1[1:], v_t[-1:]])
    inside = jnp.concatenate([not_done[:-1], jnp.zeros((1,), dtype)])
    q_bootstrap = inside * (lambda_ * next_vs + (1.0 - lambda_) * next_v) + (1.0 - inside) * v_t
    q_estimate = r_t + discount_t * q_bootstrap
    return jnp.minimum(clip_pg_rho_threshold, rho_tm1) * (q_estimate - v_tm1)


def importance_sampling_single(
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
    """Truncated per-decision importance sampling (IS) for one trajectory, cut at every ``done_t``.

    With ρ̃_s = min(ρ̄, ρ_s) and δ_s = r_s + γ_s V(x_{s+1}) - V(x_s), the λ-return corrected per decision:

        v_s - V(x_s) = ρ̃_s (δ_s + γ_s λ (1 - done_s) (v_{s+1} - V(x_{s+1})))
        A_s = min(ρ̄_pg, ρ_s) (r_s + γ_s q_{s+1} - V(x_s)),  q_{s+1} as in :func:`vtrace_single`.

    Unlike V-trace the trace coefficient is the clipped ratio itself (it can exceed 1 when ρ̄ > 1), and
    the ratio multiplies the whole corrected error, not only δ_s. At ρ̄ = 1 the targets coincide with
    V-trace's: V-trace's c_s = min(1, ρ_s) then equals the clipped ratio, and the two recursions agree.

    Source: Precup, Sutton & Singh 2000, "Eligibility traces for off-policy policy evaluation"; the
    recursion of ``rlax.importance_corrected_td_errors`` (Sutton et al. 2014,
    http://proceedings.mlr.press/v32/sutton14.html) applied to clipped ratios.

    Args:
      As :func:`vtrace_single` (``[T]`` each, times [0, T-1] for ``v_tm1``/``rho_tm1``, [1, T] for the rest).

    Returns:
      :class:`VTraceOutput` ``(vs, pg_advantage)``, each ``[T]``, gradients stopped.

    Raises:
      AssertionError (chex) if the inputs are not all rank 1 with equal shapes.

    With no ``done_t`` set, consistent values (``v_t[s] = v_tm1[s+1]``) and ρ already below ρ̄ this
    equals ``rlax.importance_corrected_td_errors(r_t, discount_t, rho_tm1, lambda_, values) + v_tm1``.
    """
    chex.assert_rank([v_tm1, v_t, r_t, discount_t, rho_tm1, done_t], 1)
    chex.assert_equal_shape([v_tm1, v_t, r_t, discount_t, rho_tm1, done_t])
    not_done = 1.0 - done_t.astype(v_tm1.dtype)
    rho_clipped = jnp.minimum(clip_rho_threshold, rho_tm1)
    delta = r_t + discount_t * v_t - v_tm1

    def _body(acc, xs):
        d, discount, rho, nd = xs
        acc = rho * (d + discount * lambda_ * nd * acc)
        return acc, acc

    _, errors = jax.lax.scan(_body, jnp.zeros_like(delta[-1]), (delta, discount_t, rho_clipped, not_done), reverse=True)
    vs = errors + v_tm1
    pg_advantage = _pg_advantage(vs, v_tm1, v_t, r_t, discount_t, rho_tm1, not_done, lambda_, clip_pg_rho_threshold)
    return VTraceOutput(jax.lax.stop_gradient(vs), jax.lax.stop_gradient(pg_advantage))


def _over_batch(single, *xs, **kwargs):
    """``single`` (one trajectory, time first) applied to every column of ``[T, B, ...]`` inputs."""
    return jax.vmap(lambda *x: single(*x, **kwargs), in_axes=1, out_axes=1)(*xs)


def _state_value_batch(single, v_tm1, v_t, r_t, discount_t, rho_tm1, done_t, lambda_, clip_rho_threshold,
                       clip_pg_rho_threshold) -> VTraceOutput:
    """Shape guards, then ``single`` (V-trace or IS, one trajectory) over the ``B`` columns of ``[T, B]`` inputs."""
    chex.assert_rank([v_tm1, v_t, r_t, discount_t, rho_tm1, done_t], 2)
    chex.assert_equal_shape([v_tm1, v_t, r_t, discount_t, rho_tm1, done_t])
    return _over_batch(single, v_tm1, v_t, r_t, discount_t, rho_tm1, done_t, lambda_=lambda_,
                       clip_rho_threshold=clip_rho_threshold, clip_pg_rho_threshold=clip_pg_rho_threshold)


def importance_sampling(
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
    """Truncated importance sampling on ``[T, B]`` inputs: :func:`importance_sampling_single` vmapped over ``B``.

    Raises:
      AssertionError (chex) if the inputs are not all rank 2 with equal shapes.
    """
    return _state_value_batch(importance_sampling_single, v_tm1, v_t, r_t, discount_t, rho_tm1, done_t,
                              lambda_, clip_rho_threshold, clip_pg_rho_threshold)


def retrace_single(
    q_tm1: jax.Array,
    q_t: jax.Array,
    a_tm1: jax.Array,
    a_t: jax.Array,
    r_t: jax.Array,
    discount_t: jax.Array,
    pi_t: jax.Array,
    mu_t: jax.Array,
    done_t: jax.Array,
    *,
    lambda_: float = 1.0,
) -> jax.Array:
    """Retrace(λ) targets for Q(x_{s}, a_{s}) along one trajectory of ``T`` transitions, cut at ``done_t``.

    With c_{s+1} = λ min(1, π(a_{s+1}|x_{s+1}) / μ(a_{s+1}|x_{s+1})) and E_π Q(x_{s+1}, ·) = Σ_a π(a|x_{s+1}) Q(x_{s+1}, a):

        G_s = r_s + γ_s (E_π Q(x_{s+1}, ·) + k_s c_{s+1} (G_{s+1} - Q(x_{s+1}, a_{s+1}))),
        k_s = 0 at an episode end (``done_s``) and at the last row, else 1.

    Source: Munos, Stepleton, Harutyunyan & Bellemare 2016, "Safe and Efficient Off-Policy Reinforcement
    Learning", https://arxiv.org/abs/1606.02647, eq. (3) in its recursive form (as rlax's
    ``general_off_policy_returns_from_action_values``).

    Args:
      q_tm1: ``[T, A]`` float Q(x_s, ·) at the observation each transition started at, times [0, T-1].
      q_t: ``[T, A]`` float Q of the observation that followed transition s (the true final
        observation at an episode end), times [1, T].
      a_tm1: ``[T]`` int action a_s taken, times [0, T-1].
      a_t: ``[T]`` int action taken at the next observation, times [1, T] (``a_tm1[s+1]`` inside an
        episode; ignored where ``done_t`` and at the last row).
      r_t: ``[T]`` float reward, times [1, T].
      discount_t: ``[T]`` float γ_s; 0 only at a true termination (truncation keeps γ).
      pi_t: ``[T, A]`` float target-policy probabilities π(·|x_{s+1}), times [1, T].
      mu_t: ``[T]`` float behaviour probability μ(a_t|x_{s+1}) of ``a_t``, times [1, T].
      done_t: ``[T]`` bool or float, 1 where transition s ended its episode; the trace is cut there.
      lambda_: trace mixing λ in [0, 1].

    Returns:
      ``[T]`` float Retrace targets for Q(x_s, a_s), gradients stopped.

    Raises:
      AssertionError (chex) for wrong ranks or shapes.

    With no ``done_t`` set this equals ``q_tm1[a_tm1] + rlax.retrace(...)`` (its TD error).
    """
    chex.assert_rank([q_tm1, q_t, a_tm1, a_t, r_t, discount_t, pi_t, mu_t, done_t], [2, 2, 1, 1, 1, 1, 2, 1, 1])
    chex.assert_equal_shape([q_tm1, q_t, pi_t])
    chex.assert_equal_shape([a_tm1, a_t, r_t, discount_t, mu_t, done_t])
    chex.assert_equal_shape_prefix([q_tm1, r_t], 1)
    dtype = r_t.dtype
    exp_q_t = jnp.sum(pi_t * q_t, axis=-1)
    q_a_t = jnp.take_along_axis(q_t, a_t[:, None].astype(jnp.int32), axis=-1)[:, 0]
    pi_a_t = jnp.take_along_axis(pi_t, a_t[:, None].astype(jnp.int32), axis=-1)[:, 0]
    c_t = lambda_ * jnp.minimum(CLIP_C_THRESHOLD, pi_a_t / mu_t)
    not_done = 1.0 - done_t.astype(dtype)
    # The last row has no next target to trace into: it bootstraps from E_π Q alone.
    inside = jnp.concatenate([not_done[:-1], jnp.zeros((1,), dtype)])

    def _body(g_next, xs):
        r, discount, eq, k, c, qa = xs
        # k * c (never c alone): where k = 0 the next row belongs to another episode and may hold anything.
        g = r + discount * (eq + k * c * (g_next - qa))
        return g, g

    _, targets = jax.lax.scan(
        _body, jnp.zeros_like(r_t[-1]), (r_t, discount_t, exp_q_t, inside, c_t, q_a_t), reverse=True
    )
    return jax.lax.stop_gradient(targets)


def retrace(
    q_tm1: jax.Array,
    q_t: jax.Array,
    a_tm1: jax.Array,
    a_t: jax.Array,
    r_t: jax.Array,
    discount_t: jax.Array,
    pi_t: jax.Array,
    mu_t: jax.Array,
    done_t: jax.Array,
    *,
    lambda_: float = 1.0,
) -> jax.Array:
    """Retrace(λ) targets on time-major inputs: :func:`retrace_single` vmapped over ``B``.

    Args:
      q_tm1, q_t, pi_t: ``[T, B, A]`` float; a_tm1, a_t: ``[T, B]`` int; r_t, discount_t, mu_t, done_t:
        ``[T, B]``. Meanings and time ranges as :func:`retrace_single`.

    Returns:
      ``[T, B]`` float Retrace targets for Q(x_{t-1}, a_{t-1}), gradients stopped.

    Raises:
      AssertionError (chex) for wrong ranks or shapes.

    Source: Munos et al. 2016, https://arxiv.org/abs/1606.02647. Equals ``q_tm1[a_tm1]`` plus
    ``rlax.retrace``'s TD error (vmapped over ``B``) when no ``done_t`` is set.
    """
    chex.assert_rank([q_tm1, q_t, a_tm1, a_t, r_t, discount_t, pi_t, mu_t, done_t], [3, 3, 2, 2, 2, 2, 3, 2, 2])
    return _over_batch(retrace_single, q_tm1, q_t, a_tm1, a_t, r_t, discount_t, pi_t, mu_t, done_t, lambda_=lambda_)


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
    return _state_value_batch(vtrace_single, v_tm1, v_t, r_t, discount_t, rho_tm1, done_t,
                              lambda_, clip_rho_threshold, clip_pg_rho_threshold)


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
    """Apply the state-value corrector ``name`` to a ``[T, B]`` rollout.

    Args:
      name: ``"vtrace"`` (ratios ρ = exp(log π - log μ)), ``"is"`` (truncated per-decision importance
        sampling, :func:`importance_sampling`) or ``"none"`` (ρ = 1: the on-policy λ-return and
        advantage, no correction for the behaviour policy). ``"retrace"`` is rejected here: it needs
        Q-values (:func:`retrace`).
      log_rho_tm1: ``[T, B]`` float log π(a|x) - log μ(a|x), summed over action dimensions.
      Other arguments as :func:`vtrace`.

    Returns:
      :class:`VTraceOutput`, each field ``[T, B]``.

    Raises:
      ValueError: if ``name`` is not one of :data:`VALUE_CORRECTORS` (naming ``retrace``'s function
        when it is ``"retrace"``).
    """
    if name == "retrace":
        raise ValueError("corrector 'retrace' needs Q-values; call corrector.retrace (the learner's retrace loss does)")
    if name in ("vtrace", "is"):
        rho_tm1 = jnp.exp(log_rho_tm1)
    elif name == "none":
        rho_tm1 = jnp.ones_like(log_rho_tm1)
    else:
        raise ValueError(f"unknown corrector {name!r}; expected one of {', '.join(CORRECTORS)}")
    fn = importance_sampling if name == "is" else vtrace
    return fn(
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
