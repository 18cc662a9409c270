"""envpool adapter: ``B`` C++ environments stepped from the host (synchronous ``step``).

envpool resets on the *next* ``step`` call after an episode ends: that call ignores the action and
returns the first observation of the new episode with reward 0. That transition is not an MDP
transition; this adapter marks it ``valid = False`` so it gets zero weight in every loss
(docs/DESIGN.md, "Conventions"). At the step that ends an episode envpool returns the true final
observation, so ``next_obs`` is simply the returned observation.

:class:`EnvpoolXlaEnv` steps the same pool through envpool's XLA interface (``env.xla()``) inside a
jitted program (the Anakin loop), with the same reset rule and bookkeeping (one function, :func:`_transition`,
in numpy on the host and in ``jax.numpy`` in the program).

Reward clipping (``reward_clip=True``; the ``--reward-clip`` default for Atari): the learner trains on
``sign(r)`` (IMPALA, CleanRL and Sample Factory train on rewards clipped to [-1, 1]; baselines' and
envpool's own ``reward_clip`` take the sign) while ``episode_return`` sums the raw game score, which is
what the Monitor logs and the summary reports. The adapter clips, not envpool (whose clipped pool
exposes no raw reward), so the host and XLA interfaces clip alike. It applies to the tasks envpool itself
offers reward clipping for (its Atari games); other tasks' rewards pass unchanged.

Known limitation: envpool reports an episode that terminates on its last allowed step as truncated. For
Atari the adapter recovers the termination from ``info["terminated"]``; for classic control (e.g.
``CartPole-v1``, a fall exactly at step 500) envpool exposes nothing to recover it from, so that one
step bootstraps when it should not.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from accerl_jax.envs.base import EnvInfo, did_you_mean
from accerl_jax.seeds import MAX_ENV_SEED, envpool_seed  # noqa: F401 (re-exported)
from accerl_jax.types import Transition




class EnvpoolState(NamedTuple):
    """Host-side bookkeeping (numpy arrays ``[B]``)."""

    needs_reset: np.ndarray  # bool: the previous step ended an episode; this step is the reset step
    episode_return: np.ndarray  # float32
    episode_length: np.ndarray  # int32


def _make(env_id: str, **kwargs):
    """``envpool.make`` of a gymnasium-API pool, without the gymnasium ``UserWarning``s its spaces print
    (e.g. "Box low's precision lowered by casting to float32"): they say nothing a user can act on."""
    import envpool

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module="gymnasium")
        env = envpool.make(env_id, env_type="gymnasium", **kwargs)
        # The pool builds (and caches) its spaces at their first access, which is where the warnings come from.
        env.observation_space, env.action_space
    return env


class EnvpoolEnv:
    """``B`` envpool environments behind the adapter interface (not jittable).

    Raises:
      ValueError: if ``env_id`` is not an envpool task, or its action space is neither discrete nor a
        1-D box.

    Continuous (box) actions (MuJoCo tasks such as ``HalfCheetah-v4``) are clipped to the space's bounds
    before ``step``. ``reward_clip``: see the module docstring (``info.reward_clip`` says whether it applies).
    """

    def __init__(self, env_id: str, num_envs: int, seed: int, *, batch_size: int | None = None,
                 reward_clip: bool = False):
        # batch_size: an asynchronous pool (AsyncEnvpoolEnv) of that recv batch; None: a synchronous one.
        import envpool  # imported here: importing envpool is slow and gymnax-only runs skip it

        if env_id not in envpool.list_all_envs():
            raise ValueError(
                f"unknown envpool task {env_id!r}{did_you_mean(env_id, envpool.list_all_envs(), 'envpool')}; e.g. "
                "Pong-v5, Breakout-v5, CartPole-v1 "
                "(envpool.list_all_envs() lists all)"
            )
        try:
            self._env = _make(env_id, num_envs=num_envs, seed=seed,
                              **({} if batch_size is None else {"batch_size": batch_size}))
        except Exception as err:  # envpool raises many kinds (bad seed, missing system libraries, ...)
            raise ValueError(f"cannot build envpool:{env_id} with {num_envs} envs, seed {seed}: {err}") from None
        space = self._env.action_space
        continuous = not hasattr(space, "n")
        if continuous and len(getattr(space, "shape", ()) or ()) != 1:
            raise ValueError(f"envpool:{env_id} has action space {space!r}; expected discrete or a 1-D box")
        if continuous:
            self._low = np.asarray(space.low, np.float32)
            self._high = np.asarray(space.high, np.float32)
            action = dict(num_actions=0, action_shape=(int(space.shape[0]),),
                          action_low=tuple(map(float, self._low)), action_high=tuple(map(float, self._high)))
        else:
            action = dict(num_actions=int(space.n))
        obs_shape = getattr(self._env.observation_space, "shape", None)
        if not obs_shape:
            raise ValueError(f"envpool:{env_id} has a structured (dict/tuple) observation space; only array observations are supported")
        shape = tuple(obs_shape)
        if batch_size is None:  # the first reset shows a multi-player task (several observations per env);
            first_obs, _ = self._env.reset()  # an asynchronous pool's task has been checked synchronously before
            if getattr(first_obs, "shape", (None,))[0] != num_envs:
                raise ValueError(f"envpool:{env_id} returns more than one observation per environment (multi-player); "
                                 "not supported")
        self._obs_dtype = "uint8" if self._env.observation_space.dtype == np.uint8 else "float32"
        # envpool's Atari tasks have their own reward_clip option (left off: raw rewards come out).
        self._reward_clip = reward_clip and "reward_clip" in self._env.spec.config._fields
        self.info = EnvInfo(
            name=f"envpool:{env_id}",
            num_envs=num_envs,
            obs_shape=shape,
            obs_dtype=self._obs_dtype,
            channels_first=len(shape) == 3,
            jittable=False,
            max_episode_steps=int(self._env.spec.config.max_episode_steps),
            delayed_reset=True,
            reward_clip=self._reward_clip,
            **action,
        )

    def xla(self) -> "EnvpoolXlaEnv":
        """This pool behind envpool's XLA interface (:class:`EnvpoolXlaEnv`); the host ``step`` must not
        be used on it afterwards (both would advance the same environments).

        Raises:
          ValueError: see :func:`check_xla`.
        """
        return EnvpoolXlaEnv(self)

    def _cast(self, obs):
        """Observations in the adapter's dtype (numpy or JAX arrays)."""
        return obs.astype(self._obs_dtype, copy=False)

    def _action(self, action, xp=np):
        """int32 actions, or float32 actions clipped to the box, in the array module ``xp``."""
        if self.info.continuous:
            return xp.clip(xp.asarray(action, xp.float32), self._low, self._high)
        return xp.asarray(action, dtype=xp.int32)

    def reset(self, key=None) -> tuple[EnvpoolState, np.ndarray]:
        """Reset all environments (seeded at construction; ``key`` is ignored)."""
        obs, _ = self._env.reset()
        b = self.info.num_envs
        state = EnvpoolState(np.zeros(b, bool), np.zeros(b, np.float32), np.zeros(b, np.int32))
        return state, self._cast(obs)

    def step(self, state: EnvpoolState, action) -> tuple[EnvpoolState, Transition]:
        """Step with ``action [B]`` int (or ``[B, D]`` float, clipped to the bounds); returns numpy
        :class:`Transition` fields ``[B, ...]``."""
        return _transition(state, self._cast, *self._env.step(self._action(action)), clip=self._reward_clip)


