"""The Anakin loop (``--loop anakin``; the default for gymnax): the whole actor-learner iteration in one
jitted program (Podracer's Anakin, Hessel et al. 2021, https://arxiv.org/abs/2104.06272; issue 5).

One *update* is: a rollout of ``T`` steps of the ``B`` envs with the compressed policy the actor
was given, the Corrector and learner update with the non-finite guard fused in
(:func:`accerl_jax.guard.guard_update`), and re-compression of the new learner parameters every
``--compress-every`` updates. A *chunk* of updates (up to the next ``--log-every`` /
``--checkpoint-every`` boundary) is one ``lax.scan`` of that update inside one jitted call; between
chunks the host logs, checkpoints and checks for signals, so a signal stops the run within a chunk.

Pipelining: the actor acts with the compressed parameters made ``--policy-lag`` updates before the latest
(a fixed-length tuple in the scan carry, oldest first), and each set carries its *policy version* (the
update after which it was compressed), so the lag of the acting policy behind the learner is known at
every update and logged as ``policy_lag_versions``.

Environments: gymnax envs are pure functions, stepped in the program. envpool envs (only by an explicit
``--loop anakin``; ``--loop auto`` picks Sebulba for them) are stepped in the same program through
envpool's XLA interface (:class:`accerl_jax.envs.envpool_env.EnvpoolXlaEnv`): each step is a
side-effecting call on the one host pool, ordered by the handle threaded through the scan carry, with the
host adapter's reset rule (envpool's reset step is ``valid = False``). The pool cannot be copied, so
envpool runs take one seed and one local device; its state cannot be saved, so a checkpoint keeps the
actor's key and ``--resume`` restarts the envs (as the sequential loop does).

``--num-seeds N`` trains N independent seeds (``--seed + k``) at once: the chunk is ``vmap``-ed over a
leading seed axis of the state; each seed gets ``<logdir>/seed<k>/`` (metrics.csv, summary.json, curves)
and the run's summary lists them.

``--compressor auto`` (one seed) runs here too: :class:`AutoChunks` takes the decisions at chunk
boundaries and keeps one compiled chunk program per candidate (:mod:`accerl_jax.compressor.auto`).
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from accerl_jax import checkpoint, networks, xla
from accerl_jax import guard as guard_lib
from accerl_jax import learner as learner_lib
from accerl_jax.actor import ActorCarry, AnakinActor
from accerl_jax.compressor.auto import AutoState
from accerl_jax.guard import FINITE, guard_update, quantity
from accerl_jax.monitor import Monitor
from accerl_jax.run import (DIVERGENCE_SAMPLES, REFRESH_SAMPLES, Run, measure_speed, policy_versions, summarize,
                            unmeasured_speed)
from accerl_jax.signals import Interrupted, StopSignals


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
    bad_update: jax.Array  # [] int32, the first update with a non-finite quantity (--on-nan stop), 0: none
    bad_quantity: jax.Array  # [] int32, its index into accerl_jax.guard.QUANTITIES, FINITE (-1): none


class UpdateOutput(NamedTuple):
    """What one update hands the host (stacked over the chunk: a leading ``[C]`` axis)."""

    metrics: dict  # [] float32 each: the learner's metrics, skipped_updates, policy_lag_versions
    episode_return: jax.Array  # [T, B] float32, return of the episode that ended at each step
    finished: jax.Array  # [T, B] bool, an episode ended at this step
    episode_length: jax.Array  # [T, B] int32, length (agent steps) of the episode that ended at each step
    refreshed: jax.Array  # [] bool, the actor's policy was re-compressed after this update


class ChunkEnd(NamedTuple):
    """Measured inside the chunk's program on its final state (no extra dispatches on the host)."""

    divergence: dict  # KL(π_learner ‖ π_actor) and agreement of the policy the actor runs next
    refresh_divergence: dict  # the same for the freshest compressed policy (TensorBoard refresh/*)
    # --compressor auto only: [2] float32, the shares of the chunk's last rollout's valid steps with ρ > ρ̄
    # and ρ > ρ̄ · CLIP_MARGIN (AutoCompressor.clip_fractions, ρ from the learner parameters of that update).
    clipping: Any = None


