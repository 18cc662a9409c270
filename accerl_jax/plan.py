"""The plan of a run: every check of the configuration, in one place, and the choices that follow from
it (loop, device layout, loss, network, compressor capabilities; :func:`check_compressor` runs a
compressor abstractly on the learner's network so that one that does not fit is refused up front).

:func:`check_config` checks what the flags alone decide; :func:`make_plan` adds what the environment's
facts (:class:`~accerl_jax.envs.EnvInfo`) and the machine (devices, processes) decide, and returns the
:class:`Plan` that setup (:mod:`accerl_jax.run`), the :class:`~accerl_jax.driver.Driver` and the steppers
(:mod:`accerl_jax.loops`) follow without checking again. Each bad combination has one
:class:`~accerl_jax.config.ConfigError` (the CLI exits 2 with it), raised before anything is written.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from accerl_jax import learner as learner_lib
from accerl_jax import networks
from accerl_jax.config import Config, ConfigError, flag, validate
from accerl_jax.corrector import CORRECTORS
from accerl_jax.seeds import envpool_seed

LOOPS = ("auto", "anakin", "sequential", "sebulba")
MULTI_HOST_LOOPS = ("auto", "anakin", "sequential")  # --loop values a multi-host run accepts
SEBULBA_FLAGS = {"actor_threads": 1, "actor_batch": 0, "actor_device": "cpu", "queue_size": 2}
MAX_UPDATES = 2**31 - 1  # the optimizer's step counter is int32
# APPO's passes over each rollout where --epochs is 0 (its default). Measured on the main job (CartPole-v1,
# 16 envs x 16 steps, MLP(64, 64), full-batch passes, 200k steps, 2-core CPU): 8 solved all 8 seeds tried;
# 4 solved none of 4, 6 solved 4 of 4 but later (docs/RESULTS.md, "The default job").
APPO_EPOCHS = 8


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a run will do, decided once (module docstring)."""

    loop: str  # "anakin", "sequential" or "sebulba"
    loss: learner_lib.LossConfig
    spec: networks.NetworkSpec  # the learner's network
    auto: bool  # --compressor auto: the compressor is chosen (and changed) while training
    num_processes: int  # multi-host: processes in the run
    process_id: int
    local_devices: int  # the learner's batch axis is sharded over these (x num_processes)
    # Index in jax.local_devices() of the learner's first device: 1 where --actor-device cpu-apart keeps
    # the host CPU's device 0 for the actor (first_learner_device), else 0.
    first_learner_device: int
    steps_per_update: int  # agent steps per update over all processes: num_envs x rollout_length x processes
    num_updates: int


def make_loss_config(cfg: Config) -> learner_lib.LossConfig:
    """The learner's :class:`~accerl_jax.learner.LossConfig` for ``cfg``, with ``--loss auto`` and
    ``--epochs 0`` resolved: ``auto`` is ``appo``, or ``actor-critic`` with ``--corrector retrace`` (APPO
    needs state-value advantages); epochs 0 is :data:`APPO_EPOCHS` with ``appo``, 1 with ``actor-critic``.

    Raises:
      ConfigError: for a bad ``--loss`` or a combination the losses do not accept (``appo`` with
        ``retrace``; ``--epochs``/``--minibatches`` other than 1 without ``appo``).
    """
    if cfg.loss not in (*learner_lib.LOSSES, "auto"):
        raise ConfigError(f"bad --loss {cfg.loss!r}; expected one of {', '.join(learner_lib.LOSSES)} or auto")
    loss = cfg.loss
    if loss == "auto":
        loss = "actor-critic" if cfg.corrector == "retrace" else "appo"
    epochs = cfg.epochs or (APPO_EPOCHS if loss == "appo" else 1)
    if loss != "appo" and (epochs, cfg.minibatches) != (1, 1):
        settings = {"epochs": cfg.epochs, "minibatches": cfg.minibatches}
        given = " ".join(f"{flag(name)} {value}" for name, value in settings.items() if value not in (0, 1))
        why = " (--loss auto with --corrector retrace)" if cfg.loss == "auto" else ""
        raise ConfigError(f"bad {given} with --loss actor-critic{why}: it takes one gradient step per rollout; "
                          "drop the flag, or use --loss appo (not with retrace)")
    try:
        return learner_lib.LossConfig(
            corrector=cfg.corrector, discount=cfg.discount, lambda_=cfg.lambda_,
            clip_rho_threshold=cfg.clip_rho_threshold, clip_pg_rho_threshold=cfg.clip_pg_rho_threshold,
            value_coef=cfg.value_coef, entropy_coef=cfg.entropy_coef, loss=loss, ppo_clip=cfg.ppo_clip,
            epochs=epochs, minibatches=cfg.minibatches,
        )
    except ValueError as err:
        raise ConfigError(f"bad --loss/--corrector combination: {err}") from None


