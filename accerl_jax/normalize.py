"""Observation normalisation and reward scaling (``--normalize-observations``, ``--normalize-rewards``):
running statistics held as pytrees, so that a loop can carry, combine, checkpoint and restore them.

* Observations: a running count, mean and sum of squared deviations ``M2`` per observation element,
  updated from each batch with Chan et al.'s parallel rule (Chan, Golub & LeVeque 1979, "Updating
  formulae and a pairwise algorithm for computing sample variances"; :func:`combine`). Combining the
  statistics of two batches equals the statistics of their concatenation, so a batch split over
  devices and combined gives one device's result (to float rounding). Normalised observations are
  ``clip((x - mean) / sqrt(var + eps), -10, 10)`` with ``var = M2 / count`` (population variance) and
  ``eps = 1e-8``, as gym's ``NormalizeObservation`` wrapper and CleanRL's PPO scripts.
* Rewards: scaled by the running standard deviation of each environment's discounted return, as gym's
  ``NormalizeReward`` and CleanRL: per environment ``G <- discount * G + r`` at every step, the running
  statistics take ``G``, then ``G <- 0`` where the episode ended (terminated or truncated); the scaled
  reward is ``clip(r / sqrt(var(G) + eps), -10, 10)``. The mean of ``G`` is not subtracted.

Unlike the gym wrappers, which update the statistics before normalising each step, a loop here
normalises a whole rollout with the statistics it started with (frozen while the actor acts) and
updates them from the rollout afterwards (:func:`update_from_rollout`): the actor and the learner then
see the same normalised inputs.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

EPSILON = 1e-8  # gym's NormalizeObservation / NormalizeReward epsilon
PRIOR_COUNT = 1e-4  # gym's RunningMeanStd starts from mean 0, variance 1 with this count
CLIP = 10.0  # gym's and CleanRL's clip of normalised observations and scaled rewards


class RunningStats(NamedTuple):
    """Running moments of a quantity of shape ``S``: ``count`` [] float32 (samples seen, weights summed),
    ``mean`` [*S] float32, ``m2`` [*S] float32 (sum of squared deviations from the mean)."""

    count: jax.Array
    mean: jax.Array
    m2: jax.Array

    @property
    def var(self) -> jax.Array:
        """Population variance ``m2 / count`` (0 while nothing was seen), [*S] float32."""
        return jnp.where(self.count > 0, self.m2 / jnp.maximum(self.count, 1e-30), 0.0)


class NormState(NamedTuple):
    """What a loop carries for normalisation. ``obs``: :class:`RunningStats` of the observations, or None
    (observations not normalised); ``reward``: :class:`RunningStats` ``[]`` of the discounted returns, or
    None; ``returns``: [B] float32, each environment's discounted return so far (None without reward
    scaling)."""

    obs: RunningStats | None
    reward: RunningStats | None
    returns: jax.Array | None


def init_stats(shape) -> RunningStats:
    """The statistics before any sample, of a quantity of shape ``shape``: gym's ``RunningMeanStd`` start,
    mean 0 and variance 1 with a count of :data:`PRIOR_COUNT` (float32), so that the first rollout, which
    is normalised before any statistics exist, passes nearly unchanged; the prior's weight in the
    statistics is negligible after a single sample."""
    count = jnp.full((), PRIOR_COUNT, jnp.float32)
    return RunningStats(count, jnp.zeros(shape, jnp.float32), jnp.full(shape, PRIOR_COUNT, jnp.float32))


def init_state(obs_shape, num_envs: int, observations: bool, rewards: bool) -> NormState:
    """The :class:`NormState` of a new run of ``num_envs`` environments (the global batch) with
    observations of shape ``obs_shape``; the parts switched off are None."""
    return NormState(init_stats(tuple(obs_shape)) if observations else None,
                     init_stats(()) if rewards else None,
                     jnp.zeros((num_envs,), jnp.float32) if rewards else None)


def batch_stats(x: jax.Array, weight: jax.Array | None = None, sample_dims: int = 1) -> RunningStats:
    """The statistics of one batch ``x [*N, *S]`` whose first ``sample_dims`` axes are samples;
    ``weight [*N]`` (0/1, e.g. a rollout's ``valid``) leaves samples out."""
    x = x.astype(jnp.float32)
    axes = tuple(range(sample_dims))
    w = jnp.ones(x.shape[:sample_dims], jnp.float32) if weight is None else weight.astype(jnp.float32)
    wx = w.reshape(w.shape + (1,) * (x.ndim - sample_dims))
    count = jnp.sum(w)
    mean = jnp.sum(wx * x, axis=axes) / jnp.maximum(count, 1.0)
    m2 = jnp.sum(wx * jnp.square(x - jnp.broadcast_to(mean, x.shape)), axis=axes)
    return RunningStats(count, mean, m2)


def combine(a: RunningStats, b: RunningStats) -> RunningStats:
    """Chan et al.'s parallel rule: the statistics of the union of the samples behind ``a`` and ``b``.
    ``n = n_a + n_b``, ``delta = mean_b - mean_a``, ``mean = mean_a + delta * n_b / n``,
    ``M2 = M2_a + M2_b + delta^2 * n_a * n_b / n``; either side may be empty (count 0)."""
    n = a.count + b.count
    safe = jnp.maximum(n, 1e-30)
    delta = b.mean - a.mean
    mean = jnp.where(n > 0, a.mean + delta * (b.count / safe), a.mean)
    m2 = a.m2 + b.m2 + jnp.square(delta) * (a.count * b.count / safe)
    return RunningStats(n, mean, m2)


def normalize_obs(stats: RunningStats | None, obs: jax.Array) -> jax.Array:
    """``clip((obs - mean) / sqrt(var + 1e-8), -10, 10)`` as float32, broadcast over ``obs``'s leading
    axes (``obs [..., *S]``); ``obs`` unchanged when ``stats`` is None."""
    if stats is None:
        return obs
    obs = obs.astype(jnp.float32)  # explicit broadcasts: the tests run with jax_numpy_rank_promotion="raise"
    out = (obs - jnp.broadcast_to(stats.mean, obs.shape)) / jnp.broadcast_to(jnp.sqrt(stats.var + EPSILON), obs.shape)
    return jnp.clip(out, -CLIP, CLIP)


def scale_reward(stats: RunningStats | None, reward: jax.Array) -> jax.Array:
    """``clip(reward / sqrt(var(G) + 1e-8), -10, 10)`` (float32); ``reward`` unchanged when ``stats`` is None."""
    if stats is None:
        return reward
    return jnp.clip(reward.astype(jnp.float32) / jnp.sqrt(stats.var + EPSILON), -CLIP, CLIP)


def discounted_returns(returns: jax.Array, reward: jax.Array, done: jax.Array, discount: float):
    """Each environment's running discounted return through a rollout: ``returns [B]`` at its start,
    ``reward [T, B]``, ``done [T, B]`` bool (the episode ended at that step: terminated or truncated).
    Returns ``(G [T, B] float32: the return after each step's reward, before the reset; returns at the
    end [B], 0 where the last step ended an episode)``."""
    def step(g, x):
        r, d = x
        g = discount * g + r.astype(jnp.float32)
        return jnp.where(d, 0.0, g), g

    end, seen = jax.lax.scan(step, returns.astype(jnp.float32), (reward, done))
    return seen, end


def update_from_rollout(state: NormState, obs: jax.Array, reward: jax.Array, done: jax.Array,
                        valid: jax.Array, discount: float) -> NormState:
    """The statistics after a rollout: ``obs [T, B, *S]`` (the raw observations actions were taken at),
    ``reward [T, B]`` (raw), ``done [T, B]`` bool, ``valid [T, B]`` bool (steps that count: envpool's
    reset steps do not). Invalid steps leave the returns and statistics as they were."""
    obs_stats, reward_stats, returns = state
    if obs_stats is not None:
        obs_stats = combine(obs_stats, batch_stats(obs, valid, sample_dims=2))
    if reward_stats is not None:
        seen, end = discounted_returns(returns, jnp.where(valid, reward, 0.0), done & valid, discount)
        reward_stats = combine(reward_stats, batch_stats(seen, valid, sample_dims=2))
        returns = end
    return NormState(obs_stats, reward_stats, returns)


def normalize_rollout(state: NormState, rollout):
    """``rollout`` (:class:`accerl_jax.types.Rollout` ``[T, B, ...]``) as the learner sees it: ``obs`` and
    ``bootstrap_obs`` normalised and ``reward`` scaled with ``state``'s statistics (those the actor acted
    with); episode returns and lengths stay raw (they are what is reported)."""
    return rollout._replace(obs=normalize_obs(state.obs, rollout.obs),
                            bootstrap_obs=normalize_obs(state.obs, rollout.bootstrap_obs),
                            reward=scale_reward(state.reward, rollout.reward))


def normalized_apply(apply):
    """``apply`` taking ``(params, obs stats)`` pairs: ``(pair, obs) -> apply(params, normalize_obs(stats, obs))``."""
    def wrapped(pair, obs):
        params, stats = pair
        return apply(params, normalize_obs(stats, obs))

    return wrapped
