"""The pieces of one update at a run's shapes, and their cost split (:mod:`accerl_jax.platform.cost`; docs/DESIGN.md,
"Where compression can pay").

The pieces are the ones the Anakin program fuses: a rollout of ``T`` steps of the ``B`` envs with the
acting (compressed) policy, the same rollout with the learner's own policy, the learner update (with
the outputs a distill compressor reuses, ``Run.teacher_update``) and one compression. :func:`cost_split`
always counts their FLOPs (XLA's cost analysis of each piece lowered alone; nothing is compiled) and,
when asked (``--cost-split``), also compiles and times each alone.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import jax

from accerl_jax.platform import cost
from accerl_jax.loops.anakin_program import compress_inputs
from accerl_jax.loops.shared import learner_update
from accerl_jax.run import auto_gate
from accerl_jax.run.build import Run

FLOPS_SOURCE = ("XLA's cost analysis of each piece lowered alone at the run's shapes, loops unrolled "
                "(accerl_jax.platform.cost.flops; nothing compiled)")
TIMED_SOURCE = "each piece compiled and timed alone at the run's shapes (median of 20 interleaved calls)"


def has_pieces(run: Run) -> bool:
    """Whether :func:`cost_split` can split this run: a jittable (gymnax) actor, one process, and a
    compressor that runs in the program (not ``auto``, whose compressor changes while training, nor
    ``--distill-async``'s host thread)."""
    return (run.actor_for is not None and run.plan.num_processes == 1 and not run.plan.auto
            and not run.cfg.distill_async)


def _compress_fn(run: Run, split_rows: bool = False) -> Callable:
    """``(learner params, compressor state, obs [T * B, ...], teacher outputs or None, rollout or None) ->
    (actor params, compressor state)``, the teacher outputs ``[T, B, ...]`` flattened as the Anakin program
    hands them over, and a search rollout's recorded children likewise (``--distill-children``): the
    program's own :func:`~accerl_jax.loops.anakin_program.compress_inputs`. With ``split_rows`` they are split
    by rows over the run's devices first, as the Anakin program splits them (a distillation then runs
    data-parallel, as in the program; unsplit, XLA may run it whole on every device)."""
    def compress(params, state, obs, outputs, rollout=None):
        obs, kwargs = compress_inputs(run, run.compressor, obs, [] if outputs is None else [outputs], rollout,
                                      split_rows)
        return run.compressor.compress(params, state, obs, **kwargs)

    return compress


def count_flops(run: Run, learner, actor_params, comp_state, carry) -> dict:
    """The FLOPs part of :func:`cost_split`: ``{"flops": amdahl(..., unit="flops"), "flops_source": ...}``;
    ``run.counted_flops`` where ``--compressor auto``'s gate counted them before training (:mod:`accerl_jax.run.auto_gate`).

    Only shapes and dtypes are read: the arguments may be arrays or ``jax.ShapeDtypeStruct`` trees (as
    :class:`BackgroundFlops` passes them). Nothing is compiled or run.

    Raises:
      ValueError: ``run`` has no separable pieces (:func:`has_pieces`).
    """
    if not has_pieces(run):
        raise ValueError("this run's update has no separable pieces (envpool, several processes, "
                         "--compressor auto or --distill-async)")
    if run.counted_flops is not None:  # --compressor auto resolved to none: its gate counted them already
        return {"flops": dict(run.counted_flops), "flops_source": auto_gate.FLOPS_SOURCE}
    reuse = run.teacher_update is not None
    update = learner_update(run)
    actor_flops, (_, rollout_shape) = cost.flops_and_shape(run.actor.rollout_fn, actor_params, carry)
    if run.cfg.compressor == "none":  # the actor runs the learner's own policy
        uncompressed_flops = actor_flops
    else:
        uncompressed_flops = cost.flops(run.actor_for(run.learner_apply).rollout_fn, learner.params, carry)
    learner_flops, update_shape = cost.flops_and_shape(update, learner, rollout_shape)
    obs_shape = _flat_obs(rollout_shape.obs)
    outputs_shape = update_shape[2] if reuse else None
    compress_flops = cost.flops(_compress_fn(run), learner.params, comp_state, obs_shape, outputs_shape,
                                rollout_shape)
    return {"flops": cost.amdahl(actor_flops, uncompressed_flops, learner_flops,
                                 compress_flops / run.cfg.compress_every, unit="flops"),
            "flops_source": FLOPS_SOURCE}


def _flat_obs(obs) -> jax.ShapeDtypeStruct:
    """The shape of a rollout's ``obs [T, B, ...]`` flattened to ``[T * B, ...]``, as the Anakin program
    hands it to the compressor."""
    return jax.ShapeDtypeStruct((obs.shape[0] * obs.shape[1],) + tuple(obs.shape[2:]), obs.dtype)


class BackgroundFlops:
    """:func:`count_flops` in a daemon thread, so that a loop can count while its program runs instead of
    after it (tracing and lowering the pieces takes host time). The Anakin loop starts
    it with the chunk that ends the budget: started with the first chunk, it slowed the training it ran
    beside by about as much as it took. Pass ``jax.ShapeDtypeStruct`` trees: arrays the program may take
    over (donated buffers) must not be read by the thread. :meth:`result` waits for it."""

    def __init__(self, run: Run, learner, actor_params, comp_state, carry):
        self._result: dict | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._count, args=(run, learner, actor_params, comp_state, carry),
                                        daemon=True, name="accerl-count-flops")
        self._thread.start()

    def _count(self, run: Run, *shapes) -> None:
        try:
            self._result = count_flops(run, *shapes)
        except BaseException as err:  # re-raised by result(), in the caller's thread
            self._error = err

    def result(self) -> dict:
        """:func:`count_flops`'s dict, once the thread has finished; re-raises what it raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result


def cost_split(run: Run, learner, actor_params, comp_state, carry, timed: bool, flops: dict | None = None,
               split_rows: bool = False) -> dict:
    """The per-update cost split of ``run``'s pieces at the state given (one seed's).

    Args:
      run: the run (:func:`has_pieces` must hold).
      learner: the learner state (:class:`accerl_jax.learner.LearnerState`).
      actor_params: the compressed parameters the actor acts with.
      comp_state: the compressor's state.
      carry: the actor's carry (env states, observations ``[B, ...]``, key).
      timed: also compile and time each piece alone (:func:`accerl_jax.platform.cost.time_pieces`, 20 rounds).
      flops: :func:`count_flops`'s result at these shapes if already counted (:class:`BackgroundFlops`);
        None counts them here.
      split_rows: time the compression with its rows split over the run's devices, as the Anakin program
        runs it (:func:`_compress_fn`); on one device the same program either way.

    Returns:
      ``{"flops": amdahl(..., unit="flops"), "flops_source": ..., "timed": timed}``; with ``timed`` also
      the seconds (:func:`accerl_jax.platform.cost.amdahl`'s keys, ``actor_s_per_update``, ...) and
      ``timed_source``. ``actor_share``, ``ceiling`` and ``predicted_saving`` at the top level are the
      timed ones when timed, else the FLOPs ones; ``ceiling_source`` (``"timed"`` or ``"flops"``) says
      which. Compression counts once per ``--compress-every`` updates.

    Raises:
      ValueError: ``run`` has no separable pieces (:func:`has_pieces`).
    """
    split: dict[str, Any] = dict(flops if flops is not None else count_flops(run, learner, actor_params, comp_state, carry),
                                 timed=timed)
    shares = split["flops"]
    if timed:
        reuse = run.teacher_update is not None
        update = learner_update(run)
        roll_c = jax.jit(run.actor.rollout_fn)
        roll_u = jax.jit(run.actor_for(run.learner_apply).rollout_fn)
        compress_c = jax.jit(_compress_fn(run, split_rows))
        _, rollout = roll_c(actor_params, carry)
        outputs = update(learner, rollout)[2] if reuse else None
        obs = rollout.obs.reshape(_flat_obs(rollout.obs).shape)
        seconds = cost.time_pieces({
            "actor": lambda: roll_c(actor_params, carry),
            "uncompressed_actor": lambda: roll_u(learner.params, carry),
            "learner": lambda: update(learner, rollout),
            "compress": lambda: compress_c(learner.params, comp_state, obs, outputs, rollout),
        }, repeats=20)
        shares = cost.amdahl(seconds["actor"], seconds["uncompressed_actor"], seconds["learner"],
                             seconds["compress"] / run.cfg.compress_every)
        split.update(shares, timed_source=TIMED_SOURCE)
    split.update(actor_share=shares["actor_share"], ceiling=shares["ceiling"],
                 predicted_saving=shares["predicted_saving"], ceiling_source="timed" if timed else "flops")
    return split