def make_update_step(run: Run, with_rollout: bool = False):
    """The traceable Anakin update ``(AnakinState, None) -> (AnakinState, UpdateOutput)`` for ``lax.scan``
    (``with_rollout``: ``-> (AnakinState, UpdateOutput, Rollout [T, B, ...])``, the rollout it trained on)."""
    cfg, compressor, info = run.cfg, run.compressor, run.info
    guarded = guard_update(run.update, cfg.on_nan)
    every = cfg.compress_every

    def step(s: AnakinState, _) -> tuple[AnakinState, UpdateOutput]:
        it = s.update + 1
        carry, rollout = run.actor.rollout_fn(s.actor_params[0], s.carry)
        learner, metrics, bad = guarded(s.learner, rollout, it)
        skipped = s.skipped + (bad != FINITE).astype(jnp.int32) if cfg.on_nan == "skip" else s.skipped
        obs = rollout.obs.reshape((-1,) + tuple(info.obs_shape))
        if every == 1:
            actor_params, comp_state = compressor.compress(learner.params, s.compressor, obs)
            refreshed, version = jnp.bool_(True), it
        else:
            refreshed = it % every == 0
            actor_params, comp_state = jax.lax.cond(
                refreshed, lambda: compressor.compress(learner.params, s.compressor, obs),
                lambda: (s.actor_params[-1], s.compressor))
            version = jnp.where(refreshed, it, s.versions[-1])
        first_bad = (s.bad_update == 0) & (bad != FINITE) if cfg.on_nan == "stop" else jnp.bool_(False)
        new = AnakinState(
            learner=learner,
            actor_params=s.actor_params[1:] + (actor_params,),
            versions=jnp.concatenate([s.versions[1:], jnp.reshape(version, (1,)).astype(jnp.int32)]),
            compressor=comp_state,
            carry=carry,
            obs=obs,
            update=it,
            skipped=skipped,
            bad_update=jnp.where(first_bad, it, s.bad_update),
            bad_quantity=jnp.where(first_bad, bad, s.bad_quantity),
        )
        metrics = dict(metrics, skipped_updates=skipped.astype(jnp.float32),
                       policy_lag_versions=(s.update - s.versions[0]).astype(jnp.float32))
        finished = (rollout.terminated | rollout.truncated) & rollout.valid
        out = UpdateOutput(metrics, rollout.episode_return, finished, rollout.episode_length, refreshed)
        return (new, out, rollout) if with_rollout else (new, out)

    return step


def state_sharding():
    """Where the Anakin state lives: replicated over the learner's mesh of all local devices."""
    return NamedSharding(learner_lib.make_mesh(), P())


def chunk_length(run: Run) -> int:
    """Updates per compiled chunk: chunks end at every --log-every and --checkpoint-every multiple, so none
    is longer than the smaller of the two (and the budget)."""
    cfg = run.cfg
    return min([cfg.log_every, run.num_updates] + ([cfg.checkpoint_every] if cfg.checkpoint_every else []))


