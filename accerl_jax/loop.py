"""The AcceRL training loop: Learner params -> Compressor -> Actor -> Corrector -> Learner, watched by
the Monitor (docs/DESIGN.md). Stages are separate jitted calls so that each
is timed; the actor always runs the compressed parameters made after the previous learner update.

:func:`train` has two phases. *Setup* checks everything the user chose (config, environment,
compressor, log folder) and raises :class:`~accerl_jax.config.ConfigError` before anything is written.
*Training* then runs; Ctrl-C or a non-finite loss stops it early, and the summary of what ran is still
written (``"stopped": "interrupted"`` / ``"diverged"``).
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
import uuid

import jax
import numpy as np

from accerl_jax import learner as learner_lib
from accerl_jax import networks, speed, xla
from accerl_jax.actor import make_actor
from accerl_jax.compressor import make_compressor
from accerl_jax.config import Config, ConfigError, validate
from accerl_jax.corrector import CORRECTORS
from accerl_jax.envs import make_env
from accerl_jax.monitor import Monitor, is_run_file, policy_divergence

DIVERGENCE_SAMPLES = 1024  # observations on which KL(π_learner ‖ π_actor) is measured at each log
REFRESH_SAMPLES = 256  # observations for the KL/agreement logged at every refresh of the actor's policy
SPEED_FORWARDS = 32  # forward passes per timed scan in the policy-speed measurement
MAX_UPDATES = 2**31 - 1  # the optimizer's step counter is int32


def default_logdir(cfg: Config) -> str:
    """``runs/<env>-<compressor>-s<seed>-<time>-<random>``; the random part keeps parallel runs apart."""
    slug = f"{cfg.env}-{cfg.compressor}-s{cfg.seed}".replace(":", "_").replace("+", "_").replace("/", "_")
    return os.path.join("runs", f"{slug}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}")


def check_logdir(logdir: str) -> None:
    """Refuse a ``logdir`` that is a file or already holds a run, so that nothing saved is overwritten.

    Raises:
      ConfigError: naming the folder and what is in the way.
    """
    if os.path.exists(logdir) and not os.path.isdir(logdir):
        raise ConfigError(f"bad --logdir {logdir!r}: it is a file; expected a folder")
    if os.path.isdir(logdir):
        taken = sorted(f for f in os.listdir(logdir) if is_run_file(f))
        if taken:
            raise ConfigError(
                f"bad --logdir {logdir!r}: it already holds a run ({', '.join(taken)}); choose a new folder or remove it"
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


def train(cfg: Config, *, trained: dict | None = None) -> dict:
    """Run one training job and return its summary (also written to ``<logdir>/summary.json``).

    ``trained``, if given, is filled with ``learner_params``, ``actor_params`` and ``obs`` (the last
    rollout's observations ``[T * B, *obs_shape]``), for experiments that study the trained policy.

    Raises:
      ConfigError: for any bad setting (env, compressor, corrector, numeric value, log folder), raised
        before anything is written.
    """
    validate(cfg)
    if cfg.corrector not in CORRECTORS:
        raise ConfigError(f"bad --corrector {cfg.corrector!r}; expected one of {', '.join(CORRECTORS)}")
    logdir = cfg.logdir or default_logdir(cfg)
    check_logdir(logdir)  # fail fast, before building environments
    wall_start = time.perf_counter()
    try:
        env = make_env(cfg.env, cfg.num_envs, cfg.seed)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    info = env.info
    n_dev = jax.local_device_count()
    if info.num_envs % n_dev:
        raise ConfigError(f"bad --num-envs {info.num_envs}: must be a multiple of the {n_dev} local devices")
    steps_per_update = info.num_envs * cfg.rollout_length
    num_updates = max(1, cfg.total_steps // steps_per_update)
    if num_updates > MAX_UPDATES:
        raise ConfigError(f"bad --total-steps {cfg.total_steps}: more than {MAX_UPDATES} updates; use a smaller budget")
    try:
        spec = networks.default_spec(info.obs_shape, info.num_actions, info.channels_first)
    except ValueError as err:
        raise ConfigError(f"bad --env {cfg.env!r}: {err}") from None
    learner_apply = networks.make_apply(spec)
    try:
        compressor = make_compressor(
            cfg.compressor, spec, learner_apply,
            distill_steps=cfg.distill_steps, distill_learning_rate=cfg.distill_learning_rate,
            distill_async=cfg.distill_async,
        )
    except ValueError as err:
        raise ConfigError(str(err)) from None
    claim_logdir(logdir)

    k_net, k_comp, k_actor = jax.random.split(jax.random.PRNGKey(cfg.seed), 3)
    params = networks.init_params(spec, k_net)
    optimizer = learner_lib.make_optimizer(cfg.learning_rate, cfg.max_grad_norm, num_updates)
    state = learner_lib.init_state(params, optimizer)
    loss_cfg = learner_lib.LossConfig(
        corrector=cfg.corrector, discount=cfg.discount, lambda_=cfg.lambda_,
        clip_rho_threshold=cfg.clip_rho_threshold, clip_pg_rho_threshold=cfg.clip_pg_rho_threshold,
        value_coef=cfg.value_coef, entropy_coef=cfg.entropy_coef,
    )
    update = learner_lib.make_update(learner_apply, optimizer, loss_cfg, family=spec.family)
    actor_apply = compressor.actor_apply(learner_apply)
    actor = make_actor(env, actor_apply, cfg.rollout_length, family=spec.family)
    learner_logits = xla.jit(lambda p, o: learner_apply(p, o)[0], spec.family)
    actor_logits = xla.jit(lambda p, o: actor_apply(p, o)[0], spec.family)

    monitor = Monitor(logdir, num_updates * steps_per_update, cfg.return_window, cfg.progress)
    env_calibration = []  # seconds of one env-only rollout (Anakin actors)
    metrics: dict = {}
    stopped = None
    rollout = None
    completed = 0  # learner updates (with their compression) that finished
    logged = 0  # the last update written to metrics.csv

    def log(it: int, metrics: dict) -> dict:
        held = rollout.obs.reshape((-1,) + info.obs_shape)[:DIVERGENCE_SAMPLES]
        metrics = dict(metrics, **policy_divergence(learner_logits(state.params, held), actor_logits(actor_params, held)))
        if info.jittable:
            env_calibration.append(actor.time_env_only(carry))
            # The fused actor's env share, calibrated so far (see AnakinActor.time_env_only).
            monitor.set_env_time(min(float(np.median(env_calibration)) * it, monitor.times["actor"]))
        monitor.log(it, metrics)
        return metrics

    try:
        carry = actor.reset(k_actor)
        with monitor.time("compress"):  # first observations calibrate int8's activation ranges
            actor_params, comp_state = compressor.init(params, k_comp, carry.obs)
            jax.block_until_ready(actor_params)
        for it in range(1, num_updates + 1):
            with monitor.time("actor"):
                carry, rollout, actor_times = actor.rollout(actor_params, carry)
                jax.block_until_ready(rollout)
            for stage in ("env", "inference"):
                if f"{stage}_time_s" in actor_times:
                    monitor.add_time(stage, actor_times[f"{stage}_time_s"])
            with monitor.time("learner"):
                state, metrics = update(state, rollout)
                jax.block_until_ready(state)
            with monitor.time("compress"):
                obs_flat = rollout.obs.reshape((-1,) + info.obs_shape)
                previous = actor_params
                actor_params, comp_state = compressor.compress(state.params, comp_state, obs_flat)
                jax.block_until_ready(actor_params)
            if actor_params is not previous:  # the actor's policy was refreshed: log its divergence
                held = obs_flat[:REFRESH_SAMPLES]
                monitor.log_refresh(it, policy_divergence(learner_logits(state.params, held), actor_logits(actor_params, held)))
            completed = it
            finished = np.asarray((rollout.terminated | rollout.truncated) & rollout.valid)
            monitor.record_episodes(np.asarray(rollout.episode_return), finished, steps_per_update)
            diverged = not math.isfinite(float(metrics["loss"]))
            if diverged or it % cfg.log_every == 0 or it == num_updates:
                metrics, logged = log(it, metrics), it
            else:
                monitor.progress()
            if diverged:
                stopped = "diverged"
                break
    except KeyboardInterrupt:
        stopped = "interrupted"
    if stopped == "interrupted" and completed == 0:
        monitor.close()
        monitor.discard()  # nothing ran: free the folder for a rerun
        raise KeyboardInterrupt
    try:
        if completed and logged != completed:  # the interrupted run's last updates get their row too
            metrics = log(completed, metrics)
        speed_report = speed.policy_speedup(
            learner_apply, state.params, actor_apply, actor_params,
            rollout.obs[: min(SPEED_FORWARDS, cfg.rollout_length)], family=spec.family,
        )
    except KeyboardInterrupt:  # Ctrl-C during the final measurements: still summarise what ran
        stopped = "interrupted"
        speed_report = {"actor_policy_speedup": None, "base_forward_s": None, "actor_forward_s": None,
                        "forward_batch": info.num_envs}
    finally:
        monitor.close()
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
        "seed": cfg.seed,
        "num_envs": info.num_envs,
        "rollout_length": cfg.rollout_length,
        "updates": completed,
        "stopped": stopped,
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
    return summary
