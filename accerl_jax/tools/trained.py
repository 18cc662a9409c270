"""A trained policy read back from a run folder, for evaluation (:mod:`accerl_jax.evaluate`) and export
(:mod:`accerl_jax.export`).

The configuration saved with the checkpoint is checked by the same plan as training
(:func:`accerl_jax.run.plan.check_config`, :func:`~accerl_jax.run.plan.make_plan`) and rebuilds the learner
network and the compressor with the same setup code (:func:`accerl_jax.run.build.make_run_compressor`); the
checkpoint's arrays, each checked against its recorded SHA-256 (:func:`accerl_jax.run.checkpoint.read_checked`),
fill them. ``policy="actor"`` gives the run's newest compressed parameters with the compressor's
``actor_apply`` (the policy the run's summary describes); ``"learner"`` the learner's own.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from accerl_jax import networks
from accerl_jax import normalize
from accerl_jax.run import checkpoint, replicas
from accerl_jax.run import plan as plan_lib
from accerl_jax.actor import sample_from
from accerl_jax.tools.cli import DEFAULT_POLICY, POLICIES, run_folder
from accerl_jax.config import Config, ConfigError
from accerl_jax.envs import make_env
from accerl_jax.monitor import gaussian_policy_divergence, policy_divergence
from accerl_jax.tools.presets import saved_settings
from accerl_jax.run.build import make_run_compressor
from accerl_jax.seeds import eval_envpool_seed
from accerl_jax.types import ApplyFn

WHAT = "RUN_DIR"  # how the user names the run folder, in error messages


@dataclasses.dataclass(frozen=True)
class Trained:
    """One policy of a trained run, ready to act.

    ``apply(params, obs [N, *obs_shape]) -> (policy_out [N, A] logits or [N, 2D] mean/log-std, value [N])``
    is the chosen policy's network; ``learner_apply``/``learner_params`` the learner's (the reference
    for KL and agreement). ``env`` is a fresh adapter of the run's env id with the requested number of
    copies. ``extra`` is the checkpoint's bookkeeping (``completed`` updates, ...).
    """

    run_dir: str
    step: int  # the checkpoint's update
    cfg: Config
    env: Any  # accerl_jax.envs adapter with the requested num_envs
    spec: networks.NetworkSpec  # the learner's network
    policy: str  # "learner" or "actor"
    apply: ApplyFn
    params: Any
    learner_apply: ApplyFn
    learner_params: Any
    extra: dict

    @property
    def info(self):
        return self.env.info

    @property
    def continuous(self) -> bool:
        return self.env.info.continuous


def saved_config(point: checkpoint.ResumePoint) -> Config:
    """The :class:`Config` saved with a checkpoint, with the run-control fields (log folder, resume,
    W&B, progress, multi-host addresses) reset: reading a run writes nothing and joins nothing.

    Raises:
      ConfigError: the record names fields this version does not know, or fails the plan's checks.
    """
    cfg = Config(**saved_settings(point.meta["config"], f"{WHAT} {point.logdir!r}", "read"))
    return dataclasses.replace(cfg, logdir=None, resume=None, overwrite=False, progress=False, wandb=False,
                               wandb_project=None, coordinator_address=None, num_processes=None, process_id=None)


def load(run_dir: str, *, policy: str = DEFAULT_POLICY, step: Optional[int] = None, num_envs: Optional[int] = None,
         seed: int = 0, seed_index: int = 0) -> Trained:
    """Read a run folder's checkpoint into a :class:`Trained` policy; writes nothing.

    Args:
      run_dir: the run folder (``--logdir`` of training), its ``checkpoints`` folder, or one of its
        ``checkpoints/<update>`` folders.
      policy: ``"learner"`` or ``"actor"`` (the run's compressed actor).
      step: the checkpoint's update (default: the latest, or the one ``run_dir`` names).
      num_envs: environments of the fresh env adapter (default: the run's ``--num-envs``).
      seed: evaluation's seed: envpool's fresh envs get its block of seeds below zero
        (:func:`accerl_jax.seeds.eval_envpool_seed`, disjoint from every training run's); gymnax envs are
        keyed at reset (:func:`accerl_jax.seeds.eval_key`).
      seed_index: for a ``--num-seeds`` run, which of its seeds (0-based).

    Raises:
      ConfigError: one line naming the bad value: not a run folder, no finished or a damaged checkpoint,
        an env that cannot be built here, a checkpoint that does not fit its configuration's networks,
        ``--policy actor`` for a ``--compressor auto`` run whose cost-split gate kept auto (one it resolved
        to a compressor is that compressor's run), a bad ``policy`` or ``seed_index``.
    """
    if policy not in POLICIES:
        raise ConfigError(f"bad --policy {policy!r}; expected one of {', '.join(POLICIES)}")
    point = checkpoint.find_checkpoint(run_folder(run_dir), WHAT)
    if step is not None and step != point.step:
        point = checkpoint.find_checkpoint(_checkpoint_path(point, step, run_dir), WHAT)
    cfg = saved_config(point)
    try:
        plan_lib.check_config(cfg)
    except ConfigError as err:
        raise ConfigError(f"bad {WHAT} {run_dir!r}: its saved configuration is refused ({err})") from None
    n_runs = replicas.count(cfg)  # --num-seeds x --sweep's combinations
    if not 0 <= seed_index < n_runs:
        what = f"{n_runs} runs (--sweep)" if cfg.sweep else f"{n_runs} seed(s)"
        raise ConfigError(f"bad --seed-index {seed_index}: the run trained {what}; expected 0 to {n_runs - 1}")
    resolved = plan_lib.saved_resolution(point.meta) if cfg.compressor == "auto" else None
    if resolved is not None:  # its cost-split gate resolved auto to one compressor for the whole run
        cfg = dataclasses.replace(cfg, compressor=resolved)
    if policy == "actor" and cfg.compressor == "auto":
        raise ConfigError(f"bad --policy actor (the default) for {run_dir!r}: this --compressor auto run ran auto's "
                          "candidates, whose actor changes network with each decision and is not rebuilt from its "
                          "checkpoint; use --policy learner")
    num_envs = num_envs or cfg.num_envs
    try:
        env_seed = eval_envpool_seed(seed, num_envs)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    try:
        env = make_env(cfg.env, num_envs, env_seed)
    except Exception as err:  # ValueError from the adapters; envpool may raise others for a missing task
        raise ConfigError(f"bad {WHAT} {run_dir!r}: its env {cfg.env!r} cannot be built here ({err})") from None
    # The network only: the training machine's device layout (--actor-device cpu-apart) does not apply here.
    plan = plan_lib.make_plan(dataclasses.replace(cfg, actor_device="cpu"),
                              dataclasses.replace(env.info, num_envs=cfg.num_envs), plan_lib.Machine())
    spec = plan.spec
    learner_apply = networks.make_apply(spec)
    leaves = checkpoint.read_checked(point, WHAT)
    pick = _picker(leaves, n_runs, seed_index, run_dir, point.step)
    learner_params = pick(".learner.params", jax.eval_shape(lambda k: networks.init_params(spec, k), jax.random.PRNGKey(0)))
    if policy == "learner":
        apply, params = learner_apply, learner_params
    else:
        compressor = make_run_compressor(cfg, spec, learner_apply, env.info.continuous)
        obs = jax.ShapeDtypeStruct((cfg.num_envs,) + tuple(env.info.obs_shape), env.info.obs_dtype)
        template = jax.eval_shape(compressor.init, learner_params, jax.random.PRNGKey(0), obs)[0]
        lagged = {int(p[len(".actor_params["):].split("]")[0]) for p in leaves if p.startswith(".actor_params[")}
        if not lagged:
            raise ConfigError(f"bad {WHAT} {run_dir!r}: checkpoint {point.step} holds no actor parameters")
        # The newest compressed set (the run's summary describes it); with --policy-lag the actor ran it
        # that many updates later.
        params = pick(f".actor_params[{max(lagged)}]", template)
        apply = compressor.actor_apply(learner_apply)
    if cfg.normalize_observations:
        # The run's observation statistics, frozen: both policies normalise raw observations themselves,
        # as the run's actor and learner did (their networks never saw raw observations).
        stats = pick(".normalizer.obs", normalize.init_stats(tuple(env.info.obs_shape)))
        apply, learner_apply = _normalizing(apply, stats), _normalizing(learner_apply, stats)
    return Trained(run_dir=point.logdir, step=point.step, cfg=cfg, env=env, spec=spec, policy=policy, apply=apply,
                   params=params, learner_apply=learner_apply, learner_params=learner_params,
                   extra=point.meta.get("extra", {}))


def _normalizing(apply: ApplyFn, stats: normalize.RunningStats) -> ApplyFn:
    """``apply`` on observations normalised with the frozen ``stats`` (:func:`accerl_jax.normalize.normalize_obs`)."""
    def wrapped(params, obs):
        return apply(params, normalize.normalize_obs(stats, obs))

    return wrapped


def _checkpoint_path(point: checkpoint.ResumePoint, step: int, run_dir: str) -> str:
    """The folder of checkpoint ``step`` (an update number) of ``point``'s run.

    Raises:
      ConfigError: the run has no finished checkpoint of that update; names the ones it has (update and
        env step), and the update whose checkpoint a ``step`` given as an env step would be.
    """
    steps = checkpoint.finished_steps(point.logdir)
    if step in steps:
        return os.path.join(point.logdir, checkpoint.CHECKPOINT_DIR, str(step))
    saved = point.meta["config"]
    per_update = int(saved["num_envs"]) * int(saved["rollout_length"]) * int(saved.get("num_processes") or 1)
    shown = [f"{s} (env step {s * per_update:,})" for s in steps]
    if len(shown) > 8:
        shown = shown[:2] + ["..."] + shown[-5:]
    hint = (f"; env step {step:,} is update {step // per_update}: --step {step // per_update}"
            if step % per_update == 0 and step // per_update in steps else "")
    raise ConfigError(f"bad --step {step}: {run_dir!r} has no checkpoint of update {step} (--step counts updates "
                      f"of {per_update:,} env steps, not env steps){hint}; its checkpoints: {', '.join(shown)}")


def _picker(leaves: dict, num_seeds: int, seed_index: int, run_dir: str, step: int) -> Callable:
    """``pick(prefix, template)``: the checkpoint leaves under ``prefix`` in ``template``'s structure."""

    def pick(prefix: str, template):
        flat, treedef = jax.tree_util.tree_flatten_with_path(template)
        out = []
        for path, want in flat:
            name = prefix + jax.tree_util.keystr(path)
            got = leaves.get(name)
            if got is not None and num_seeds > 1:
                got = got[seed_index]  # every leaf of a --num-seeds run has a leading seed axis
            if got is None or tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
                found = "missing" if got is None else f"{got.dtype}{list(got.shape)}"
                raise ConfigError(f"bad {WHAT} {run_dir!r}: checkpoint {step} does not fit the networks its saved "
                                  f"configuration builds (leaf {name}: {found}, expected {want.dtype}{list(want.shape)})")
            out.append(jnp.asarray(got))
        return jax.tree.unflatten(treedef, out)

    return pick


def clip_action(action: jax.Array, info) -> jax.Array:
    """The one clip of a Gaussian action to the env's box outside the env adapters (evaluation, video,
    export): ``action [N, D]`` float32 clipped per dimension to ``info.action_low``/``info.action_high``
    (:class:`accerl_jax.envs.base.EnvInfo`); discrete actions ``[N]`` int32 pass unchanged."""
    if not info.continuous:
        return action
    low = jnp.asarray(info.action_low, jnp.float32)[None]
    high = jnp.asarray(info.action_high, jnp.float32)[None]
    return jnp.clip(action.astype(jnp.float32), low, high)


def make_forward(apply: ApplyFn, params, info) -> Callable:
    """The policy as one function of observations and a key, parameters closed over:
    ``forward(obs [N, *obs_shape], key uint32[2]) -> (action, greedy_action, policy_out)``.

    ``info`` is the env's :class:`accerl_jax.envs.base.EnvInfo` (action space and bounds). ``action`` is
    sampled as the run's actor samples (:func:`accerl_jax.actor.sample_from`: distrax
    ``Categorical(logits).sample(seed=key)``, int32 ``[N]`` in ``[0, A)``; continuous: the diagonal Gaussian,
    float32 ``[N, D]``); ``greedy_action`` is ``argmax(logits)`` (continuous: the mean). Continuous actions,
    sampled and greedy, are clipped to the box (:func:`clip_action`): this is an env boundary, as the
    adapters are in training (the actor stores the unclipped sample's log-prob; docs/DESIGN.md).
    ``policy_out`` is the unclipped ``[N, A]`` logits (or ``[N, 2D]`` mean then log-std).
    """
    continuous = info.continuous

    def forward(obs, key):
        out = apply(params, obs)[0]
        action, _ = sample_from(out, key, continuous)
        if continuous:
            greedy = jnp.split(out, 2, axis=-1)[0].astype(jnp.float32)
        else:
            greedy = jnp.argmax(out, axis=-1).astype(jnp.int32)
        return clip_action(action, info), clip_action(greedy, info), out

    return forward


def divergence(trained: Trained, obs: np.ndarray) -> dict:
    """KL(π_learner ‖ π_policy) in nats and greedy-action agreement of ``trained``'s policy on ``obs
    [N, *obs_shape]`` (:func:`accerl_jax.monitor.policy_divergence`, the measure the run logs), as floats."""
    learner_out = jax.jit(lambda p, o: trained.learner_apply(p, o)[0])(trained.learner_params, obs)
    out = jax.jit(lambda p, o: trained.apply(p, o)[0])(trained.params, obs)
    measure = gaussian_policy_divergence if trained.continuous else policy_divergence
    return {k: float(v) for k, v in measure(learner_out, out).items()}
