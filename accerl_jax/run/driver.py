"""The run's life, the same for every loop: the :class:`Driver` takes the :class:`Step` records a
*stepper* (:mod:`accerl_jax.loops`) yields and owns everything around them.

A stepper only produces updates: the Anakin stepper one :class:`Step` per chunk of updates, the
sequential and Sebulba steppers one per update. The driver

* records the finished episodes and writes Monitor rows (every ``--log-every`` updates, the last one, a
  diverged one) and the actor's policy refreshes, for one seed or for each of ``--num-seeds``;
* saves checkpoints every ``--checkpoint-every`` updates and at the end, never cut short by a signal
  (:mod:`accerl_jax.run.signals`: deferral), never of a diverged state;
* stops on a non-finite update (``--on-nan stop``), on SIGINT/SIGTERM (the stepper asks
  :meth:`Driver.keep_going` before each new update or chunk, which also *arms* the signals once an update
  of this session has finished), and on a stepper's exception (the last completed update is saved, then
  the exception is re-raised);
* tears a run down that was interrupted before its first update (a new run's folder is freed), and
  otherwise measures the policy speed and writes the summary.

A stepper implements :class:`Stepper`; the contract is one-way: a stepper never writes the Monitor, a
checkpoint or the summary, nor handles signals. Everything that happened in a step travels in the
:class:`Step` it yields -- metrics, finished episodes, a snapshot for the checkpoint, and its
:class:`Events` (stage seconds measured with its own :class:`~accerl_jax.platform.clock.StageClock`, policy
refreshes, ``--compressor auto`` decisions) -- and the driver is the only writer.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Iterator, NamedTuple, Optional, Protocol

import jax
import numpy as np

from accerl_jax import networks
from accerl_jax.platform import clock, compile_cache, speed
from accerl_jax.run import checkpoint, folder as run_folder
from accerl_jax.run import guard as guard_lib
from accerl_jax.run import replicas
from accerl_jax.monitor import Monitor
from accerl_jax.monitor import summary as summary_lib
from accerl_jax.monitor.summary import Summary
from accerl_jax.run.build import SPEED_FORWARDS, Run, tensorboard_purge_step
from accerl_jax.search.fidelity import summary_fields as search_summary_fields
from accerl_jax.run.shards import params_digest
from accerl_jax.run.signals import Interrupted, StopSignals, signal_name


class Episodes(NamedTuple):
    """Episodes that ended during a step, for one seed (time-major ``[N, B]``: ``N`` env steps of ``B`` envs)."""

    episode_return: np.ndarray  # [N, B] float32, the return of the episode that ended at each step
    finished: np.ndarray  # [N, B] bool, an episode ended at this step
    episode_length: np.ndarray  # [N, B] int32, its length in agent steps

    @classmethod
    def of_rollout(cls, rollout) -> "Episodes":
        """The episodes that ended in a ``[T, B]`` rollout (terminated or truncated, at valid steps)."""
        finished = np.asarray((rollout.terminated | rollout.truncated) & rollout.valid)
        return cls(np.asarray(rollout.episode_return), finished, np.asarray(rollout.episode_length))


class Bad(NamedTuple):
    """A non-finite update under ``--on-nan stop``."""

    quantity: str  # the first non-finite part, e.g. "rewards", "behaviour log_prob" (accerl_jax.run.guard.QUANTITIES)
    update: int  # the update (1-based) that produced it
    seed: int  # index of the seed it happened in (0 for one seed)
    streak: int = 0  # --on-nan skip: the consecutive skipped updates that stopped the run (0: --on-nan stop)


class Refresh(NamedTuple):
    """A re-compression of the actor's policy whose divergence is logged (TensorBoard ``refresh/*``)."""

    update: int  # the learner update the refreshed policy was compressed after
    divergence: list  # per seed: {"kl_learner_actor", "action_agreement"} of the refreshed policy ([] scalars)


class Events(NamedTuple):
    """What happened during a step besides the update itself, for the driver to record."""

    stage_s: dict = {}  # stage ("actor", "learner", "compress", ...) -> wall seconds measured (never mutated)
    refreshes: tuple = ()  # Refresh records, logged before the step's episodes are counted
    decisions: tuple = ()  # --compressor auto decisions (dicts, accerl_jax.compressor.auto), in order


