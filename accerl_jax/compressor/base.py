"""The Compressor interface (optax-style) and named composition.

A compressor turns learner parameters into the parameters of the policy the Actor runs:

* ``init(params, key[, obs]) -> (actor_params, state)``: the first actor parameters and the compressor's
  own state (a NamedTuple), from the learner's initial ``params``; ``obs [N, *obs_shape]`` (optional)
  are first observations, which calibrating stages (``int8``) need.
* ``compress(params, state, obs) -> (actor_params, state)``: new actor parameters from the current
  learner ``params``; ``obs [N, *obs_shape]`` are recent actor observations (distillation trains on
  them, others ignore them). A compressor that declares ``takes_teacher`` also accepts
  ``compress(params, state, obs, teacher=(policy_out [N, ...], value [N]))``: the learner network's
  outputs at ``obs``, which the loop has from the learner's own forward pass (under the parameters
  before the update, :class:`accerl_jax.learner.LearnerOutputs`), used instead of a forward pass of
  ``params`` over ``obs``. A compressor that declares ``takes_children`` also accepts
  ``compress(..., children=(child_obs [N, A, *obs_shape], child_valid [N, A] bool))``: the observations
  of each search root's children (:attr:`accerl_jax.search.acting.SearchRollout.child_obs`), which a
  search run's loop passes where the actor records them (``--distill-children``).
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
    * ``takes_teacher``: ``compress`` takes the keyword ``teacher`` (module docstring); a loop that has
      the learner's outputs at ``obs`` passes them, saving the compressor a forward pass of the teacher.
    """

    init: Callable[..., tuple[Params, Any]]  # (params, key[, obs])
    compress: Callable[[Params, Any, jax.Array], tuple[Params, Any]]
    actor_apply: Callable[[ApplyFn], ApplyFn]
    timed_stages: tuple = ()
    takes_teacher: bool = False
    takes_children: bool = False


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
    manager entered around stage ``name``, which is blocked on before it exits (per-stage wall time);
    and ``teacher`` (the learner network's outputs at ``obs``), passed to the stages that declare
    ``takes_teacher`` (the chain declares it when any stage does); and ``children`` (a search's root
    children, module docstring), passed likewise to the stages that declare ``takes_children``.

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

    def compress(params, state, obs, *, timer=None, teacher=None, children=None):
        # timer(name): a context manager around each stage, which is then blocked on inside it, so that
        # the Monitor can time a stage (distillation) apart from the rest; None: no blocking.
        new_state = {}
        for name, c in named:
            kwargs = {"teacher": teacher} if c.takes_teacher and teacher is not None else {}
            if c.takes_children and children is not None:
                kwargs["children"] = children
            if timer is None:
                params, new_state[name] = c.compress(params, state[name], obs, **kwargs)
            else:
                with timer(name):
                    params, new_state[name] = jax.block_until_ready(c.compress(params, state[name], obs, **kwargs))
        return params, new_state

    def actor_apply(apply):
        for _, c in named:
            apply = c.actor_apply(apply)
        return apply

    timed = tuple(name for name, c in named if c.timed_stages)
    return Compressor(init, compress, actor_apply, timed_stages=timed,
                      takes_teacher=any(c.takes_teacher for _, c in named),
                      takes_children=any(c.takes_children for _, c in named))