def check_config(cfg: Config, num_processes: int = 1, local_devices: int = 1) -> str:
    """Every check the flags (and the machine's process and device counts) decide: numbers, names,
    combinations, the loop; nothing is built or written. Returns the loop the flags choose
    (:func:`choose_loop`; :func:`make_plan` may still move a conv net on CPU to the sequential loop).

    Raises:
      ConfigError: naming the bad flag and value and what is accepted.
    """
    validate(cfg)
    if cfg.wandb or cfg.wandb_project:
        from accerl_jax.monitor import require_wandb

        require_wandb()
    if cfg.corrector not in CORRECTORS:
        raise ConfigError(f"bad --corrector {cfg.corrector!r}; expected one of {', '.join(CORRECTORS)}")
    make_loss_config(cfg)
    if cfg.loop not in LOOPS:
        raise ConfigError(f"bad --loop {cfg.loop!r}; expected one of {', '.join(LOOPS)}")
    if cfg.compressor == "auto":
        if cfg.resume is not None:
            raise ConfigError(f"bad --resume {cfg.resume!r} with --compressor auto: resuming an auto run is not "
                              "supported (its actor parameters change structure with each decision); start a new "
                              "run, or resume a run with a fixed --compressor")
        if cfg.distill_async:
            raise ConfigError("bad --distill-async with --compressor auto: auto runs its candidates' distillation "
                              "itself, synchronously; drop the flag")
    if num_processes > 1 and cfg.loop not in MULTI_HOST_LOOPS:
        raise ConfigError(f"bad --loop {cfg.loop!r} with several processes: multi-host training runs the Anakin "
                          "loop (gymnax envs) or the sequential loop; use --loop anakin, sequential or auto")
    if cfg.env.startswith("envpool:"):
        try:  # the last replica's block of env seeds must fit envpool's int seed
            envpool_seed(cfg.seed + cfg.num_seeds - 1, cfg.num_envs * num_processes)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    loop = choose_loop(cfg, num_processes=num_processes, local_devices=local_devices)
    if num_processes > 1:
        check_multi_host(cfg, loop)
    return loop


def check_multi_host(cfg: Config, loop: str) -> None:
    """Refuse what a run of several processes cannot do with ``loop``.

    Raises:
      ConfigError: the Anakin loop with an envpool env or ``--num-seeds`` > 1; ``--resume`` outside the
        Anakin loop (the sequential loop's actors keep process-local state, which a checkpoint does not hold).
    """
    if loop == "anakin":
        if not cfg.env.startswith("gymnax:"):
            raise ConfigError(f"bad --loop anakin for {cfg.env} with several processes: envpool's XLA step cannot "
                              "be partitioned over the processes' devices; use --loop sequential")
        if cfg.num_seeds > 1:
            raise ConfigError(f"bad --num-seeds {cfg.num_seeds} with several processes: train the seeds one "
                              "multi-host run at a time (--num-seeds 1)")
    elif cfg.resume is not None:
        raise ConfigError(f"bad --resume {cfg.resume!r} with several processes and --loop {loop}: only a "
                          "multi-host run of the Anakin loop (gymnax envs) can be resumed (the sequential loop's "
                          "actors and compressors keep process-local state); start a new run")


