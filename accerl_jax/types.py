"""Shared data types of accerl_jax: the rollout the Actor produces and the Learner consumes.

Everything is time-major, ``[T, B, ...]`` (docs/DESIGN.md, "Conventions"). This module imports nothing
from the package, so every other module may import it.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax

Array = jax.Array
Params = Any  # a pytree of arrays (flax variables)
PRNGKey = jax.Array
# apply(params, obs[..., *obs_shape]) -> (logits [..., A] float32, value [...] float32)
ApplyFn = Callable[[Params, Array], tuple[Array, Array]]


class Transition(NamedTuple):
    """One batched environment transition, as every env adapter returns it.

    Attributes (``B`` = number of environments):
      obs: ``[B, *obs_shape]`` the observation the *next* action is taken at (after any auto-reset).
      next_obs: ``[B, *obs_shape]`` the true next observation of this transition: the final
        observation of the episode where it ended (terminated or truncated), else equal to ``obs``.
      reward: ``[B]`` float32 reward of this transition.
      terminated: ``[B]`` bool, the episode reached a true terminal state (no bootstrap).
      truncated: ``[B]`` bool, the episode was cut by a time limit (bootstrap from ``next_obs``).
      valid: ``[B]`` bool, False for transitions that are not MDP transitions (envpool's reset step,
        which ignores the action and returns the first observation with reward 0); these get zero
        weight in every loss.
      episode_return: ``[B]`` float32 undiscounted return of the episode that ended at this step
        (meaningful where ``terminated | truncated``), in reward units.
      episode_length: ``[B]`` int32 length of that episode, in agent steps.
    """

    obs: Array
    next_obs: Array
    reward: Array
    terminated: Array
    truncated: Array
    valid: Array
    episode_return: Array
    episode_length: Array


class Rollout(NamedTuple):
    """A time-major rollout ``[T, B, ...]`` produced by the Actor with the behaviour policy μ.

    Attributes:
      obs: ``[T, B, *obs_shape]`` observation each action was taken at.
      action: ``[T, B]`` int32 action taken, or ``[T, B, D]`` float32 for continuous actions (the
        unclipped Gaussian sample; the env adapter clips it to the bounds).
      log_prob: ``[T, B]`` float32 behaviour log-probability log μ(a|x) of ``action`` (summed over the
        ``D`` action dimensions for continuous actions).
      reward, terminated, truncated, valid, next_obs, episode_return, episode_length: as in
        :class:`Transition`, stacked over time.
    """

    obs: Array
    action: Array
    log_prob: Array
    reward: Array
    terminated: Array
    truncated: Array
    valid: Array
    next_obs: Array
    episode_return: Array
    episode_length: Array