class Step(NamedTuple):
    """What a stepper yields after one update (sequential, Sebulba) or one chunk of updates (Anakin)."""

    update: int  # learner updates completed after this step (counted from the run's start)
    updates: int  # how many of them this step ran
    metrics: list  # per seed: dict of [] scalars of the step's last update
    episodes: list  # per seed: Episodes of this step, covering ``updates * steps_per_update`` agent steps
    snapshot: Optional[checkpoint.TrainState]  # what a checkpoint of ``update`` saves; None when ``bad``
    bad: Optional[Bad] = None
    # Per seed: the divergence of the freshest policy re-compressed during this step, logged with the
    # step's Monitor row if it gets one (the Anakin loop measures it in its program); None: no refresh.
    refresh: Optional[list] = None
    events: Events = Events()
    # time.perf_counter() when the step's outputs reached the host: its Monitor row's wall time, where the
    # row is logged later (a stepper that dispatches ahead and waits there first); None: when it is logged.
    done_at: Optional[float] = None


class Final(NamedTuple):
    """The state a stepper ended in, for the summary (one seed)."""

    learner: Any  # accerl_jax.learner.LearnerState
    actor_params: Any  # the freshest compressed parameters
    obs: Optional[jax.Array]  # [T, B, *obs_shape] the last rollout's observations; None: no rollout ran


class Result(NamedTuple):
    """What a run returns: its summary and the final state of its first seed."""

    summary: dict  # the run's summary: Summary.to_json() (accerl_jax.monitor.summary), also <logdir>/summary.json
    learner_params: Any  # the learner's final parameters
    actor_params: Any  # the freshest compressed parameters
    obs: Optional[np.ndarray]  # [T * B, *obs_shape] the last rollout's observations; None: no rollout ran


class Stepper(Protocol):
    """A loop: produces updates, nothing else (module docstring)."""

    def steps(self, driver: "Driver") -> Iterator[Step]:
        """Run updates from ``run.start_update`` to ``run.plan.num_updates``; before each new update (or chunk)
        call ``driver.keep_going(completed)`` and end when it is False."""

    def row(self, update: int) -> list:
        """Per seed: fields added to the Monitor row of ``update`` (e.g. KL of the actor's policy)."""

    def env_seconds(self, update: int) -> Optional[float]:
        """Called after :meth:`row`: the seconds of env stepping in the actor's time over ``update`` updates,
        where a fused actor's env share is calibrated (the Monitor splits its ``actor`` time with it), else None."""

    def extra(self) -> dict:
        """The stepper's JSON-able bookkeeping saved with a checkpoint (``skipped_updates``, ...)."""

    def final(self) -> list:
        """Per seed: the :class:`Final` state."""

    def fields(self, times: dict) -> dict:
        """Loop-specific summary fields (``loop``, per-stage times, ...: the summary's ``loop_fields``,
        :class:`~accerl_jax.monitor.summary.Summary`); ``times`` are the run's stage seconds so far
        (stage -> seconds, every session's)."""

    def cost_split(self) -> dict:
        """The per-update cost split of the loop's pieces, measured after training
        (:func:`accerl_jax.loops.pieces.cost_split`: FLOPs always, seconds with ``--cost-split``), or {}
        where they cannot be split."""

    def close(self) -> Events:
        """Release what the stepper holds (threads); called once, also after an exception. Returns what
        happened after the last step (e.g. worker threads' last seconds), for the driver to record."""


def seed_monitors(run: Run) -> list[Monitor]:
    """One Monitor per replica (:mod:`accerl_jax.run.replicas`): the run's own for one; for ``--num-seeds``
    > 1 or ``--sweep`` one per replica in its folder, ``<logdir>/seed<k>/`` or
    ``<logdir>/<name>=<value>-seed<k>/`` (the run's Monitor then summarises them: :attr:`Monitor.seeds
    <accerl_jax.monitor.Monitor.seeds>`)."""
    cfg = run.cfg
    reps = replicas.replicas(cfg)
    if len(reps) == 1:
        return [run.outputs.monitor]
    monitors = []
    for k, rep in enumerate(reps):
        state = run.extra["seed_monitors"][k] if run.extra else None
        m = Monitor(os.path.join(run.outputs.logdir, rep.folder), run.plan.num_updates * run.plan.steps_per_update,
                    cfg.return_window, progress=False, append=run.plan.resume is not None, purge_step=tensorboard_purge_step(state))
        if state is not None:
            m.load_state_dict(state)
        monitors.append(m)
    run.outputs.monitor.seeds = monitors
    run.outputs.monitor.replica_word = "run" if cfg.sweep else "seed"  # a sweep's replicas differ in more than the seed
    return monitors