def make_chunk(run: Run, clipping: Callable | None = None):
    """The jitted chunk ``(AnakinState, active) -> (AnakinState, UpdateOutput [C, ...], ChunkEnd)``: one
    ``lax.scan`` of ``C =`` :func:`chunk_length` steps of which the first ``active`` ([] int32, traced)
    run an update and the rest leave the state as it is (their outputs are zeros), so that a chunk cut
    short (the budget's end, a resume between boundaries) reuses the one compiled program (compiling a
    second length cost ~24 s on a loaded 2-core CPU). Vmapped over the seed axis for ``--num-seeds`` > 1.

    Inputs are expected on :func:`state_sharding` and outputs are put there too, so that the state a
    chunk returns hits the same compiled program (otherwise its different shardings compile the
    program a second time: measured ~9 s on a loaded 2-core CPU).

    ``clipping(params, rollout) -> (clipped, beyond)`` ([] float32 each; ``--compressor auto``'s
    :meth:`~accerl_jax.compressor.auto.AutoCompressor.clip_fractions`), if given, is measured on the
    chunk's last update only (one extra forward pass per chunk) and returned as ``ChunkEnd.clipping``.
    The returned function's ``jitted`` attribute is the compiled ``jax.jit`` object (its cache counts
    compilations).
    """
    step = make_update_step(run, with_rollout=clipping is not None)
    length = chunk_length(run)

    def chunk(state: AnakinState, active):
        idle_out = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(step, state, None)[1])

        def update(carry, i):
            s, clip = carry
            if clipping is None:
                new, out = step(s, None)
            else:
                new, out, rollout = step(s, None)
                clip = jax.lax.cond(i == active - 1, lambda: jnp.stack(clipping(s.learner.params, rollout)),
                                    lambda: clip)
            return (new, clip), out

        def body(carry, i):
            return jax.lax.cond(i < active, update, lambda c, _: (c, idle_out), carry, i)

        clip = None if clipping is None else jnp.zeros((2,), jnp.float32)
        (state, clip), out = jax.lax.scan(body, (state, clip), jnp.arange(length, dtype=jnp.int32))
        held, fresh = state.obs[:DIVERGENCE_SAMPLES], state.obs[:REFRESH_SAMPLES]
        learner_out = lambda o: run.learner_apply(state.learner.params, o)[0]  # noqa: E731
        end = ChunkEnd(run.divergence(learner_out(held), run.actor_apply(state.actor_params[0], held)[0]),
                       run.divergence(learner_out(fresh), run.actor_apply(state.actor_params[-1], fresh)[0]),
                       clip)
        return state, out, end

    if run.cfg.num_seeds > 1:
        chunk = jax.vmap(chunk, in_axes=(0, None))
    jitted = xla.jit(chunk, run.spec.family, out_shardings=state_sharding())

    def call(state: AnakinState, active: int):
        return jitted(state, np.int32(active))

    call.jitted = jitted
    return call


def initial_state(run: Run, seed: int) -> AnakinState:
    """A new run's state for ``seed``, with the keys :func:`accerl_jax.run.setup` derives from it."""
    cfg = run.cfg
    k_net, k_comp, k_actor = jax.random.split(jax.random.PRNGKey(seed), 3)
    params = networks.init_params(run.spec, k_net)
    carry = run.actor.reset(k_actor)
    actor_params, comp_state = run.compressor.init(params, k_comp, carry.obs)  # first obs calibrate int8
    lag = cfg.policy_lag + 1
    obs = jnp.zeros((cfg.rollout_length * run.info.num_envs,) + tuple(run.info.obs_shape), carry.obs.dtype)
    zero = jnp.zeros((), jnp.int32)
    return AnakinState(learner_lib.init_state(params, run.optimizer), (actor_params,) * lag,
                       jnp.zeros((lag,), jnp.int32), comp_state, carry, obs, zero, zero, zero,
                       jnp.full((), FINITE, jnp.int32))


def restored_state(run: Run, skipped) -> AnakinState:
    """The state of a ``--resume`` checkpoint: its (trimmed) lagged parameter sets padded to
    ``--policy-lag + 1`` by repeating the oldest, as a new run starts."""
    cfg, completed = run.cfg, run.start_update
    learner, lagged, comp_state, carry = run.restored
    if not run.info.jittable:  # host (envpool) envs cannot be saved: they restart, the actor's key continues
        carry = run.actor.reset(run.k_actor)._replace(key=carry)
    lag = cfg.policy_lag + 1
    lagged = (lagged[0],) * (lag - len(lagged)) + tuple(lagged)
    versions = jnp.asarray(policy_versions(completed, lag, cfg.compress_every), jnp.int32)
    seeds = cfg.num_seeds
    obs = jnp.zeros((cfg.rollout_length * run.info.num_envs,) + tuple(run.info.obs_shape), carry.obs.dtype)

    def per_seed(x):
        return jnp.broadcast_to(x, (seeds,) + x.shape) if seeds > 1 else x

    return AnakinState(learner, lagged, per_seed(versions), comp_state, carry, per_seed(obs),
                       per_seed(jnp.int32(completed)), jnp.asarray(skipped, jnp.int32),
                       per_seed(jnp.int32(0)), per_seed(jnp.int32(FINITE)))


