"""The search agent's learning targets and loss (``LossConfig.loss == "search"``).

Policy target (``--search-target``): Gumbel MuZero's improved policy ``softmax(prior logits + σ(completed
Q))`` (Danihelka et al. 2022, eq. 11), the loss the cross-entropy ``-Σ_a w_a log π(a|x)``.

* ``search`` (default): the search's own action weights, recorded by the actor in
  :attr:`~accerl_jax.search.acting.SearchRollout.action_weights`; the actors search with the compressed
  parameters μ, so the prior in them (and the root value that completes the unvisited actions' Q) is μ's.
* ``learner``: the same formula recomputed at learner time (:func:`improved_policy`) from the tree's root
  Q-values and visit counts the rollout carries, with the *learner's* prior logits and value at the root
  in place of the actor's: the compressed network then only shapes which actions were searched and the
  Q-values below the root, not the prior the target adds them to.

Value target: the n-step return (MuZero's, Schrittwieser et al. 2020), with the bootstrap from the
learner's own value at learner time (gradients stopped) under either policy target -- never the search's
root value, so the compressed network does not enter it -- cut at a termination, bootstrapped from the
final observation's value at a truncation and at the rollout's last row
(:func:`accerl_jax.learner.next_step_outputs`).

Two-player games by self-play (``LossConfig.value_target == "outcome"``, ``--env pgx:<game>``): the
value target is the game's **outcome** from the perspective of the player to move at each step
(AlphaZero's ``z``, :func:`game_outcomes`), not bootstrapped; steps whose game has not ended by the
rollout's last row have no outcome yet and count 0 in the value loss (their policy target still counts).
Illegal moves (the rollout's ``legal_actions``) are masked out of the learner's policy: the cross-entropy
and the entropy are over the legal moves only.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from accerl_jax.learner import LearnerOutputs, LossConfig, next_step_outputs, ratio_sums

MASKED_LOGIT = -1e9  # an illegal move's logit in the learner's policy (exp underflows to exactly 0)


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


def game_outcomes(r_t: jax.Array, done_t: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The outcome of each step's game for the player who moved at that step, in a time-major ``[T, B]``
    rollout of a two-player zero-sum game played by self-play (players alternate every step).

    ``z_s = r_s`` at a game end (``done_s``), else ``z_s = r_s - z_{s+1}``: the next step is the other
    player's, whose outcome is the negative. Only the game-ending steps carry a reward in pgx's board
    games, so ``z_s = ±r_end``, +1 where the player to move at ``s`` goes on to win.

    Args:
      r_t: ``[T, B]`` float32 rewards of each move to its mover.
      done_t: ``[T, B]`` bool, the game ended at this step.

    Returns:
      ``(z [T, B] float32, known [T, B] bool)``: ``known`` is False for steps whose game has not ended by
      the last row (their ``z`` is meaningless, a partial sum).
    """
    def back(carry, x):
        z_next, known_next = carry
        r, done = x
        z = jnp.where(done, r, r - z_next)
        known = done | known_next
        return (z, known), (z, known)

    r_t = r_t.astype(jnp.float32)
    init = (r_t[-1] * 0.0, jnp.logical_and(done_t[-1], False))  # from the inputs: varying like them under shard_map
    _, (z, known) = jax.lax.scan(back, init, (r_t, done_t), reverse=True)
    return z, known


