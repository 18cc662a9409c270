"""The AcceRL training loop: Learner params -> Compressor -> Actor -> Corrector -> Learner, watched by
the Monitor (docs/DESIGN.md). Stages are separate jitted calls so that each
is timed; the actor always runs the compressed parameters made after the previous learner update.

:func:`train` has two phases. *Setup* checks everything the user chose (config, environment,
compressor, log folder) and raises :class:`~accerl_jax.config.ConfigError` before anything is written.
*Training* then runs; Ctrl-C/SIGTERM or a non-finite loss stops it early, and the summary of what ran is
still written (``"stopped": "interrupted"`` / ``"diverged"``). Checkpoints, ``--resume``, the signal
handling and the non-finite guard live in :mod:`~accerl_jax.checkpoint`, :mod:`~accerl_jax.signals` and
:mod:`~accerl_jax.guard` (issue 7); the loop only calls them.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import time
import uuid

import jax
import numpy as np

from accerl_jax import checkpoint
from accerl_jax import learner as learner_lib
from accerl_jax import networks, speed, xla
from accerl_jax.guard import UpdateGuard
from accerl_jax.signals import Interrupted, StopSignals, signal_name
from accerl_jax.actor import make_actor
from accerl_jax.compressor import make_compressor
from accerl_jax.config import Config, ConfigError, validate
from accerl_jax.corrector import CORRECTORS
from accerl_jax.envs import make_env
from accerl_jax.monitor import Monitor, gaussian_policy_divergence, is_run_file, policy_divergence

DIVERGENCE_SAMPLES = 1024  # observations on which KL(π_learner ‖ π_actor) is measured at each log
REFRESH_SAMPLES = 256  # observations for the KL/agreement logged at every --log-every-th refresh of the actor's policy
SPEED_FORWARDS = 32  # forward passes per timed scan in the policy-speed measurement
MAX_UPDATES = 2**31 - 1  # the optimizer's step counter is int32


def default_logdir(cfg: Config) -> str:
    """``runs/<env>-<compressor>-s<seed>-<time>-<random>``; the random part keeps parallel runs apart."""
    slug = f"{cfg.env}-{cfg.compressor}-s{cfg.seed}".replace(":", "_").replace("+", "_").replace("/", "_")
    return os.path.join("runs", f"{slug}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}")


def check_logdir(logdir: str, overwrite: bool = False) -> None:
    """Refuse a ``logdir`` that is a file or already holds a run (unless ``overwrite``), so that nothing
    saved is overwritten.

    Raises:
      ConfigError: naming the folder and what is in the way.
    """
    if os.path.exists(logdir) and not os.path.isdir(logdir):
        raise ConfigError(f"bad --logdir {logdir!r}: it is a file; expected a folder")
    if os.path.isdir(logdir) and not overwrite:
        taken = sorted(f for f in os.listdir(logdir) if is_run_file(f) or f == checkpoint.CHECKPOINT_DIR)
        if taken:
            raise ConfigError(
                f"bad --logdir {logdir!r}: it already holds a run ({', '.join(taken)}); choose a new folder, "
                f"continue it with --resume {logdir}, or replace it with --overwrite"
            )


def claim_logdir(logdir: str) -> None:
    """Create ``logdir`` and claim it by creating ``metrics.csv`` exclusively (``O_EXCL``).

    Two runs started together on the same folder cannot both claim it: the second gets a ConfigError.

    Raises:
      ConfigError: if the folder holds a run, is claimed by another run, or cannot be created/written.
    """
    check_logdir(logdir)
    try:
        os.makedirs(logdir, exist_ok=True)
        with open(os.path.join(logdir, "metrics.csv"), "x"):
            pass
    except FileExistsError:
        raise ConfigError(f"bad --logdir {logdir!r}: another run has just claimed it; choose a new folder") from None
    except OSError as err:
        raise ConfigError(f"bad --logdir {logdir!r}: cannot write there ({err.strerror or err})") from None


def make_loss_config(cfg: Config) -> learner_lib.LossConfig:
    """The learner's :class:`~accerl_jax.learner.LossConfig` for ``cfg``.

    Raises:
      ConfigError: for a bad ``--loss`` or a combination the losses do not accept (``appo`` with
        ``retrace``; ``--epochs``/``--minibatches`` other than 1 without ``appo``).
    """
    if cfg.loss not in learner_lib.LOSSES:
        raise ConfigError(f"bad --loss {cfg.loss!r}; expected one of {', '.join(learner_lib.LOSSES)}")
    try:
        return learner_lib.LossConfig(
            corrector=cfg.corrector, discount=cfg.discount, lambda_=cfg.lambda_,
            clip_rho_threshold=cfg.clip_rho_threshold, clip_pg_rho_threshold=cfg.clip_pg_rho_threshold,
            value_coef=cfg.value_coef, entropy_coef=cfg.entropy_coef, loss=cfg.loss, ppo_clip=cfg.ppo_clip,
            epochs=cfg.epochs, minibatches=cfg.minibatches,
        )
    except ValueError as err:
        raise ConfigError(f"bad --loss/--corrector combination: {err}") from None


def check_action_space(cfg: Config, info) -> None:
    """Reject what continuous actions do not support.

    Raises:
      ConfigError: ``--corrector retrace`` (needs a Q table over discrete actions) on a continuous-action env.
    """
    if info.continuous and cfg.corrector == "retrace":
        raise ConfigError(f"bad --corrector retrace for {cfg.env}: Retrace needs discrete actions (a Q head over "
                          "all actions); this env has continuous actions; use vtrace, is or none")


def train(cfg: Config, *, trained: dict | None = None) -> dict:
    """Run one training job and return its summary (also written to ``<logdir>/summary.json``).

    ``trained``, if given, is filled with ``learner_params``, ``actor_params`` and ``obs`` (the last
    rollout's observations ``[T * B, *obs_shape]``), for experiments that study the trained policy.

    SIGINT/SIGTERM stop it at an update boundary (:mod:`accerl_jax.signals`); a checkpoint is saved and
    the summary has ``"stopped": "interrupted"`` and ``"exit_signal"``.

    Raises:
      ConfigError: for any bad setting (env, compressor, corrector, numeric value, log folder, --resume
        checkpoint), raised before anything is written.
      accerl_jax.signals.Interrupted: a signal before the first update of this session finished (a new
        run's folder is freed; a resumed run's checkpoints are untouched).
    """
    claimed: list[str] = []  # the new run's folder while it holds no finished update
    with StopSignals() as stop:
        try:
            return _train(cfg, stop, trained, claimed)
        except KeyboardInterrupt:
            for logdir in claimed:  # stopped during setup or compilation: free the folder for a rerun
                checkpoint.remove_run(logdir)
                if os.path.isdir(logdir) and not os.listdir(logdir):
                    os.rmdir(logdir)
            raise


def _train(cfg: Config, stop: StopSignals, trained: dict | None, claimed: list[str]) -> dict:
    validate(cfg)
    if cfg.corrector not in CORRECTORS:
        raise ConfigError(f"bad --corrector {cfg.corrector!r}; expected one of {', '.join(CORRECTORS)}")
    loss_cfg = make_loss_config(cfg)
    config_json = dataclasses.asdict(cfg)
    resume_point = None
    if cfg.resume is not None:
        resume_point = checkpoint.find_resume_point(cfg.resume, cfg.logdir, config_json)
        logdir = resume_point.logdir
    else:
        logdir = cfg.logdir or default_logdir(cfg)
        check_logdir(logdir, cfg.overwrite)  # fail fast, before building environments
    wall_start = time.perf_counter()
    try:
        env = make_env(cfg.env, cfg.num_envs, cfg.seed)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    info = env.info
    n_dev = jax.local_device_count()
    if info.num_envs % n_dev:
        raise ConfigError(f"bad --num-envs {info.num_envs}: must be a multiple of the {n_dev} local devices")
    if info.num_envs % (n_dev * cfg.minibatches):
        raise ConfigError(f"bad --num-envs {info.num_envs}: must be a multiple of --minibatches {cfg.minibatches} "
                          f"x {n_dev} devices = {n_dev * cfg.minibatches}")
    check_action_space(cfg, info)
    steps_per_update = info.num_envs * cfg.rollout_length
    num_updates = max(1, cfg.total_steps // steps_per_update)
    if num_updates > MAX_UPDATES:
        raise ConfigError(f"bad --total-steps {cfg.total_steps}: more than {MAX_UPDATES} updates; use a smaller budget")
    if resume_point is not None and resume_point.meta["extra"]["completed"] >= num_updates:
        raise ConfigError(f"bad --resume {cfg.resume!r}: that run already finished all {num_updates} updates; "
                          "nothing to resume")
    try:
        spec = networks.default_spec(info.obs_shape, info.num_actions, info.channels_first,
                                     action_dim=info.action_dim, q_head=cfg.corrector == "retrace")
    except ValueError as err:
        raise ConfigError(f"bad --env {cfg.env!r}: {err}") from None
    learner_apply = networks.make_apply(spec)
    loss_apply = networks.make_apply_with_q(spec) if spec.q_head else learner_apply
    try:
        compressor = make_compressor(
            cfg.compressor, spec, learner_apply,
            distill_steps=cfg.distill_steps, distill_learning_rate=cfg.distill_learning_rate,
            distill_async=cfg.distill_async,
        )
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if resume_point is None:
        if cfg.overwrite:
            checkpoint.remove_run(logdir)
        claim_logdir(logdir)
        claimed.append(logdir)

    k_net, k_comp, k_actor = jax.random.split(jax.random.PRNGKey(cfg.seed), 3)
    params = networks.init_params(spec, k_net)
    # The learning rate anneals over optimizer steps (APPO takes epochs x minibatches per rollout).
    optimizer = learner_lib.make_optimizer(cfg.learning_rate, cfg.max_grad_norm, num_updates * loss_cfg.optimizer_steps)
    state = learner_lib.init_state(params, optimizer)
    update = learner_lib.make_update(loss_apply, optimizer, loss_cfg, family=spec.family)
    actor_apply = compressor.actor_apply(learner_apply)
    actor = make_actor(env, actor_apply, cfg.rollout_length, family=spec.family)
    learner_logits = xla.jit(lambda p, o: learner_apply(p, o)[0], spec.family)
    actor_logits = xla.jit(lambda p, o: actor_apply(p, o)[0], spec.family)
    divergence = gaussian_policy_divergence if info.continuous else policy_divergence

    saver = checkpoint.Checkpointer(logdir, cfg.keep_checkpoints, config_json)
    extra: dict = {}
    if resume_point is not None:
        carry_template = (jax.eval_shape(actor.reset, k_actor) if info.jittable
                          else jax.ShapeDtypeStruct(k_actor.shape, k_actor.dtype))
        obs_template = jax.ShapeDtypeStruct((info.num_envs,) + tuple(info.obs_shape), info.obs_dtype)
        actor_template, comp_template = jax.eval_shape(compressor.init, params, k_comp, obs_template)
        # The actor's lagged parameter sets: one more per completed update, up to --policy-lag + 1.
        n_lagged = min(resume_point.meta["extra"]["completed"], cfg.policy_lag) + 1
        template = checkpoint.TrainState(state, (actor_template,) * n_lagged, comp_template, carry_template)
        restored, extra = saver.restore(resume_point, template)  # ConfigError if damaged or incompatible
    try:
        lock = checkpoint.lock_run(logdir)  # ConfigError if another process is writing this run
    except ConfigError:
        saver.close()
        raise
    if resume_point is not None:
        checkpoint.trim_metrics(logdir, extra["completed"])
        wall_start -= extra["wall_time_s"]
    monitor = Monitor(logdir, num_updates * steps_per_update, cfg.return_window, cfg.progress,
                      append=resume_point is not None)
    env_calibration = list(extra.get("env_calibration", []))  # seconds of one env-only rollout (Anakin actors)
    if extra:
        monitor.load_state_dict(extra["monitor"])
    guard = UpdateGuard(update, cfg.on_nan, skipped=extra.get("skipped_updates", 0))
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
                "skipped_updates": guard.skipped, "wall_time_s": time.perf_counter() - wall_start,
            })
        finally:
            stop.deferring = deferring

    def log(it: int, metrics: dict) -> dict:
        held = rollout.obs.reshape((-1,) + info.obs_shape)[:DIVERGENCE_SAMPLES]
        # The divergence of the policy the actor runs next (stale by --policy-lag updates) from the learner's.
        metrics = dict(metrics, **divergence(learner_logits(state.params, held), actor_logits(lagged[0], held)))
        if info.jittable:
            env_calibration.append(actor.time_env_only(carry))
            # The fused actor's env share, calibrated so far (see AnakinActor.time_env_only).
            monitor.set_env_time(min(float(np.median(env_calibration)) * it, monitor.times["actor"]))
        monitor.log(it, metrics)
        return metrics

    try:
        if resume_point is None:
            carry = actor.reset(k_actor)
            with monitor.time("compress"):  # first observations calibrate int8's activation ranges
                actor_params, comp_state = compressor.init(params, k_comp, carry.obs)
                jax.block_until_ready(actor_params)
            lagged_params = (actor_params,)
        else:
            state, lagged_params, comp_state, carry = restored
            actor_params = lagged_params[-1]
            if not info.jittable:  # host envs cannot be saved: they restart, the actor's key continues
                carry = actor.reset(k_actor)._replace(key=carry)
        # The last policy_lag + 1 compressed parameter sets, oldest first; the actor runs the oldest.
        lagged = collections.deque(lagged_params, maxlen=cfg.policy_lag + 1)
        # The last completed update's state: what a checkpoint saves, even if a later update is abandoned.
        snapshot = checkpoint.TrainState(state, tuple(lagged), comp_state, checkpoint.host_key_only(carry, info.jittable))
        for it in range(start_update + 1, num_updates + 1):
            with monitor.time("actor"):
                carry, rollout, actor_times = actor.rollout(lagged[0], carry)
                jax.block_until_ready(rollout)
            for stage in ("env", "inference"):
                if f"{stage}_time_s" in actor_times:
                    monitor.add_time(stage, actor_times[f"{stage}_time_s"])
            with monitor.time("learner"):
                state, metrics, bad = guard(state, rollout)  # bad: the non-finite quantity (--on-nan stop)
                jax.block_until_ready(state)
            with monitor.time("compress"):
                obs_flat = rollout.obs.reshape((-1,) + info.obs_shape)
                previous = actor_params
                actor_params, comp_state = compressor.compress(state.params, comp_state, obs_flat)
                jax.block_until_ready(actor_params)
                lagged.append(actor_params)
            refreshed = actor_params is not previous
            refreshes += refreshed
            # Every --log-every-th refresh of the actor's policy logs its divergence: measuring it at every
            # refresh (every update here) cost ~1.8 ms per update, ~10% of the default CartPole job.
            if refreshed and refreshes % cfg.log_every == 0:
                held = obs_flat[:REFRESH_SAMPLES]
                monitor.log_refresh(it, divergence(learner_logits(state.params, held), actor_logits(actor_params, held)))
            finished = np.asarray((rollout.terminated | rollout.truncated) & rollout.valid)
            monitor.record_episodes(np.asarray(rollout.episode_return), finished, steps_per_update)
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
                stop_reason = (f"non-finite {bad} at update {it} (loss {float(metrics['loss'])}, "
                               f"grad_norm {float(metrics['grad_norm'])})")
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
    try:
        if stopped != "diverged" and saver.last_step != completed:
            save(completed)
        if logged != completed:  # the interrupted run's last updates get their row too
            metrics = log(completed, metrics)
        if stopped is None:
            speed_report = speed.policy_speedup(
                learner_apply, state.params, actor_apply, actor_params,
                rollout.obs[: min(SPEED_FORWARDS, cfg.rollout_length)], family=spec.family,
            )
        else:  # a stopped run exits promptly; its policy speed is not measured
            speed_report = {"actor_policy_speedup": None, "base_forward_s": None, "actor_forward_s": None,
                            "forward_batch": info.num_envs}
    except KeyboardInterrupt:  # Ctrl-C during the final measurements: still summarise what ran
        stopped = "interrupted"
        speed_report = {"actor_policy_speedup": None, "base_forward_s": None, "actor_forward_s": None,
                        "forward_batch": info.num_envs}
    finally:
        monitor.close()
        saver.close()
    if trained is not None and rollout is not None:
        trained.update(learner_params=state.params, actor_params=actor_params,
                       obs=rollout.obs.reshape((-1,) + info.obs_shape))
    times = monitor.times
    wall = time.perf_counter() - wall_start
    final = jax.device_get(metrics)
    summary = {
        "env": cfg.env,
        "compressor": cfg.compressor,
        "corrector": cfg.corrector,
        "loss": cfg.loss,
        "policy_lag": cfg.policy_lag,
        "seed": cfg.seed,
        "num_envs": info.num_envs,
        "rollout_length": cfg.rollout_length,
        "updates": completed,
        "stopped": stopped,
        "stop_reason": stop_reason,
        "exit_signal": signal_name(stop.requested) if stopped == "interrupted" else None,
        "skipped_updates": guard.skipped,
        "resumed_from_update": resume_point.step if resume_point is not None else None,
        "last_checkpoint": (os.path.join(logdir, checkpoint.CHECKPOINT_DIR, str(saver.last_step))
                            if saver.last_step is not None else None),
        "checkpoint_time_s": saver.seconds,
        "total_env_steps": monitor.env_steps,
        "wall_time_s": wall,
        "actor_time_s": times["actor"],
        "env_time_s": times["env"],
        "env_time_source": "calibrated: env-only rollouts with random actions" if info.jittable else "measured",
        "inference_time_s": times["inference"],
        "learner_time_s": times["learner"],
        "compress_time_s": times["compress"],
        "final_return_mean": monitor.return_mean if monitor.returns else None,
        "return_window": cfg.return_window,
        "returns_averaged": len(monitor.returns),
        "episodes": monitor.episodes,
        "steps_per_s": monitor.env_steps / wall,
        "learner_network": dataclasses.asdict(spec),
        "learner_params": networks.param_count(state.params),
        "actor_params": networks.param_count(actor_params),
        "actor_param_bytes": networks.param_bytes(actor_params),
        "kl_learner_actor": float(final["kl_learner_actor"]) if "kl_learner_actor" in final else None,
        "action_agreement": float(final["action_agreement"]) if "action_agreement" in final else None,
        "devices": n_dev,
        "backend": jax.default_backend(),
        "logdir": logdir,
        "config": dataclasses.asdict(cfg),
        **speed_report,
    }
    monitor.plot(f"{cfg.env}  compressor={cfg.compressor}  corrector={cfg.corrector}  seed={cfg.seed}")
    monitor.write_summary(summary)
    lock.release()
    return summary
