"""The AcceRL training loop: Learner params -> Compressor -> Actor -> Corrector -> Learner, watched by
the Monitor (DESIGN.md). Stages are separate jitted calls so that each is timed; the actor always runs
the compressed parameters made after the previous learner update.
"""
from __future__ import annotations

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from accerl_jax import learner as learner_lib
from accerl_jax import networks, speed, xla
from accerl_jax.actor import make_actor
from accerl_jax.compressor import make_compressor
from accerl_jax.config import Config, validate
from accerl_jax.corrector import CORRECTORS
from accerl_jax.envs import make_env
from accerl_jax.monitor import Monitor, policy_divergence, print_summary

DIVERGENCE_SAMPLES = 1024  # observations on which KL(π_learner ‖ π_actor) is measured at each log
SPEED_FORWARDS = 32  # forward passes per timed scan in the policy-speed measurement


def default_logdir(cfg: Config) -> str:
    slug = f"{cfg.env}-{cfg.compressor}-s{cfg.seed}".replace(":", "_").replace("+", "_").replace("/", "_")
    return os.path.join("runs", f"{slug}-{time.strftime('%Y%m%d-%H%M%S')}")


def check_logdir(logdir: str) -> None:
    """Refuse a ``logdir`` that already holds a run, so that nothing saved is overwritten.

    Raises:
      ValueError: if ``logdir`` is a file, or a folder holding summary.json, metrics.csv or TensorBoard events.
    """
    if os.path.exists(logdir) and not os.path.isdir(logdir):
        raise ValueError(f"bad --logdir {logdir!r}: it is a file; expected a folder (new or empty)")
    if os.path.isdir(logdir):
        taken = [f for f in os.listdir(logdir) if f in ("summary.json", "metrics.csv") or f.startswith("events.out")]
        if taken:
            raise ValueError(
                f"bad --logdir {logdir!r}: it already holds a run ({', '.join(sorted(taken))}); "
                "choose a new folder or remove it"
            )


def train(cfg: Config) -> dict:
    """Run one training job and return its summary (also written to ``<logdir>/summary.json``).

    Raises:
      ValueError: for any bad setting (bad env, compressor, corrector or numeric value), before anything
        is written.
    """
    validate(cfg)
    if cfg.corrector not in CORRECTORS:
        raise ValueError(f"bad --corrector {cfg.corrector!r}; expected one of {', '.join(CORRECTORS)}")
    logdir = cfg.logdir or default_logdir(cfg)
    check_logdir(logdir)
    wall_start = time.perf_counter()
    key = jax.random.PRNGKey(cfg.seed)
    env = make_env(cfg.env, cfg.num_envs, cfg.seed)
    info = env.info
    n_dev = jax.local_device_count()
    if info.num_envs % n_dev:
        raise ValueError(f"bad --num-envs {info.num_envs}: must be a multiple of the {n_dev} local devices")
    spec = networks.default_spec(info.obs_shape, info.num_actions, info.channels_first)
    learner_apply = networks.make_apply(spec)
    compressor = make_compressor(
        cfg.compressor, spec, learner_apply,
        distill_steps=cfg.distill_steps, distill_learning_rate=cfg.distill_learning_rate,
    )
    steps_per_update = info.num_envs * cfg.rollout_length
    num_updates = max(1, cfg.total_steps // steps_per_update)

    k_net, k_comp, k_actor = jax.random.split(key, 3)
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
    try:
        with monitor.time("compress"):
            actor_params, comp_state = compressor.init(params, k_comp)
            jax.block_until_ready(actor_params)
        carry = actor.reset(k_actor)
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
            obs_flat = rollout.obs.reshape((-1,) + info.obs_shape)
            with monitor.time("compress"):
                actor_params, comp_state = compressor.compress(state.params, comp_state, obs_flat)
                jax.block_until_ready(actor_params)
            finished = np.asarray((rollout.terminated | rollout.truncated) & rollout.valid)
            monitor.record_episodes(np.asarray(rollout.episode_return), finished, steps_per_update)
            if it % cfg.log_every == 0 or it == num_updates:
                held = obs_flat[:DIVERGENCE_SAMPLES]
                metrics = dict(metrics, **policy_divergence(learner_logits(state.params, held),
                                                            actor_logits(actor_params, held)))
                if info.jittable:
                    env_calibration.append(actor.time_env_only(carry))
                monitor.log(it, metrics)
            else:
                monitor.progress()

        obs_seq = rollout.obs[: min(SPEED_FORWARDS, cfg.rollout_length)]
        speed_report = speed.policy_speedup(
            learner_apply, state.params, actor_apply, actor_params, obs_seq, family=spec.family
        )
    finally:
        monitor.close()

    times = dict(monitor.times)
    if info.jittable:
        times["env"] = min(float(np.median(env_calibration)) * num_updates, times["actor"])
        times["inference"] = times["actor"] - times["env"]
        env_source = "calibrated: env-only rollouts with random actions"
    else:
        env_source = "measured"
    wall = time.perf_counter() - wall_start
    final = jax.device_get(metrics)
    summary = {
        "env": cfg.env,
        "compressor": cfg.compressor,
        "corrector": cfg.corrector,
        "seed": cfg.seed,
        "num_envs": info.num_envs,
        "rollout_length": cfg.rollout_length,
        "updates": num_updates,
        "total_env_steps": monitor.env_steps,
        "wall_time_s": wall,
        "actor_time_s": times["actor"],
        "env_time_s": times["env"],
        "env_time_source": env_source,
        "inference_time_s": times["inference"],
        "learner_time_s": times["learner"],
        "compress_time_s": times["compress"],
        "final_return_mean": monitor.return_mean if monitor.returns else None,
        "return_window": cfg.return_window,
        "episodes": monitor.episodes,
        "steps_per_s": monitor.env_steps / wall,
        "learner_network": dataclasses.asdict(spec),
        "learner_params": networks.param_count(state.params),
        "actor_params": networks.param_count(actor_params),
        "actor_param_bytes": networks.param_bytes(actor_params),
        "kl_learner_actor": float(final["kl_learner_actor"]),
        "action_agreement": float(final["action_agreement"]),
        "devices": n_dev,
        "backend": jax.default_backend(),
        "logdir": logdir,
        "config": dataclasses.asdict(cfg),
        **speed_report,
    }
    monitor.plot(f"{cfg.env}  compressor={cfg.compressor}  corrector={cfg.corrector}  seed={cfg.seed}")
    monitor.write_summary(summary)
    return summary

