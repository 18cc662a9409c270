"""Shared data types of accerl_jax: the rollout the Actor produces and the Learner consumes.

Everything is time-major, ``[T, B, ...]`` (docs/DESIGN.md, "Conventions"). This module imports nothing
from the package, so every other module may import it.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

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
      reward, terminated, truncated, valid, episode_return, episode_length: as in :class:`Transition`,
        stacked over time.
      bootstrap_obs: ``[K + 1, B, *obs_shape]`` (``obs``'s dtype) the true next observations that are
        *not* a later row's ``obs`` (:func:`pack_bootstrap_obs`): ``bootstrap_obs[K]`` is the next
        observation of the last row ``T - 1``; ``bootstrap_obs[k]`` for ``k < K`` is the final observation
        of the ``k``-th truncated step (from 0, in time order, :func:`bootstrap_slot`) among rows
        ``0 .. T-2`` of the column; unused slots hold zeros. Every other row's next observation is the
        next row's ``obs``, except after a termination, which needs none (no bootstrap). ``K`` is static
        and chosen by the producer (:meth:`accerl_jax.envs.base.EnvInfo.bootstrap_slots`); ``K = 0``
        states that a truncated step's next observation *is* the next row's ``obs`` (envpool, which resets
        one step later). The learner's forward pass over ``bootstrap_obs`` is ``K + 1`` rows instead of
        ``T`` (docs/DESIGN.md, "Where compression can pay").
    """

    obs: Array
    action: Array
    log_prob: Array
    reward: Array
    terminated: Array
    truncated: Array
    valid: Array
    bootstrap_obs: Array
    episode_return: Array
    episode_length: Array


def bootstrap_slot(truncated: Array) -> Array:
    """Slot in :attr:`Rollout.bootstrap_obs` of each truncated step's final observation.

    Args:
      truncated: ``[T, B]`` bool (numpy or jax).

    Returns:
      ``[T - 1, B]`` int32 (the same array module): for rows ``s < T - 1``, the number of truncated
      steps in rows ``0 .. s - 1`` of the column, i.e. the slot of row ``s`` where row ``s`` is truncated
      (meaningless elsewhere; it may exceed any slot count there).
    """
    xp = np if isinstance(truncated, np.ndarray) else jnp
    trunc = truncated[:-1].astype(xp.int32)
    return (xp.cumsum(trunc, axis=0) - trunc).astype(xp.int32)


def pack_bootstrap_obs(obs: Array, next_obs: Array, truncated: Array, slots: int) -> Array:
    """:attr:`Rollout.bootstrap_obs` ``[slots + 1, B, *obs_shape]`` from a rollout's true next observations.

    Args:
      obs: ``[T, B, *obs_shape]`` observation each action was taken at.
      next_obs: ``[T, B, *obs_shape]`` true next observation of each transition (:class:`Transition`).
      truncated: ``[T, B]`` bool.
      slots: ``K``, final-observation slots per column (:meth:`accerl_jax.envs.base.EnvInfo.bootstrap_slots`).

    Returns:
      ``[K + 1, B, *obs_shape]``, ``obs``'s dtype; numpy for numpy inputs, else jax (traceable).

    Raises:
      ValueError (numpy inputs only; a traced call cannot check, its producer's ``K`` must bound the data):
      if a column holds more than ``K`` truncated steps in rows ``0 .. T-2``, or, for ``K = 0``, a
      truncated step's ``next_obs`` differs from the next row's ``obs``.
    """
    b = truncated.shape[1]
    trunc = truncated[:-1]
    slot = bootstrap_slot(truncated)
    if isinstance(next_obs, np.ndarray) and isinstance(truncated, np.ndarray):
        if slots == 0:
            if not np.array_equal(next_obs[:-1][trunc], np.asarray(obs)[1:][trunc]):
                raise ValueError("a truncated step's next observation differs from the next row's obs; "
                                 "such a rollout needs final-observation slots (K > 0)")
        elif trunc.any() and int(trunc.sum(axis=0).max()) > slots:
            raise ValueError(f"a column holds {int(trunc.sum(axis=0).max())} truncated steps before its last row, "
                             f"more than the {slots} final-observation slots")
        buf = np.zeros((slots, b) + next_obs.shape[2:], obs.dtype)
        if slots:
            rows, cols = np.nonzero(trunc)
            buf[slot[rows, cols], cols] = next_obs[:-1][rows, cols]
        return np.concatenate([buf, next_obs[-1:].astype(obs.dtype)])
    if slots == 0:
        return jnp.asarray(next_obs[-1:], obs.dtype)
    # Steps that are not truncated scatter to slot K, out of range: dropped.
    idx = jnp.where(trunc, slot, slots)
    cols = jnp.broadcast_to(jnp.arange(b), idx.shape)
    buf = jnp.zeros((slots, b) + next_obs.shape[2:], obs.dtype)
    buf = buf.at[idx, cols].set(jnp.asarray(next_obs[:-1], obs.dtype), mode="drop")
    return jnp.concatenate([buf, jnp.asarray(next_obs[-1:], obs.dtype)])
