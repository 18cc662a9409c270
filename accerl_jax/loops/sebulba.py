"""The Sebulba stepper (``--loop sebulba``, the default for envpool; docs/DESIGN.md "Execution styles";
Podracer's Sebulba, arXiv 2104.06272, and cleanba). Threads of each process:

* ``--actor-threads`` actor threads (:class:`accerl_jax.async_actor.AsyncActor`), each stepping its own
  envpool in async mode (``recv``/``send`` of ``--actor-batch`` environments) and running the compressed
  policy on ``--actor-device`` (``cpu``/``cpu-apart``: the host's ``cpu:0``; ``learner``: the learner's
  first device); each rollout is copied to the learner's devices (``run.mesh``, sharded over the batch
  axis) and put, with the policy version that produced it, into a bounded queue (``--queue-size``).
  With ``cpu-apart`` on XLA:CPU the learner's mesh leaves ``cpu:0`` out
  (:func:`accerl_jax.run.plan.first_learner_device`), so actor and learner hold their arrays apart as they
  do beside a GPU learner.
* the learner, in the calling thread (where signals arrive): takes one rollout per actor thread, applies
  the guarded update (:class:`accerl_jax.run.guard.UpdateGuard`), records the policy lag in versions
  (``policy_lag_versions``), yields one :class:`~accerl_jax.run.driver.Step`, and hands its newest
  parameters to
* the compressor thread (:func:`~accerl_jax.loops.sebulba_compress.compress_loop`), which compresses
  the newest learner parameters it has been given (older ones are skipped), takes ``--compressor auto``'s
  decisions, and publishes the policy to the actors; so compression overlaps acting and learning.

``--normalize-observations`` / ``--normalize-rewards`` (:mod:`accerl_jax.normalize`): the learner holds
the statistics, normalises each rollout with them at update time and then updates them from the raw
rollout; the actors get the observation statistics with each published policy and act on observations
normalised with those. An actor's statistics may be a few versions older than the learner's: from the
raw observations' view that is one more difference between μ and π, and the stored ``log μ(a|x)``
corrects for it as it does for the parameters' lag.

Several processes (``--num-processes``; cleanba's layout): every process runs these threads. Its actors'
rollouts go to its first learner device; the update (:class:`accerl_jax.run.shards.GlobalUpdate`) takes
them as its devices' shard of the global batch ``[T, processes x --num-envs]`` over the mesh of every
process's learner devices, so the learners stay bitwise equal. What the processes must learn alike is
learnt from the global batch, gathered in the learner thread (:func:`accerl_jax.run.shards.gather_columns`):
the normalisation statistics, the compressor's observations (the teacher's outputs at them come gathered
from the update) and int8's first calibration. Only the learner thread enters cross-process collectives
(the update, those gathers, the driver's stop vote), in the same order on every process. Each compressor
thread still skips to the newest parameters at its own pace, so the processes' actors may differ by a
version. Env ``g`` of the run's ``processes x --num-envs`` is seeded as in the other loops; each actor
thread has its own action key.

A worker thread that raises stops the run within ~:data:`POLL_S`: the stepper re-raises the worker's own
exception, and the driver saves the last completed update. Host environments restart on ``--resume``.

Version ``v`` is the policy compressed from the learner after ``v`` updates (``0``: the initial one). The
lag of a rollout (updates completed when it is taken, minus the oldest version among its steps) is at
most ``--queue-size + 4``: the learner waits before update ``u`` until the compressor has finished version
``u - 2``; the oldest step of a rollout may have been chosen while its predecessor was being collected,
after which the learner can take at most ``--queue-size`` queued rollouts, the predecessor, and finish
the update in flight.
"""
from __future__ import annotations

