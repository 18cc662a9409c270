"""Actor: steps ``B`` environments with the *compressed* policy μ and records a time-major rollout.

Two ways to run, one output (:class:`accerl_jax.types.Rollout`, ``[T, B, ...]``):

* :class:`AnakinActor` -- jittable (gymnax) environments, or envpool through its XLA interface
  (:class:`accerl_jax.envs.envpool_env.EnvpoolXlaEnv`): env stepping and policy inference fused in
  one jitted ``lax.scan`` of ``T`` steps (Podracer's Anakin, arXiv 2104.06272). The split of its time
  into env stepping and inference is *calibrated*: :meth:`AnakinActor.time_env_only` times the same scan
  with uniform-random actions (no policy), which is also the actor's ceiling (docs/DESIGN.md).
* :class:`ShardedActor` -- the envs of an :class:`AnakinActor` as independently keyed groups (one env
  each in training), their carry placed along the batch axis of the learner's mesh and each device
  stepping its own under ``shard_map``: the same rollouts on any number of devices and processes.
* :class:`HostActor` -- host (envpool) environments: a jitted policy call and a host ``step`` per time
  step; both parts are timed directly.

Actions are sampled from ``softmax(logits)`` (or, for continuous actions, from the diagonal Gaussian
of :func:`accerl_jax.networks.policy_distribution`); the behaviour log-probability ``log μ(a|x)`` is stored.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, NamedTuple, Protocol, Sequence, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from accerl_jax.platform import xla
from accerl_jax.networks import policy_distribution
from accerl_jax.types import ApplyFn, Rollout, Transition, pack_bootstrap_obs


def sample_action(
    apply: ApplyFn, params, obs: jax.Array, key: jax.Array, continuous: bool = False
) -> tuple[jax.Array, jax.Array]:
    """Sample ``a ~ softmax(logits)`` (distrax); returns ``(action [B] int32, log_prob [B] float32)``.

    With ``continuous``, samples the diagonal Gaussian instead: ``(action [B, D] float32, log_prob [B])``,
    the log-prob summed over the ``D`` dimensions.
    """
    return sample_from(apply(params, obs)[0], key, continuous)


def sample_from(policy_out: jax.Array, key: jax.Array, continuous: bool = False) -> tuple[jax.Array, jax.Array]:
    """:func:`sample_action` given the network's policy output ``[B, A]`` logits (or ``[B, 2D]``)."""
    pi = policy_distribution(policy_out, continuous)
    # sample + log_prob, not sample_and_log_prob: the latter relies on rank promotion, which our tests forbid.
    action = pi.sample(seed=key)
    action = action.astype(jnp.float32) if continuous else action.astype(jnp.int32)
    return action, pi.log_prob(action)


