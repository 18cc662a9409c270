"""``--learner-children``: the actor carries the learner's own parameters beside the compressed ones.

A search agent's compressed search compares its root's actions by ``r + γ v(child)``, and a small
student's values get the differences between those children wrong (docs/RESULTS.md, "Breakout-MinAtar
past 150k steps"). With ``--learner-children`` the learner's uncompressed network evaluates the root's
children and the compressed one every other node (:func:`accerl_jax.search.acting.search_policy`'s
``exact``). :func:`with_learner` wraps the run's compressor so that the actor's parameters are the pair
``(compressed, learner)`` and its apply function a :class:`PairedApply`, which acts as the compressed
network does and also offers the learner's (:meth:`PairedApply.learner`): every search over the pair
(the actors', the evaluation's, the Monitor's fidelity check) then evaluates the children with the learner's
network without being told.
"""
from __future__ import annotations

from accerl_jax.compressor.base import Compressor
from accerl_jax.types import ApplyFn


class PairedApply:
    """The apply function of paired actor parameters ``(compressed, learner)``.

    Calling it, ``(params, obs [N, *obs_shape]) -> (policy_out [N, ...], value [N], ...)``, runs the
    compressed network on ``params[0]`` (the policy the actor's divergence and speed are measured on);
    :meth:`learner` runs the learner's network on ``params[1]``.

    Args:
      actor_apply: the compressed network's apply function (the inner compressor's ``actor_apply``).
      learner_apply: the learner network's.
    """

    def __init__(self, actor_apply: ApplyFn, learner_apply: ApplyFn):
        self.actor_apply = actor_apply
        self.learner_apply = learner_apply

    def __call__(self, params, obs, *args, **kwargs):
        return self.actor_apply(params[0], obs, *args, **kwargs)

    def learner(self, params, obs):
        """The learner's network at ``obs`` under ``params[1]``: ``(policy_out, value, ...)``."""
        return self.learner_apply(params[1], obs)


def with_learner(inner: Compressor) -> Compressor:
    """``inner`` whose actor parameters are ``(inner's actor parameters, the learner's parameters)``
    (those ``compress`` was given: the actor's learner copy is as fresh as its compressed one) and whose
    ``actor_apply`` is a :class:`PairedApply`; its state, stages and what it takes from the loop are
    ``inner``'s."""

    def init(params, key, obs=None):
        actor, state = inner.init(params, key, obs)
        return (actor, params), state

    def compress(params, state, obs, **kwargs):
        actor, state = inner.compress(params, state, obs, **kwargs)
        return (actor, params), state

    return Compressor(init=init, compress=compress,
                      actor_apply=lambda apply: PairedApply(inner.actor_apply(apply), apply),
                      timed_stages=inner.timed_stages, takes_teacher=inner.takes_teacher,
                      takes_children=inner.takes_children)
