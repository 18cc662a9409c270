"""Evaluating a search run (``python -m accerl_jax.evaluate`` on a ``--agent search`` run): by default
the evaluation plays as the run's actors did, a Gumbel MuZero search at every step
(:func:`~accerl_jax.search.acting.search_policy`) with the evaluated policy's network (``--policy actor``:
the compressed one) and the env as its model, with its own ``--num-simulations`` (unset: the run's);
``--no-search`` plays the network alone.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from accerl_jax.config import ConfigError


def search_settings(cfg, num_simulations: Optional[int], no_search: bool):
    """The :class:`~accerl_jax.search.acting.SearchSettings` an evaluation of the run of ``cfg``
    (:class:`~accerl_jax.config.Config`) searches with, or None to play the network alone (``no_search``,
    or a run of another agent).

    Raises:
      ConfigError: ``num_simulations`` < 1, or ``num_simulations``/``no_search`` given for a run that is
        not a search run.
    """
    if cfg.agent != "search":
        if num_simulations is not None or no_search:
            flag = "--no-search" if no_search else f"--num-simulations {num_simulations}"
            raise ConfigError(f"bad {flag}: the run is not a search run (--agent {cfg.agent}); "
                              "it takes no search at evaluation")
        return None
    if num_simulations is not None and num_simulations < 1:
        raise ConfigError(f"bad --num-simulations {num_simulations}; expected an integer >= 1")
    if no_search:
        return None
    from accerl_jax.search.acting import SearchSettings

    settings = SearchSettings.from_config(cfg)
    return settings if num_simulations is None else dataclasses.replace(settings, num_simulations=num_simulations)


def make_search_act(trained, settings, greedy: bool) -> Callable:
    """``act(env_state, obs [B, *obs_shape], key uint32[2]) -> action [B] int32``: a search with
    ``trained``'s (:class:`accerl_jax.tools.trained.Trained`) network and env model from each env's state
    (``env_state``: its adapter state). The action is the search's (Gumbel MuZero's sequential halving,
    as the actors act); ``greedy``: the argmax of its action weights."""
    import jax.numpy as jnp

    from accerl_jax.search.acting import search_policy

    model = trained.env.model

    def act(env_state, obs, key):
        out = search_policy(trained.apply, model, settings, trained.params, obs, env_state.env_state, key)
        return jnp.argmax(out.action_weights, -1).astype(jnp.int32) if greedy else out.action

    return act
