"""Setup of a run: build what the :class:`~accerl_jax.run.plan.Plan` says (environment, networks, compressor,
optimizer, learner update, actor, checkpointer, Monitor), claim the log folder, restore a ``--resume``
checkpoint. :func:`setup` raises :class:`~accerl_jax.config.ConfigError` before anything is written; the
:class:`Run` it returns is driven by :class:`accerl_jax.run.driver.Driver` through one stepper
(:mod:`accerl_jax.loops`).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
import textwrap
import time
import uuid
from typing import Any, Callable

import jax
import numpy as np

from accerl_jax.platform import compile_cache
from accerl_jax.run import checkpoint, folder as run_folder
from accerl_jax.run import plan as plan_lib
from accerl_jax import learner as learner_lib
from accerl_jax import networks
from accerl_jax import normalize
from accerl_jax.platform import speed, xla
from accerl_jax.run import auto_gate, distributed, replicas
from accerl_jax.actor import AnakinActor, NetworkOnlyEnv, make_actor
from accerl_jax.compressor import Compressor, paired
from accerl_jax.compressor.auto import auto
from accerl_jax.config import Config, ConfigError
from accerl_jax.envs import envpool_seed, make_env
from accerl_jax.monitor import Monitor, gaussian_policy_divergence, policy_divergence
from accerl_jax.run.folder import claim_logdir, folder_facts
from accerl_jax.run.shards import env_group_ids, local_devices, make_global_update

DIVERGENCE_SAMPLES = 1024  # observations on which KL(π_learner ‖ π_actor) is measured at each log
REFRESH_SAMPLES = 256  # observations for the KL/agreement logged at every --log-every-th refresh of the actor's policy
SPEED_FORWARDS = 32  # forward passes per timed scan in the policy-speed measurement
AUTO_CHECK_EVERY = 10  # --compressor auto measures its triggers (KL, clipped fraction of ρ) every this many updates


def default_logdir(cfg: Config) -> str:
    """``runs/<env>-<compressor>-s<seed>-<time>-<random>``; the random part keeps parallel runs apart."""
    slug = f"{cfg.env}-{cfg.compressor}-s{cfg.seed}".replace(":", "_").replace("+", "_").replace("/", "_")
    return os.path.join("runs", f"{slug}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}")


def read_folder(cfg: Config, process_id: int = 0) -> plan_lib.Folder:
    """The run folder's facts for the plan (:class:`~accerl_jax.run.plan.Folder`): with ``--resume``, its
    checkpoint's record (every process reads it; only process 0 continues the run in that folder), else
    ``--logdir`` (or a new :func:`default_logdir`) as it is on disk; a multi-host process other than 0
    writes no run folder. Reads, writes nothing.

    Raises:
      ConfigError: a ``--resume`` path that holds no readable finished checkpoint, is not the run's latest,
        or is not the run of ``--logdir`` (:func:`accerl_jax.run.checkpoint.find_checkpoint`).
    """
    if cfg.resume is not None:
        point = checkpoint.find_checkpoint(cfg.resume, "--resume", latest_only=True, logdir=cfg.logdir)
        return plan_lib.Folder(logdir=point.logdir if process_id == 0 else None, resume=point)
    if process_id != 0:
        return plan_lib.Folder()
    logdir = cfg.logdir or default_logdir(cfg)
    is_file, taken = folder_facts(logdir)
    return plan_lib.Folder(logdir=logdir, is_file=is_file, taken=taken)


def make_auto_compressor(cfg: Config, spec: networks.NetworkSpec, learner_apply, continuous: bool,
                         obs_dtype: str = "float32", num_processes: int = 1):
    """The :class:`~accerl_jax.compressor.auto.AutoCompressor` of ``--compressor auto``; with several
    processes, every measurement it decides on is process 0's (:func:`accerl_jax.run.distributed.from_process_0`).

    Raises:
      ValueError: a bad ``--auto-candidates`` list.
      ConfigError: a bad candidate spec, or one that does not fit ``spec``
        (:func:`accerl_jax.run.plan.make_checked_compressor`).
    """
    make = functools.partial(plan_lib.make_checked_compressor, spec=spec, learner_apply=learner_apply,
                             obs_dtype=obs_dtype, **plan_lib.distill_kwargs(cfg, auto_candidate=True))
    return auto(
        cfg.auto_candidates, spec, learner_apply, make,
        divergence=gaussian_policy_divergence if continuous else policy_divergence,
        forward_timer=functools.partial(speed.forward_timer, family=spec.family),
        max_kl=cfg.max_actor_kl, every=cfg.auto_every, check_every=min(AUTO_CHECK_EVERY, cfg.auto_every),
        max_clip_fraction=cfg.auto_max_clip, clip_rho_threshold=cfg.clip_rho_threshold,
        samples=REFRESH_SAMPLES, speed_forwards=min(SPEED_FORWARDS // 4, cfg.rollout_length),
        **({"agree": distributed.from_process_0} if num_processes > 1 else {}),
    )


def make_run_compressor(cfg: Config, spec: networks.NetworkSpec, learner_apply, continuous: bool,
                        obs_dtype: str = "float32", num_processes: int = 1) -> Compressor:
    """The run's compressor (``--compressor`` and its distillation flags) for the learner network ``spec``,
    checked as the plan checks it (:func:`accerl_jax.run.plan.make_checked_compressor`: a chain with a
    registered stage is first run abstractly on ``spec``).

    Raises:
      ConfigError: a bad ``--compressor`` (or ``--auto-candidates``) string, or a compressor that does not
        fit ``spec``.
    """
    if cfg.compressor == "auto":
        try:
            return make_auto_compressor(cfg, spec, learner_apply, continuous, obs_dtype, num_processes)
        except ConfigError:
            raise
        except ValueError as err:
            raise ConfigError(str(err)) from None
    compressor = plan_lib.make_checked_compressor(cfg.compressor, spec, learner_apply, obs_dtype,
                                                  **plan_lib.distill_kwargs(cfg))
    # --learner-children: the actor's parameters paired with the learner's (the plan allows it for search runs)
    return paired.with_learner(compressor) if cfg.learner_children else compressor


@dataclasses.dataclass(frozen=True)
class Outputs:
    """Where a run writes: its folder (process 0's; a temporary one on another process of a multi-host
    run), its checkpointer, the folder's lock and the Monitor.

    ``claimed`` is True for a new run's folder claimed by this session
    (:func:`accerl_jax.run.folder.claim_logdir`): it is freed again if the run stops before its first
    update finished (:func:`accerl_jax.run.folder.free_claim`); a resumed run's folder is never claimed,
    its checkpoints are never removed.
    """

    logdir: str
    saver: checkpoint.Checkpointer
    lock: Any  # accerl_jax.run.folder.RunLock, held until the summary is written (or the run is torn down)
    monitor: Monitor
    claimed: bool = False


@dataclasses.dataclass(frozen=True)
class Run:
    """A built run: what the :class:`~accerl_jax.run.plan.Plan` decided (``plan``, with ``cfg``), the parts
    :func:`build` made for it, where it writes (``outputs``) and where this session starts.

    ``restored`` is the :class:`~accerl_jax.run.checkpoint.TrainState` of a ``--resume`` checkpoint (else None)
    and ``extra`` its metadata (``completed`` updates, Monitor state, ...; empty for a new run), from
    which this session starts at update ``start_update``.
    ``learner_logits``/``actor_logits`` are jitted ``(params, obs [N, *obs_shape]) -> policy outputs``;
    ``divergence(learner_out, actor_out) -> {kl_learner_actor, action_agreement}`` suits the action space.
    """

    # What was decided.
    cfg: Config
    plan: plan_lib.Plan
    # The built parts.
    env: Any
    info: Any  # accerl_jax.envs.EnvInfo
    learner_apply: Callable
    loss_apply: Callable
    compressor: Compressor
    actor_apply: Callable
    # accerl_jax.actor.ShardedActor (gymnax) | HostActor (envpool) | AnakinActor (envpool, --loop anakin:
    # stepped through the pool's XLA interface inside the fused program)
    actor: Any
    # apply -> the same actor (envs, groups, placement) running another policy (gymnax; None for envpool):
    # the cost split times the learner's own policy's rollout with it.
    actor_for: Callable | None
    optimizer: Any
    update: Callable
    # The same update also returning the learner's outputs at the rollout's observations
    # (learner.make_update(outputs=True)), for a compressor that takes them as its teacher's
    # (Compressor.takes_teacher, --distill-reuse-teacher) in a loop whose learner state is global; else None.
    teacher_update: Callable | None
    # The learner's initial parameters and state (a resumed run's are in ``restored``); the Anakin loop's
    # as shapes only (jax.ShapeDtypeStruct leaves: it builds its own, accerl_jax.loops.anakin_state).
    params: Any
    state: learner_lib.LearnerState
    k_comp: jax.Array
    k_actor: jax.Array
    learner_logits: Callable
    actor_logits: Callable
    divergence: Callable
    mesh: Any  # the learner's 1-D mesh: all devices of all processes (jax.sharding.Mesh)
    # Where the process-local learner state lives: ``mesh`` with one process, else this process's first
    # learner device (a 1-device mesh).
    state_mesh: Any
    # Where it writes.
    outputs: Outputs
    # Where this session starts.
    wall_start: float  # time.perf_counter() at the start (earlier by the resumed run's wall time)
    restored: Any
    extra: dict
    start_update: int  # updates completed before this session (extra["completed"]; 0 for a new run)
    # --compressor auto's cost-split gate (accerl_jax.run.auto_gate.record; None for a fixed --compressor), and
    # the FLOPs it counted where it resolved auto to none (the cost split's, at this run's shapes; else None).
    auto_gate: dict | None = None
    counted_flops: dict | None = None

    def actor_with(self, apply: Callable):
        """The stage-by-stage loops' actor (the same envs, groups and placement as :attr:`actor`) running the
        policy ``apply`` instead (e.g. :func:`accerl_jax.normalize.normalized_apply`'s): ``actor_for``'s
        for gymnax envs, a :class:`~accerl_jax.actor.HostActor` for envpool's."""
        if self.actor_for is not None:
            return self.actor_for(apply)
        return make_actor(self.env, apply, self.cfg.rollout_length, family=self.plan.spec.family)


def setup(cfg: Config, before_write: Callable[[], None] | None = None) -> Run:
    """Plan ``cfg`` on this machine (:func:`plan_run`) and build its :class:`Run` (:func:`build`); a new
    run's folder is claimed (``Run.outputs.claimed``).

    ``before_write`` is called after every check and before the first file is written (multi-host: the
    processes' vote, :class:`accerl_jax.run.distributed.SetupVote`).

    Raises:
      ConfigError: for any bad setting (env, compressor, corrector, numeric value, log folder, --resume
        checkpoint), raised before anything is written.
    """
    plan, env, wall_start = plan_run(cfg)
    return build(cfg, plan, env, before_write, wall_start)


def plan_run(cfg: Config) -> tuple[plan_lib.Plan, Any, float]:
    """Gather the facts :func:`accerl_jax.run.plan.make_plan` needs and make the plan: the machine's
    (:meth:`~accerl_jax.run.plan.Machine.current`), the run folder's (:func:`read_folder`) and the
    environments' (``env.info``: the environments are built here, the one heavy step before the plan).
    The plan's checks that need no environment (:func:`accerl_jax.run.plan.check_config`,
    :func:`~accerl_jax.run.plan.check_folder`) run first, so that a bad setting is refused before the
    environments are built. Writes nothing.

    Returns:
      ``(plan, env, wall_start)``: the :class:`~accerl_jax.run.plan.Plan`, the built environments and the
      ``time.perf_counter()`` at which building began.

    Raises:
      ConfigError: any refusal of the plan, a ``--resume`` path without a readable checkpoint, or an env
        that cannot be built.
    """
    machine = plan_lib.Machine.current()
    n_proc, pid = machine.num_processes, machine.process_id
    plan_lib.check_config(cfg, n_proc, machine.local_devices)
    compile_cache.use(cfg.compile_cache)  # before the first compile: JAX reads it once per process
    folder = read_folder(cfg, pid)
    plan_lib.check_folder(cfg, folder, n_proc)  # fail fast, before building environments
    wall_start = time.perf_counter()
    try:
        # Host (envpool) envs: env g of the run's num_envs x processes is seeded seed x (that total) + g;
        # process p holds the p-th block of num_envs (envpool_seed).
        env = make_env(cfg.env, cfg.num_envs, envpool_seed(cfg.seed, cfg.num_envs * n_proc, pid * cfg.num_envs),
                       reward_clip=cfg.reward_clip)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return plan_lib.make_plan(cfg, env.info, machine, folder), env, wall_start


def build(cfg: Config, plan: plan_lib.Plan, env,
          before_write: Callable[[], None] | None = None, wall_start: float | None = None) -> Run:
    """Build the :class:`Run` that ``plan`` (made for ``cfg`` by :func:`accerl_jax.run.plan.make_plan`) says,
    on the environments ``env`` it was made for; checks nothing the plan decides. A new run's folder is
    claimed (``Run.outputs.claimed``; freed again if a signal stops the build); a ``--resume`` checkpoint
    is restored.

    ``before_write`` is called before the first file is written. With several processes
    (``plan.num_processes > 1``) the learner's mesh spans all of their devices (:mod:`accerl_jax.run.shards`),
    ``--num-envs`` counts this process's environments, and processes other than 0 write into a temporary
    folder (removed by the caller); on ``--resume`` they read the checkpoint from the run's folder (which
    must be on a shared file system) and restore it as host (numpy) arrays, which the Anakin loop places
    on the global mesh. The Anakin loop's actor then holds every process's env groups over that mesh; the
    sequential loop's holds this process's own on its first device. ``wall_start`` (default: now) is the
    ``time.perf_counter()`` the run's wall time counts from. ``--compressor auto`` first passes its
    cost-split gate (:func:`count_gate`, :func:`gate_auto`), which may resolve it to one compressor: the Run's ``cfg`` and
    ``plan`` are then those of that compressor (``auto_gate`` records why).

    Raises:
      ConfigError: the run folder claimed or locked by another process meanwhile, a ``--resume``
        checkpoint damaged or not fitting the networks (found when it is read), or (before anything is
        written) a ``--compressor auto`` run whose gate keeps auto's candidates with what they cannot run
        (:func:`accerl_jax.run.plan.refuse_running_candidates`).
    """
    n_proc, pid = plan.num_processes, plan.process_id
    wall_start = time.perf_counter() if wall_start is None else wall_start
    config_json = plan_lib.config_record(cfg)  # as saved: tuples become lists
    info = env.info
    resume_point, logdir = plan.resume, plan.logdir
    spec, loss_cfg = plan.spec, plan.loss
    steps_per_update, num_updates = plan.steps_per_update, plan.num_updates
    learner_apply = networks.make_apply(spec)
    loss_apply = networks.make_apply_with_q(spec) if spec.q_head else learner_apply
    compressor = make_run_compressor(cfg, spec, learner_apply, info.continuous, info.obs_dtype, plan.num_processes)
    if resume_point is not None and pid == 0:
        changes = plan_lib.resume_changes(resume_point.meta["config"], config_json)
        if changes:  # one line: what this session changed of the run's own settings
            print(f"resume: {', '.join(changes)} (the run's own otherwise)", flush=True)
    if cfg.total_steps < steps_per_update and pid == 0:  # rounded up, not down as the budget's help says
        print(f"--total-steps {cfg.total_steps:,} is less than one update: training one, {steps_per_update:,} env "
              "steps (--num-envs x --rollout-length over all processes)", flush=True)
    # The pieces, and --compressor auto's count, before anything is written: the gate may refuse what a run
    # of auto's candidates cannot do (accerl_jax.run.plan.refuse_running_candidates).
    k_net, k_comp, k_actor = jax.random.split(jax.random.PRNGKey(cfg.seed), 3)
    # The Anakin loop builds its initial state in one program of its own (accerl_jax.loops.anakin_state):
    # here it needs only the shapes (a --resume checkpoint's template), which compile nothing.
    shapes_only = plan.loop == "anakin"
    init_params = functools.partial(networks.init_params, spec)
    params = jax.eval_shape(init_params, k_net) if shapes_only else init_params(k_net)
    # The learning rate anneals over optimizer steps (APPO takes epochs x minibatches per rollout).
    optimizer_steps = num_updates * loss_cfg.optimizer_steps
    # Settings, not a transformation: the update builds Adam from its traced learning rate and clip
    # (learner.make_update's hyper), so another value reuses the compiled programs.
    optimizer = learner_lib.AdamConfig(cfg.learning_rate, cfg.max_grad_norm, optimizer_steps, anneal=cfg.anneal_lr)
    # The learner's mesh: all devices of all processes, process after process, but each process's cpu:0
    # with --actor-device cpu-apart on XLA:CPU, where its actor runs.
    mesh = learner_lib.make_mesh(learner_devices(plan.first_learner_device))
    # With several processes, the Anakin program runs on global arrays (its state spans the mesh); the
    # sequential and Sebulba loops keep process-local state and their update assembles the global batch.
    global_state = n_proc == 1 or plan.loop == "anakin"
    state_mesh = learner_lib.make_mesh(local_devices(mesh)[:1]) if n_proc > 1 else mesh
    make_learner = functools.partial(
        learner_lib.make_learner, loss_apply, optimizer, loss_cfg, mesh, family=spec.family, state_mesh=state_mesh)
    learner = make_learner()
    update = learner.update
    init_state = functools.partial(learner.init, key=learner_lib.learner_key(cfg.seed))
    state = jax.eval_shape(init_state, params) if shapes_only else init_state(params)
    actor_for = count_actor_for = None
    if info.jittable:
        # Every env its own group, keyed by its global index (accerl_jax.run.shards): the same rollouts on any
        # number of devices and processes. A global state places all groups over the mesh; the sequential
        # loop of several processes steps this process's own groups on its first device.
        groups = list(range(info.num_envs * n_proc)) if global_state else env_group_ids(mesh, info.num_envs)
        make = make_actor
        if cfg.agent == "search":  # each step a search with the actor's network (the plan checked the env)
            from accerl_jax.search.acting import SearchSettings, make_search_actor

            # --distill-children: the actor records its roots' children for the student (the compressor's
            # takes_children).
            make = functools.partial(make_search_actor, settings=SearchSettings.from_config(cfg),
                                     record_children=cfg.distill_children > 0)
        actor_for = functools.partial(make, make_env(cfg.env, 1, cfg.seed), rollout_length=cfg.rollout_length,
                                      family=spec.family, groups=groups, mesh=mesh if global_state else None)
        # --compressor auto's gate counts the rollout the update consumes, the global batch's: the sequential
        # loop of several processes acts on this process's groups only, so it counts every group over the mesh.
        count_actor_for = actor_for if global_state else functools.partial(
            actor_for, groups=list(range(info.num_envs * n_proc)), mesh=mesh)
    else:  # host envs: the gate counts the network's part of the global batch's rollout (NetworkOnlyEnv)
        count_actor_for = functools.partial(make_actor, NetworkOnlyEnv(info, info.num_envs * n_proc),
                                            rollout_length=cfg.rollout_length, family=spec.family)
    # --compressor auto's cost-split gate (accerl_jax.run.auto_gate): counted before the processes' vote (it
    # may refuse), resolved after it (a search run's pick times the candidates, a collective).
    counted = count_gate(cfg, plan, count_actor_for, update, params, state, k_actor, learner_apply) if plan.auto else None
    if before_write is not None:
        before_write()
    gate = counted_flops = None
    if plan.auto:
        cfg, plan, compressor, gate, counted_flops = gate_auto(cfg, plan, compressor, counted, params, learner_apply,
                                                               info)
    claimed = False  # a new run's folder claimed here
    held = None  # --overwrite: the run folder's lock, taken before anything in the folder is deleted
    if logdir is None:  # a multi-host process other than 0: its files are thrown away
        logdir = tempfile.mkdtemp(prefix=f"accerl-process{pid}-")
    elif resume_point is None:
        if cfg.overwrite:
            # A folder another process is writing is refused (ConfigError) with nothing deleted; the lock is
            # kept, so that no other process can start in the folder while it is replaced.
            held = run_folder.lock_run(logdir) if os.path.isdir(logdir) else None
            run_folder.remove_run(logdir, keep_lock=held is not None)
        claim_logdir(logdir)
        claimed = True

    try:
        reuse = plan.takes_teacher and cfg.distill_reuse_teacher
        teacher_update = make_learner(outputs=True).update if reuse else None
        if n_proc > 1:
            if not global_state:  # its outputs come back gathered: the teacher's at the global batch's observations
                update = make_global_update(update, mesh)
                teacher_update = make_global_update(teacher_update, mesh) if reuse else None
        actor_apply = compressor.actor_apply(learner_apply)
        if info.jittable:
            actor = actor_for(actor_apply)
        elif plan.loop == "anakin":  # envpool stepped in the fused program through its XLA interface
            actor = AnakinActor(env.xla(), actor_apply, cfg.rollout_length, family=spec.family)
        else:
            actor = make_actor(env, actor_apply, cfg.rollout_length, family=spec.family)
            if n_proc > 1:  # host envs: each process samples its actions with its own key
                k_actor = jax.random.fold_in(k_actor, pid)
        learner_logits = xla.jit(lambda p, o: learner_apply(p, o)[0], spec.family)
        actor_logits = xla.jit(lambda p, o: actor_apply(p, o)[0], spec.family)
        divergence = gaussian_policy_divergence if info.continuous else policy_divergence

        saver = checkpoint.Checkpointer(logdir, cfg.keep_checkpoints, config_json)
        extra: dict = {}
        restored = None
        if resume_point is not None:
            carry_template = (jax.eval_shape(actor.reset, k_actor) if info.jittable
                              else jax.ShapeDtypeStruct(k_actor.shape, k_actor.dtype))
            obs_template = jax.ShapeDtypeStruct((info.num_envs,) + tuple(info.obs_shape), info.obs_dtype)
            actor_template, comp_template = jax.eval_shape(compressor.init, params, k_comp, obs_template)
            # The actor's lagged parameter sets: one more per completed update, up to --policy-lag + 1.
            n_lagged = min(resume_point.meta["extra"]["completed"], cfg.policy_lag) + 1
            norm_template = None
            if cfg.normalize_observations or cfg.normalize_rewards:
                norm_template = jax.eval_shape(lambda: normalize.init_state(
                    info.obs_shape, info.num_envs * n_proc, cfg.normalize_observations, cfg.normalize_rewards))
            template = checkpoint.TrainState(state, (actor_template,) * n_lagged, comp_template, carry_template,
                                             norm_template)
            n_runs = replicas.count(cfg)
            if n_runs > 1:  # --num-seeds, --sweep: every leaf carries a leading replica axis
                template = jax.tree.map(lambda x: jax.ShapeDtypeStruct((n_runs,) + tuple(x.shape), x.dtype),
                                        template)
            if n_proc > 1:  # read as host (numpy) arrays; the loop places them on the global mesh
                template = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), template)
            restored, extra = saver.restore(resume_point, template)  # ConfigError if damaged or incompatible
        try:
            lock = held or run_folder.lock_run(logdir)  # ConfigError if another process is writing this run
        except ConfigError:
            saver.close()
            raise
        if resume_point is not None:
            if pid == 0:
                run_folder.trim_metrics(logdir, extra["completed"])
                reps = replicas.replicas(cfg)
                for rep in reps if len(reps) > 1 else ():  # each replica's own rows
                    run_folder.trim_metrics(os.path.join(logdir, rep.folder), extra["completed"])
            wall_start -= extra["wall_time_s"]
        wandb = None
        if (cfg.wandb or cfg.wandb_project) and pid == 0:
            wandb = {"project": cfg.wandb_project or "accerl_jax", "config": config_json}
        monitor = Monitor(logdir, num_updates * steps_per_update, cfg.return_window, cfg.progress and pid == 0,
                          append=resume_point is not None and pid == 0, wandb=wandb,
                          purge_step=tensorboard_purge_step(extra.get("monitor")))
        if extra:
            monitor.load_state_dict(extra["monitor"])
        return Run(
            cfg=cfg, plan=plan, env=env, info=info, learner_apply=learner_apply, loss_apply=loss_apply,
            compressor=compressor, actor_apply=actor_apply, actor=actor, actor_for=actor_for, optimizer=optimizer,
            update=update, teacher_update=teacher_update, params=params, state=state, k_comp=k_comp,
            k_actor=k_actor, learner_logits=learner_logits, actor_logits=actor_logits, divergence=divergence,
            mesh=mesh, state_mesh=state_mesh, outputs=Outputs(logdir, saver, lock, monitor, claimed), wall_start=wall_start,
            restored=restored, extra=extra, start_update=extra.get("completed", 0), auto_gate=gate,
            counted_flops=counted_flops,
        )
    except KeyboardInterrupt:  # stopped while building: a new run's folder is freed for a rerun
        if claimed:
            run_folder.free_claim(logdir)
        raise


