"""The pieces of one update at a run's shapes, and their cost split (:mod:`accerl_jax.cost`; docs/DESIGN.md,
"Where compression can pay").

The pieces are the ones the Anakin program fuses: a rollout of ``T`` steps of the ``B`` envs with the
acting (compressed) policy, the same rollout with the learner's own policy, the learner update (with
the outputs a distill compressor reuses, ``Run.teacher_update``) and one compression. :func:`cost_split`
always counts their FLOPs (XLA's cost analysis of each piece lowered alone; nothing is compiled) and,
when asked (``--cost-split``), also compiles and times each alone.
"""
from __future__ import annotations

from typing import Any, Callable

import jax

from accerl_jax import cost
from accerl_jax.run import Run, teacher_kwargs

FLOPS_SOURCE = ("XLA's cost analysis of each piece lowered alone at the run's shapes, loops unrolled "
                "(accerl_jax.cost.flops; nothing compiled)")
TIMED_SOURCE = "each piece compiled and timed alone at the run's shapes (median of 20 interleaved calls)"


def has_pieces(run: Run) -> bool:
    """Whether :func:`cost_split` can split this run: a jittable (gymnax) actor, one process, and a
    compressor that runs in the program (not ``auto``, whose compressor changes while training, nor
    ``--distill-async``'s host thread)."""
    return (run.actor_for is not None and run.num_processes == 1 and not run.plan.auto
            and not run.cfg.distill_async)


def _compress_fn(run: Run) -> Callable:
    """``(learner params, compressor state, obs [T * B, ...], teacher outputs or None) -> (actor params,
    compressor state)``, the teacher outputs ``[T, B, ...]`` flattened as the Anakin program hands them over."""
    def compress(params, state, obs, outputs):
        teacher = teacher_kwargs([] if outputs is None else [outputs], obs.shape[0])
        return run.compressor.compress(params, state, obs, **teacher)

    return compress


def cost_split(run: Run, learner, actor_params, comp_state, carry, timed: bool) -> dict:
    """The per-update cost split of ``run``'s pieces at the state given (one seed's).

    Args:
      run: the run (:func:`has_pieces` must hold).
      learner: the learner state (:class:`accerl_jax.learner.LearnerState`).
      actor_params: the compressed parameters the actor acts with.
      comp_state: the compressor's state.
      carry: the actor's carry (env states, observations ``[B, ...]``, key).
      timed: also compile and time each piece alone (:func:`accerl_jax.cost.time_pieces`, 20 rounds).

    Returns:
      ``{"flops": amdahl(..., unit="flops"), "flops_source": ..., "timed": timed}``; with ``timed`` also
      the seconds (:func:`accerl_jax.cost.amdahl`'s keys, ``actor_s_per_update``, ...) and
      ``timed_source``. ``actor_share``, ``ceiling`` and ``predicted_saving`` at the top level are the
      timed ones when timed, else the FLOPs ones; ``ceiling_source`` (``"timed"`` or ``"flops"``) says
      which. Compression counts once per ``--compress-every`` updates.

    Raises:
      ValueError: ``run`` has no separable pieces (:func:`has_pieces`).
    """
    if not has_pieces(run):
        raise ValueError("this run's update has no separable pieces (envpool, several processes, "
                         "--compressor auto or --distill-async)")
    every = run.cfg.compress_every
    roll = run.actor.rollout_fn
    roll_uncompressed = run.actor_for(run.learner_apply).rollout_fn
    reuse = run.teacher_update is not None
    update = run.teacher_update if reuse else run.update
    compress = _compress_fn(run)
    actor_flops, (_, rollout_shape) = cost.flops_and_shape(roll, actor_params, carry)
    if run.cfg.compressor == "none":  # the actor runs the learner's own policy
        uncompressed_flops = actor_flops
    else:
        uncompressed_flops = cost.flops(roll_uncompressed, learner.params, carry)
    learner_flops, update_shape = cost.flops_and_shape(update, learner, rollout_shape)
    obs_shape = jax.ShapeDtypeStruct((rollout_shape.obs.shape[0] * rollout_shape.obs.shape[1],)
                                     + tuple(rollout_shape.obs.shape[2:]), rollout_shape.obs.dtype)
    outputs_shape = update_shape[2] if reuse else None
    compress_flops = cost.flops(compress, learner.params, comp_state, obs_shape, outputs_shape)
    split: dict[str, Any] = {
        "flops": cost.amdahl(actor_flops, uncompressed_flops, learner_flops, compress_flops / every, unit="flops"),
        "flops_source": FLOPS_SOURCE, "timed": timed,
    }
    shares = split["flops"]
    if timed:
        roll_c, roll_u, compress_c = jax.jit(roll), jax.jit(roll_uncompressed), jax.jit(compress)
        _, rollout = roll_c(actor_params, carry)
        outputs = update(learner, rollout)[2] if reuse else None
        obs = rollout.obs.reshape(obs_shape.shape)
        seconds = cost.time_pieces({
            "actor": lambda: roll_c(actor_params, carry),
            "uncompressed_actor": lambda: roll_u(learner.params, carry),
            "learner": lambda: update(learner, rollout),
            "compress": lambda: compress_c(learner.params, comp_state, obs, outputs),
        }, repeats=20)
        shares = cost.amdahl(seconds["actor"], seconds["uncompressed_actor"], seconds["learner"],
                             seconds["compress"] / every)
        split.update(shares, timed_source=TIMED_SOURCE)
    split.update(actor_share=shares["actor_share"], ceiling=shares["ceiling"],
                 predicted_saving=shares["predicted_saving"], ceiling_source="timed" if timed else "flops")
    return split