def improved_policy(prior_logits: jax.Array, value: jax.Array, qvalues: jax.Array, visit_counts: jax.Array,
                    invalid_actions: jax.Array | None = None, *, value_scale: float = 0.1,
                    maxvisit_init: float = 50.0, rescale_values: bool = True, use_mixed_value: bool = True,
                    epsilon: float = 1e-8) -> jax.Array:
    """Gumbel MuZero's improved policy at a searched root, ``π' = softmax(logits + σ(completedQ))``
    (Danihelka et al. 2022, "Policy improvement by planning with Gumbel", eq. 11), computed as
    ``mctx.gumbel_muzero_policy`` computes its ``action_weights`` with its default
    ``mctx.qtransform_completed_by_mix_value`` -- but from any prior and root value, e.g. the learner's.

    Steps (mctx 0.0.71 ``qtransforms.py``): the prior is masked (``logits - max``, invalid actions at the
    float32 minimum); the mixed value (Appendix D, eq. 33) ``v_mix = (v + N Σ_{a visited} π(a) q(a) /
    Σ_{a visited} π(a)) / (N + 1)`` with ``N = Σ_a n(a)`` and ``π = softmax(masked logits)`` (``v`` alone
    if not ``use_mixed_value``) completes the Q-values of the unvisited actions; ``rescale_values`` maps
    the completed Q to [0, 1] by their min and max over the actions (denominator at least ``epsilon``);
    ``σ(q) = (maxvisit_init + max_a n(a)) · value_scale · q`` (eq. 8); the result is the softmax of the
    masked ``logits + σ``. The keyword defaults are mctx's.

    Args:
      prior_logits: ``[..., A]`` float32 prior logits at the root (the learner's, or the search's own to
        reproduce its ``action_weights``).
      value: ``[...]`` float32 value estimate of the root where mctx uses the root network's value
        (``tree.raw_values`` at the root).
      qvalues: ``[..., A]`` float32 the tree's root Q-values ``r + γ v(child)`` (``SearchSummary.qvalues``;
        any value where unvisited).
      visit_counts: ``[..., A]`` root visit counts (``SearchSummary.visit_counts``), float or int.
      invalid_actions: ``[..., A]`` bool, True for an illegal action (mctx's convention), or None (every
        action legal: today's envs have no masks).
      value_scale, maxvisit_init, rescale_values, use_mixed_value, epsilon: mctx's
        ``qtransform_completed_by_mix_value`` settings.

    Returns:
      ``[..., A]`` float32 action weights (sum to 1; ~0 on invalid actions).
    """
    logits = prior_logits.astype(jnp.float32)
    if invalid_actions is not None:
        logits = logits - jnp.max(logits, axis=-1, keepdims=True)
        logits = jnp.where(invalid_actions, jnp.finfo(logits.dtype).min, logits)
    qvalues = qvalues.astype(jnp.float32)
    visits = visit_counts.astype(jnp.float32)
    value = value.astype(jnp.float32)
    visited = visits > 0
    if use_mixed_value:
        probs = jnp.maximum(jnp.finfo(jnp.float32).tiny, jax.nn.softmax(logits, axis=-1))
        sum_visits = jnp.sum(visits, axis=-1)
        sum_probs = jnp.sum(jnp.where(visited, probs, 0.0), axis=-1, keepdims=True)
        weighted_q = jnp.sum(jnp.where(visited, probs * qvalues / jnp.where(visited, sum_probs, 1.0), 0.0), axis=-1)
        value = (value + sum_visits * weighted_q) / (sum_visits + 1)
    completed = jnp.where(visited, qvalues, value[..., None])
    if rescale_values:
        low = jnp.min(completed, axis=-1, keepdims=True)
        high = jnp.max(completed, axis=-1, keepdims=True)
        completed = (completed - low) / jnp.maximum(high - low, epsilon)
    sigma = (maxvisit_init + jnp.max(visits, axis=-1, keepdims=True)) * value_scale * completed
    search_logits = logits + sigma
    if invalid_actions is not None:
        search_logits = search_logits - jnp.max(search_logits, axis=-1, keepdims=True)
        search_logits = jnp.where(invalid_actions, jnp.finfo(jnp.float32).min, search_logits)
    return jax.nn.softmax(search_logits, axis=-1)