def learner_devices(first: int) -> list:
    """The learner's devices over all processes, in process order: each process's local devices from its
    ``first`` on (``first`` 1: ``--actor-device cpu-apart`` on XLA:CPU keeps each process's cpu:0 for its
    actor; :func:`accerl_jax.run.plan.first_learner_device`)."""
    if jax.process_count() == 1:
        return jax.local_devices()[first:]
    by_process: dict = {}
    for d in sorted(jax.devices(), key=lambda d: (d.process_index, d.id)):
        by_process.setdefault(d.process_index, []).append(d)
    return [d for p in sorted(by_process) for d in by_process[p][first:]]


def count_gate(cfg: Config, plan: plan_lib.Plan, actor_for: Callable | None, update: Callable, params, state,
               k_actor, learner_apply: Callable) -> dict | None:
    """The counting half of ``--compressor auto``'s cost-split gate (:mod:`accerl_jax.run.auto_gate`), run by
    :func:`build` before anything is written: count the FLOPs of the uncompressed actor's rollout and of the
    learner ``update`` at the run's shapes (``params``, ``state`` and the carry's, from
    ``actor_for(learner_apply)`` and ``k_actor``, the global batch's with several processes; for host envs
    the actor of :class:`~accerl_jax.actor.NetworkOnlyEnv`, the network's part; nothing compiled or
    exchanged, so every process counts the same) unless ``--auto-min-actor-share`` is 0, and decide
    (:func:`accerl_jax.run.auto_gate.decide`).
    Where the gate keeps auto's candidates, refuse what they cannot run
    (:func:`accerl_jax.run.plan.refuse_running_candidates`).

    Returns:
      ``{"min_share", "flops", "outcome"}`` for :func:`gate_auto`; None on ``--resume`` (the run
      keeps its decision).

    Raises:
      ConfigError: from :func:`~accerl_jax.run.plan.refuse_running_candidates`.
    """
    if plan.resume is not None:
        return None
    min_share = cfg.auto_min_actor_share
    flops = None
    if min_share > 0:
        uncompressed = actor_for(learner_apply)
        carry = jax.eval_shape(uncompressed.reset, k_actor)
        # Shapes only: a process-local state's placement would not fit a program over every process's devices.
        shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (params, state))
        flops = auto_gate.count_ceiling(uncompressed.rollout_fn, update, *shapes, carry)
    outcome = auto_gate.decide(min_share, None if flops is None else flops["ceiling"], cfg.agent == "search")
    if outcome == "auto" and flops is not None:  # with the gate off (a share of 0), the plan refused these already
        plan_lib.refuse_running_candidates(cfg, f"its cost-split gate kept auto's candidates: the actor is "
                                                f"{auto_gate.percent(flops['ceiling'])} of an update by FLOPs",
                                           plan.loop, plan.num_processes)
    return {"min_share": min_share, "flops": flops, "outcome": outcome}