class Driver:
    """Drives one stepper through the run's life (module docstring).

    Args:
      run: the built run (:func:`accerl_jax.run.build.setup`).
      stop: the signal handler of this training call.
      entered_s: :func:`accerl_jax.platform.clock.process_age` when the training call began (None: now), so that
        the summary splits the start-up into what ran before it (interpreter, imports, parsing) and after.
    """

    def __init__(self, run: Run, stop: StopSignals, entered_s: float | None = None):
        self.run, self.stop = run, stop
        self.entered_s = clock.process_age() if entered_s is None else entered_s
        self.startup_s: Optional[float] = None  # process age when this session's first update finished
        self.cache_before = compile_cache.counts()
        self.monitors = seed_monitors(run)
        self.completed = self.logged = run.start_update
        self.done_at: Optional[float] = None  # the last step's (Step.done_at)
        self.snapshot: Optional[checkpoint.TrainState] = None
        self.metrics: list = [{} for _ in self.monitors]
        self.stopped: Optional[str] = None
        self.stop_reason: Optional[str] = None
        self.stepper: Optional[Stepper] = None

    # -- what a stepper may ask --------------------------------------------------------------------------
    def keep_going(self, completed: int) -> bool:
        """Called by the stepper with the updates it has ``completed`` so far, before it starts a new
        update or chunk. Once an update of this session has finished, a signal only requests a stop (the
        signals are armed here); returns False when one has."""
        if completed > self.run.start_update:
            self.stop.armed = True
        if self.run.plan.num_processes > 1:
            self._agree_on_stop()
        return self.stop.requested is None

    def _agree_on_stop(self) -> None:
        """Multi-host: a signal that reached any process stops every process at the same update, so that
        none waits for the others in a collective they never enter. (A collective itself: every process
        asks at the same points, as every process runs the same stepper.)"""
        from jax.experimental import multihost_utils

        signals = np.asarray(multihost_utils.process_allgather(np.int32(self.stop.requested or 0))).reshape(-1)
        if self.stop.requested is None and np.any(signals):
            self.stop.requested = int(signals[signals > 0][0])

    def row_due(self, update: int) -> bool:
        """Whether update ``update`` gets a Monitor row (every ``--log-every``-th and the last)."""
        return update % self.run.cfg.log_every == 0 or update == self.run.plan.num_updates

    # -- the life ----------------------------------------------------------------------------------------
    def drive(self, stepper: Stepper) -> Result:
        """Run ``stepper`` to the budget, a stop or a failure; return the run's summary and final state.

        Raises:
          accerl_jax.run.signals.Interrupted: a signal before the first update of this session finished.
          BaseException: a stepper's own exception, after the last completed update has been saved.
        """
        self.stepper, run = stepper, self.run
        try:
            for step in stepper.steps(self):
                self._take(step)
                if self.stopped == "diverged":
                    break
        except KeyboardInterrupt:  # a signal before the first update, or a second one: abandon the update
            self.stopped = "interrupted"
        except BaseException:
            self.stop.deferring = True
            self._record(stepper.close())
            self._fail()
            raise
        self.stop.deferring = True  # saving and summarising are never cut short by another signal
        self._record(stepper.close())
        if self.stopped is None and self.stop.requested is not None:
            self.stopped = "interrupted"
        if self.stopped == "interrupted" and self.completed == run.start_update:
            self._release()  # interrupted before the first update of this session: nothing to save
            raise Interrupted(self.stop.requested)
        return self._finish()

    def _record(self, events: Events) -> None:
        """Write what happened besides the updates: stage seconds, auto decisions and logged refreshes
        (at the env steps counted so far)."""
        monitor = self.run.outputs.monitor
        for stage, seconds in events.stage_s.items():
            monitor.add_time(stage, seconds)
        for decision in events.decisions:
            monitor.log_decision(decision)
        for r in events.refreshes:
            for k, m in enumerate(self.monitors):
                m.log_refresh(r.update, r.divergence[k])

    def _take(self, step: Step) -> None:
        run = self.run
        if self.startup_s is None:
            self.startup_s = clock.process_age()
        self._record(step.events)
        for k, m in enumerate(self.monitors):
            e = step.episodes[k]
            steps = step.updates * run.plan.steps_per_update
            m.record_episodes(e.episode_return, e.finished, steps, episode_length=e.episode_length)
        if len(self.monitors) > 1:  # one seed's steps (the shared x axis), every seed's episodes
            run.outputs.monitor.record_steps(steps, sum(int(np.count_nonzero(e.finished)) for e in step.episodes))
        self.metrics = step.metrics
        self.completed, self.done_at = step.update, step.done_at
        if step.bad is not None:  # the diverged state is never saved: the last good checkpoint stays
            b = step.bad
            where = replica_where(run, b.seed) if len(self.monitors) > 1 else ""
            self.stopped = "diverged"
            self.stop_reason = guard_lib.stop_reason(b.quantity, b.update, step.metrics[b.seed], where, b.streak)
            self._log(step.update, step.refresh)
            return
        self.snapshot = step.snapshot
        if self.row_due(step.update):
            self._log(step.update, step.refresh)
        else:
            for m in self.monitors:
                m.progress()
        if run.cfg.checkpoint_every and step.update % run.cfg.checkpoint_every == 0:
            self.save(step.update, wait=False)  # written while training goes on (checkpoint.Checkpointer)

    def _log(self, update: int, refresh: Optional[list]) -> None:
        """The Monitor rows of ``update`` (each seed's, and the run's summary of them), with the step's
        ``refresh`` divergences (per seed) logged first."""
        run = self.run
        extra = self.stepper.row(update)
        env_s = self.stepper.env_seconds(update)
        if env_s is not None:  # a fused actor's calibrated env share of its time
            run.outputs.monitor.set_env_time(min(env_s, run.outputs.monitor.times["actor"]))
        rows = []
        for k, m in enumerate(self.monitors):
            row = dict(self.metrics[k], **extra[k])
            m.log(update, row, refresh[k] if refresh else None, at=self.done_at)
            rows.append(row)
        if len(self.monitors) > 1:  # return_mean, length_mean: means over seeds; the rest: seed 0's
            run.outputs.monitor.log(update, rows[0], at=self.done_at)
        self.metrics, self.logged = rows, update

    def save(self, step: int, wait: bool = True) -> None:
        """Checkpoint the last completed update ``step`` (its snapshot); a signal never cuts it short.
        ``wait=False``: return once the snapshot is copied to the host, orbax writing it in the background."""
        run, stop = self.run, self.stop
        deferring, stop.deferring = stop.deferring, True
        try:
            for m in {id(m): m for m in (*self.monitors, run.outputs.monitor)}.values():
                m.flush()  # every row up to the checkpoint is on disk before it is
            run.outputs.saver.save(step, self.snapshot, {
                "completed": step, "monitor": run.outputs.monitor.state_dict(),
                "seed_monitors": [m.state_dict() for m in self.monitors] if len(self.monitors) > 1 else [],
                "wall_time_s": time.perf_counter() - run.wall_start, "num_processes": run.plan.num_processes,
                "auto_gate": run.auto_gate,  # --compressor auto: what it resolved to, kept by a --resume
                **self.stepper.extra(),
            }, wait=wait)
        finally:
            stop.deferring = deferring

    def _close_outputs(self) -> None:
        for m in self.monitors:
            m.close()
        if len(self.monitors) > 1:
            self.run.outputs.monitor.close()
        self.run.outputs.saver.close()

    def _fail(self) -> None:
        """A stepper raised: save its last completed update (if any ran), close everything."""
        run = self.run
        try:
            if self.completed > run.start_update and run.outputs.saver.last_step != self.completed:
                self.save(self.completed)
        finally:
            self._release()

    def _release(self) -> None:
        """Close the outputs and the run's lock without a summary; a new run in which no update finished
        frees its folder for a rerun."""
        run = self.run
        self._close_outputs()
        run.outputs.lock.release()
        if self.completed == run.start_update == 0:
            run_folder.remove_run(run.outputs.logdir)
            for m in self.monitors if len(self.monitors) > 1 else []:
                m.discard()
            run.outputs.monitor.discard()

    def _startup(self) -> dict:
        """This session's start-up: process start to its first update (Anakin: its first chunk), and the
        part of it before the training call."""
        now = compile_cache.counts()
        return {"startup_s": self.startup_s, "startup_before_train_s": self.entered_s,
                "startup_scope": STARTUP_SCOPE, "compile_cache": compile_cache.folder_in_use(),
                "compile_cache_hits": now["hits"] - self.cache_before["hits"],
                "compile_cache_misses": now["misses"] - self.cache_before["misses"]}

    def _finish(self) -> Result:
        """Save and log the last update, measure the policy speed, close, and write the summary."""
        run, stepper = self.run, self.stepper
        final = stepper.final()
        try:
            if self.stopped != "diverged" and run.outputs.saver.last_step != self.completed:
                self.save(self.completed)
            run.outputs.saver.wait()  # the last periodic save, written in the background, is on disk
            if self.logged != self.completed:  # an interrupted run's last updates get their row too
                self._log(self.completed, None)
            f0 = final[0]
            measure = self.stopped is None and run.plan.process_id == 0 and f0.obs is not None
            report = measure_speed(run, f0.learner, f0.actor_params, f0.obs) if measure else unmeasured_speed(run)
            start = time.perf_counter()
            report["cost_split"] = (stepper.cost_split() if measure else {}) or None
            if report["cost_split"] is not None:
                report["cost_split"]["measure_s"] = time.perf_counter() - start
        except KeyboardInterrupt:  # Ctrl-C during the final measurements: still summarise what ran
            self.stopped = "interrupted"
            report = unmeasured_speed(run)
        finally:
            self._close_outputs()
        f0 = final[0]
        summary = self._summary(final, report)
        obs = None if f0.obs is None else f0.obs.reshape((-1,) + tuple(run.info.obs_shape))
        return Result(summary, f0.learner.params, f0.actor_params, obs)

    def _summary(self, final: list, report: dict) -> dict:
        """Write the summary (each seed's too) and return the run's (:meth:`Summary.to_json
        <accerl_jax.monitor.summary.Summary.to_json>`)."""
        run, stepper = self.run, self.stepper
        fields = stepper.fields(dict(run.outputs.monitor.times))
        skipped = stepper.extra().get("skipped_updates", 0)
        skipped = [int(s) for s in np.asarray(skipped).reshape(-1)]
        if self.stopped is None and self.completed > 0 and 2 * max(skipped) > self.completed:
            # A run that skipped most of its updates did not train: never a normal finish (exit status 1).
            k = int(np.argmax(skipped))
            where = replica_where(run, k) if len(self.monitors) > 1 else ""
            self.stopped = "diverged"
            self.stop_reason = (f"{skipped[k]} of {self.completed} updates{where} skipped for non-finite quantities "
                                "(--on-nan skip): most of the run did not train")
        common = dict(completed=self.completed, stopped=self.stopped, stop_reason=self.stop_reason,
                      exit_signal=self.stop.requested, speed_report=report, startup=self._startup(),
                      loop_fields=fields)
        if len(self.monitors) == 1:
            return summarize(run, state=final[0].learner, actor_params=final[0].actor_params, metrics=self.metrics[0],
                             skipped_updates=skipped[0], **common).to_json()
        last_checkpoint = (os.path.join(run.outputs.logdir, checkpoint.CHECKPOINT_DIR, str(run.outputs.saver.last_step))
                           if run.outputs.saver.last_step is not None else None)
        per_seed = []
        seeds = len(self.monitors)
        seed_scope = (f"per seed: this seed's env steps / the whole run's wall_time_s ({seeds} seeds ran together; "
                      f"{WHOLE_RUN})")
        for k, m in enumerate(self.monitors):
            per_seed.append(summarize(run, seed=k, state=final[k].learner, actor_params=final[k].actor_params,
                                      metrics=self.metrics[k], skipped_updates=skipped[k],
                                      last_checkpoint=last_checkpoint, steps_per_s_scope=seed_scope,
                                      **common).to_json())
        # The run's Monitor counts one seed's steps; the run itself stepped every seed's envs.
        monitor = run.outputs.monitor
        steps = monitor.env_steps * seeds
        wall = time.perf_counter() - run.wall_start
        return summarize(run, state=final[0].learner, actor_params=final[0].actor_params, metrics=self.metrics[0],
                         skipped_updates=sum(skipped), total_env_steps=steps, env_steps_per_seed=monitor.env_steps,
                         steps_per_s=steps / wall, steps_per_s_per_seed=monitor.env_steps / wall,
                         steps_per_s_scope=f"all {seeds} seeds' env steps / wall_time_s ({WHOLE_RUN}); "
                                           "steps_per_s_per_seed: one seed's",
                         final_return_mean_per_seed=[p["final_return_mean"] for p in per_seed],
                         seeds=[dict({k: v for k, v in p.items() if k not in ("config", "learner_network")},
                                     **({"run": r.folder, "swept": r.values} if run.cfg.sweep else {}))
                                for p, r in zip(per_seed, replicas.replicas(run.cfg))], **common).to_json()


