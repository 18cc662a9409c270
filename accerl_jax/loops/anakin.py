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

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from accerl_jax import checkpoint
from accerl_jax import guard as guard_lib
from accerl_jax.actor import AnakinActor
from accerl_jax.guard import quantity
from accerl_jax.loops.anakin_auto import AutoChunks
from accerl_jax.loops.anakin_program import (AnakinState, _seed, initial_state, make_chunk, record_chunk,
                                             restored_state, state_sharding)
from accerl_jax.monitor import Monitor
from accerl_jax.run import Run, measure_speed, summarize, unmeasured_speed
from accerl_jax.signals import Interrupted, StopSignals


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