def search_loss_sums(params, apply, batch, cfg: LossConfig):
    """Masked *sums* of the search agent's loss over a (local) ``[T, B]`` batch, in the keys the learner's
    gradient step reads (:func:`accerl_jax.learner.make_update`): ``"pg"`` the cross-entropy
    ``-Σ_a w_a log π(a|x_s)`` to the policy target ``w`` (``cfg.search_target``: ``"search"`` the search's
    action weights, ``"learner"`` the :func:`improved_policy` of the rollout's root Q-values and visits with
    the learner's own logits and value at ``x_s``, gradients stopped), ``"value"`` ``½ (G_s - V(x_s))²`` with
    ``G_s`` the :func:`n_step_returns` of horizon ``cfg.n_step``, ``"entropy"`` ``H(π(·|x_s))``, ``"vs"``
    ``G_s``, ``"rho"`` and the :func:`~accerl_jax.learner.ratio_sums` of ``π(a_s|x_s) / w_{a_s}`` (the
    learner's prior against the search policy that chose the action; a diagnostic, no correction). With
    ``cfg.value_target == "outcome"`` (self-play games) ``G_s`` is :func:`game_outcomes`' ``z_s`` instead,
    counted only where known; with the rollout's ``legal_actions`` the policy is over the legal moves only.

    Args:
      params: the learner's parameters.
      apply: ``(params, obs) -> (logits [..., A], value [...], ...)``.
      batch: a :class:`~accerl_jax.search.acting.SearchRollout` ``[T, B, ...]``.
      cfg: :class:`~accerl_jax.learner.LossConfig` (``discount``, ``n_step``, ``search_target``).

    Returns:
      ``(count, sums, LearnerOutputs)``: ``count`` [] float32 valid steps, ``sums`` of [] float32, and the
      learner's outputs at ``batch.obs`` (gradients stopped; a distilling compressor's teacher outputs).
    """
    logits, v_tm1 = apply(params, batch.obs)[:2]
    mask = batch.valid.astype(jnp.float32)
    if cfg.value_target == "outcome":  # self-play: the game's outcome for the player to move, no bootstrap
        outcome, known = game_outcomes(batch.reward, batch.terminated | batch.truncated)
        returns, value_mask = outcome, mask * known.astype(jnp.float32)
    else:
        v_t = next_step_outputs(v_tm1, apply(params, batch.bootstrap_obs)[1], batch.truncated)
        discount_t = cfg.discount * (1.0 - batch.terminated.astype(jnp.float32))
        done_t = batch.terminated | batch.truncated
        returns, value_mask = n_step_returns(batch.reward, discount_t, v_t, done_t, cfg.n_step), mask
    returns = jax.lax.stop_gradient(returns)
    legal = getattr(batch, "legal_actions", None)
    # Illegal moves out of the policy: a large finite logit (not -inf), so that 0 weights times it stay 0.
    masked = logits.astype(jnp.float32) if legal is None else jnp.where(legal, logits.astype(jnp.float32), MASKED_LOGIT)
    log_pi = jax.nn.log_softmax(masked)
    if cfg.search_target == "learner":  # the learner's prior and root value in place of the actor's
        weights = jax.lax.stop_gradient(improved_policy(logits, v_tm1, batch.root_qvalues, batch.root_visits,
                                                        None if legal is None else jnp.logical_not(legal)))
    else:
        weights = batch.action_weights
    cross_entropy = -jnp.sum(weights * log_pi, axis=-1)
    entropy = -jnp.sum(jnp.exp(log_pi) * log_pi, axis=-1)
    log_pi_a = jnp.take_along_axis(log_pi, batch.action[..., None], axis=-1)[..., 0]
    log_rho = jax.lax.stop_gradient(log_pi_a) - batch.log_prob
    sums = {
        "pg": jnp.sum(mask * cross_entropy),
        "value": jnp.sum(value_mask * 0.5 * (returns - v_tm1) ** 2),
        "entropy": jnp.sum(mask * entropy),
        "rho": jnp.sum(mask * jnp.exp(log_rho)),
        "vs": jnp.sum(value_mask * returns),
        **ratio_sums(log_rho, mask, cfg),
    }
    outputs = jax.lax.stop_gradient(LearnerOutputs(logits.astype(jnp.float32), v_tm1.astype(jnp.float32)))
    return jnp.sum(mask), sums, outputs
