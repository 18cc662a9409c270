"""Sebulba's actor: one thread's loop over an asynchronous envpool, cut into time-major rollouts.

envpool's async mode (:class:`accerl_jax.envs.envpool_env.AsyncEnvpoolEnv`) returns, at each ``recv``, a
*subset* of the environments in whatever order they finished. :class:`RolloutAssembler` keeps one
trajectory per environment id and cuts a rollout ``[T, B]`` as soon as every environment has ``T`` steps
(steps beyond ``T`` of the faster environments start the next rollout), so column ``b`` of a rollout is
always ``T`` consecutive steps of environment ``b``. :class:`AsyncActor` runs recv -> policy -> send
(cleanba's actor loop, https://github.com/vwxyzjn/cleanba) and yields the rollouts with the oldest policy
version that produced any of their steps and the seconds spent in each stage.
"""
from __future__ import annotations

import time
from typing import Callable, Iterator

import jax
import numpy as np

from accerl_jax.types import Rollout, Transition, pack_bootstrap_obs


class RolloutAssembler:
    """Per-environment trajectories from asynchronous results, cut into rollouts ``[T, B, ...]``.

    Call :meth:`act` when actions are sent for environments ``ids`` (it remembers the observation, action,
    log-prob and policy version of each), then :meth:`record` with the result of those environments'
    step, which closes the step; :meth:`pop` returns a rollout once every environment has ``T`` closed
    steps. An environment's first result (its initial observation) has no pending action and records
    nothing.

    Args:
      num_envs: ``B``, environment ids ``0 .. B-1``.
      rollout_length: ``T``.
      slots: ``K`` of the rollouts' ``bootstrap_obs`` (:meth:`accerl_jax.envs.base.EnvInfo.bootstrap_slots`;
        0 for envpool); default ``T - 1``, which holds any rollout.
    """

    def __init__(self, num_envs: int, rollout_length: int, slots: int | None = None):
        self.num_envs = num_envs
        self.rollout_length = rollout_length
        self.slots = max(rollout_length - 1, 0) if slots is None else slots
        self._count = np.zeros(num_envs, np.int64)  # closed steps buffered per env
        self._has_pending = np.zeros(num_envs, bool)
        self._pending: dict | None = None  # obs, action, log_prob, version: [B, ...]
        self._buf: dict | None = None  # the pending fields and the Transition's but obs: [B, capacity, ...]

    def act(self, ids: np.ndarray, obs, action, log_prob, version: int) -> None:
        """Remember the actions sent to environments ``ids [M]`` (``obs [M, ...]`` they were chosen at)."""
        parts = {"obs": np.asarray(obs), "action": np.asarray(action), "log_prob": np.asarray(log_prob),
                 "version": np.full(len(ids), version, np.int64)}
        if self._pending is None:
            self._pending = {k: np.zeros((self.num_envs,) + v.shape[1:], v.dtype) for k, v in parts.items()}
        for k, v in parts.items():
            self._pending[k][ids] = v
        self._has_pending[ids] = True

    def record(self, ids: np.ndarray, tr: Transition) -> None:
        """Close the pending step of each environment in ``ids [M]`` with its result ``tr [M, ...]``."""
        closing = self._has_pending[ids]
        if not closing.any():
            return
        ids = ids[closing]
        step = {k: self._pending[k][ids] for k in ("obs", "action", "log_prob", "version")}
        step.update({k: np.asarray(getattr(tr, k))[closing] for k in Transition._fields if k != "obs"})
        if self._buf is None:
            cap = 2 * self.rollout_length
            self._buf = {k: np.zeros((self.num_envs, cap) + v.shape[1:], v.dtype) for k, v in step.items()}
        if self._count[ids].max() >= self._capacity:
            self._buf = {k: np.concatenate([v, np.zeros_like(v)], axis=1) for k, v in self._buf.items()}
        at = self._count[ids]
        for k, v in step.items():
            self._buf[k][ids, at] = v
        self._count[ids] += 1
        self._has_pending[ids] = False

    @property
    def _capacity(self) -> int:
        return next(iter(self._buf.values())).shape[1]

    def pop(self) -> tuple[Rollout, int] | None:
        """The next rollout (numpy, time-major ``[T, B, ...]``) and the oldest policy version among its
        steps, or None while some environment has fewer than ``T`` closed steps."""
        t = self.rollout_length
        if self._buf is None or self._count.min() < t:
            return None
        out = {k: np.ascontiguousarray(v[:, :t].swapaxes(0, 1)) for k, v in self._buf.items()}
        for v in self._buf.values():
            v[:, : self._capacity - t] = v[:, t:].copy()
        self._count -= t
        version = int(out.pop("version").min())
        next_obs = out.pop("next_obs")
        out["bootstrap_obs"] = pack_bootstrap_obs(out["obs"], next_obs, out["truncated"], self.slots)
        return Rollout(**out), version


class AsyncActor:
    """One Sebulba actor thread's loop: recv a batch of environments, act on it, send, assemble.

    Args:
      env: an :class:`~accerl_jax.envs.envpool_env.AsyncEnvpoolEnv`.
      act: ``act(params, obs [M, ...], key) -> (action [M], log_prob [M], key)``
        (:meth:`accerl_jax.actor.HostActor.act`).
      rollout_length: ``T``.
      key: the thread's action-sampling PRNG key (on the actor's device).
    """

    def __init__(self, env, act: Callable, rollout_length: int, key: jax.Array):
        self.env = env
        self.act = act
        self.key = key
        self.assembler = RolloutAssembler(env.info.num_envs, rollout_length, env.info.bootstrap_slots(rollout_length))

    def rollouts(self, latest_params: Callable[[], tuple], stopping: Callable[[], bool]) -> Iterator[tuple]:
        """Reset the envs and yield ``(rollout, version, seconds)`` until ``stopping()``.

        ``latest_params() -> (params, version)`` is read before every policy step, so the actor always
        runs the newest published policy. ``rollout`` is numpy ``[T, B, ...]``, ``version`` the oldest
        policy version that chose any of its actions, and ``seconds`` maps ``"env"`` (recv + send) and
        ``"inference"`` (policy + fetching the actions) to wall seconds since the previous rollout.
        """
        self.env.reset()
        seconds = {"env": 0.0, "inference": 0.0}
        while not stopping():
            start = time.perf_counter()
            ids, tr = self.env.recv()
            received = time.perf_counter()
            self.assembler.record(ids, tr)
            params, version = latest_params()
            action, log_prob, self.key = self.act(params, tr.obs, self.key)
            action, log_prob = jax.device_get((action, log_prob))
            acted = time.perf_counter()
            self.env.send(action, ids)
            sent = time.perf_counter()
            self.assembler.act(ids, tr.obs, action, log_prob, version)
            seconds["env"] += (received - start) + (sent - acted)
            seconds["inference"] += acted - received
            done = self.assembler.pop()
            if done is not None:
                yield done[0], done[1], seconds
                seconds = {"env": 0.0, "inference": 0.0}
