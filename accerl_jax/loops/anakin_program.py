"""The Anakin loop's program: the whole actor-learner update as one traceable step, and a *chunk* of
updates as one jitted ``lax.scan`` (Podracer's Anakin, Hessel et al. 2021, https://arxiv.org/abs/2104.06272).

One *update* is: a rollout of ``T`` steps of the ``B`` envs with the compressed policy the actor was
given, the Corrector and learner update with the non-finite guard fused in
(:func:`accerl_jax.run.guard.guard_update`), and re-compression of the new learner parameters every
``--compress-every`` updates; a distill compressor gets the learner's own outputs at the rollout's
observations as its teacher's (``Run.teacher_update``), so no second teacher forward pass is traced. The actor acts with the compressed parameters made ``--policy-lag`` updates
before the latest (a fixed-length tuple in the state, oldest first); each set carries its *policy
version* (the update after which it was compressed), so the lag of the acting policy is known at every
update. The host side (:mod:`accerl_jax.loops.anakin`) dispatches chunks and reads their outputs.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.extend.core import jaxpr_as_fun
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from accerl_jax import learner as learner_lib
from accerl_jax import normalize
from accerl_jax.platform import xla
from accerl_jax.actor import ActorCarry
from accerl_jax.compressor import Compressor
from accerl_jax.run import guard as guard_lib
from accerl_jax.run import replicas
from accerl_jax.run.guard import FINITE
from accerl_jax.loops.shared import learner_update
from accerl_jax.run.build import DIVERGENCE_SAMPLES, REFRESH_SAMPLES, Run, children_kwargs, teacher_kwargs


class AnakinState(NamedTuple):
    """The scan carry of the Anakin loop (one seed; ``--num-seeds`` adds a leading seed axis to every leaf)."""

    learner: learner_lib.LearnerState
    actor_params: tuple  # the last --policy-lag + 1 compressed parameter sets, oldest first; the actor runs [0]
    versions: jax.Array  # [policy_lag + 1] int32: the update after which each set was compressed (0: initial)
    compressor: Any  # compressor state, dict keyed by stage name
    carry: ActorCarry  # env state, current observations, action-sampling key
    obs: jax.Array  # [T * B, *obs_shape] the last rollout's observations (held-out set for divergence logs)
    update: jax.Array  # [] int32, updates completed
    skipped: jax.Array  # [] int32, updates skipped by --on-nan skip
    streak: jax.Array  # [] int32, consecutive updates skipped up to the last (--on-nan skip; 0 after a resume)
    # [] int32, the first update with a non-finite quantity (--on-nan stop), or the one that made more than
    # accerl_jax.run.guard.MAX_SKIP_STREAK consecutive skips (--on-nan skip); 0: none
    bad_update: jax.Array
    bad_quantity: jax.Array  # [] int32, its index into accerl_jax.run.guard.QUANTITIES, FINITE (-1): none
    # --normalize-observations / --normalize-rewards: the running statistics (accerl_jax.normalize.NormState),
    # replicated; None (no leaves) without normalisation
    normalizer: Any = None
    # {name: [] float32}: the learner's hyperparameters (accerl_jax.learner.HYPER), an input of the program
    # rather than its constants, so that a run with other values reuses the compiled chunk; not saved in
    # checkpoints (a resumed run takes them from its settings)
    hyper: Any = None


class UpdateOutput(NamedTuple):
    """What one update hands the host (stacked over the chunk: a leading ``[C]`` axis)."""

    metrics: dict  # [] float32 each: the learner's metrics, skipped_updates, policy_lag_versions
    episode_return: jax.Array  # [T, B] float32, return of the episode that ended at each step
    finished: jax.Array  # [T, B] bool, an episode ended at this step
    episode_length: jax.Array  # [T, B] int32, length (agent steps) of the episode that ended at each step
    refreshed: jax.Array  # [] bool, the actor's policy was re-compressed after this update


@jax.tree_util.register_pytree_node_class
class Columns:
    """An array ``[..., M]`` whose last axis holds ``M`` named columns; the names are static pytree data, so
    they travel with the values through ``jit``, ``vmap`` and ``jax.device_get`` as one leaf."""

    def __init__(self, values, names: tuple):
        self.values, self.names = values, tuple(names)

    def tree_flatten(self):
        return (self.values,), self.names

    @classmethod
    def tree_unflatten(cls, names, children):
        return cls(children[0], names)

    def as_dict(self) -> dict:
        """``{name: values[..., i]}`` in column order."""
        return {k: self.values[..., i] for i, k in enumerate(self.names)}


class ChunkOutput(NamedTuple):
    """What a chunk hands the host, its :class:`UpdateOutput` s packed into a few arrays (each array is one
    host copy, whose fixed cost the chunk's ~26 separate leaves paid 26 times; :func:`unpack` restores them).

    Attributes:
      metrics: :class:`Columns` ``[C, M]`` float32, the updates' metrics by name.
      episodes: ``[3, C, T, B]`` float32: each step's ``episode_return``, ``finished`` (0 or 1) and
        ``episode_length`` (agent steps; exact in float32 below 2**24).
      refreshed: ``[C]`` bool, as :attr:`UpdateOutput.refreshed`.
      counters: ``[3]`` int32, the chunk's final ``bad_update``, ``bad_quantity`` and ``skipped``.
    """

    metrics: Columns
    episodes: jax.Array
    refreshed: jax.Array
    counters: jax.Array


def pack(out: UpdateOutput, state: "AnakinState") -> ChunkOutput:
    """``out`` (stacked over a chunk) and ``state``'s counters as a :class:`ChunkOutput` (traced)."""
    f32 = jnp.float32
    names = tuple(sorted(out.metrics))
    return ChunkOutput(Columns(jnp.stack([out.metrics[k].astype(f32) for k in names], axis=-1), names),
                       jnp.stack([out.episode_return.astype(f32), out.finished.astype(f32),
                                  out.episode_length.astype(f32)]),
                       out.refreshed,
                       jnp.stack([state.bad_update, state.bad_quantity, state.skipped]).astype(jnp.int32))


def unpack(packed: ChunkOutput) -> tuple[UpdateOutput, tuple]:
    """One seed's fetched :class:`ChunkOutput` (numpy arrays) as its :class:`UpdateOutput` (``[C, ...]``) and
    the counters ``(bad_update, bad_quantity, skipped)`` as ints: what :func:`pack` packed, bit for bit."""
    ret, finished, length = packed.episodes
    out = UpdateOutput(packed.metrics.as_dict(), ret, finished > 0, length.astype(np.int32), packed.refreshed)
    return out, tuple(int(x) for x in packed.counters)


class ChunkEnd(NamedTuple):
    """Measured inside the chunk's program on its final state (no extra dispatches on the host)."""

    divergence: dict  # KL(π_learner ‖ π_actor) and agreement of the policy the actor runs next
    refresh_divergence: dict  # the same for the freshest compressed policy (TensorBoard refresh/*)
    # --compressor auto only: [2] float32, the shares of the chunk's last rollout's valid steps with ρ > ρ̄
    # and ρ > ρ̄ · CLIP_MARGIN (AutoCompressor.clip_fractions, ρ from the learner parameters of that update).
    clipping: Any = None


def make_update_step(run: Run, with_rollout: bool = False, compressor: Compressor | None = None):
    """The traceable Anakin update ``(AnakinState, None) -> (AnakinState, UpdateOutput)`` for ``lax.scan``
    (``with_rollout``: ``-> (AnakinState, UpdateOutput, Rollout [T, B, ...])``, the rollout it trained on),
    compressing with ``compressor`` (default ``run.compressor``; ``--compressor auto``: one candidate's)."""
    cfg, info = run.cfg, run.info
    compressor = run.compressor if compressor is None else compressor
    # run.teacher_update: the learner's own outputs at the rollout's observations go to the compressor as
    # its teacher's (distillation then needs no second forward pass of the teacher).
    guarded = guard_lib.guard_update(learner_update(run), cfg.on_nan)
    every = cfg.compress_every
    # --normalize-observations: the actor acts on observations normalised with the statistics the update
    # starts with (its parameters paired with them); the learner and the compressor then get the rollout
    # normalised with the same statistics (accerl_jax.normalize.normalize_rollout), and the statistics
    # take the rollout's raw observations and rewards afterwards.
    norm_actor = (run.actor_for(normalize.normalized_apply(compressor.actor_apply(run.learner_apply)))
                  if cfg.normalize_observations else None)

    def act(s: AnakinState):
        if norm_actor is not None:
            return norm_actor.rollout_fn((s.actor_params[0], s.normalizer.obs), s.carry)
        return run.actor.rollout_fn(s.actor_params[0], s.carry)

    def step(s: AnakinState, _) -> tuple[AnakinState, UpdateOutput]:
        it = s.update + 1
        carry, rollout = act(s)
        normalizer = s.normalizer
        if normalizer is not None:
            raw, rollout = rollout, normalize.normalize_rollout(normalizer, rollout)
            normalizer = normalize.update_from_rollout(normalizer, raw.obs, raw.reward, raw.terminated | raw.truncated,
                                                       raw.valid, cfg.discount if s.hyper is None else s.hyper["discount"])
        learner, metrics, bad, *outputs = guarded(s.learner, rollout, it, s.hyper)
        bad = guard_lib.refine(bad, s.actor_params[0])  # a diverged student is named, not the learner
        if cfg.on_nan == "skip":
            skipped = s.skipped + (bad != FINITE).astype(jnp.int32)
            streak = jnp.where(bad != FINITE, s.streak + 1, 0).astype(jnp.int32)
            first_bad = (s.bad_update == 0) & (streak > guard_lib.MAX_SKIP_STREAK)
        else:
            skipped, streak = s.skipped, s.streak
            first_bad = (s.bad_update == 0) & (bad != FINITE)
        obs, kwargs = compress_inputs(run, compressor, rollout.obs.reshape((-1,) + tuple(info.obs_shape)),
                                      outputs, rollout)
        if every == 1:
            actor_params, comp_state = compressor.compress(learner.params, s.compressor, obs, **kwargs)
            refreshed, version = jnp.bool_(True), it
        else:
            refreshed = it % every == 0
            actor_params, comp_state = jax.lax.cond(
                refreshed, lambda: compressor.compress(learner.params, s.compressor, obs, **kwargs),
                lambda: (s.actor_params[-1], s.compressor))
            version = jnp.where(refreshed, it, s.versions[-1])
        new = AnakinState(
            learner=learner,
            actor_params=s.actor_params[1:] + (actor_params,),
            versions=jnp.concatenate([s.versions[1:], jnp.reshape(version, (1,)).astype(jnp.int32)]),
            compressor=comp_state,
            carry=carry,
            obs=obs,
            update=it,
            skipped=skipped,
            streak=streak,
            bad_update=jnp.where(first_bad, it, s.bad_update),
            bad_quantity=jnp.where(first_bad, bad, s.bad_quantity),
            normalizer=normalizer,
            hyper=s.hyper,
        )
        metrics = dict(metrics, skipped_updates=skipped.astype(jnp.float32),
                       policy_lag_versions=(s.update - s.versions[0]).astype(jnp.float32))
        finished = (rollout.terminated | rollout.truncated) & rollout.valid
        out = UpdateOutput(metrics, rollout.episode_return, finished, rollout.episode_length, refreshed)
        return (new, out, rollout) if with_rollout else (new, out)

    return step


def compress_inputs(run: Run, compressor: Compressor, obs, outputs: list, rollout, split_rows: bool = True):
    """``(obs, kwargs)`` for ``compressor.compress(params, state, obs, **kwargs)`` as the Anakin program hands
    them over: ``obs [T * B, ...]`` (the rollout's, flattened), the teacher's outputs from what the update
    returned after its metrics (``outputs``: ``[]`` or ``[LearnerOutputs [T, B, ...]]``,
    :func:`~accerl_jax.run.build.teacher_kwargs`) and a search rollout's recorded children
    (:func:`~accerl_jax.run.build.children_kwargs`, ``--distill-children``); with ``split_rows`` all of it
    split by rows over the run's devices (:func:`rows_over_devices`). The cost split times the compression
    on the same inputs (:mod:`accerl_jax.loops.pieces`)."""
    kwargs = teacher_kwargs(outputs, obs.shape[0])
    kwargs.update(children_kwargs(compressor, rollout, obs.shape[0]))
    return rows_over_devices(run.mesh, (obs, kwargs)) if split_rows else (obs, kwargs)


def rows_over_devices(mesh, tree):
    """``tree``'s arrays (rows first: the rollout's ``T * B`` observations and what the compressor takes
    with them) constrained to be split by rows over ``mesh``'s devices, or ``tree`` itself on one device.

    The compressor's state is replicated, so without this XLA computes a distillation replicated on every
    device: each device does all of it. Split by rows, XLA's partitioner runs it data-parallel (each
    device its rows, the student's gradient summed over the devices). Measured (Breakout-MinAtar, the
    learner-children benchmark's (b), 2 forced host devices on the 2-core CPU, 120k-step runs): 220 ms
    per update against 290 ms replicated; 1 device 303-323 ms.
    """
    if mesh.devices.size == 1:
        return tree
    return jax.lax.with_sharding_constraint(tree, NamedSharding(mesh, P(learner_lib.AXIS)))


def normalizing(run: Run) -> bool:
    """Whether ``run`` normalises observations or rewards (its state then carries
    :class:`accerl_jax.normalize.NormState`)."""
    return run.cfg.normalize_observations or run.cfg.normalize_rewards


def state_sharding(run: Run | None = None):
    """Where the Anakin state lives, on the learner's mesh (``run.mesh``: all devices of all processes).

    Without ``run``: one replicated sharding over this process's devices (a placement any single-process
    state accepts; :func:`make_chunk`'s call moves it to the run's own). With ``run``: a sharding per field
    of :class:`AnakinState` (a pytree prefix for :func:`jax.device_put` and ``jit``): the actor's carry
    (env state, observations and keys of its env groups, :class:`~accerl_jax.run.shards.ShardedActor`)
    sharded along its env-group axis (the leading axis, after the seed axis of ``--num-seeds`` > 1), so
    each device steps its own environments; the rest (learner, compressed parameters, counters, the last
    rollout's observations) replicated. For an envpool actor (one device), all replicated. With several
    processes these are global arrays (:func:`accerl_jax.loops.anakin_state.place_state`).
    """
    mesh = learner_lib.make_mesh() if run is None else run.mesh
    replicated = NamedSharding(mesh, P())
    if run is None:
        return replicated
    if run.info.jittable:
        batch = NamedSharding(mesh, P(None, learner_lib.AXIS) if replicas.count(run.cfg) > 1 else P(learner_lib.AXIS))
    else:
        batch = replicated
    return AnakinState(learner=replicated, actor_params=replicated, versions=replicated, compressor=replicated,
                       carry=ActorCarry(batch, batch, batch), obs=replicated, update=replicated,
                       skipped=replicated, streak=replicated, bad_update=replicated, bad_quantity=replicated,
                       normalizer=replicated if normalizing(run) else None,
                       hyper=None if getattr(learner_update(run), "hyper", None) is None else replicated)


def chunk_length(run: Run) -> int:
    """Updates per compiled chunk: chunks end at every --log-every and --checkpoint-every multiple, so none
    is longer than the smaller of the two (and the budget)."""
    cfg = run.cfg
    return min([cfg.log_every, run.plan.num_updates] + ([cfg.checkpoint_every] if cfg.checkpoint_every else []))


def make_chunk(run: Run, clipping: Callable | None = None, compressor: Compressor | None = None):
    """The jitted chunk ``(AnakinState, active) -> (AnakinState, UpdateOutput [C, ...], ChunkEnd)``: one
    ``lax.scan`` of ``C =`` :func:`chunk_length` steps of which the first ``active`` ([] int32, traced)
    run an update and the rest leave the state as it is (their outputs are zeros), so that a chunk cut
    short (the budget's end, a resume between boundaries) reuses the one compiled program (a second
    length would compile it again). Vmapped over the seed axis for ``--num-seeds`` > 1.

    The call ``(state, active) -> (state, ChunkOutput, ChunkEnd)`` runs ``active`` updates (the rest of
    the compiled length idles). The state is placed on :func:`state_sharding` ``(run)`` before each call
    (skipped for the state the previous call returned, which is there already) and the returned state is
    put there too, so that every call hits the same compiled program (different shardings compile the program a second time). With several local devices the env
    groups (carry) are sharded along the batch axis, the actor steps each device's own under
    ``shard_map`` and the learner's update is data-parallel over the same mesh: the rollouts and, to float
    tolerance, the updates equal one device's for the same global batch.

    ``clipping(params, rollout) -> (clipped, beyond)`` ([] float32 each; ``--compressor auto``'s
    :meth:`~accerl_jax.compressor.auto.AutoCompressor.clip_fractions`), if given, is measured on the
    chunk's last update only (one extra forward pass per chunk) and returned as ``ChunkEnd.clipping``.
    ``compressor`` (default ``run.compressor``) is the one the program runs (``--compressor auto``: one
    candidate's, :class:`~accerl_jax.loops.anakin_auto.AutoChunks`).
    The returned function's ``jitted`` attribute is the compiled ``jax.jit`` object (its cache counts
    compilations).
    """
    step = make_update_step(run, with_rollout=clipping is not None, compressor=compressor)
    length = chunk_length(run)

    def chunk(state: AnakinState, active):
        def update(carry, i):
            s, clip = carry
            if clipping is None:
                new, out = step(s, None)
            else:
                new, out, rollout = step(s, None)
                clip = jax.lax.cond(i == active - 1, lambda: jnp.stack(clipping(s.learner.params, rollout)),
                                    lambda: clip)
            return (new, clip), out

        clip = None if clipping is None else jnp.zeros((2,), jnp.float32)
        # Tracing the update is most of building the program (part of every run's start-up), so it is
        # traced once: its jaxpr is the cond's update branch (the same program as tracing it there), and
        # its output shapes give the idle branch's zeros.
        traced, shapes = jax.make_jaxpr(update, return_shape=True)((state, clip), jnp.int32(0))
        out_tree = jax.tree.structure(shapes)

        def traced_update(carry, i):
            return jax.tree.unflatten(out_tree, jaxpr_as_fun(traced)(*jax.tree.leaves((carry, i))))

        def idle(carry, i):
            return carry, jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes[1])

        def body(carry, i):
            return jax.lax.cond(i < active, traced_update, idle, carry, i)

        (state, clip), out = jax.lax.scan(body, (state, clip), jnp.arange(length, dtype=jnp.int32))
        held, fresh = state.obs[:DIVERGENCE_SAMPLES], state.obs[:REFRESH_SAMPLES]
        learner_out = lambda o: run.learner_apply(state.learner.params, o)[0]  # noqa: E731
        divergence = run.divergence(learner_out(held), run.actor_apply(state.actor_params[0], held)[0])
        if run.cfg.agent == "search":  # the compressed search against the learner's, from held env states
            from accerl_jax.search.acting import SearchSettings
            from accerl_jax.search.fidelity import search_divergence

            divergence.update(search_divergence(run.actor_apply, run.learner_apply, run.actor.env.model,
                                                SearchSettings.from_config(run.cfg), state.actor_params[0],
                                                state.learner.params, state.carry))
        end = ChunkEnd(divergence,
                       run.divergence(learner_out(fresh), run.actor_apply(state.actor_params[-1], fresh)[0]),
                       clip)
        return state, pack(out, state), end

    if replicas.count(run.cfg) > 1:
        chunk = jax.vmap(chunk, in_axes=(0, None))
    # The outputs are small ([C, T, B] episode records, [] metrics) and replicated: with several processes
    # every process reads all episodes from its own copy.
    placed, replicated = state_sharding(run), NamedSharding(run.mesh, P())
    jitted = xla.jit(chunk, run.plan.spec.family, out_shardings=(placed, replicated, replicated))

    last = [None]  # the state the previous call returned (already placed: out_shardings)

    def call(state: AnakinState, active: int):
        # Placing a state is a host-side walk over its ~70 leaves, costlier than dispatching the chunk
        # (measured 2-10 ms against 0.6 ms, CartPole's default shapes): only a state this function did not
        # return itself (the first, a restored or a hand-made one) is placed.
        if state is not last[0]:
            state = jax.device_put(state, placed)
        new, out, end = jitted(state, np.int32(active))
        last[0] = new
        return new, out, end

    call.jitted = jitted
    return call


def _seed(tree, k: int, seeds: int):
    return jax.tree.map(lambda x: x[k], tree) if seeds > 1 else tree