def replica_where(run: Run, k: int) -> str:
    """`` of seed S`` (``--num-seeds``) or `` of run <folder>`` (``--sweep``): which replica ``k`` is, for a
    message about one of several."""
    rep = replicas.replicas(run.cfg)[k]
    return f" of run {rep.folder}" if run.cfg.sweep else f" of seed {rep.seed}"


def measure_speed(run: Run, state, actor_params, obs) -> dict:
    """The actor's policy speedup over the learner's (:func:`accerl_jax.platform.speed.policy_speedup`) on
    ``obs [T, B, *obs_shape]`` (the first :data:`~accerl_jax.run.build.SPEED_FORWARDS` steps are used); with
    ``--compressor none`` only the learner's policy is timed (the actor runs it: speedup 1)."""
    return speed.policy_speedup(run.learner_apply, state.params, run.actor_apply, actor_params,
                                obs[: min(SPEED_FORWARDS, run.cfg.rollout_length)], family=run.plan.spec.family,
                                identical=run.cfg.compressor == "none")


def unmeasured_speed(run: Run) -> dict:
    """The speed fields of a run that stopped early (its policy speed is not measured)."""
    return {"actor_policy_speedup": None, "base_forward_s": None, "actor_forward_s": None,
            "forward_batch": run.info.num_envs, "cost_split": None}