def gate_auto(cfg: Config, plan: plan_lib.Plan, compressor, counted: dict | None, params, learner_apply: Callable,
              info) -> tuple:
    """The deciding half of ``--compressor auto``'s cost-split gate, after :func:`count_gate` (``counted``)
    and, with several processes, after their setup vote (a search run's pick times the candidates with
    process 0's timings broadcast, a collective): resolve ``auto`` to ``none`` below the threshold, for a
    search run to the fastest candidate (timed on ``compressor``, the run's AutoCompressor), else keep it.
    A resolved run is built as ``--compressor <resolved>`` would be (``cfg``, ``plan`` and the compressor
    replaced); the configuration recorded in its checkpoints stays the one asked for, and its checkpoints
    record the gate's, which a ``--resume`` (``counted`` None) takes instead of deciding again (nothing
    counted or timed; the record gains ``resumed: True``; the plan refused resuming a run whose gate kept
    auto).

    Returns:
      ``(cfg, plan, compressor, gate record, counted FLOPs)``: the record is
      :func:`accerl_jax.run.auto_gate.record`'s; the FLOPs (``amdahl`` dict) only where auto resolved to
      none (then they are that run's cost split), else None.
    """
    if counted is None:  # --resume: the decision of the run's start (accerl_jax.run.plan.saved_resolution)
        saved = dict(plan.resume.meta["extra"]["auto_gate"], resumed=True)
        saved["reason"] = saved["reason"].removesuffix(" (kept on --resume)") + " (kept on --resume)"
        return (*_resolve(cfg, plan, learner_apply, info, saved["resolved"], saved), None)
    min_share, flops, outcome = (counted[k] for k in ("min_share", "flops", "outcome"))
    if outcome == "auto":
        return cfg, plan, compressor, auto_gate.record(min_share, flops, outcome), None
    timed: dict = {}
    chosen = "none"
    if outcome == "pick":
        chosen, seconds, base = auto_gate.pick_fastest(compressor, params, plan.spec.obs_shape, info.obs_dtype,
                                                       info.num_envs, compressor.speed_forwards)
        timed = dict(forward_s=seconds, base_forward_s=base, batch=info.num_envs)
    gate = auto_gate.record(min_share, flops, outcome, chosen=chosen, **timed)
    return (*_resolve(cfg, plan, learner_apply, info, chosen, gate), flops if outcome == "none" else None)


