"""pgx adapter: two-player board games (pgx, Koyamada et al. 2023, https://github.com/sotetsuk/pgx) played
by self-play, ``B`` games stepped with ``vmap``; pure and jittable like the gymnax adapter.

One agent plays both sides, so everything is seen from the **player to move**:

* ``obs``: pgx's own observation of the player to move (e.g. Connect Four's ``[6, 7, 2]`` planes, the
  mover's stones first), flattened to a float32 vector ``[D]`` (MLP by ``--network auto``).
* ``reward``: the reward of the move to the player who made it (``State.rewards[mover]``): +1 for the
  winning move, 0 for a draw and every other move (-1 only for an illegal move, which pgx scores as a
  loss and which the search never makes).
* A game ends at pgx's ``terminated`` or ``truncated`` (a game cut by its rules' move limit, a draw by
  its rewards); both are reported as ``terminated`` (a game end, no bootstrap), ``truncated`` is never
  set. The game resets in the same step (``obs`` is the new game's first observation, ``next_obs`` the
  final one); pgx picks which player id moves first at random.
* ``episode_return`` sums the movers' rewards: 1 for a decisive game, 0 for a draw; ``episode_length``
  counts plies.
* The legal moves: :meth:`PgxEnv.legal_actions` ``[B, A]`` bool; the search's model is
  :attr:`PgxEnv.model` (:class:`PgxModel`).

pgx's pretrained baseline models (``pgx.make_baseline_model``) download weights and are never used here.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from accerl_jax.config import PGX_GAMES
from accerl_jax.envs.base import EnvInfo, did_you_mean
from accerl_jax.types import Transition

# The longest game in plies where the rules bound it simply (the board fills up); others: no limit known here.
MAX_PLIES = {"connect_four": 42, "tic_tac_toe": 9}


class PgxState(NamedTuple):
    env_state: Any  # pgx State, leaves [B, ...] (the search's model state)
    key: jax.Array  # PRNG key for the next step and resets
    episode_return: jax.Array  # [B] float32, movers' rewards of the running game
    episode_length: jax.Array  # [B] int32, plies of the running game


def observe(game) -> jax.Array:
    """``[B, D]`` float32: pgx's observations of the player to move in each of ``B`` games, flattened."""
    obs = game.observation
    return obs.reshape((obs.shape[0], -1)).astype(jnp.float32)


def mover_rewards(game, mover: jax.Array) -> jax.Array:
    """``[B]`` float32: ``game.rewards [B, 2]`` of the players ``mover [B]`` int32."""
    return jnp.take_along_axis(game.rewards, mover[:, None].astype(jnp.int32), axis=1)[:, 0].astype(jnp.float32)


class PgxModel:
    """A pgx game as the search's model (:mod:`accerl_jax.search.acting`): two-player and zero-sum, so
    the search alternates sides (discount -1 per ply, values from the player to move).

    Args:
      env: a ``pgx.Env``.
    """

    two_player = True

    def __init__(self, env):
        self.env = env

    def step(self, keys: jax.Array, game, action: jax.Array):
        """One ply in each of ``B`` games, without the reset.

        Args:
          keys: ``[B, 2]`` uint32 PRNG keys.
          game: pgx State, leaves ``[B, ...]``.
          action: ``[B]`` int32.

        Returns:
          ``(obs [B, D] float32 of the next player to move, next game, reward [B] float32 of the move to its
          mover, ended [B] bool)``; a game that has ended stays as it is, with reward 0.
        """
        mover = game.current_player
        nxt = jax.vmap(self.env.step)(game, action, keys)
        return observe(nxt), nxt, mover_rewards(nxt, mover), nxt.terminated | nxt.truncated

    def legal(self, game) -> jax.Array:
        """``[B, A]`` bool, True for a legal move of the player to move (all True once a game has ended)."""
        return game.legal_action_mask

    def init(self, keys: jax.Array):
        """``B`` new games (pgx State, leaves ``[B, ...]``) from ``keys [B, 2]``."""
        return jax.vmap(self.env.init)(keys)


def make_game(game_id: str):
    """``pgx.make(game_id)``.

    Raises:
      ValueError: ``game_id`` not in :data:`accerl_jax.config.PGX_GAMES`, naming the accepted ones.
    """
    if game_id not in PGX_GAMES:
        raise ValueError(f"unknown pgx game {game_id!r}{did_you_mean(game_id, PGX_GAMES, 'pgx')}; expected one of "
                         f"{', '.join(PGX_GAMES)} (two-player, perfect-information games)")
    import pgx

    return pgx.make(game_id)


class PgxEnv:
    """``B`` self-play games of a pgx two-player game behind the adapter interface (module docstring).

    Args:
      game_id: one of :data:`accerl_jax.config.PGX_GAMES`, e.g. ``"connect_four"``.
      num_envs: ``B``.

    Raises:
      ValueError: an unknown game.
    """

    def __init__(self, game_id: str, num_envs: int):
        self._env = make_game(game_id)
        self.model = PgxModel(self._env)
        self.info = EnvInfo(
            name=f"pgx:{game_id}",
            num_envs=num_envs,
            obs_shape=(int(math.prod(self._env.observation_shape)),),
            obs_dtype="float32",
            num_actions=int(self._env.num_actions),
            channels_first=False,
            jittable=True,
            max_episode_steps=MAX_PLIES.get(game_id, 2**31 - 1),
        )

    def legal_actions(self, state: PgxState) -> jax.Array:
        """``[B, A]`` bool, the legal moves at the adapter state's current observations."""
        return state.env_state.legal_action_mask

    def reset(self, key: jax.Array) -> tuple[PgxState, jax.Array]:
        """``B`` new games. Returns the state and ``obs [B, D]`` float32."""
        key, sub = jax.random.split(key)
        game = self.model.init(jax.random.split(sub, self.info.num_envs))
        b = self.info.num_envs
        return PgxState(game, key, jnp.zeros((b,), jnp.float32), jnp.zeros((b,), jnp.int32)), observe(game)

    def step(self, state: PgxState, action: jax.Array) -> tuple[PgxState, Transition]:
        """One ply in each game with ``action [B]`` int32; games that end restart in the same step."""
        b = self.info.num_envs
        key, step_key, reset_key = jax.random.split(state.key, 3)
        final_obs, game, reward, ended = self.model.step(jax.random.split(step_key, b), state.env_state, action)
        fresh = self.model.init(jax.random.split(reset_key, b))
        game = jax.tree.map(lambda new, old: jnp.where(ended.reshape((b,) + (1,) * (old.ndim - 1)), new, old),
                            fresh, game)
        ep_ret = state.episode_return + reward
        ep_len = state.episode_length + 1
        transition = Transition(
            obs=observe(game),
            next_obs=final_obs,
            reward=reward,
            terminated=ended,
            truncated=jnp.zeros_like(ended),
            valid=jnp.ones_like(ended),
            episode_return=ep_ret,
            episode_length=ep_len,
        )
        return PgxState(game, key, jnp.where(ended, 0.0, ep_ret), jnp.where(ended, 0, ep_len)), transition