def choose_loop(cfg: Config, *, num_processes: int = 1, local_devices: int = 1) -> str:
    """The loop ``cfg.loop`` names, ``auto`` resolved: ``anakin`` for gymnax envs (``sequential`` with
    ``--distill-async``), ``sebulba`` for envpool
    (``sequential`` with several processes).

    Raises:
      ConfigError: a loop that cannot run what ``cfg`` asks for (``--num-seeds`` > 1 outside Anakin;
        see :func:`check_anakin` and :func:`check_sebulba`).
    """
    jittable = cfg.env.startswith("gymnax:")
    loop = cfg.loop
    if loop == "auto":
        if cfg.env.startswith("envpool:"):
            loop = "sebulba" if num_processes == 1 else "sequential"
        elif cfg.distill_async and cfg.num_seeds == 1:
            loop = "sequential"  # asynchronous distillation runs in a host thread
        else:
            loop = "anakin"
    if cfg.num_seeds > 1 and loop != "anakin":
        raise ConfigError(f"bad --num-seeds {cfg.num_seeds} with --loop {cfg.loop}: several seeds at once are "
                          "trained by vmap of the Anakin loop's program; use --loop anakin with a gymnax env, or "
                          "--num-seeds 1")
    if loop == "anakin":
        check_anakin(cfg, jittable, local_devices)
    check_sebulba(cfg, loop)
    return loop


def check_anakin(cfg: Config, jittable: bool, local_devices: int = 1) -> None:
    """Refuse what the Anakin loop cannot run.

    ``jittable`` is False for a host (envpool) env, which the loop steps through envpool's XLA interface.

    Raises:
      ConfigError: ``--distill-async`` (a host thread cannot run inside the jitted program),
        ``--compressor auto`` with ``--num-seeds`` > 1 (each seed would take its own decisions, so the
        seeds could not share one vmapped program); for envpool: ``--num-seeds`` > 1 (``vmap`` cannot copy the one host pool), more than one
        local device (XLA cannot partition envpool's side-effecting step over devices), or a task with
        64-bit arrays (:func:`accerl_jax.envs.envpool_env.check_xla`).
    """
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
    if cfg.num_seeds > 1:
        raise ConfigError(f"bad --num-seeds {cfg.num_seeds} with --loop anakin and {cfg.env}: the Anakin loop "
                          "steps envpool's one host pool through its XLA interface, which vmap cannot copy per "
                          "seed; use --num-seeds 1 (one run per seed) or a gymnax env")
    if local_devices > 1:
        # XLA's SPMD partitioner rejects the program ("Side-effect HLO must have sharding").
        raise ConfigError(f"bad --loop anakin for {cfg.env} on {local_devices} local devices: the "
                          "Anakin program is partitioned over the devices, and envpool's side-effecting XLA step "
                          "on its one host pool cannot be; use --loop sebulba (or sequential), or one device")
    from accerl_jax.envs.envpool_env import check_xla

    try:
        check_xla(cfg.env.partition(":")[2])
    except ValueError as err:
        raise ConfigError(f"bad --loop anakin for {cfg.env}: {err}; use --loop sebulba or sequential") from None


def check_sebulba(cfg: Config, loop: str) -> None:
    """Check the Sebulba flags against the loop.

    Raises:
      ConfigError: Sebulba flags with another loop; ``--loop sebulba`` with a non-envpool env, with
        ``--policy-lag`` or ``--compress-every`` other than 1; ``--num-envs`` not a
        multiple of ``--actor-threads``; ``--actor-batch`` larger than a thread's environments.
    """
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
    if cfg.compress_every != 1:
        raise ConfigError(f"bad --compress-every {cfg.compress_every} with --loop sebulba: its compressor thread "
                          "re-compresses as fast as it can, overlapped with learning; use --loop sequential")
    if cfg.num_envs % cfg.actor_threads:
        raise ConfigError(f"bad --num-envs {cfg.num_envs}: must be a multiple of --actor-threads {cfg.actor_threads}")
    per_thread = cfg.num_envs // cfg.actor_threads
    if cfg.actor_batch > per_thread:
        raise ConfigError(f"bad --actor-batch {cfg.actor_batch}: at most the {per_thread} environments of each "
                          f"actor thread (--num-envs {cfg.num_envs} / --actor-threads {cfg.actor_threads})")