def _transition(state: EnvpoolState, cast, obs, reward, terminated, truncated, info,
                xp=np, clip: bool = False) -> tuple[EnvpoolState, Transition]:
    """The adapter's :class:`Transition` for one envpool result, given the bookkeeping ``state`` of the
    same environments (``[M]`` arrays, in the result's order); returns the updated bookkeeping too.

    ``clip``: the transition's ``reward`` is ``sign(reward)``; ``episode_return`` still sums the raw rewards.
    Pure array code in the array module ``xp``: ``numpy`` on the host (:class:`EnvpoolEnv`,
    :class:`AsyncEnvpoolEnv`), ``jax.numpy`` inside a jitted program (:class:`EnvpoolXlaEnv`).
    """
    if "terminated" in info:
        # Atari reports game over in info even when the time limit cut the same step (then envpool's
        # own flags say truncated only); a true termination must not bootstrap.
        terminated = terminated | info["terminated"].astype(bool)
    obs = cast(obs)
    raw = reward.astype(xp.float32)
    valid = ~state.needs_reset
    terminated = terminated & valid
    truncated = truncated & valid & ~terminated
    done = terminated | truncated
    ep_ret = state.episode_return + xp.where(valid, raw, 0.0).astype(xp.float32)
    ep_len = state.episode_length + valid.astype(xp.int32)
    transition = Transition(
        obs=obs,
        next_obs=obs,
        reward=xp.sign(raw) if clip else raw,
        terminated=terminated,
        truncated=truncated,
        valid=valid,
        episode_return=ep_ret,
        episode_length=ep_len,
    )
    new_state = EnvpoolState(
        done, xp.where(done, 0.0, ep_ret).astype(xp.float32), xp.where(done, 0, ep_len).astype(xp.int32)
    )
    return new_state, transition


def check_xla(env_id: str) -> None:
    """Refuse an envpool task that envpool's XLA interface cannot carry in this JAX.

    The interface declares its buffers in JAX's canonical dtypes: without ``jax_enable_x64`` a 64-bit
    array (MuJoCo's float64 observations and actions) is declared 32-bit while envpool writes 64-bit
    values into it. An id that is not an envpool task passes (the adapter's constructor names it).

    Raises:
      ValueError: naming the task and its 64-bit arrays.
    """
    import envpool

    if env_id not in envpool.list_all_envs() or jax.config.jax_enable_x64:
        return
    spec = envpool.make_spec(env_id)
    wide = sorted(k for k, v in {**spec.state_array_spec, **spec.action_array_spec}.items()
                  if np.dtype(v.dtype).itemsize == 8)
    if wide:
        raise ValueError(f"envpool:{env_id} has 64-bit arrays ({', '.join(wide)}), which envpool's XLA interface "
                         "cannot pass in JAX's default 32-bit mode")


