"""Environment adapters: gymnax (jittable, on device), envpool (host) and pgx two-player games by self-play
(jittable), one interface.

:func:`make_env` parses the ``--env`` string ``gymnax:<id>``, ``envpool:<id>`` or ``pgx:<game>``; your own
gymnax-style environment: ``gymnax:<name>`` after :func:`register_env`, or ``gymnax:package.module:Class``.
"""
from __future__ import annotations

from accerl_jax.envs.base import EnvInfo
from accerl_jax.envs.envpool_env import EnvpoolEnv, envpool_seed
from accerl_jax.envs.gymnax_env import GymnaxEnv, register_env
from accerl_jax.envs.pgx_env import PgxEnv

BACKENDS = ("gymnax", "envpool", "pgx")


def make_env(name: str, num_envs: int, seed: int = 0, *, reward_clip: bool = False):
    """Build the adapter for ``name`` (``gymnax:<id>``, ``envpool:<id>`` or ``pgx:<game>``) with ``num_envs`` copies;
    ``reward_clip``: the learner's rewards of envpool's Atari tasks are their sign (episode returns stay
    raw; :mod:`accerl_jax.envs.envpool_env`), other envs' are never clipped.

    ``seed`` is envpool's: its environment ``i`` is seeded ``seed + i`` (a run passes :func:`envpool_seed`,
    so that distinct run seeds get disjoint env seeds); gymnax envs are keyed by the actor instead.

    Raises:
      ValueError: for a malformed name, an unknown backend or id, or ``num_envs < 1``.
    """
    backend, sep, env_id = name.partition(":")
    if not sep or not env_id or backend not in BACKENDS:
        raise ValueError(
            f"bad --env {name!r}; expected 'gymnax:<id>' (e.g. gymnax:CartPole-v1, gymnax:Breakout-MinAtar), "
            "'envpool:<id>' (e.g. envpool:Pong-v5, envpool:CartPole-v1) or 'pgx:<game>' (e.g. pgx:connect_four)"
        )
    if num_envs < 1:
        raise ValueError(f"bad --num-envs {num_envs}; expected a positive integer")
    if backend == "gymnax":
        return GymnaxEnv(env_id, num_envs)
    if backend == "pgx":
        return PgxEnv(env_id, num_envs)
    return EnvpoolEnv(env_id, num_envs, seed, reward_clip=reward_clip)


__all__ = ["EnvInfo", "EnvpoolEnv", "GymnaxEnv", "PgxEnv", "make_env", "envpool_seed", "register_env", "BACKENDS"]
