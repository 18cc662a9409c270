"""gymnax adapter: pure, jittable, ``B`` environments stepped with ``vmap``.

gymnax 1.0 auto-resets inside ``step`` and returns the true last observation in
``info["final_observation"]``; this adapter exposes it as ``Transition.next_obs``. Every gymnax
transition is an MDP transition (``valid`` is always True).
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, NamedTuple

import jax

from accerl_jax.platform import lazy

# gymnax imports its render helpers' plotting libraries (matplotlib.pyplot, seaborn and with it scipy.stats)
# with every environment; training never renders, so they load only if something uses them (accerl_jax.platform.lazy).
lazy.defer("matplotlib.pyplot", "seaborn")
import gymnax  # noqa: E402
from gymnax.environments.environment import Environment  # noqa: E402
import jax.numpy as jnp
import numpy as np

from accerl_jax.envs.base import EnvInfo, did_you_mean
from accerl_jax.types import Transition


class GymnaxState(NamedTuple):
    env_state: Any  # gymnax state pytree, leaves [B, ...]
    key: jax.Array  # PRNG key for the next step
    episode_return: jax.Array  # [B] float32, running undiscounted return
    episode_length: jax.Array  # [B] int32, running length in agent steps


# Your own gymnax-style environments by name (:func:`register_env`): name -> a no-argument factory.
CUSTOM_ENVS: dict[str, Callable[[], Any]] = {}


def register_env(name: str, make: Callable[[], Any]) -> None:
    """Make ``--env gymnax:<name>`` build your own environment.

    Args:
      name: the id after ``gymnax:``; not one of gymnax's registered ids and without ``:``.
      make: called with no arguments, returns a ``gymnax.environments.environment.Environment`` instance
        (its ``default_params`` are used) or an ``(environment, params)`` pair; an ``Environment``
        subclass itself works too.
    Raises:
      ValueError: if ``name`` is empty, holds ``:``, or shadows a gymnax id.
    """
    if not name or ":" in name or name in gymnax.registered_envs:
        raise ValueError(f"cannot register environment {name!r}: give a new name without ':' that is not a "
                         "gymnax id")
    CUSTOM_ENVS[name] = make


def _build(env_id: str):
    """``(environment, params)`` for a gymnax id, a :func:`register_env` name, or an import path
    ``package.module:Class`` (a gymnax ``Environment`` subclass built with no arguments)."""
    if env_id in CUSTOM_ENVS:
        made, where = CUSTOM_ENVS[env_id](), f"the factory registered as {env_id!r}"
    elif ":" in env_id:
        module_name, _, attr = env_id.partition(":")
        try:
            made = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"cannot import the environment gymnax:{env_id} ({err}); expected "
                             "'gymnax:package.module:Class' with the module importable (on PYTHONPATH)") from None
        made, where = (made() if isinstance(made, type) else made), env_id
    elif env_id in gymnax.registered_envs:
        return gymnax.make(env_id)
    else:
        raise ValueError(
            f"unknown gymnax environment {env_id!r}{did_you_mean(env_id, list(gymnax.registered_envs) + list(CUSTOM_ENVS), 'gymnax')}; "
            "known ones include "
            f"{', '.join(sorted(gymnax.registered_envs)[:12])}, ...; your own: register_env(name, make) or "
            "'gymnax:package.module:Class'"
        )
    env, params = made if isinstance(made, tuple) else (made, getattr(made, "default_params", None))
    if not isinstance(env, Environment) or params is None:
        raise ValueError(f"gymnax:{env_id}: {where} gave {type(env).__name__}; expected a gymnax Environment "
                         "(gymnax.environments.environment.Environment subclass) with default_params")
    return env, params


def _time_limit(env_id: str, params) -> int:
    limit = getattr(params, "max_steps_in_episode", None)
    if limit is None:
        raise ValueError(f"gymnax:{env_id}: its params have no max_steps_in_episode; give them one (the "
                         "time limit in agent steps, as gymnax's EnvParams do)")
    return int(limit)


class GymnaxEnv:
    """``B`` copies of a gymnax environment behind the adapter interface: a gymnax id, an environment
    of your own registered with :func:`register_env`, or an import path ``package.module:Class``.

    Raises:
      ValueError: if ``env_id`` is none of these, or its action space is neither discrete nor a 1-D box.

    Continuous (box) actions are clipped to the space's bounds before ``step``.
    """

    def __init__(self, env_id: str, num_envs: int):
        try:
            self._env, self._params = _build(env_id)
        except ValueError:
            raise
        except Exception as err:  # some gymnax envs download data at construction (e.g. MNISTBandit)
            raise ValueError(f"cannot build gymnax:{env_id}: {err}") from None
        space = self._env.action_space(self._params)
        continuous = not hasattr(space, "n")
        if continuous and len(getattr(space, "shape", ())) != 1:
            raise ValueError(f"gymnax:{env_id} has action space {space!r}; expected discrete or a 1-D box")
        if continuous:
            dim = int(space.shape[0])
            low = tuple(float(x) for x in np.broadcast_to(np.asarray(space.low, np.float32), (dim,)))
            high = tuple(float(x) for x in np.broadcast_to(np.asarray(space.high, np.float32), (dim,)))
            action = dict(num_actions=0, action_shape=(dim,), action_low=low, action_high=high)
        else:
            action = dict(num_actions=int(space.n))
        obs_space = self._env.observation_space(self._params)
        self.info = EnvInfo(
            name=f"gymnax:{env_id}",
            num_envs=num_envs,
            obs_shape=tuple(obs_space.shape),
            obs_dtype="float32",
            channels_first=False,
            jittable=True,
            max_episode_steps=_time_limit(env_id, self._params),
            **action,
        )

    @property
    def model(self) -> tuple[Environment, Any]:
        """``(environment, params)``: the gymnax environment itself (its ``step_env`` steps one state without
        the auto-reset; a search agent's model, :mod:`accerl_jax.search.acting`) and its params."""
        return self._env, self._params

    def reset(self, key: jax.Array) -> tuple[GymnaxState, jax.Array]:
        """Reset all ``B`` environments. Returns the state and ``obs [B, *obs_shape]`` float32."""
        key, sub = jax.random.split(key)
        keys = jax.random.split(sub, self.info.num_envs)
        obs, env_state = jax.vmap(self._env.reset, in_axes=(0, None))(keys, self._params)
        b = self.info.num_envs
        state = GymnaxState(env_state, key, jnp.zeros((b,), jnp.float32), jnp.zeros((b,), jnp.int32))
        return state, obs.astype(jnp.float32)

    def step(self, state: GymnaxState, action: jax.Array) -> tuple[GymnaxState, Transition]:
        """Step all ``B`` environments with ``action [B]`` int32 (or ``[B, D]`` float32, clipped to the
        bounds); auto-resets finished episodes."""
        if self.info.continuous:
            low, high = jnp.asarray(self.info.action_low)[None], jnp.asarray(self.info.action_high)[None]
            action = jnp.clip(action, low, high)
        key, sub = jax.random.split(state.key)
        keys = jax.random.split(sub, self.info.num_envs)
        obs, env_state, reward, terminated, truncated, info = jax.vmap(
            self._env.step, in_axes=(0, 0, 0, None)
        )(keys, state.env_state, action, self._params)
        reward = reward.astype(jnp.float32)
        done = jnp.logical_or(terminated, truncated)
        ep_ret = state.episode_return + reward
        ep_len = state.episode_length + 1
        transition = Transition(
            obs=obs.astype(jnp.float32),
            next_obs=info["final_observation"].astype(jnp.float32),
            reward=reward,
            terminated=terminated,
            truncated=jnp.logical_and(truncated, jnp.logical_not(terminated)),
            valid=jnp.ones_like(done),
            episode_return=ep_ret,
            episode_length=ep_len,
        )
        new_state = GymnaxState(env_state, key, jnp.where(done, 0.0, ep_ret), jnp.where(done, 0, ep_len))
        return new_state, transition
