"""The Compressor interface (optax-style) and named composition.

A compressor turns learner parameters into the parameters of the policy the Actor runs:

* ``init(params, key[, obs]) -> (actor_params, state)``: the first actor parameters and the compressor's
  own state (a NamedTuple), from the learner's initial ``params``; ``obs [N, *obs_shape]`` (optional)
  are first observations, which calibrating stages (``int8``) need.
* ``compress(params, state, obs) -> (actor_params, state)``: new actor parameters from the current
  learner ``params``; ``obs [N, *obs_shape]`` are recent actor observations (distillation trains on
  them, others ignore them).
* ``actor_apply(apply) -> apply``: the apply function of the actor network, given the apply function
  of the network the compressor's input parameters belong to (static, Python-level).

:func:`chain` composes compressors by name, so a chain's state reads ``state["fakequant"]``, not
``state[1]`` (docs/DESIGN.md, "Conventions"; optax's ``named_chain``).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax

from accerl_jax.types import ApplyFn, Params


class Compressor(NamedTuple):
    """A pair of pure functions plus the apply-function transform (module docstring), and what the
    compressor needs from a loop, declared so that no loop has to probe it:

    * ``timed_stages``: stages whose seconds the Monitor reports apart (``distill``); a compressor that
      declares any takes ``compress(..., timer=...)`` (:func:`chain`).
    """

    init: Callable[..., tuple[Params, Any]]  # (params, key[, obs])
    compress: Callable[[Params, Any, jax.Array], tuple[Params, Any]]
    actor_apply: Callable[[ApplyFn], ApplyFn]
    timed_stages: tuple = ()


class IdentityState(NamedTuple):
    """``none`` has no state."""


def identity() -> Compressor:
    """``none``: the actor runs the learner's parameters unchanged."""
    return Compressor(
        init=lambda params, key, obs=None: (params, IdentityState()),
        compress=lambda params, state, obs: (params, state),
        actor_apply=lambda apply: apply,
    )


def chain(*named: tuple[str, Compressor]) -> Compressor:
    """Compose ``(name, compressor)`` pairs, applied left to right; state is a dict keyed by name.

    The chain's ``compress`` also takes an optional keyword ``timer``: ``timer(name)`` returns a context
    manager entered around stage ``name``, which is blocked on before it exits (per-stage wall time).

    Raises:
      ValueError: if two stages share a name.
    """
    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        raise ValueError(f"compressor chain {'+'.join(names)!r} repeats a stage; each may appear once")

    def init(params, key, obs=None):
        state = {}
        keys = jax.random.split(key, max(1, len(named)))
        for (name, c), k in zip(named, keys):
            # Stages written as init(params, key) (no calibration) still compose when no obs is given.
            params, state[name] = c.init(params, k) if obs is None else c.init(params, k, obs)
        return params, state

    def compress(params, state, obs, *, timer=None):
        # timer(name): a context manager around each stage, which is then blocked on inside it, so that
        # the Monitor can time a stage (distillation) apart from the rest; None: no blocking.
        new_state = {}
        for name, c in named:
            if timer is None:
                params, new_state[name] = c.compress(params, state[name], obs)
            else:
                with timer(name):
                    params, new_state[name] = jax.block_until_ready(c.compress(params, state[name], obs))
        return params, new_state

    def actor_apply(apply):
        for _, c in named:
            apply = c.actor_apply(apply)
        return apply

    timed = tuple(name for name, c in named if c.timed_stages)
    return Compressor(init, compress, actor_apply, timed_stages=timed)
