"""What every stepper does alike: the learner update it runs, the state a checkpoint saves, the actor's
carry on ``--resume``, and the divergence of the actor's policy from the learner's."""
from __future__ import annotations

from typing import Callable

from accerl_jax.run import checkpoint
from accerl_jax.run.build import Run


def learner_update(run: Run) -> Callable:
    """The learner update a loop runs: ``run.teacher_update`` when the compressor takes the learner's
    outputs at the rollout's observations as its teacher's (no second teacher forward pass), else
    ``run.update``. The teacher update returns those outputs after its metrics."""
    return run.update if run.teacher_update is None else run.teacher_update


def snapshot(run: Run, learner, lagged, comp_state, *, carry=None, key=None, normalizer=None) -> checkpoint.TrainState:
    """What a checkpoint saves: the learner state, the lagged compressed parameter sets (oldest first),
    the compressor state and the actor's ``carry`` -- all of it for jittable envs, only its PRNG key for
    host envs (:func:`accerl_jax.run.checkpoint.host_key_only`) -- or, where the loop keeps no carry (its
    actors are threads), the actors' base ``key``; and the ``normalizer`` statistics
    (:class:`accerl_jax.normalize.NormState`, None without normalisation)."""
    saved = key if carry is None else checkpoint.host_key_only(carry, run.info.jittable)
    return checkpoint.TrainState(learner, tuple(lagged), comp_state, saved, normalizer)


def resumed_carry(run: Run, saved):
    """The actor's carry of a ``--resume``: the saved one for jittable envs; host envs cannot be saved,
    so they restart (:meth:`reset`) and only the actor's PRNG key (``saved``) continues."""
    return saved if run.info.jittable else run.actor.reset(run.k_actor)._replace(key=saved)


def divergence(run: Run, learner_params, actor_params, obs, samples: int) -> dict:
    """KL(π_learner ‖ π_actor) and greedy-action agreement (``run.divergence``'s dict of [] scalars) on the
    first ``samples`` of ``obs [..., *obs_shape]`` (flattened to ``[N, *obs_shape]``)."""
    held = obs.reshape((-1,) + tuple(run.info.obs_shape))[:samples]
    return run.divergence(run.learner_logits(learner_params, held), run.actor_logits(actor_params, held))