def make_plan(cfg: Config, info, loop: str, *, num_processes: int | None = None, process_id: int | None = None,
              local_devices: int | None = None, backend: str | None = None) -> Plan:
    """The :class:`Plan` for ``cfg`` on environments described by ``info`` (an
    :class:`~accerl_jax.envs.EnvInfo`) and this machine (default: what JAX sees). ``loop`` is what
    :func:`check_config` returned for ``cfg`` (setup calls it before it builds the environments); with
    ``--loop auto``, a conv net on CPU moves from Anakin to the sequential loop: its gradient steps inside
    one XLA:CPU program run many times slower than as separate calls (docs/DESIGN.md, "Known XLA:CPU
    pitfall").

    Raises:
      ConfigError: any bad setting or combination (module docstring).
    """
    n_proc = jax.process_count() if num_processes is None else num_processes
    pid = jax.process_index() if process_id is None else process_id
    n_dev = jax.local_device_count() if local_devices is None else local_devices
    first = first_learner_device(cfg, n_dev, backend)
    n_dev -= first
    if info.num_envs % n_dev:
        raise ConfigError(f"bad --num-envs {info.num_envs}: must be a multiple of the {n_dev} local devices"
                          + (" of the learner (cpu:0 is the actor's)" if first else ""))
    if info.num_envs % (n_dev * cfg.minibatches):
        raise ConfigError(f"bad --num-envs {info.num_envs}: must be a multiple of --minibatches {cfg.minibatches} "
                          f"x {n_dev} devices = {n_dev * cfg.minibatches}")
    if info.continuous and cfg.corrector == "retrace":
        raise ConfigError(f"bad --corrector retrace for {cfg.env}: Retrace needs discrete actions (a Q head over "
                          "all actions); this env has continuous actions; use vtrace, is or none")
    steps_per_update = info.num_envs * cfg.rollout_length * n_proc
    num_updates = max(1, cfg.total_steps // steps_per_update)
    if num_updates > MAX_UPDATES:
        raise ConfigError(f"bad --total-steps {cfg.total_steps}: more than {MAX_UPDATES} updates; use a smaller budget")
    try:
        spec = networks.default_spec(info.obs_shape, info.num_actions, info.channels_first,
                                     action_dim=info.action_dim, q_head=cfg.corrector == "retrace")
    except ValueError as err:
        raise ConfigError(f"bad --env {cfg.env!r}: {err}") from None
    if cfg.hidden_sizes:
        if spec.family == "cnn" and len(cfg.hidden_sizes) != len(spec.widths):
            raise ConfigError(f"bad --hidden-sizes {' '.join(map(str, cfg.hidden_sizes))} for {cfg.env} (a conv net): "
                              f"expected {len(spec.widths)} numbers, three conv channel counts then the dense size, "
                              f"e.g. {' '.join(map(str, spec.widths))}")
        spec = dataclasses.replace(spec, widths=tuple(cfg.hidden_sizes))
    if (cfg.loop == "auto" and loop == "anakin" and cfg.num_seeds == 1 and spec.family == "cnn"
            and (backend or jax.default_backend()) == "cpu"):
        loop = "sequential"
        if n_proc > 1:
            check_multi_host(cfg, loop)
    return Plan(loop=loop, loss=make_loss_config(cfg), spec=spec, auto=cfg.compressor == "auto",
                num_processes=n_proc, process_id=pid, local_devices=n_dev, first_learner_device=first,
                steps_per_update=steps_per_update, num_updates=num_updates)


def first_learner_device(cfg: Config, local_devices: int, backend: str | None = None) -> int:
    """Index in ``jax.local_devices()`` of the learner's first device: 1 for ``--actor-device cpu-apart``
    where the learner's devices are the host CPU's own (``backend``, default JAX's, is ``"cpu"``): the actor
    takes device 0, the learner's mesh the other ``local_devices - 1``. Else 0: the learner uses every
    local device (on a GPU/TPU machine the actor's host CPU is not among them anyway).

    Raises:
      ConfigError: ``--actor-device cpu-apart`` on XLA:CPU with fewer than 2 local devices.
    """
    if cfg.actor_device != "cpu-apart" or (backend or jax.default_backend()) != "cpu":
        return 0
    if local_devices < 2:
        raise ConfigError(f"bad --actor-device cpu-apart on {local_devices} CPU device: it keeps cpu:0 for the actor "
                          "and the learner needs at least one other; set "
                          "XLA_FLAGS=--xla_force_host_platform_device_count=N with N >= 2, or use --actor-device cpu")
    return 1


def _family_name(spec: networks.NetworkSpec) -> str:
    """``'MLP Gaussian'``, ``'CNN categorical with a Q head'``, ...: the network family in words."""
    policy = "Gaussian" if spec.action_dim else "categorical"
    return f"{spec.family.upper()} {policy}" + (" with a Q head" if spec.q_head else "")


def check_compressor(compressor, spec: networks.NetworkSpec, name: str, obs_dtype: str = "float32",
                     num_obs: int = 2) -> None:
    """Refuse a compressor that cannot run on the learner's network, before anything is written.

    Runs the compressor once *abstractly* (``jax.eval_shape``: shapes and dtypes only, nothing compiled
    or computed): ``init(params, key, obs)`` on the learner's parameters and ``num_obs`` observations,
    then its actor's ``apply`` on the result, which must return a floating ``[num_obs, A]`` policy output
    (``[num_obs, 2D]`` for a Gaussian) and a floating ``[num_obs]`` value. A compressor that assumes
    another network family (a missing layer, a parameter of another shape) fails here with its own
    error, which becomes the ConfigError.

    Args:
      compressor: the :class:`~accerl_jax.compressor.Compressor` built for ``spec``.
      spec: the learner's network.
      name: the ``--compressor`` spec (or auto candidate) for the message.
      obs_dtype: the environment's observation dtype name (``"float32"``, ``"uint8"``).
      num_obs: the abstract observation batch.

    Raises:
      ConfigError: naming the compressor, the network family and the failure.
    """
    obs = jax.ShapeDtypeStruct((num_obs,) + tuple(spec.obs_shape), obs_dtype)
    key = jax.random.PRNGKey(0)  # abstract only: no random number is drawn
    out_dim = 2 * spec.action_dim if spec.action_dim else spec.num_actions
    try:
        params = jax.eval_shape(lambda k: networks.init_params(spec, k), key)
        actor_params, _ = jax.eval_shape(compressor.init, params, key, obs)
        policy_out, value = jax.eval_shape(compressor.actor_apply(networks.make_apply(spec)), actor_params, obs)[:2]
        if (policy_out.shape != (num_obs, out_dim) or value.shape != (num_obs,)
                or not all(jnp.issubdtype(x.dtype, jnp.floating) for x in (policy_out, value))):
            raise ValueError(f"its actor returns policy {policy_out.shape} {policy_out.dtype} and value "
                             f"{value.shape} {value.dtype}; expected floating ({num_obs}, {out_dim}) and ({num_obs},)")
    except Exception as err:  # any failure of the dry run means the compressor does not fit this network
        raise ConfigError(f"bad --compressor {name!r} for the {_family_name(spec)} network "
                          f"(widths {spec.widths}, observations {spec.obs_shape}): {type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}; choose another --compressor") from None