def _resolve(cfg: Config, plan: plan_lib.Plan, learner_apply: Callable, info, chosen: str, gate: dict) -> tuple:
    """``(cfg, plan, compressor, gate)`` of the run as ``--compressor chosen`` (``gate``'s reason printed
    by process 0)."""
    cfg = dataclasses.replace(cfg, compressor=chosen)
    resolved = make_run_compressor(cfg, plan.spec, learner_apply, info.continuous, info.obs_dtype, plan.num_processes)
    plan = dataclasses.replace(plan, auto=False, takes_teacher=resolved.takes_teacher)
    if plan.process_id == 0:
        print(textwrap.fill(gate["reason"], 80), flush=True)
    return cfg, plan, resolved, gate


def tensorboard_purge_step(monitor_state: dict | None) -> int | None:
    """The TensorBoard step from which a resumed run's events replace its earlier ones (tensorboardX's
    ``SummaryWriter(purge_step=...)``): one env step after the checkpoint's (its own row stays, the rows
    logged after it are logged again). None for a new run (``monitor_state`` None: nothing to purge)."""
    return None if monitor_state is None else int(monitor_state["env_steps"]) + 1


def teacher_kwargs(outputs: list, rows: int) -> dict:
    """``compress``'s ``teacher`` keyword from what the update returned after its metrics (``[]``, or the
    learner's outputs at the rollout's ``[T, B]`` observations: :attr:`Run.teacher_update`):
    ``{"teacher": (policy outputs [rows, ...], values [rows])}`` with ``rows = T * B``, or ``{}``."""
    if not outputs:
        return {}
    flat = lambda x: x.reshape((rows,) + x.shape[2:])  # noqa: E731  [T, B, ...] -> [T * B, ...]
    return {"teacher": (flat(outputs[0].policy_out), flat(outputs[0].value))}