# What the summary's startup_s covers.
STARTUP_SCOPE = ("process start to the end of this session's first update (the Anakin loop: its first chunk of "
                 "updates): interpreter, imports, setup, compilation; startup_before_train_s: the part before "
                 "the training call (interpreter, imports, argument parsing)")
# What the summary's wall_time_s (the denominator of its steps/s) covers.
WHOLE_RUN = "the whole run: setup, compilation, training and the final measurements, of every session if resumed"


def summarize(run: Run, *, state, actor_params, metrics: dict, completed: int, stopped: str | None,
              stop_reason: str | None, exit_signal: int | None, skipped_updates: int, speed_report: dict,
              startup: dict, loop_fields: dict, seed: int | None = None, **given) -> Summary:
    """Build the run's :class:`~accerl_jax.monitor.summary.Summary`, draw its curves, write
    ``summary.json`` and release the run's lock; with ``seed`` (an index of ``--num-seeds``), that seed's
    summary instead, from its own Monitor (``run.outputs.monitor.seeds[seed]``, in ``<logdir>/seed<k>/``),
    releasing nothing.

    ``speed_report`` (:func:`measure_speed` or :func:`unmeasured_speed`, with ``cost_split``) and
    ``startup`` (:meth:`Driver._startup`) are Summary fields; ``loop_fields`` the loop's own
    (:meth:`Stepper.fields`); ``given`` are Summary fields that the caller measured itself (the run's
    summary of several seeds: its steps, rates and per-seed fields; a seed's: the run's last checkpoint).
    """
    cfg, info, monitor, saver, logdir = run.cfg, run.info, run.outputs.monitor, run.outputs.saver, run.outputs.logdir
    if seed is not None:
        cfg, monitor = replicas.replica_config(cfg, replicas.replicas(cfg)[seed]), monitor.seeds[seed]
        logdir = monitor.logdir
    times = monitor.times
    wall = time.perf_counter() - run.wall_start
    final = jax.device_get(metrics)
    last = lambda k: float(final[k]) if k in final else None  # noqa: E731  the last update's metric, if reported
    fields = dict(
        env=cfg.env,
        compressor=cfg.compressor,
        corrector=None if cfg.agent == "search" else cfg.corrector,  # a search trains on its own targets
        loss=run.plan.loss.loss,
        epochs=run.plan.loss.epochs,
        minibatches=run.plan.loss.minibatches,
        policy_lag=cfg.policy_lag,
        seed=cfg.seed,
        num_envs=info.num_envs,
        rollout_length=cfg.rollout_length,
        updates=completed,
        stopped=stopped,
        stop_reason=stop_reason,
        exit_signal=signal_name(exit_signal) if stopped == "interrupted" else None,
        skipped_updates=skipped_updates,
        resumed_from_update=run.plan.resume.step if run.plan.resume is not None else None,
        last_checkpoint=(os.path.join(run.outputs.logdir, checkpoint.CHECKPOINT_DIR, str(saver.last_step))
                         if saver.last_step is not None else None),
        checkpoint_time_s=saver.seconds,
        total_env_steps=monitor.env_steps,
        wall_time_s=wall,
        actor_time_s=times["actor"],
        env_time_s=times["env"],
        env_time_source="calibrated: env-only rollouts with random actions" if info.jittable else "measured",
        inference_time_s=times["inference"],
        learner_time_s=times["learner"],
        compress_time_s=times["compress"],
        distill_time_s=times["distill"],
        final_return_mean=monitor.return_mean if monitor.has_returns else None,
        final_length_mean=monitor.length_mean if monitor.has_returns else None,
        return_window=cfg.return_window,
        returns_averaged=min(len(m.returns) for m in monitor.seeds) if monitor.seeds else len(monitor.returns),
        episodes=monitor.episodes,
        episodes_nonfinite=monitor.nonfinite_episodes,
        steps_per_s=monitor.env_steps / wall,
        steps_per_s_per_seed=monitor.env_steps / wall,
        steps_per_s_scope=f"env steps / wall_time_s ({WHOLE_RUN})",
        **summary_lib.training_rate(monitor.rows, since_update=run.start_update),
        **summary_lib.fidelity(monitor.rows),
        # S + 1 (and the learner's A with --learner-children), search fidelity
        **(search_summary_fields(cfg, monitor.rows, run.info.num_actions) if cfg.agent == "search" else {}),
        learner_network=dataclasses.asdict(run.plan.spec),
        learner_params=networks.param_count(state.params),
        actor_params=networks.param_count(actor_params),
        actor_param_bytes=networks.param_bytes(actor_params),
        kl_learner_actor=last("kl_learner_actor"),
        action_agreement=last("action_agreement"),
        abs_log_rho_mean=last("abs_log_rho_mean"),
        rho_clipped_frac=last("rho_clipped_frac"),
        c_clipped_frac=last("c_clipped_frac"),
        rho_beyond_frac=last("rho_beyond_frac"),
        rho_clipped_mass=last("rho_clipped_mass"),
        learning_rate=last("learning_rate"),
        devices=run.plan.local_devices,
        num_processes=run.plan.num_processes,
        process_id=run.plan.process_id,
        learner_devices=int(run.mesh.devices.size),
        learner_batch=info.num_envs * run.plan.num_processes,
        learner_params_digest=params_digest(state.params),
        actor_params_digest=params_digest(actor_params),
        backend=jax.default_backend(),
        logdir=logdir,
        config=dataclasses.asdict(cfg),
        **speed_report,
        **startup,
        auto_gate=run.auto_gate,
    )
    summary = Summary(**dict(fields, **given), loop_fields=loop_fields)
    if run.plan.process_id == 0:  # multi-host: only process 0's outputs are kept
        monitor.plot(f"{cfg.env}  compressor={cfg.compressor}  corrector={fields['corrector']}  seed={cfg.seed}")
    monitor.write_summary(summary.to_json())
    if seed is None:
        run.outputs.lock.release()
    return summary