import functools
import queue
import threading
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from accerl_jax.run import checkpoint, shards
from accerl_jax import learner as learner_lib
from accerl_jax import normalize
from accerl_jax.actor import HostActor
from accerl_jax.async_actor import AsyncActor
from accerl_jax.platform.clock import StageClock
from accerl_jax.config import Config
from accerl_jax.run.driver import Bad, Episodes, Events, Final, Step
from accerl_jax.envs.envpool_env import AsyncEnvpoolEnv, envpool_seed
from accerl_jax.run.guard import UpdateGuard
from accerl_jax.loops import shared
from accerl_jax.loops.auto import AutoControl
from accerl_jax.loops.sebulba_compress import compress_loop
from accerl_jax.loops.sebulba_threads import Failure, Latest, WorkerFailed, feed, take, thread, wait_for_version
from accerl_jax.run.build import DIVERGENCE_SAMPLES, Run, teacher_kwargs

POLL_S = 0.05  # how often a blocked thread looks for a stop or a failure elsewhere
JOIN_S = 10.0  # how long the learner waits for a stopping worker thread


def actor_batch(cfg: Config) -> int:
    """Environments per envpool recv in each actor thread (``--actor-batch``, 0: half, at least 1)."""
    return cfg.actor_batch or max(1, cfg.num_envs // cfg.actor_threads // 2)


class SebulbaStepper:
    """Actor threads, a compressor thread and the learner in the calling thread; one step per learner
    update (module docstring).

    Raises (from :meth:`steps`): the original exception of a failed actor or compressor thread.
    """

    def __init__(self, run: Run):
        self.run = run
        cfg = run.cfg
        self.guard = UpdateGuard(shared.learner_update(run), cfg.on_nan, skipped=run.extra.get("skipped_updates", 0),
                                 family=run.plan.spec.family)
        # Where the learner's inputs go: with one process, its mesh (with --actor-device cpu-apart on XLA:CPU,
        # every local device but cpu:0); with several, this process's first learner device, where its
        # process-local learner state lives: the update assembles the global batch from each process's
        # rollouts (accerl_jax.run.shards.GlobalUpdate), as in the sequential loop.
        self.processes, self.pid = run.plan.num_processes, run.plan.process_id
        local = run.state_mesh
        self.local_replicated = NamedSharding(local, P())
        self.actor_device = (local.devices.flat[0] if cfg.actor_device == "learner"
                             else jax.local_devices(backend="cpu")[0])
        self.threads_n, self.per_thread, self.batch = cfg.actor_threads, cfg.num_envs // cfg.actor_threads, actor_batch(cfg)
        self.rollout_sharding = (NamedSharding(local, P(None, learner_lib.AXIS))
                                 if self.per_thread % local.devices.size == 0 else local.devices.flat[0])
        self.rollout = None
        self.lags: list[int] = []
        # Stage seconds of every thread (drained into each Step); the learner's own go to the same clock.
        self.failure, self.stopping, self.clock = Failure(), threading.Event(), StageClock()
        self.put_wait = StageClock()  # seconds the actor threads waited for room in the queue (the learner is behind)
        self.compress_wait = StageClock()  # seconds the learner waited for the compressor (> one update behind)
        self.rollouts: queue.Queue = queue.Queue(maxsize=cfg.queue_size)
        self.refreshes: list = []  # Refresh records of every --log-every-th refresh (compressor thread), not yet yielded
        # --compressor auto's one wiring; its decisions are taken in the compressor thread.
        self.auto = AutoControl(run.compressor) if run.plan.auto else None
        self.workers: list[threading.Thread] = []
        self.norm = shared.LearnerNormalizer(run)  # the statistics, set by _start
        # The actors' policy with --normalize-observations: (actor params, observation statistics) pairs.
        self.act = (HostActor(run.env, normalize.normalized_apply(run.actor_apply), cfg.rollout_length,
                              run.plan.spec.family).act if cfg.normalize_observations else run.actor.act)

    def _start(self) -> None:
        run = self.run
        if run.plan.resume is None:
            state, base_key = run.state, run.k_actor
            # The first observations calibrate int8's activation ranges: the whole global batch's, so that
            # every process starts from the same compressed policy.
            _, first_obs = run.env.reset()
            first_obs = shards.gather_columns(np.asarray(first_obs)[None])[0]
            with self.clock.time("compress"):  # on the learner's devices, where its parameters live
                actor_params, comp_state = run.compressor.init(state.params, run.k_comp, jnp.asarray(first_obs))
                jax.block_until_ready(actor_params)
        else:
            state, lagged, comp_state, base_key = run.restored[:4]
            if self.processes > 1:  # restored as host arrays: onto this process's first learner device
                state, lagged, comp_state, base_key = jax.device_put((state, lagged, comp_state, base_key),
                                                                     self.local_replicated)
            actor_params = lagged[-1]
        # The statistics of the global batch (every process's envs), the same on every process; host envs
        # restart on --resume, and so do their discounted returns.
        self.norm.start(restart_returns=True)
        self.state = state
        self.thread_key, self.saved_key = jax.random.split(base_key)
        start = run.start_update
        self.comp_box = Latest((actor_params, comp_state), start)  # compressor output on the learner's devices
        self.actor_box = Latest(self._to_actor(actor_params), start)  # the actors' copy, with its version
        self.learner_box = Latest(None, start)  # (learner params, observations) to compress
        self.workers = [thread(f"accerl-actor-{i}", self._actor_body(i), self.failure, self.stopping)
                        for i in range(self.threads_n)]
        compress = functools.partial(compress_loop, run, self.learner_box, self.comp_box, self.actor_box,
                                     self._to_actor, self.stopping, self.clock, self.refreshes, self.auto,
                                     POLL_S)
        self.workers.append(thread("accerl-compress", compress, self.failure, self.stopping))

    def _to_actor(self, params):
        # With --normalize-observations the learner's newest statistics go with the policy.
        return jax.device_put(self.norm.actor_params(params), self.actor_device)

    def _actor_body(self, index: int) -> Callable[[], None]:
        run, cfg = self.run, self.run.cfg

        def body():
            # Built in the thread: a failure here stops the run like any other (and envs build in parallel).
            # Env g of the run's num_envs x processes is seeded seed x (that total) + g (as in the other loops);
            # this thread holds the index-th block of its process's block, and its own action key.
            first = self.pid * cfg.num_envs + index * self.per_thread
            env = AsyncEnvpoolEnv(cfg.env.split(":", 1)[1], self.per_thread, self.batch,
                                  envpool_seed(cfg.seed, cfg.num_envs * self.processes, first),
                                  reward_clip=cfg.reward_clip)
            key = jax.random.fold_in(self.thread_key, self.pid * self.threads_n + index)
            key = jax.device_put(key, self.actor_device)
            actor = AsyncActor(env, self.act, cfg.rollout_length, key)
            feed(actor.rollouts(lambda: self.actor_box.item, self.stopping.is_set), self.rollout_sharding,
                 self.rollouts, self.stopping, self.clock, self.put_wait, POLL_S)

        return body

    def _wait_for_compression(self, version: int) -> None:
        """Wait until the compressor has processed ``version``."""
        start = time.perf_counter()
        wait_for_version(self.comp_box, version, self.failure, POLL_S)
        self.compress_wait.add("wait", time.perf_counter() - start)

    def _snapshot(self) -> checkpoint.TrainState:
        (params, cstate), _ = self.comp_box.item
        return shared.snapshot(self.run, self.state, (params,), cstate, key=self.saved_key, normalizer=self.norm.state)

    def _drain(self) -> Events:
        """What the threads measured since the last drain: stage seconds, refreshes, auto decisions."""
        refreshes = tuple(self.refreshes.pop(0) for _ in range(len(self.refreshes)))
        return Events(self.clock.drain(), refreshes, self.auto.take_decisions() if self.auto is not None else ())

    def steps(self, driver):
        try:
            yield from self._steps(driver)
        except WorkerFailed:
            raise self.failure.error from None  # the worker's own exception, with its traceback
        except BaseException as err:
            if not isinstance(err, KeyboardInterrupt):
                self.failure.record("learner", err)
            raise

    def _steps(self, driver):
        run, clock = self.run, self.clock
        self._start()
        for w in self.workers:
            w.start()
        completed = run.start_update
        for it in range(run.start_update + 1, run.plan.num_updates + 1):
            if not driver.keep_going(it - 1):
                return
            with clock.time("queue_wait"):  # one rollout per actor thread
                items = [take(self.rollouts, self.failure, POLL_S) for _ in range(self.threads_n)]
            parts = [item[0] for item in items]
            rollout = parts[0] if self.threads_n == 1 else jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=1), *parts)
            rollout, learner_obs = self.norm.learner_view(rollout)
            self.rollout = rollout
            for _, _, seconds in items:
                for stage, sec in seconds.items():
                    clock.add(stage, sec)
            lag = (it - 1) - min(item[1] for item in items)
            self.lags.append(lag)
            # Compression may overlap this update, but not fall further behind: that bounds the lag.
            self._wait_for_compression(it - 2)
            rho_params = self.state.params  # the parameters the update computes ρ with
            with clock.time("learner"):
                # The actors' current parameters name a diverged compressor as the cause of a bad update
                # (guard.refine; read only for a bad one), as the other loops name theirs.
                self.state, metrics, bad, *outputs = self.guard(self.state, rollout, it,
                                                                actor_params=self.actor_box.item[0])
                jax.block_until_ready(self.state)
            obs = learner_obs.reshape((-1,) + run.info.obs_shape)
            self.learner_box.publish((self.state.params, obs, teacher_kwargs(outputs, obs.shape[0]), rollout,
                                      rho_params), it)
            events = self._drain()
            metrics = dict(metrics, policy_lag_versions=jnp.float32(lag))
            completed = it
            yield Step(it, 1, [metrics], [Episodes.of_rollout(rollout)], None if bad is not None else self._snapshot(),
                       Bad(bad, it, 0, self.guard.streak) if bad is not None else None, events=events)
            if bad is not None:
                return
        if driver.keep_going(completed):  # the actor's final policy: the compression of the last update
            self._wait_for_compression(completed)

    def row(self, update: int) -> list:
        (params, _), _ = self.comp_box.item
        return [shared.divergence(self.run, self.state.params, params, self.rollout.obs, DIVERGENCE_SAMPLES)]

    def env_seconds(self, update: int) -> None:
        return None  # the actor threads time env stepping apart

    def extra(self) -> dict:
        return {"env_calibration": [], "skipped_updates": self.guard.skipped}

    def final(self) -> list:
        (actor_params, _), _ = self.comp_box.item
        return [Final(self.state, actor_params, None if self.rollout is None else self.rollout.obs)]

    def fields(self, times: dict) -> dict:
        cfg = self.run.cfg
        return dict(
            loop="sebulba", actor_threads=self.threads_n, actor_batch=self.batch,
            actor_device=str(self.actor_device), queue_size=cfg.queue_size,
            policy_lag_mean=float(np.mean(self.lags)) if self.lags else None,
            policy_lag_max=max(self.lags) if self.lags else None,
            transfer_time_s=times["transfer"], queue_wait_time_s=times["queue_wait"],
            actor_put_wait_s=self.put_wait.drain().get("put", 0.0),
            learner_compress_wait_s=self.compress_wait.drain().get("wait", 0.0),
            stage_times_overlap=True,
            **(self.auto.summary(self.comp_box.item[0][1]) if self.auto is not None else {}),
        )

    def cost_split(self) -> dict:
        return {}  # its stages are timed apart while training

    def close(self) -> Events:
        """Stop the worker threads (waiting up to :data:`JOIN_S` seconds); returns what they measured last."""
        self.stopping.set()
        deadline = time.perf_counter() + JOIN_S
        for w in self.workers:
            if w.is_alive():
                w.join(max(0.0, deadline - time.perf_counter()))
        return self._drain()