def check_anakin(cfg, jittable: bool) -> None:
    """Refuse what the Anakin loop cannot run.

    ``jittable`` is False for a host (envpool) env, which the loop steps through envpool's XLA interface.

    Raises:
      ConfigError: ``--distill-async`` (a host thread cannot run inside the jitted program),
        ``--compressor auto`` with ``--num-seeds`` > 1 (each seed would take its own decisions, so the
        seeds could not share one vmapped program); for envpool: ``--compressor auto`` (not built for
        the pool's XLA actor), ``--num-seeds`` > 1 (``vmap`` cannot copy the one host pool), more than one
        local device (XLA cannot partition envpool's side-effecting step over devices), or a task with
        64-bit arrays (:func:`accerl_jax.envs.envpool_env.check_xla`).
    """
    from accerl_jax.config import ConfigError

    if cfg.distill_async:
        raise ConfigError("bad --distill-async with --loop anakin: asynchronous distillation runs in a host "
                          "thread, which cannot run inside the Anakin loop's jitted program; drop --distill-async "
                          "(distillation then runs inside the program) or use --loop sequential")
    if cfg.compressor == "auto" and cfg.num_seeds > 1:
        raise ConfigError(f"bad --num-seeds {cfg.num_seeds} with --compressor auto: each seed takes its own "
                          "compression decisions, so the seeds cannot share one vmapped program; run the seeds "
                          "one at a time (--num-seeds 1) or use a fixed --compressor")
    if jittable:
        return
    if cfg.compressor == "auto":
        raise ConfigError(f"bad --compressor auto with --loop anakin and {cfg.env}: auto's per-candidate "
                          "programs are built for gymnax envs, not envpool's XLA actor; use --loop sequential "
                          "or a fixed --compressor")
    if cfg.num_seeds > 1:
        raise ConfigError(f"bad --num-seeds {cfg.num_seeds} with --loop anakin and {cfg.env}: the Anakin loop "
                          "steps envpool's one host pool through its XLA interface, which vmap cannot copy per "
                          "seed; use --num-seeds 1 (one run per seed) or a gymnax env")
    if jax.local_device_count() > 1:
        # Measured: XLA's SPMD partitioner rejects the program ("Side-effect HLO must have sharding").
        raise ConfigError(f"bad --loop anakin for {cfg.env} on {jax.local_device_count()} local devices: the "
                          "Anakin program is partitioned over the devices, and envpool's side-effecting XLA step "
                          "on its one host pool cannot be; use --loop sebulba (or sequential), or one device")
    from accerl_jax.envs.envpool_env import check_xla

    try:
        check_xla(cfg.env.partition(":")[2])
    except ValueError as err:
        raise ConfigError(f"bad --loop anakin for {cfg.env}: {err}; use --loop sebulba or sequential") from None


def fused_actor_run(run: Run) -> Run:
    """``run`` with an actor the Anakin program can fuse: a host (envpool) env's :class:`~accerl_jax.actor.HostActor`
    is replaced by an :class:`~accerl_jax.actor.AnakinActor` over the same pool's XLA interface; a gymnax
    run is returned as it is."""
    if run.info.jittable:
        return run
    actor = AnakinActor(run.env.xla(), run.actor_apply, run.cfg.rollout_length, family=run.spec.family)
    return dataclasses.replace(run, actor=actor)


def record_chunk(monitor: Monitor, out: UpdateOutput, updates: int, steps_per_update: int) -> None:
    """Hand ``monitor`` the episodes that ended in the first ``updates`` updates of one seed's chunk
    output (``[C, T, B]`` arrays, flattened to ``[updates * T, B]`` in time order: one call, not one per
    update); ``steps_per_update`` agent steps count per update."""
    def flat(x):
        x = np.asarray(x)[:updates]
        return x.reshape((-1,) + x.shape[2:])

    monitor.record_episodes(flat(out.episode_return), flat(out.finished), updates * steps_per_update,
                            episode_length=flat(out.episode_length))