def random_action(info, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Uniform-random actions for ``info.num_envs`` envs (the env-only ceiling) and their log-probs."""
    b = info.num_envs
    if info.continuous:
        low, high = jnp.asarray(info.action_low)[None], jnp.asarray(info.action_high)[None]
        action = low + (high - low) * jax.random.uniform(key, (b, info.action_dim), jnp.float32)
        return action, jnp.full((b,), -jnp.sum(jnp.log(high - low)), jnp.float32)
    action = jax.random.randint(key, (b,), 0, info.num_actions)
    return action, jnp.full(action.shape, -jnp.log(info.num_actions), jnp.float32)


def rollout_from_steps(obs, action, log_prob, tr: Transition, slots: int) -> Rollout:
    """The :class:`Rollout` of ``T`` stacked steps: ``obs [T, B, ...]`` each action was taken at, ``action``,
    ``log_prob`` and the stacked :class:`Transition` ``tr`` ``[T, B, ...]``; its ``next_obs`` is kept only
    where a later row's ``obs`` is not it, in ``bootstrap_obs [slots + 1, B, ...]``
    (:func:`accerl_jax.types.pack_bootstrap_obs`; ``slots`` from
    :meth:`accerl_jax.envs.base.EnvInfo.bootstrap_slots`). numpy inputs give numpy fields (checked),
    jax inputs traceable jax fields."""
    return Rollout(
        obs=obs,
        action=action,
        log_prob=log_prob,
        reward=tr.reward,
        terminated=tr.terminated,
        truncated=tr.truncated,
        valid=tr.valid,
        bootstrap_obs=pack_bootstrap_obs(obs, tr.next_obs, tr.truncated, slots),
        episode_return=tr.episode_return,
        episode_length=tr.episode_length,
    )


class ActorCarry(NamedTuple):
    env_state: Any  # adapter state
    obs: Any  # [B, *obs_shape] observation the next action is taken at
    key: jax.Array  # PRNG key for action sampling


@runtime_checkable
class Actor(Protocol):
    """The Actor component (docs/DESIGN.md): steps ``B`` environments for ``T`` steps with the compressed
    policy μ and returns a time-major :class:`~accerl_jax.types.Rollout` ``[T, B, ...]`` with the behaviour
    ``log_prob`` ``log μ(a|x)`` of every action.

    :class:`AnakinActor`, :class:`ShardedActor` and :class:`HostActor` are Actors (:func:`make_actor` picks
    one for the env). Sebulba's actor thread (:class:`accerl_jax.async_actor.AsyncActor`) runs
    :meth:`HostActor.act` against asynchronous envs and yields the same :class:`Rollout` records as they
    fill up, so it is fed parameters as they are published instead of being called per rollout.
    """

    env: Any  # the env adapter (accerl_jax.envs): its ``info`` (an EnvInfo) says the spaces
    rollout_length: int  # T, agent steps per rollout and env

    def reset(self, key: jax.Array) -> ActorCarry:
        """Reset the envs: the carry (env state, first observations ``[B, *obs_shape]``, sampling key);
        ``key`` is a ``[2]`` uint32 PRNG key."""

    def rollout(self, params, carry: ActorCarry) -> tuple[ActorCarry, Rollout, dict]:
        """One rollout under the actor parameters ``params``: the new carry, the :class:`Rollout`
        ``[T, B, ...]`` and the stage seconds the actor measured itself (``{"env_time_s",
        "inference_time_s"}``, or ``{}`` where env and inference run fused)."""


class AnakinActor:
    """Fused jitted rollout of ``rollout_length`` steps for a jittable env adapter.

    Args:
      env: a jittable adapter (``env.info.jittable``), or one whose ``step`` runs in a jitted program
        (``env.info.xla_step``: envpool's XLA interface; its ``reset`` then runs on the host, and
        :meth:`time_env_only` is not available, as it would step the run's own environments).
      apply: the actor network's apply function (from the Compressor).
      rollout_length: ``T``, agent steps per rollout and environment.
    """

    def __init__(self, env, apply: ApplyFn, rollout_length: int, family: str = "mlp"):
        if not (env.info.jittable or env.info.xla_step):
            raise ValueError(f"{env.info.name} is a host environment; use HostActor")
        self.env = env
        self.rollout_length = rollout_length
        slots = env.info.bootstrap_slots(rollout_length)

        def _run(params, carry: ActorCarry, random_actions: bool):
            def step(c: ActorCarry, _):
                key, sub = jax.random.split(c.key)
                if random_actions:
                    action, log_prob = random_action(env.info, sub)
                else:
                    action, log_prob = sample_action(apply, params, c.obs, sub, env.info.continuous)
                env_state, tr = env.step(c.env_state, action)
                return ActorCarry(env_state, tr.obs, key), (c.obs, action, log_prob, tr)

            carry, (obs, action, log_prob, tr) = jax.lax.scan(step, carry, None, length=rollout_length)
            return carry, rollout_from_steps(obs, action, log_prob, tr, slots)

        self._reset = jax.jit(env.reset) if env.info.jittable else env.reset
        # The traceable rollout ``(params, carry) -> (carry, Rollout)``, for loops that fuse it into a
        # larger program (the Anakin loop); ``rollout`` is its jitted form.
        self.rollout_fn = lambda p, c: _run(p, c, False)
        self._rollout = xla.jit(self.rollout_fn, family)
        # The env-only twin returns just the carry and a checksum, so that its rollout is not materialised.
        self._env_only = jax.jit(lambda c: jax.tree.map(jnp.sum, _run(None, c, True)[0].obs))
        self._env_only_compiled = False

    def reset(self, key: jax.Array) -> ActorCarry:
        env_key, act_key = jax.random.split(key)
        env_state, obs = self._reset(env_key)
        return ActorCarry(env_state, obs, act_key)

    def rollout(self, params, carry: ActorCarry) -> tuple[ActorCarry, Rollout, dict]:
        """One rollout; returns the new carry, the :class:`Rollout` and ``{}`` (no direct timings)."""
        carry, rollout = self._rollout(params, carry)
        return carry, rollout, {}

    def time_env_only(self, carry: ActorCarry) -> float:
        """Wall seconds of ``T`` steps of the same envs with random actions and no policy (the ceiling).

        Raises:
          ValueError: for an ``xla_step`` env (the random steps would advance the run's own envs).
        """
        if not self.env.info.jittable:
            raise ValueError(f"{self.env.info.name}: env-only timing needs a pure (gymnax) env")
        if not self._env_only_compiled:  # compile on first use, untimed
            jax.block_until_ready(self._env_only(carry))
            self._env_only_compiled = True
        start = time.perf_counter()
        jax.block_until_ready(self._env_only(carry))
        return time.perf_counter() - start


class HostActor:
    """Rollout of ``rollout_length`` steps for a host (envpool) adapter; env and inference timed apart.

    Args:
      env: a host adapter (``not env.info.jittable``).
      apply: the actor network's apply function.
      rollout_length: ``T``.
    """

    def __init__(self, env, apply: ApplyFn, rollout_length: int, family: str = "mlp"):
        self.env = env
        self.rollout_length = rollout_length

        def policy(params, obs, key):
            key, sub = jax.random.split(key)
            return (*sample_action(apply, params, obs, sub, env.info.continuous), key)

        # Key splitting lives inside the jitted call: one dispatch per step.
        self._policy = xla.jit(policy, family)

    def reset(self, key: jax.Array) -> ActorCarry:
        env_key, act_key = jax.random.split(key)
        env_state, obs = self.env.reset(env_key)
        return ActorCarry(env_state, obs, act_key)

    def act(self, params, obs, key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """One jitted policy step on ``obs [M, *obs_shape]``: ``(action [M], log_prob [M], next key)``
        (:func:`sample_action`); runs on the device holding ``params`` and ``key``."""
        return self._policy(params, obs, key)

    def rollout(self, params, carry: ActorCarry) -> tuple[ActorCarry, Rollout, dict]:
        """One rollout; returns the new carry, the :class:`Rollout` (device arrays) and the measured
        ``{"env_time_s", "inference_time_s"}`` in seconds."""
        env_time = inference_time = 0.0
        env_state, obs, key = carry
        steps = []
        for _ in range(self.rollout_length):
            start = time.perf_counter()
            action, log_prob, key = self._policy(params, obs, key)
            action, log_prob = jax.device_get((action, log_prob))
            mid = time.perf_counter()
            env_state, tr = self.env.step(env_state, action)
            inference_time += mid - start
            env_time += time.perf_counter() - mid
            steps.append((obs, action, log_prob, tr))
            obs = tr.obs
        stacked = jax.tree.map(lambda *xs: np.stack(xs), *steps)
        rollout = jax.device_put(rollout_from_steps(*stacked, self.env.info.bootstrap_slots(self.rollout_length)))
        return ActorCarry(env_state, obs, key), rollout, {"env_time_s": env_time, "inference_time_s": inference_time}


class NetworkOnlyEnv:
    """A stand-in for a host (envpool) environment, for counting a rollout's network work at the run's
    shapes (:mod:`accerl_jax.run.auto_gate`; traced, never run): ``reset`` gives zero observations and
    ``step`` returns the observation it was given, with zero rewards and no episode ends, in
    :class:`~accerl_jax.types.Transition`'s dtypes. Host environments step outside XLA, so XLA's cost
    analysis cannot count them; what it counts of :class:`AnakinActor` over this env is the policy's
    ``T`` forward passes and samples at ``[B, *obs_shape]``, the part of the actor a compressor shrinks.

    Args:
      info: the host environment's :class:`~accerl_jax.envs.base.EnvInfo`.
      num_envs: ``B``, the batch to count at (the global batch with several processes).
    """

    def __init__(self, info, num_envs: int):
        self.info = dataclasses.replace(info, num_envs=num_envs, jittable=True, xla_step=False)

    def reset(self, key: jax.Array):
        """``(state, obs)``: zero observations ``[B, *obs_shape]``, which are also the state."""
        del key
        obs = jnp.zeros((self.info.num_envs, *self.info.obs_shape), self.info.obs_dtype)
        return obs, obs

    def step(self, state, action):
        """``(state, Transition)``: the same observations, reward 0, no episode ended, every step valid."""
        del action
        b = self.info.num_envs
        zeros, no = jnp.zeros((b,), jnp.float32), jnp.zeros((b,), bool)
        return state, Transition(obs=state, next_obs=state, reward=zeros, terminated=no, truncated=no,
                                 valid=jnp.ones((b,), bool), episode_return=zeros,
                                 episode_length=jnp.zeros((b,), jnp.int32))


class ShardedActor:
    """The jittable actor as independently keyed env groups, optionally sharded over devices.

    Group ``g`` (a global index) is reset with its own key ``fold_in(key, g)``, so its rollout depends only
    on ``g``, not on which device or process steps it, nor on how many groups are stepped together. With
    one env per group (:func:`accerl_jax.run.shards.env_group_ids`, as :func:`accerl_jax.run.build.setup` builds it),
    one device stepping all ``B`` envs, ``D`` devices stepping ``B/D`` each, or several processes
    stepping their own columns produce the same rollouts.

    Args:
      inner: an :class:`AnakinActor` over one group's ``b`` envs.
      shard_ids: the global indices ``g`` of the ``S`` groups this process steps, in column order.
      family: network family, for the compiler options.
      mesh: a 1-D mesh of this process's devices (the learner's, :func:`accerl_jax.learner.make_mesh`) to
        shard the groups over (``S`` must be a multiple of its size); default: this process's first device.
        The carry is placed along its leading (group) axis and, on several devices, the rollout runs under
        ``shard_map``, each device stepping its own groups.

      check_vma: ``shard_map``'s check that loop carries keep their varying-over-devices type; off for a
        rollout whose library loops start from constants (``mctx``'s search: :mod:`accerl_jax.search`).

    Raises:
      ValueError: if the ``S`` groups do not split evenly over the mesh's devices.

    The carry's ``obs`` is ``[S * b, *obs_shape]`` (groups concatenated, as the rollout's columns);
    its ``env_state`` and ``key`` have a leading group axis ``[S]``: every carry leaf is sharded along its
    leading axis. Methods as ``AnakinActor``; :attr:`rollout_fn` is the traceable rollout for fused loops.
    """

    def __init__(self, inner: AnakinActor, shard_ids: Sequence[int], family: str = "mlp",
                 mesh: Mesh | None = None, check_vma: bool = True):
        self.inner = inner
        self.env = inner.env
        self.rollout_length = inner.rollout_length
        ids = jnp.asarray(shard_ids, jnp.uint32)
        mesh = Mesh(np.asarray(jax.local_devices()[:1]), ("batch",)) if mesh is None else mesh
        axis = mesh.axis_names[0]
        sharded = mesh.devices.size > 1
        if len(shard_ids) % mesh.devices.size:
            raise ValueError(f"{len(shard_ids)} env groups do not split over {mesh.devices.size} devices")

        def reset(key):
            carry = jax.vmap(lambda i: inner.reset(jax.random.fold_in(key, i)))(ids)
            return carry._replace(obs=_merge(carry.obs, 0))

        def split(carry: ActorCarry) -> ActorCarry:
            # The groups present here (all, or one device's share under shard_map): the key's leading axis.
            s = carry.key.shape[0]
            return carry._replace(obs=carry.obs.reshape((s, -1) + carry.obs.shape[1:]))

        def rollout(params, carry: ActorCarry):
            carry, ro = jax.vmap(inner.rollout_fn, in_axes=(None, 0))(params, split(carry))
            # [S, T, b, ...] -> [T, S * b, ...]: group-major columns, as the mesh shards them.
            return carry._replace(obs=_merge(carry.obs, 0)), jax.tree.map(lambda x: _merge(x, 1), ro)

        if sharded:
            # Each device steps its own groups: no communication in the actor, and per group the same
            # program as on one device.
            rollout = jax.shard_map(rollout, mesh=mesh, in_specs=(P(), P(axis)), out_specs=(P(axis), P(None, axis)),
                                    check_vma=check_vma)
        self._reset = jax.jit(reset, out_shardings=NamedSharding(mesh, P(axis)))
        # Parameters are placed replicated on the mesh before each rollout, wherever they come from (the
        # compressor's init or its compress, a learner state on one device or the mesh), so that the
        # jitted rollout compiles once.
        self._params_sharding = NamedSharding(mesh, P())
        # The traceable rollout ``(params, carry) -> (carry, Rollout [T, S * b, ...])``; ``rollout`` jits it.
        self.rollout_fn = rollout
        self._rollout = xla.jit(rollout, family)
        self._env_only = jax.jit(lambda c: jax.tree.map(jnp.sum, jax.vmap(inner._env_only)(split(c))))
        self._env_only_compiled = False

    def reset(self, key: jax.Array) -> ActorCarry:
        """The carry of all groups (class docstring), placed along the group axis of the mesh."""
        return self._reset(key)

    def rollout(self, params, carry: ActorCarry) -> tuple[ActorCarry, Rollout, dict]:
        """One rollout of all groups: the new carry, the :class:`Rollout` ``[T, S * b, ...]`` (sharded along
        ``S * b`` over the mesh) and ``{}``; ``params`` are placed replicated on the mesh first."""
        carry, rollout = self._rollout(jax.device_put(params, self._params_sharding), carry)
        return carry, rollout, {}

    def time_env_only(self, carry: ActorCarry) -> float:
        """Wall seconds of ``T`` steps of all groups with random actions (see ``AnakinActor``)."""
        if not self._env_only_compiled:
            jax.block_until_ready(self._env_only(carry))
            self._env_only_compiled = True
        start = time.perf_counter()
        jax.block_until_ready(self._env_only(carry))
        return time.perf_counter() - start


def _merge(x: jax.Array, axis: int) -> jax.Array:
    """Move the leading group axis next to ``axis`` (the batch axis of the result) and merge them."""
    x = jnp.moveaxis(x, 0, axis)
    return x.reshape(x.shape[:axis] + (-1,) + x.shape[axis + 2:])


def make_actor(env, apply: ApplyFn, rollout_length: int, family: str = "mlp", groups: Sequence[int] | None = None,
               mesh: Mesh | None = None):
    """:class:`AnakinActor` for a jittable env, :class:`HostActor` otherwise; with ``groups``, a
    :class:`ShardedActor` of those env groups (``env`` is then one group's jittable adapter) placed over
    ``mesh``.

    ``family`` (``"mlp"``, ``"cnn"``, ...) selects the compiler options (:func:`accerl_jax.platform.xla.options_for`).

    Raises:
      ValueError: ``groups`` with a host env, or groups that do not split evenly over ``mesh``.
    """
    if groups is not None:
        return ShardedActor(AnakinActor(env, apply, rollout_length, family), groups, family, mesh)
    cls = AnakinActor if env.info.jittable else HostActor
    return cls(env, apply, rollout_length, family)
