"""Fidelity of the compressed search (issue 31, item 5): how far the search the actors run with the
compressed network moves from the search the learner's own network would run.

At each log (the end of an Anakin chunk, not every step) :func:`search_divergence` searches from held
states -- the current states of all ``B`` environments -- twice with the same key: once
with the actor's (compressed) parameters, once with the learner's. Its two numbers join the row's
``kl_learner_actor`` / ``action_agreement`` (the driver writes them into the Monitor's rows), and
:func:`summary_fields` condenses the logged rows for the summary as :func:`accerl_jax.monitor.summary.fidelity`
does for the KL.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

# This module imports no mctx at module level (the driver imports summary_fields for every run).

# Row keys (fractions in [0, 1]): the share of held states where both searches' action weights have the
# same argmax, and the mean total-variation distance ½ Σ_a |w_actor - w_learner| between them.
AGREEMENT, TV = "search_agreement", "search_tv"
# The fold of the carry's key that both searches use (the carry's own key is left as it was).
FIDELITY_FOLD = 0x5EA


def weights_divergence(w_actor: jax.Array, w_learner: jax.Array) -> dict:
    """Move agreement and total variation of two searches' action weights ``[N, A]`` float32 (rows sum
    to 1). Returns ``{AGREEMENT, TV}``: [] float32 means over the N states."""
    agree = jnp.mean((jnp.argmax(w_actor, -1) == jnp.argmax(w_learner, -1)).astype(jnp.float32))
    tv = jnp.mean(0.5 * jnp.sum(jnp.abs(w_actor - w_learner), -1))
    return {AGREEMENT: agree, TV: tv}


def search_divergence(actor_apply, learner_apply, model, settings, actor_params, learner_params,
                      carry) -> dict:
    """Search from the held states of ``carry`` with the actor's and with the learner's parameters (same
    key) and compare (:func:`weights_divergence`).

    Args:
      actor_apply, learner_apply: ``(params, obs [N, *obs_shape]) -> (logits [N, A], value [N], ...)``.
      model: the gymnax model (:attr:`~accerl_jax.envs.gymnax_env.GymnaxEnv.model`).
      settings: the run's :class:`~accerl_jax.search.acting.SearchSettings`.
      actor_params, learner_params: the compressed and the learner's parameters.
      carry: the actor's :class:`~accerl_jax.actor.ActorCarry`: one group's (``key`` ``[2]``, leaves
        ``[b, ...]``) or a :class:`~accerl_jax.actor.ShardedActor`'s (``key`` ``[S, 2]``, ``env_state``
        leaves ``[S, b, ...]``, ``obs`` ``[S * b, ...]``); all its states are held.

    Returns:
      ``{AGREEMENT, TV}``, [] float32 each.
    """
    from accerl_jax.search.acting import search_policy  # mctx: only a search run imports it

    env_state, key = carry.env_state, carry.key
    if key.ndim > 1:  # groups [S, b, ...]: all S * b states, in the order of obs; the first group's key
        env_state, key = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), env_state), key[0]
    gym_state, obs = env_state.env_state, carry.obs
    key = jax.random.fold_in(key, FIDELITY_FOLD)
    w_actor = search_policy(actor_apply, model, settings, actor_params, obs, gym_state, key).action_weights
    w_learner = search_policy(learner_apply, model, settings, learner_params, obs, gym_state, key).action_weights
    return weights_divergence(w_actor, w_learner)


def summary_fields(cfg, rows: list[dict], num_actions: int) -> dict:
    """The summary's search fields of a ``--agent search`` run: ``search_target`` (``--search-target``),
    ``network_evaluations_per_step`` (the actor's network, actor side: S + 1, the root and one per
    simulation; with ``--learner-children`` on a one-player env S + 1 - min(S, A, m) for ``A =
    num_actions`` and m ``--max-num-considered-actions``, Gumbel's first visits expanding the root's
    children, which the learner's network evaluates; in a game, where the legal moves vary, S + 1 as the
    most), ``learner_evaluations_per_step`` (``--learner-children``: the learner's network at the root's
    ``num_actions`` children, actor side; else 0) and, over the
    logged ``rows``, the compressed search's fidelity: ``search_agreement_during_mean`` / ``_min`` and ``search_tv_during_mean`` / ``_max`` (None
    where no row logged a finite value) and the last row's ``search_agreement`` / ``search_tv``."""
    from accerl_jax.monitor.summary import finite_values, mean_and_worst
    from accerl_jax.search.acting import SearchSettings  # mctx: only a search run imports it

    one_player = cfg.learner_children and not cfg.env.startswith("pgx:")
    skipped = SearchSettings.from_config(cfg).first_visits(num_actions) if one_player else 0
    out = {"search_target": cfg.search_target, "network_evaluations_per_step": cfg.num_simulations + 1 - skipped,
           "learner_evaluations_per_step": num_actions if cfg.learner_children else 0,
           **mean_and_worst(rows, ((AGREEMENT, AGREEMENT, min), (TV, TV, max)))}
    for key in (AGREEMENT, TV):
        values = finite_values(rows, key)
        out[key] = values[-1] if values else None
    return out
