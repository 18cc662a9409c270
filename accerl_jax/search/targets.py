"""The search agent's learning targets and loss (``LossConfig.loss == "search"``).

Policy target: the search's action weights (Gumbel MuZero's improved policy
``softmax(prior logits + σ(completed Q))``, Danihelka et al. 2022, eq. 11), recorded by the actor in
:attr:`~accerl_jax.search.acting.SearchRollout.action_weights`; the loss is the cross-entropy
``-Σ_a w_a log π(a|x)``. Value target: the n-step return (MuZero's, Schrittwieser et al. 2020, with the
bootstrap from the learner's own value, gradients stopped), cut at a termination, bootstrapped from the
final observation's value at a truncation and at the rollout's last row
(:func:`accerl_jax.learner.next_step_outputs`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from accerl_jax.learner import LearnerOutputs, LossConfig, next_step_outputs, ratio_sums


def n_step_returns(r_t: jax.Array, discount_t: jax.Array, v_t: jax.Array, done_t: jax.Array, n: int) -> jax.Array:
    """n-step bootstrapped returns of a time-major ``[T, B]`` rollout.

    ``G_s = r_s + d_s r_{s+1} + ... + (d_s ... d_{s+k-1}) r_{s+k} + (d_s ... d_{s+k}) v_{s+k}`` with
    ``k + 1 = min(n, steps to the first episode end at or after s (done), steps to the rollout's end)``:
    the return stops at the first ``done`` step (a termination's ``d = 0`` removes its bootstrap; a
    truncation bootstraps from its final observation's value) and at the last row.

    Args:
      r_t: ``[T, B]`` float32 rewards of each step.
      discount_t: ``[T, B]`` float32, ``γ`` where the step did not terminate, 0 where it did.
      v_t: ``[T, B]`` float32 values of each step's true next state (gradients are not stopped here).
      done_t: ``[T, B]`` bool, the episode ended at this step (terminated or truncated).
      n: horizon, ``>= 1`` (static).

    Returns:
      ``[T, B]`` float32 targets.

    Raises:
      ValueError: ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"n-step horizon must be >= 1, got {n}")
    t = r_t.shape[0]
    cut = done_t | (jnp.arange(t) == t - 1).reshape((t,) + (1,) * (r_t.ndim - 1))
    g = r_t + discount_t * v_t  # the 1-step return

    def longer(_, g):  # G^(j)_s = r_s + d_s (v_s where cut_s, else G^(j-1)_{s+1})
        nxt = jnp.concatenate([g[1:], v_t[-1:]])
        return r_t + discount_t * jnp.where(cut, v_t, nxt)

    return jax.lax.fori_loop(0, min(n, t) - 1, longer, g)


def search_loss_sums(params, apply, batch, cfg: LossConfig):
    """Masked *sums* of the search agent's loss over a (local) ``[T, B]`` batch, in the keys the learner's
    gradient step reads (:func:`accerl_jax.learner.make_update`): ``"pg"`` the cross-entropy
    ``-Σ_a w_a log π(a|x_s)`` to the search's action weights ``w``, ``"value"`` ``½ (G_s - V(x_s))²`` with
    ``G_s`` the :func:`n_step_returns` of horizon ``cfg.n_step``, ``"entropy"`` ``H(π(·|x_s))``, ``"vs"``
    ``G_s``, ``"rho"`` and the :func:`~accerl_jax.learner.ratio_sums` of ``π(a_s|x_s) / w_{a_s}`` (the
    learner's prior against the search policy that chose the action; a diagnostic, no correction).

    Args:
      params: the learner's parameters.
      apply: ``(params, obs) -> (logits [..., A], value [...], ...)``.
      batch: a :class:`~accerl_jax.search.acting.SearchRollout` ``[T, B, ...]``.
      cfg: :class:`~accerl_jax.learner.LossConfig` (``discount``, ``n_step``).

    Returns:
      ``(count, sums, LearnerOutputs)``: ``count`` [] float32 valid steps, ``sums`` of [] float32, and the
      learner's outputs at ``batch.obs`` (gradients stopped; a distilling compressor's teacher outputs).
    """
    logits, v_tm1 = apply(params, batch.obs)[:2]
    v_t = next_step_outputs(v_tm1, apply(params, batch.bootstrap_obs)[1], batch.truncated)
    discount_t = cfg.discount * (1.0 - batch.terminated.astype(jnp.float32))
    done_t = batch.terminated | batch.truncated
    returns = jax.lax.stop_gradient(n_step_returns(batch.reward, discount_t, v_t, done_t, cfg.n_step))
    log_pi = jax.nn.log_softmax(logits.astype(jnp.float32))
    mask = batch.valid.astype(jnp.float32)
    cross_entropy = -jnp.sum(batch.action_weights * log_pi, axis=-1)
    entropy = -jnp.sum(jnp.exp(log_pi) * log_pi, axis=-1)
    log_pi_a = jnp.take_along_axis(log_pi, batch.action[..., None], axis=-1)[..., 0]
    log_rho = jax.lax.stop_gradient(log_pi_a) - batch.log_prob
    sums = {
        "pg": jnp.sum(mask * cross_entropy),
        "value": jnp.sum(mask * 0.5 * (returns - v_tm1) ** 2),
        "entropy": jnp.sum(mask * entropy),
        "rho": jnp.sum(mask * jnp.exp(log_rho)),
        "vs": jnp.sum(mask * returns),
        **ratio_sums(log_rho, mask, cfg),
    }
    outputs = jax.lax.stop_gradient(LearnerOutputs(logits.astype(jnp.float32), v_tm1.astype(jnp.float32)))
    return jnp.sum(mask), sums, outputs
