"""The Sebulba loop (``--loop sebulba``, the default for envpool; issue 5, docs/DESIGN.md "Execution
styles"; Podracer's Sebulba, arXiv 2104.06272, and cleanba).

Threads, all in one process:

* ``--actor-threads`` actor threads (:class:`accerl_jax.async_actor.AsyncActor`), each stepping its own
  envpool in async mode (``recv``/``send`` of ``--actor-batch`` environments) and running the compressed
  policy on ``--actor-device``; each rollout is copied to the learner's devices (sharded over the batch
  axis) and put, with the policy version that produced it, into a bounded queue (``--queue-size``).
* the learner, in the main thread (where signals arrive): takes one rollout per actor thread, applies the
  guarded update (:class:`accerl_jax.guard.UpdateGuard`), logs the policy lag in versions
  (``policy_lag_versions``: learner updates completed minus the oldest version in the rollout), and hands
  its newest parameters to
* the compressor thread, which compresses the newest learner parameters it has been given (older ones
  are skipped) and publishes them to the actors; so compression overlaps acting and learning.

A worker thread that raises stops the run: the learner notices within ~0.05 s, saves a checkpoint of the
last completed update, stops the other threads and re-raises the original exception (with its
traceback). An exception in the learner does the same. SIGINT/SIGTERM behave as in the sequential loop.
Host environments restart on ``--resume`` (their state is not saved; the actors' key is).

Version ``v`` is the policy compressed from the learner after ``v`` updates (``0``: the initial one). The
lag of a rollout (learner updates completed when it is taken, minus the oldest version among its steps)
is at most ``--queue-size + 4``: the learner waits before update ``u`` until the compressor has finished
version ``u - 2`` (so the actors' policy is never more than 2 versions behind the learner, and one
compression overlaps each update); the oldest step of a rollout may have been chosen while its
predecessor was still being collected (envpool's faster environments run ahead), after which the
learner can take at most ``--queue-size`` queued rollouts, the predecessor, and finish the update in flight.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from accerl_jax import checkpoint
from accerl_jax import learner as learner_lib
from accerl_jax.async_actor import AsyncActor
from accerl_jax.config import Config, ConfigError
from accerl_jax.envs.envpool_env import AsyncEnvpoolEnv
from accerl_jax import guard as guard_lib
from accerl_jax.guard import UpdateGuard
from accerl_jax.run import DIVERGENCE_SAMPLES, REFRESH_SAMPLES, Run, summarize, wind_up
from accerl_jax.signals import Interrupted, StopSignals

POLL_S = 0.05  # how often a blocked thread looks for a stop or a failure elsewhere
JOIN_S = 10.0  # how long the learner waits for a stopping worker thread
SEBULBA_FLAGS = {"actor_threads": 1, "actor_batch": 0, "actor_device": "cpu", "queue_size": 2}


def check_config(cfg: Config, loop: str) -> None:
    """Check the Sebulba flags against the loop; called before anything is built or written.

    Raises:
      ConfigError: Sebulba flags with another loop; ``--loop sebulba`` with a non-envpool env or with
        ``--policy-lag``; ``--num-envs`` not a multiple of ``--actor-threads``; ``--actor-batch`` larger
        than a thread's environments.
    """
    from accerl_jax.config import flag

    if loop != "sebulba":
        for name, default in SEBULBA_FLAGS.items():
            if getattr(cfg, name) != default:
                raise ConfigError(f"bad {flag(name)} {getattr(cfg, name)!r} with --loop {loop}: it is a Sebulba "
                                  "setting; add --loop sebulba (envpool envs) or leave it out")
        return
    if not cfg.env.startswith("envpool:"):
        raise ConfigError(f"bad --loop sebulba for --env {cfg.env!r}: Sebulba steps host environments; use an "
                          "envpool:<id> env, or --loop sequential")
    if cfg.policy_lag:
        raise ConfigError(f"bad --policy-lag {cfg.policy_lag} with --loop sebulba: its actors lag by themselves "
                          "(bounded by --queue-size); use --loop sequential for a fixed lag")
    if cfg.compressor == "auto":
        raise ConfigError("bad --compressor auto with --loop sebulba: auto switches its candidates between updates "
                          "of the sequential loop; use --loop sequential or a fixed compressor")
    if cfg.compress_every != 1:
        raise ConfigError(f"bad --compress-every {cfg.compress_every} with --loop sebulba: its compressor thread "
                          "re-compresses as fast as it can, overlapped with learning; use --loop sequential")
    if cfg.num_envs % cfg.actor_threads:
        raise ConfigError(f"bad --num-envs {cfg.num_envs}: must be a multiple of --actor-threads {cfg.actor_threads}")
    per_thread = cfg.num_envs // cfg.actor_threads
    if cfg.actor_batch > per_thread:
        raise ConfigError(f"bad --actor-batch {cfg.actor_batch}: at most the {per_thread} environments of each "
                          f"actor thread (--num-envs {cfg.num_envs} / --actor-threads {cfg.actor_threads})")


def actor_batch(cfg: Config) -> int:
    """Environments per envpool recv in each actor thread (``--actor-batch``, 0: half, at least 1)."""
    return cfg.actor_batch or max(1, cfg.num_envs // cfg.actor_threads // 2)


class _Failure:
    """The first exception raised in any thread (the rest are consequences)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        self.where: str | None = None

    def record(self, where: str, err: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error, self.where = err, where


class _Latest:
    """The newest value with its version; readers never wait for writers."""

    def __init__(self, value, version: int):
        self._cond = threading.Condition()
        self.item = (value, version)  # replaced whole: a reader sees a consistent pair without the lock

    def publish(self, value, version: int) -> None:
        with self._cond:
            self.item = (value, version)
            self._cond.notify_all()

    def wait_newer(self, version: int, timeout: float):
        """The item if its version is newer than ``version`` (waiting up to ``timeout`` s), else None."""
        with self._cond:
            self._cond.wait_for(lambda: self.item[1] > version, timeout)
            return self.item if self.item[1] > version else None


class _Clock:
    """Stage seconds added by worker threads and drained by the learner into the Monitor."""

    def __init__(self):
        self._lock = threading.Lock()
        self._seconds: dict[str, float] = {}

    def add(self, stage: str, seconds: float) -> None:
        with self._lock:
            self._seconds[stage] = self._seconds.get(stage, 0.0) + seconds

    def drain(self) -> dict[str, float]:
        with self._lock:
            out, self._seconds = self._seconds, {}
        return out


class _WorkerFailed(Exception):
    """Raised in the learner when a worker thread has failed (its error is in ``_Failure``)."""


def _thread(name: str, body: Callable[[], None], failure: _Failure, stopping: threading.Event) -> threading.Thread:
    def target():
        try:
            body()
        except BaseException as err:  # noqa: BLE001  (handed to the learner, which re-raises it)
            failure.record(name, err)
            stopping.set()

    return threading.Thread(target=target, name=name, daemon=True)


def run_sebulba(run: Run, stop: StopSignals, trained: dict | None, claimed: list[str]) -> dict:
    """Train ``run`` with actor, learner and compressor threads; return its summary.

    Raises:
      accerl_jax.signals.Interrupted: a signal before the first update of this session finished.
      BaseException: the original exception of a failed actor, compressor or learner step, after a
        checkpoint of the last completed update has been saved.
    """
    cfg, info, monitor, saver, compressor = run.cfg, run.info, run.monitor, run.saver, run.compressor
    extra, num_updates, steps_per_update, logdir = run.extra, run.num_updates, run.steps_per_update, run.logdir
    learner_logits, actor_logits, divergence = run.learner_logits, run.actor_logits, run.divergence
    guard = UpdateGuard(run.update, cfg.on_nan, skipped=extra.get("skipped_updates", 0), family=run.spec.family)
    mesh = learner_lib.make_mesh()
    actor_device = jax.devices("cpu")[0] if cfg.actor_device == "cpu" else mesh.devices.flat[0]
    threads_n, per_thread, batch = cfg.actor_threads, cfg.num_envs // cfg.actor_threads, actor_batch(cfg)
    rollout_sharding = (NamedSharding(mesh, P(None, learner_lib.AXIS)) if per_thread % mesh.devices.size == 0
                        else mesh.devices.flat[0])
    start_update = extra.get("completed", 0)
    completed = logged = start_update
    metrics: dict = {}
    stopped = stop_reason = None
    rollout = None
    lags: list[int] = []

    if run.resume_point is None:
        state, base_key = run.state, run.k_actor
        _, first_obs = run.env.reset()  # the first observations calibrate int8's activation ranges
        with monitor.time("compress"):
            actor_params, comp_state = compressor.init(run.params, run.k_comp, jnp.asarray(first_obs))
            jax.block_until_ready(actor_params)
    else:
        state, lagged, comp_state, base_key = run.restored
        actor_params = lagged[-1]
    thread_key, saved_key = jax.random.split(base_key)
    to_actor = (lambda p: jax.device_put(p, actor_device))
    comp_box = _Latest((actor_params, comp_state), start_update)  # compressor output on the learner's devices
    actor_box = _Latest(to_actor(actor_params), start_update)  # the actors' copy, with its version
    learner_box = _Latest(None, start_update)  # (learner params, observations) to compress
    refresh_logs: list = []  # (update, divergence) of every --log-every-th refresh, for the Monitor
    failure, stopping, clock = _Failure(), threading.Event(), _Clock()
    put_wait = _Clock()  # seconds the actor threads waited for room in the queue (the learner is behind)
    compress_wait = _Clock()  # seconds the learner waited for the compressor (more than one update behind)
    rollouts: queue.Queue = queue.Queue(maxsize=cfg.queue_size)
    env_id = cfg.env.split(":", 1)[1]

    def actor_body(index: int) -> Callable[[], None]:
        def body():
            # Built in the thread: a failure here stops the run like any other (and envs build in parallel).
            env = AsyncEnvpoolEnv(env_id, per_thread, batch, cfg.seed + index * per_thread)
            key = jax.device_put(jax.random.fold_in(thread_key, index), actor_device)
            actor = AsyncActor(env, run.actor.act, cfg.rollout_length, key)
            mark = time.perf_counter()
            for local, version, seconds in actor.rollouts(lambda: actor_box.item, stopping.is_set):
                start = time.perf_counter()
                on_learner = jax.block_until_ready(jax.device_put(local, rollout_sharding))
                ready = time.perf_counter()
                while not stopping.is_set():
                    try:
                        rollouts.put((on_learner, version, dict(seconds, transfer=ready - start)), timeout=POLL_S)
                        break
                    except queue.Full:
                        continue
                waited = time.perf_counter() - ready
                put_wait.add("put", waited)
                clock.add("actor", time.perf_counter() - mark - waited)
                mark = time.perf_counter()

        return body

    def compress_body() -> None:
        mine = {"seen": start_update, "refreshes": 0, "comp_state": comp_state, "params": actor_params}
        while not stopping.is_set():
            item = learner_box.wait_newer(mine["seen"], POLL_S)
            if item is None:
                continue
            (params, obs), version = item
            start = time.perf_counter()
            previous = mine["params"]
            new, new_state = compressor.compress(params, mine["comp_state"], obs)
            jax.block_until_ready(new)
            clock.add("compress", time.perf_counter() - start)
            mine.update(seen=version, comp_state=new_state, params=new)
            if new is not previous:  # a refreshed policy: the actors get it with its version
                mine["refreshes"] += 1
                if mine["refreshes"] % cfg.log_every == 0:
                    held = obs[:REFRESH_SAMPLES]
                    refresh_logs.append((version, divergence(learner_logits(params, held), actor_logits(new, held))))
                actor_box.publish(to_actor(new), version)
            comp_box.publish((new, new_state), version)

    workers = [_thread(f"accerl-actor-{i}", actor_body(i), failure, stopping) for i in range(threads_n)]
    workers.append(_thread("accerl-compress", compress_body, failure, stopping))

    def take():
        """One queue item; raises _WorkerFailed as soon as a worker has failed."""
        start = time.perf_counter()
        while True:
            if failure.error is not None:
                raise _WorkerFailed
            try:
                item = rollouts.get(timeout=POLL_S)
                break
            except queue.Empty:
                continue
        monitor.add_time("queue_wait", time.perf_counter() - start)
        return item

    def wait_for_compression(version: int) -> float:
        """Wait until the compressor has processed ``version``; returns the seconds waited."""
        start = time.perf_counter()
        while comp_box.item[1] < version:
            if failure.error is not None:
                raise _WorkerFailed
            comp_box.wait_newer(version - 1, POLL_S)
        return time.perf_counter() - start

    def snapshot_now():
        (params, cstate), _ = comp_box.item
        return checkpoint.TrainState(state, (params,), cstate, saved_key)

    def save(step: int) -> None:
        deferring, stop.deferring = stop.deferring, True  # a signal never cuts a checkpoint write short
        try:
            saver.save(step, snapshot, {
                "completed": step, "monitor": monitor.state_dict(), "env_calibration": [],
                "skipped_updates": guard.skipped, "wall_time_s": time.perf_counter() - run.wall_start,
            })
        finally:
            stop.deferring = deferring

    def log(it: int, metrics: dict) -> dict:
        held = rollout.obs.reshape((-1,) + info.obs_shape)[:DIVERGENCE_SAMPLES]
        (params, _), _ = comp_box.item
        metrics = dict(metrics, **divergence(learner_logits(state.params, held), actor_logits(params, held)))
        monitor.log(it, metrics)
        return metrics

    def drain_times() -> None:
        for stage, seconds in clock.drain().items():
            monitor.add_time(stage, seconds)
        while refresh_logs:
            monitor.log_refresh(*refresh_logs.pop(0))

    def stop_workers() -> None:
        stopping.set()
        deadline = time.perf_counter() + JOIN_S
        for w in workers:
            w.join(max(0.0, deadline - time.perf_counter()))

    snapshot = snapshot_now()
    for w in workers:
        w.start()
    try:
        for it in range(start_update + 1, num_updates + 1):
            items = [take() for _ in range(threads_n)]
            parts = [item[0] for item in items]
            rollout = parts[0] if threads_n == 1 else jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=1), *parts)
            for _, _, seconds in items:
                for stage, s in seconds.items():
                    monitor.add_time(stage, s)
            lag = (it - 1) - min(item[1] for item in items)
            lags.append(lag)
            # Compression may overlap this update, but not fall further behind: that bounds the lag.
            compress_wait.add("wait", wait_for_compression(it - 2))
            with monitor.time("learner"):
                state, metrics, bad = guard(state, rollout, it)
                jax.block_until_ready(state)
            learner_box.publish((state.params, rollout.obs.reshape((-1,) + info.obs_shape)), it)
            drain_times()
            metrics = dict(metrics, policy_lag_versions=jnp.float32(lag))
            finished = np.asarray((rollout.terminated | rollout.truncated) & rollout.valid)
            monitor.record_episodes(np.asarray(rollout.episode_return), finished, steps_per_update,
                                    episode_length=np.asarray(rollout.episode_length))
            completed = it
            claimed.clear()
            if bad is None:
                snapshot = snapshot_now()
            if bad is not None or it % cfg.log_every == 0 or it == num_updates:
                metrics, logged = log(it, metrics), it
            else:
                monitor.progress()
            if bad is not None:
                stopped = "diverged"
                stop_reason = guard_lib.stop_reason(bad, it, metrics)
                break
            if cfg.checkpoint_every and it % cfg.checkpoint_every == 0:
                save(it)
            stop.armed = True
            if stop.requested is not None:
                stopped = "interrupted"
                break
        if stopped is None:  # the actor's final policy: the compression of the last update
            compress_wait.add("wait", wait_for_compression(completed))
    except KeyboardInterrupt:
        stopped = "interrupted"
    except BaseException as err:  # a worker's failure, or the learner's own: save, stop, re-raise
        if not isinstance(err, _WorkerFailed):
            failure.record("learner", err)
        stop.deferring = True
        stop_workers()
        try:
            if completed > start_update and saver.last_step != completed:
                save(completed)
        finally:
            monitor.close()
            saver.close()
            run.lock.release()
            if completed == start_update == 0:
                checkpoint.remove_run(logdir)
                monitor.discard()
        if failure.error is err:
            raise
        raise failure.error from None  # the worker's own exception, with its traceback
    stop.deferring = True
    stop_workers()
    drain_times()
    if stopped == "interrupted" and completed == start_update:
        monitor.close()
        run.lock.release()
        saver.close()
        if start_update == 0:
            checkpoint.remove_run(logdir)
            monitor.discard()
        raise Interrupted(stop.requested)
    (actor_params, _), _ = comp_box.item
    stopped, metrics, speed_report = wind_up(
        run, stopped=stopped, completed=completed, logged=logged, metrics=metrics, save=save, log=log,
        state=state, actor_params=actor_params, rollout=rollout, trained=trained)
    times = monitor.times
    return summarize(
        run, state=state, actor_params=actor_params, metrics=metrics, completed=completed, stopped=stopped,
        stop_reason=stop_reason, exit_signal=stop.requested, skipped_updates=guard.skipped,
        speed_report=speed_report, loop="sebulba", actor_threads=threads_n, actor_batch=batch,
        actor_device=str(actor_device), queue_size=cfg.queue_size,
        policy_lag_mean=float(np.mean(lags)) if lags else None, policy_lag_max=max(lags) if lags else None,
        transfer_time_s=times["transfer"], queue_wait_time_s=times["queue_wait"], actor_put_wait_s=put_wait.drain().get("put", 0.0),
        learner_compress_wait_s=compress_wait.drain().get("wait", 0.0),
        stage_times_overlap=True,
    )
