"""The sequential loop: actor rollout, learner update and compression as separate jitted calls, one
after the other, each timed by the Monitor (``--loop sequential``; the baseline of
``experiments/throughput.py``). The actor runs the compressed parameters made ``--policy-lag`` updates
before the latest; the policy is re-compressed every ``--compress-every`` updates. The non-finite guard
is fused into the learner update's program (:class:`~accerl_jax.guard.UpdateGuard`).
"""
from __future__ import annotations

import collections
import functools
import inspect
import time

import jax
import numpy as np

from accerl_jax import checkpoint
from accerl_jax import guard as guard_lib
from accerl_jax.guard import UpdateGuard
from accerl_jax.run import DIVERGENCE_SAMPLES, REFRESH_SAMPLES, Run, policy_versions, summarize, wind_up
from accerl_jax.signals import Interrupted, StopSignals


def run_sequential(run: Run, stop: StopSignals, trained: dict | None, claimed: list[str]) -> dict:
    """Train ``run`` to its budget (or a signal / non-finite update) and return its summary.

    Raises:
      accerl_jax.signals.Interrupted: a signal before the first update of this session finished.
    """
    cfg, info, monitor, saver, actor, compressor = run.cfg, run.info, run.monitor, run.saver, run.actor, run.compressor
    extra, num_updates, steps_per_update = run.extra, run.num_updates, run.steps_per_update
    learner_logits, actor_logits, divergence, logdir = run.learner_logits, run.actor_logits, run.divergence, run.logdir
    state, k_actor, k_comp, params, lock = run.state, run.k_actor, run.k_comp, run.params, run.lock
    env_calibration = list(extra.get("env_calibration", []))  # seconds of one env-only rollout (Anakin actors)
    adapt = getattr(compressor, "adapt", None)  # --compressor auto's hook (accerl_jax.compressor.auto)
    decisions: list[dict] = []
    guard = UpdateGuard(run.update, cfg.on_nan, skipped=extra.get("skipped_updates", 0), family=run.spec.family)
    metrics: dict = {}
    stopped = None
    stop_reason = None
    rollout = None
    start_update = extra.get("completed", 0)
    refreshes = 0  # refreshes of the actor's policy in this session
    completed = start_update  # learner updates (with their compression) that finished
    logged = start_update  # the last update written to metrics.csv

    def save(step: int) -> None:
        deferring, stop.deferring = stop.deferring, True  # a signal never cuts a checkpoint write short
        try:
            saver.save(step, snapshot, {
                "completed": step, "monitor": monitor.state_dict(), "env_calibration": env_calibration,
                "skipped_updates": guard.skipped, "wall_time_s": time.perf_counter() - run.wall_start,
            })
        finally:
            stop.deferring = deferring

    def log(it: int, metrics: dict) -> dict:
        held = rollout.obs.reshape((-1,) + info.obs_shape)[:DIVERGENCE_SAMPLES]
        # The divergence of the policy the actor runs next (stale by --policy-lag updates) from the learner's.
        metrics = dict(metrics, **divergence(learner_logits(state.params, held), actor_logits(lagged[0], held)))
        metrics["policy_lag_versions"] = lag
        if info.jittable:
            env_calibration.append(actor.time_env_only(carry))
            # The fused actor's env share, calibrated so far (see AnakinActor.time_env_only).
            monitor.set_env_time(min(float(np.median(env_calibration)) * it, monitor.times["actor"]))
        monitor.log(it, metrics)
        return metrics

    try:
        if run.resume_point is None:
            carry = actor.reset(k_actor)
            with monitor.time("compress"):  # first observations calibrate int8's activation ranges
                actor_params, comp_state = compressor.init(params, k_comp, carry.obs)
                jax.block_until_ready(actor_params)
            lagged_params = (actor_params,)
        else:
            state, lagged_params, comp_state, carry = run.restored
            actor_params = lagged_params[-1]
            if not info.jittable:  # host envs cannot be saved: they restart, the actor's key continues
                carry = actor.reset(k_actor)._replace(key=carry)
        # The last policy_lag + 1 compressed parameter sets, oldest first; the actor runs the oldest.
        lagged = collections.deque(lagged_params, maxlen=cfg.policy_lag + 1)
        # The policy version (the update after which it was compressed; 0 = initial) of each set in lagged.
        versions = collections.deque(policy_versions(start_update, len(lagged), cfg.compress_every),
                                     maxlen=cfg.policy_lag + 1)
        # The last completed update's state: what a checkpoint saves, even if a later update is abandoned.
        snapshot = checkpoint.TrainState(state, tuple(lagged), comp_state, checkpoint.host_key_only(carry, info.jittable))
        compress = compressor.compress
        if isinstance(comp_state, dict) and "distill" in comp_state and "timer" in inspect.signature(compress).parameters:
            # Distillation's own seconds (the "distill" stage); the chain then blocks after each stage.
            compress = functools.partial(compress, timer=monitor.compressor_stage_time)
        lag = 0
        for it in range(start_update + 1, num_updates + 1):
            with monitor.time("actor"):
                carry, rollout, actor_times = actor.rollout(lagged[0], carry)
                jax.block_until_ready(rollout)
            for stage in ("env", "inference"):
                if f"{stage}_time_s" in actor_times:
                    monitor.add_time(stage, actor_times[f"{stage}_time_s"])
            lag = it - 1 - versions[0]  # learner versions the acting policy is behind
            rho_params = state.params  # the parameters the update computes ρ with
            with monitor.time("learner"):
                state, metrics, bad = guard(state, rollout, it)  # bad: the non-finite quantity (--on-nan stop)
                jax.block_until_ready(state)
            metrics["policy_lag_versions"] = lag
            obs_flat = rollout.obs.reshape((-1,) + info.obs_shape)
            previous = actor_params
            decision = None
            if it % cfg.compress_every == 0:
                with monitor.time("compress"):
                    actor_params, comp_state = compress(state.params, comp_state, obs_flat)
                    if adapt is not None:  # auto: may evaluate its candidates and switch (counted as compression)
                        actor_params, comp_state, decision = adapt(it, state.params, comp_state, actor_params,
                                                                   rollout, rho_params=rho_params)
                    jax.block_until_ready(actor_params)
                versions.append(it)
            else:
                versions.append(versions[-1])
            lagged.append(actor_params)
            refreshed = actor_params is not previous
            refreshes += refreshed
            # Every --log-every-th refresh of the actor's policy logs its divergence: measuring it at every
            # refresh (every update here) cost ~1.8 ms per update, ~10% of the default CartPole job.
            if refreshed and refreshes % cfg.log_every == 0:
                held = obs_flat[:REFRESH_SAMPLES]
                monitor.log_refresh(it, divergence(learner_logits(state.params, held), actor_logits(actor_params, held)))
            finished = np.asarray((rollout.terminated | rollout.truncated) & rollout.valid)
            monitor.record_episodes(np.asarray(rollout.episode_return), finished, steps_per_update,
                                    episode_length=np.asarray(rollout.episode_length))
            if decision is not None:
                monitor.log_decision(decision)
                decisions.append(decision)
            completed = it
            claimed.clear()  # the folder now holds a run (its checkpoints and summary are kept)
            if bad is None:
                snapshot = checkpoint.TrainState(state, tuple(lagged), comp_state,
                                                 checkpoint.host_key_only(carry, info.jittable))
            if bad is not None or it % cfg.log_every == 0 or it == num_updates:
                metrics, logged = log(it, metrics), it
            else:
                monitor.progress()
            if bad is not None:  # the diverged state is never saved: the last good checkpoint stays
                stopped = "diverged"
                stop_reason = guard_lib.stop_reason(bad, it, metrics)
                break
            if cfg.checkpoint_every and it % cfg.checkpoint_every == 0:
                save(it)
            stop.armed = True  # from now on a signal stops at the end of the update in flight
            if stop.requested is not None:
                stopped = "interrupted"
                break
    except KeyboardInterrupt:  # a signal before the first update, or a second one: abandon the update
        stopped = "interrupted"
    stop.deferring = True  # saving and summarising are never cut short by another signal
    if stopped == "interrupted" and completed == start_update:
        monitor.close()
        lock.release()
        saver.close()
        if start_update == 0:
            checkpoint.remove_run(logdir)  # nothing ran: free the folder for a rerun
            monitor.discard()
        raise Interrupted(stop.requested)
    stopped, metrics, speed_report = wind_up(
        run, stopped=stopped, completed=completed, logged=logged, metrics=metrics, save=save, log=log,
        state=state, actor_params=actor_params, rollout=rollout, trained=trained)
    return summarize(run, state=state, actor_params=actor_params, metrics=metrics, completed=completed,
                     stopped=stopped, stop_reason=stop_reason, exit_signal=stop.requested,
                     skipped_updates=guard.skipped, speed_report=speed_report, loop="sequential",
                     **({"auto_decisions": decisions, "auto_running": compressor.running(comp_state)}
                        if adapt is not None else {}))