def _seed(tree, k: int, seeds: int):
    return jax.tree.map(lambda x: x[k], tree) if seeds > 1 else tree


class AutoChunks:
    """``--compressor auto`` in the Anakin loop: called as the chunk function ``(AnakinState, active) ->
    (AnakinState, UpdateOutput [C, ...], ChunkEnd)``, it first takes the auto decision for the state it
    is given (the previous chunk's final state), then runs the chunk program of the candidate chosen.

    * One compiled chunk program per candidate (:meth:`AutoCompressor.candidate
      <accerl_jax.compressor.auto.AutoCompressor.candidate>`: the actor-params pytree differs per
      candidate), built when the candidate first runs and kept, so a switch back compiles nothing.
    * The decision is made on the host at chunk boundaries, from what the previous chunk measured at its
      end (``ChunkEnd``: KL(π_learner ‖ π_running) of the freshest compressed policy and ρ clipping of its
      last update), so checking the triggers costs no dispatch; an evaluation
      (:meth:`AutoCompressor.decide <accerl_jax.compressor.auto.AutoCompressor.decide>`) runs only when
      a trigger fires. The first one runs before the first chunk (update 0, on the reset observations).
    * A switch keeps the learner state, env carry, update counter and the non-finite guard's counters;
      the new candidate's actor parameters (compressed from the current learner parameters by the
      evaluation) fill all ``--policy-lag + 1`` lagged sets (versions: the current update), and its own
      kept compressor state (e.g. a distillation student's) becomes the state's ``compressor``. The
      running candidate's state lives in the ``AnakinState``; the host's ``AutoState`` keeps the others.
    * Each decision goes to the Monitor (``decisions.jsonl``, console, TensorBoard) and the summary.
    """

    def __init__(self, run: Run):
        self.run, self.auto = run, run.compressor
        self.programs: dict[int, Callable] = {}  # candidate index -> its compiled chunk program
        self.auto_state = None  # the host's AutoState; its entry for the running candidate is refreshed before use
        self.last_end: ChunkEnd | None = None  # what the previous chunk measured at its end
        self.decisions: list[dict] = []
        self.decide_s = 0.0  # host seconds spent in decisions (evaluations, switches); the loop waits for them

    def program(self, i: int) -> Callable:
        """Candidate ``i``'s chunk program (built once; compiled at its first call)."""
        if i not in self.programs:
            run = dataclasses.replace(self.run, compressor=self.auto.candidate(i))
            self.programs[i] = make_chunk(run, clipping=self.auto.clip_fractions)
        return self.programs[i]

    def __call__(self, s: AnakinState, active: int):
        if isinstance(s.compressor, AutoState):  # a new run's state: the host keeps every candidate's state
            self.auto_state = s.compressor
            s = s._replace(compressor=s.compressor.states[self.auto.keys[int(s.compressor.current)]])
            obs = s.carry.obs[None]
        else:
            obs = s.obs.reshape((self.run.cfg.rollout_length, self.run.info.num_envs) + tuple(self.run.info.obs_shape))
        start = time.perf_counter()
        s = self._decide(s, obs)
        self.decide_s += time.perf_counter() - start
        new_state, out, end = self.program(int(self.auto_state.current))(s, active)
        self.last_end = end
        return new_state, out, end

    def _measured(self) -> dict:
        """The running policy's trigger statistics measured at the end of the previous chunk."""
        end = jax.device_get((self.last_end.refresh_divergence["kl_learner_actor"], self.last_end.clipping))
        kl, (clipped, beyond) = end
        return {"kl": float(kl), "clip_fraction": float(clipped), "clip_fraction_margin": float(beyond)}

    def _decide(self, s: AnakinState, obs) -> AnakinState:
        auto, st = self.auto, self.auto_state
        st = st._replace(states={**st.states, auto.keys[int(st.current)]: s.compressor})
        update = int(jax.device_get(s.update))
        # The triggers' statistics are fetched only when they may fire (a scalar copy each, already computed).
        measured = self._measured() if self.last_end is not None and auto.check_due(update, st) else {}
        actor_params, st, decision = auto.decide(update, s.learner.params, st, s.actor_params[-1], obs, measured)
        self.auto_state = st
        if decision is None:
            return s
        self.decisions.append(decision)
        self.run.monitor.log_decision(decision)
        if not decision["switched"]:
            return s
        lag = self.run.cfg.policy_lag + 1
        s = s._replace(actor_params=(actor_params,) * lag, versions=jnp.full((lag,), update, jnp.int32),
                       compressor=st.states[auto.keys[int(st.current)]])
        return jax.device_put(s, state_sharding())

    def summary(self) -> dict:
        """The summary's auto fields (as the sequential loop's, plus the programs compiled)."""
        return {"auto_decisions": self.decisions, "auto_running": self.auto.running(self.auto_state),
                "auto_skipped_evaluations": self.auto.skipped_evaluations, "auto_decide_s": self.decide_s,
                "auto_chunk_programs": sorted(self.auto.specs[i] for i in self.programs)}


