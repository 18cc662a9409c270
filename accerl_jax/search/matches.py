"""Matches of a two-player game (pgx, :class:`accerl_jax.envs.pgx_env.PgxModel`): a player against a fixed
opponent, win/draw/loss counts, both colours.

A *player* is ``act(game, key) -> action [B] int32``: a move for each of ``B`` games (pgx State, leaves
``[B, ...]``) from the view of the player to move; only its moves in the games where it is to move count.
Two fixed opponents:

* :func:`random_player` -- a uniformly random legal move.
* :func:`mcts_player` -- a plain Monte-Carlo tree search: mctx's ``muzero_policy`` (PUCT, mctx's default
  ``pb_c_init`` 1.25, no Dirichlet noise) with a uniform prior over the legal moves and, as each new
  node's value, the outcome of **one random rollout** (uniformly random legal moves to the game's end);
  ``num_simulations`` simulations per move (the budget), the most visited move played. Two-player sign
  convention as the search agent's (:mod:`accerl_jax.search.acting`).

:func:`play_match` plays ``games`` games at once; in the even-numbered ones the player moves first, in the
odd-numbered ones second (half the games each colour, pgx's players' ids being drawn at random).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import mctx
import numpy as np

from accerl_jax.envs.pgx_env import mover_rewards, observe
from accerl_jax.search.acting import Node, mask_logits


def random_legal(legal: jax.Array, key: jax.Array) -> jax.Array:
    """``[B]`` int32: a uniformly random legal move for each row of ``legal [B, A]`` bool."""
    noise = jax.random.uniform(key, legal.shape)
    return jnp.argmax(jnp.where(legal, noise, -1.0), axis=-1).astype(jnp.int32)


def random_player(model) -> Callable:
    """The uniformly random legal player of ``model`` (:class:`~accerl_jax.envs.pgx_env.PgxModel`)."""
    return lambda game, key: random_legal(model.legal(game), key)


def rollout_value(model, game, key: jax.Array) -> jax.Array:
    """``[B]`` float32: the outcome of one uniformly random game continued from each of ``B`` games, for the
    player to move there (+1 win, 0 draw, -1 loss; 0 for a game already over)."""
    b = game.current_player.shape[0]
    player = game.current_player
    done0 = game.terminated | game.truncated

    def cond(c):
        return jnp.logical_not(jnp.all(c[2]))

    def body(c):
        g, total, done, k = c
        k, k_move, k_step = jax.random.split(k, 3)
        _, nxt, _, ended = model.step(jax.random.split(k_step, b), g, random_legal(model.legal(g), k_move))
        total = total + jnp.where(done, 0.0, mover_rewards(nxt, player))
        return nxt, total, done | ended, k

    _, total, _, _ = jax.lax.while_loop(cond, body, (game, jnp.zeros((b,), jnp.float32), done0, key))
    return total


def mcts_player(model, num_simulations: int) -> Callable:
    """The plain MCTS player (module docstring) with ``num_simulations`` simulations per move."""

    def act(game, key):
        b = game.current_player.shape[0]
        k_root, k_search = jax.random.split(key)
        uniform = jnp.zeros(model.legal(game).shape, jnp.float32)
        root = mctx.RootFnOutput(prior_logits=mask_logits(uniform, model.legal(game)),
                                 value=rollout_value(model, game, k_root), embedding=Node(game, jnp.zeros((b,), bool)))

        def recurrent_fn(_, rng, action, node: Node):
            k_step, k_roll = jax.random.split(rng)
            _, nxt, reward, terminated = model.step(jax.random.split(k_step, b), node.state, action)
            ended = node.terminal | terminated
            out = mctx.RecurrentFnOutput(
                reward=jnp.where(node.terminal, 0.0, reward), discount=jnp.where(ended, 0.0, -1.0),
                prior_logits=mask_logits(uniform, model.legal(nxt)),
                value=jnp.where(ended, 0.0, rollout_value(model, nxt, k_roll)))
            return out, Node(nxt, ended)

        out = mctx.muzero_policy(None, k_search, root, recurrent_fn, num_simulations=num_simulations,
                                 invalid_actions=jnp.logical_not(model.legal(game)), dirichlet_fraction=0.0)
        visits = out.search_tree.summary().visit_counts
        return jnp.argmax(jnp.where(model.legal(game), visits, -1), axis=-1).astype(jnp.int32)

    return act


def search_player(apply, params, model, settings, greedy: bool = False) -> Callable:
    """The trained agent as a player: a Gumbel MuZero search (:func:`~accerl_jax.search.acting.search_policy`)
    with ``apply``/``params`` and ``settings``; its action, or with ``greedy`` the argmax of its weights."""
    from accerl_jax.search.acting import search_policy

    def act(game, key):
        out = search_policy(apply, model, settings, params, observe(game), game, key)
        return jnp.argmax(out.action_weights, -1).astype(jnp.int32) if greedy else out.action

    return act


def network_player(apply, params, model, greedy: bool = False) -> Callable:
    """The trained network alone as a player (``--no-search``): a move sampled from its policy over the legal
    moves, or with ``greedy`` the most likely legal one."""

    def act(game, key):
        logits = mask_logits(apply(params, observe(game))[0].astype(jnp.float32), model.legal(game))
        if greedy:
            return jnp.argmax(logits, -1).astype(jnp.int32)
        return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)

    return act


def match_scores(model, player: Callable, opponent: Callable, games: int, key: jax.Array):
    """The traceable match of :func:`play_match`: ``(score [games] float32, first [games] bool)``, the
    player's outcome of each game (+1 win, 0 draw, -1 loss) and whether it moved first there. A caller that
    jits it with the player's parameters as an argument compiles one program for many checkpoints."""
    k_init, k_play = jax.random.split(key)
    game = model.init(jax.random.split(k_init, games))
    first = jnp.arange(games) % 2 == 0
    me = jnp.where(first, game.current_player, 1 - game.current_player).astype(jnp.int32)

    def cond(c):
        g = c[0]
        return jnp.logical_not(jnp.all(g.terminated | g.truncated))

    def body(c):
        g, score, k = c
        k, k_me, k_other, k_step = jax.random.split(k, 4)
        action = jnp.where(g.current_player == me, player(g, k_me), opponent(g, k_other))
        _, nxt, _, _ = model.step(jax.random.split(k_step, games), g, action)
        return nxt, score + mover_rewards(nxt, me), k

    _, score, _ = jax.lax.while_loop(cond, body, (game, jnp.zeros((games,), jnp.float32), k_play))
    return score, first