def children_kwargs(compressor, rollout, rows: int) -> dict:
    """``compress``'s ``children`` keyword for a compressor that takes them (``--distill-children``) from a
    search rollout that recorded its roots' children: ``{"children": (child_obs [rows, A, ...], child_valid
    [rows, A] bool)}`` with ``rows = T * B`` (:attr:`accerl_jax.search.acting.SearchRollout.child_obs`), or
    ``{}``. ``rollout`` may hold shapes alone (``jax.ShapeDtypeStruct``, traced)."""
    child_obs = getattr(rollout, "child_obs", None)
    if not compressor.takes_children or child_obs is None:
        return {}
    flat = lambda x: x.reshape((rows,) + tuple(x.shape[2:]))  # noqa: E731  [T, B, ...] -> [T * B, ...]
    return {"children": (flat(child_obs), flat(rollout.child_valid))}


def policy_versions(completed: int, count: int, compress_every: int) -> list[int]:
    """Policy versions of the last ``count`` compressed parameter sets after ``completed`` updates, oldest
    first: the set made after update ``u`` was compressed after update ``(u // compress_every) *
    compress_every`` (0: the initial compression; sets older than the run are the initial one)."""
    return [(max(u, 0) // compress_every) * compress_every for u in range(completed - count + 1, completed + 1)]