class EnvpoolXlaState(NamedTuple):
    """The :class:`EnvpoolXlaEnv` state: envpool's XLA handle and the bookkeeping, as JAX arrays ``[B]``."""

    handle: jax.Array  # [8] uint8: envpool's XLA handle; each step's output handle orders the next step after it
    book: EnvpoolState  # needs_reset, episode_return, episode_length, as jax arrays


class EnvpoolXlaEnv:
    """An :class:`EnvpoolEnv`'s pool stepped through envpool's XLA interface (``env.xla()``), so that
    ``step`` runs inside a jitted program (``lax.scan``; the Anakin loop).

    ``step(state, action) -> (state, Transition)`` is traceable and has the host adapter's semantics
    (the module docstring; :func:`_transition`). It is a side-effecting call on the one pool, not a pure
    function: each step's handle is threaded through the state, so steps run in order; the state must
    never be stepped twice or copied into ``vmap`` (each copy would step the same pool), and a program
    partitioned over several devices is rejected by XLA. ``reset`` runs on the host; the pool's state
    cannot be saved.

    Raises:
      ValueError: see :func:`check_xla`.
    """

    def __init__(self, env: EnvpoolEnv):
        check_xla(env.info.name.partition(":")[2])
        self._host = env
        self.info = dataclasses.replace(env.info, xla_step=True)
        handle, _, _, self._step = env._env.xla()
        self._handle = jnp.asarray(handle)

    def reset(self, key=None) -> tuple[EnvpoolXlaState, jax.Array]:
        """Reset all environments on the host (``key`` is ignored); returns the state and ``obs [B, ...]``."""
        state, obs = self._host.reset()
        return EnvpoolXlaState(self._handle, EnvpoolState(*map(jnp.asarray, state))), jnp.asarray(obs)

    def step(self, state: EnvpoolXlaState, action: jax.Array) -> tuple[EnvpoolXlaState, Transition]:
        """Step with ``action [B]`` int32 (or ``[B, D]`` float32, clipped to the bounds), traceable;
        returns :class:`Transition` fields ``[B, ...]`` as JAX arrays."""
        handle, (obs, reward, terminated, truncated, extra) = self._step(state.handle,
                                                                         self._host._action(action, xp=jnp))
        book, transition = _transition(state.book, self._host._cast, obs, reward, terminated, truncated, extra,
                                       xp=jnp, clip=self._host._reward_clip)
        return EnvpoolXlaState(handle, book), transition


class AsyncEnvpoolEnv(EnvpoolEnv):
    """``num_envs`` envpool environments in envpool's asynchronous mode, for the Sebulba loop.

    :meth:`recv` returns the ``batch_size`` environments that finished their step first (any subset, in
    any order, with their ids); :meth:`send` steps exactly those with the actions chosen for them, and
    returns at once. ``batch_size < num_envs`` lets the policy run on one batch while envpool's threads
    step the others.

    The reset rule is the synchronous adapter's (the module docstring): the first result of every env
    after :meth:`reset` (its initial observation) and the step after an episode ended (envpool's reset
    step) are marked ``valid = False`` and leave the episode counters untouched.

    Raises:
      ValueError: as :class:`EnvpoolEnv`, and for ``batch_size`` outside ``[1, num_envs]``.
    """

    def __init__(self, env_id: str, num_envs: int, batch_size: int, seed: int, *, reward_clip: bool = False):
        if not 1 <= batch_size <= num_envs:
            raise ValueError(f"bad envpool batch size {batch_size} for {num_envs} envs; expected 1 to {num_envs}")
        super().__init__(env_id, num_envs, seed, batch_size=batch_size, reward_clip=reward_clip)
        self.batch_size = batch_size
        self._state = None

    def reset(self, key=None) -> None:
        """Reset every environment asynchronously; their initial observations come from :meth:`recv`."""
        b = self.info.num_envs
        # needs_reset = True: each env's first result (its initial observation) is not a transition.
        self._state = EnvpoolState(np.ones(b, bool), np.zeros(b, np.float32), np.zeros(b, np.int32))
        self._env.async_reset()

    def recv(self) -> tuple[np.ndarray, Transition]:
        """Wait for ``batch_size`` environments; returns their ids ``[M]`` int32 and their numpy
        :class:`Transition` ``[M, ...]`` (the result of each one's last :meth:`send`)."""
        obs, reward, terminated, truncated, info = self._env.recv()
        ids = np.asarray(info["env_id"], np.int32)
        part = EnvpoolState(*(x[ids] for x in self._state))
        new, transition = _transition(part, self._cast, obs, reward, terminated, truncated, info,
                                      clip=self._reward_clip)
        for full, x in zip(self._state, new):
            full[ids] = x
        return ids, transition

    def send(self, action, env_id: np.ndarray) -> None:
        """Step environments ``env_id [M]`` with ``action [M]`` int (or ``[M, D]`` float, clipped)."""
        self._env.send(self._action(action), np.asarray(env_id, np.int32))