def tally(score, first) -> dict:
    """:func:`play_match`'s counts from :func:`match_scores`' ``(score, first)`` (numpy or jax arrays)."""
    score, first = np.asarray(score), np.asarray(first)

    def count(sel):
        s = score[sel]
        return {"games": int(s.size), "wins": int((s > 0).sum()), "draws": int((s == 0).sum()),
                "losses": int((s < 0).sum())}

    return {**count(slice(None)), "first": count(first), "second": count(~first)}


def play_match(model, player: Callable, opponent: Callable, games: int, key: jax.Array) -> dict:
    """``games`` games of ``player`` against ``opponent``, played at once to their ends (jitted).

    Args:
      model: the game (:class:`~accerl_jax.envs.pgx_env.PgxModel`).
      player, opponent: ``act(game, key) -> [B] int32`` (module docstring).
      games: ``B`` >= 1; the player moves first in games 0, 2, 4, ..., second in the others.
      key: ``[2]`` uint32 PRNG key.

    Returns:
      ``{"games", "wins", "draws", "losses", "first": {"games", "wins", "draws", "losses"}, "second": {...}}``
      (ints, the player's results; ``first``/``second`` by the colour it played; wins + draws + losses =
      games).
    """
    return tally(*jax.device_get(jax.jit(lambda k: match_scores(model, player, opponent, games, k))(key)))