def run_anakin(run: Run, stop: StopSignals, trained: dict | None, claimed: list[str]) -> dict:
    """Train ``run`` to its budget (or a signal / non-finite update) and return its summary (with
    ``--num-seeds`` > 1, the run's summary with ``"seeds"``: one summary per seed).

    Raises:
      ConfigError: see :func:`check_anakin`.
      accerl_jax.signals.Interrupted: a signal before the first chunk of this session finished.
    """
    run = fused_actor_run(run)
    cfg, info, saver, lock, logdir = run.cfg, run.info, run.saver, run.lock, run.logdir
    extra, num_updates, steps_per_update = run.extra, run.num_updates, run.steps_per_update
    seeds, lag = cfg.num_seeds, cfg.policy_lag + 1
    start_update = run.start_update
    # One Monitor per seed: the run's own for one seed; <logdir>/seed<k>/ for several (run.monitor then
    # pools the episodes of all seeds).
    if seeds == 1:
        monitors = [run.monitor]
    else:
        monitors = []
        for k in range(seeds):
            m = Monitor(os.path.join(logdir, f"seed{k}"), num_updates * steps_per_update, cfg.return_window,
                        progress=False, append=run.resume_point is not None)
            if extra:
                m.load_state_dict(extra["seed_monitors"][k])
            monitors.append(m)
    chunk_fn = AutoChunks(run) if cfg.compressor == "auto" else make_chunk(run)
    fused_wait = float(extra.get("fused_wait_s", 0.0))  # seconds the host waited for the fused program
    stopped = stop_reason = None
    completed = logged = start_update
    last_metrics: list[dict] = [{} for _ in range(seeds)]

    def snapshot_of(s: AnakinState) -> checkpoint.TrainState:
        # The same TrainState as the sequential loop saves: the lagged sets this run has made so far.
        n = min(int(completed), cfg.policy_lag) + 1
        return checkpoint.TrainState(s.learner, s.actor_params[lag - n:], s.compressor,
                                     checkpoint.host_key_only(s.carry, info.jittable))

    def save(step: int) -> None:
        deferring, stop.deferring = stop.deferring, True  # a signal never cuts a checkpoint write short
        try:
            saver.save(step, snapshot, {
                "completed": step, "monitor": run.monitor.state_dict(),
                "seed_monitors": [m.state_dict() for m in monitors] if seeds > 1 else [],
                "skipped_updates": skipped_now.tolist() if seeds > 1 else int(skipped_now),
                "fused_wait_s": fused_wait, "wall_time_s": time.perf_counter() - run.wall_start,
            })
        finally:
            stop.deferring = deferring

    def log(it: int, metrics: list[dict], refreshed: bool) -> list[dict]:
        out = []
        for k, m in enumerate(monitors):
            d = _seed(divergence, k, seeds)
            # The divergence of the policy the actor runs next (possibly versions behind) from the learner's.
            row = dict(metrics[k], time_fused_wait_s=fused_wait, **d.divergence)
            if refreshed:
                m.log_refresh(it, d.refresh_divergence)
            m.log(it, row)
            out.append(row)
        if seeds > 1:
            run.monitor.log(it, dict(out[0], return_mean_over_seeds=float(np.mean([m.return_mean for m in monitors]))))
        return out

    def boundary(after: int) -> int:
        ends = [num_updates, (after // cfg.log_every + 1) * cfg.log_every]
        if cfg.checkpoint_every:
            ends.append((after // cfg.checkpoint_every + 1) * cfg.checkpoint_every)
        return min(ends)

    def dispatch(s: AnakinState, after: int):
        end = boundary(after)
        return (end, *chunk_fn(s, end - after))  # returns at once: the program runs in the background

    state = divergence = None
    try:
        if run.resume_point is None:
            states = [initial_state(run, cfg.seed + k) for k in range(seeds)]
            state = states[0] if seeds == 1 else jax.tree.map(lambda *xs: jnp.stack(xs), *states)
        else:
            state = restored_state(run, extra.get("skipped_updates", 0))
        state = jax.device_put(state, state_sharding())
        skipped_now = np.asarray(jax.device_get(state.skipped))
        snapshot = snapshot_of(state)
        pending = dispatch(state, completed)
        while pending is not None:
            end, new_state, out, chunk_end = pending
            pending = hard_stop = None
            start = time.perf_counter()
            out, chunk_end, bad_update, bad_quantity, skipped_now = jax.device_get(
                (out, chunk_end, new_state.bad_update, new_state.bad_quantity, new_state.skipped))  # waits
            fused_wait += time.perf_counter() - start
            skipped_now = np.asarray(skipped_now)
            bad_seeds = np.asarray(bad_update).reshape(-1)
            bad_update = int(bad_seeds[bad_seeds > 0].min()) if np.any(bad_seeds > 0) else 0  # any seed stops it
            last = (bad_update if bad_update else end) - completed  # updates of this chunk that count
            for k, m in enumerate(monitors):
                o = _seed(out, k, seeds)
                record_chunk(m, o, last, steps_per_update)
                if seeds > 1:
                    record_chunk(run.monitor, o, last, steps_per_update)
                last_metrics[k] = {name: v[last - 1] for name, v in o.metrics.items()}
            if not bad_update:
                stop.armed = True  # a chunk of this session is done: a signal now stops at the end of the next
                if end < num_updates and stop.requested is None:
                    # Pipelined: the next chunk is dispatched before the host logs and checkpoints this one,
                    # so that host work runs while the program does (episodes are recorded first: one cheap
                    # call, and auto's decisions see them; a diverged state is never continued).
                    try:
                        pending = dispatch(new_state, end)
                    except KeyboardInterrupt as err:  # a hard stop (second signal) while dispatching takes
                        hard_stop = err  # effect once this finished chunk is counted, below
            refreshed = bool(np.any(out.refreshed[..., :last]))
            state, completed, divergence = new_state, completed + last, chunk_end
            claimed.clear()  # the folder now holds a run (its checkpoints and summary are kept)
            if bad_update:
                # The diverged state is never saved: the last good checkpoint stays.
                seed_k = int(np.argmax(bad_seeds == bad_update))
                what = quantity(int(np.asarray(bad_quantity).reshape(-1)[seed_k]))
                m = last_metrics[seed_k]
                stopped = "diverged"
                stop_reason = guard_lib.stop_reason(what, bad_update, m,
                                                    f" of seed {cfg.seed + seed_k}" if seeds > 1 else "")
                last_metrics, logged = log(completed, last_metrics, refreshed), completed
                break
            snapshot = snapshot_of(state)
            if hard_stop is not None:
                raise hard_stop
            if completed % cfg.log_every == 0 or completed == num_updates:
                last_metrics, logged = log(completed, last_metrics, refreshed), completed
            else:
                for m in monitors:
                    m.progress()
            if cfg.checkpoint_every and completed % cfg.checkpoint_every == 0:
                save(completed)
            if pending is None and stop.requested is not None:  # the chunk in flight has been finished
                stopped = "interrupted"
    except KeyboardInterrupt:  # a signal before the first chunk, or a second one: abandon the chunk
        stopped = "interrupted"
    stop.deferring = True  # saving and summarising are never cut short by another signal
    if stopped == "interrupted" and completed == start_update:
        for m in monitors[1:] if seeds == 1 else monitors:
            m.close()
        run.monitor.close()
        lock.release()
        saver.close()
        if start_update == 0:
            checkpoint.remove_run(logdir)  # nothing ran: free the folder for a rerun
            for m in monitors if seeds > 1 else []:
                m.discard()
            run.monitor.discard()
        raise Interrupted(stop.requested)
    final = state  # for a diverged run: the chunk's final state, summarised but never saved
    try:
        if stopped != "diverged" and saver.last_step != completed:
            save(completed)
        if logged != completed:  # the interrupted run's last updates get their row too
            last_metrics = log(completed, last_metrics, False)
        s0 = _seed(final, 0, seeds)
        obs_t = s0.obs.reshape((cfg.rollout_length, info.num_envs) + tuple(info.obs_shape))
        speed_report = (measure_speed(run, s0.learner, s0.actor_params[-1], obs_t) if stopped is None
                        else unmeasured_speed(run))  # a stopped run exits promptly
    except KeyboardInterrupt:  # Ctrl-C during the final measurements: still summarise what ran
        stopped = "interrupted"
        speed_report = unmeasured_speed(run)
    finally:
        for m in monitors:
            m.close()
        run.monitor.close()
        saver.close()
    s0 = _seed(final, 0, seeds)
    if trained is not None:
        trained.update(learner_params=s0.learner.params, actor_params=s0.actor_params[-1], obs=s0.obs)
    skipped_list = np.asarray(skipped_now).reshape(-1).tolist()
    common = dict(completed=completed, stopped=stopped, stop_reason=stop_reason, exit_signal=stop.requested,
                  speed_report=speed_report, loop="anakin", fused_wait_s=fused_wait, num_seeds=seeds,
                  compress_every=cfg.compress_every, env_time_source="not split: one fused program",
                  policy_lag_versions=float(last_metrics[0].get("policy_lag_versions", np.nan)),
                  **(chunk_fn.summary() if cfg.compressor == "auto" else {}))
    last_checkpoint = (os.path.join(logdir, checkpoint.CHECKPOINT_DIR, str(saver.last_step))
                       if saver.last_step is not None else None)
    if seeds == 1:
        return summarize(run, state=s0.learner, actor_params=s0.actor_params[-1], metrics=last_metrics[0],
                         skipped_updates=int(skipped_list[0]), **common)
    per_seed = []
    for k, m in enumerate(monitors):
        s = _seed(final, k, seeds)
        seed_run = dataclasses.replace(run, cfg=dataclasses.replace(cfg, seed=cfg.seed + k), monitor=m,
                                       logdir=m.logdir, lock=_NoLock())
        per_seed.append(summarize(seed_run, state=s.learner, actor_params=s.actor_params[-1],
                                  metrics=last_metrics[k], skipped_updates=int(skipped_list[k]),
                                  last_checkpoint=last_checkpoint, **common))
    returns = [p["final_return_mean"] for p in per_seed]
    finite = [r for r in returns if r is not None]
    top = summarize(run, state=s0.learner, actor_params=s0.actor_params[-1], metrics=last_metrics[0],
                    skipped_updates=int(sum(skipped_list)),
                    final_return_mean=float(np.mean(finite)) if finite else None,
                    final_return_mean_per_seed=returns,
                    seeds=[{k: v for k, v in p.items() if k not in ("config", "learner_network")} for p in per_seed],
                    **common)
    return top


class _NoLock:
    """A seed's summary releases no lock: the run's lock is released by the run's own summary."""

    def release(self) -> None:
        pass
