"""The plan of a run: every check of a training configuration, in one place, and the choices that
follow from it (loop, device layout, loss, network, compressor capabilities), decided once.

:func:`make_plan` takes the configuration and small typed facts -- the environment's
(:class:`~accerl_jax.envs.EnvInfo`), the machine's (:class:`Machine`: processes, devices, backend) and the
run folder's (:class:`Folder`: what ``--logdir`` holds, the ``--resume`` checkpoint's record) -- and
returns the :class:`Plan` that setup (:mod:`accerl_jax.run.build`: it only builds), the
:class:`~accerl_jax.run.driver.Driver` and the steppers (:mod:`accerl_jax.loops`) follow without checking
again. It builds nothing heavy and writes nothing: the facts are read beforehand
(:func:`accerl_jax.run.build.read_folder`, ``env.info``, :meth:`Machine.current`), and the compressor is only
run abstractly (:func:`check_compressor`). :func:`check_config` is its part that needs no environment
(the flags and the process and device counts), which multi-host processes run before they join and setup
runs before it builds the environments. Each bad combination has one
:class:`~accerl_jax.config.ConfigError` (the CLI exits 2 with it).
"""
from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from accerl_jax import learner as learner_lib
from accerl_jax import networks
from accerl_jax.run.checkpoint import LAYOUT_FIELDS, RESUME_MAY_CHANGE, ResumePoint
from accerl_jax.compressor import Compressor, make_compressor, uses_registered
from accerl_jax.compressor.auto import parse_candidates
from accerl_jax.config import PGX_GAMES, Config, ConfigError, flag, validate
from accerl_jax.corrector import CORRECTORS
from accerl_jax.platform import xla
from accerl_jax.run import replicas
from accerl_jax.run.folder import refuse_taken
from accerl_jax.seeds import envpool_seed

if TYPE_CHECKING:  # importing accerl_jax.envs imports gymnax, which starts JAX's backend: a multi-host
    from accerl_jax.envs import EnvInfo  # process must not before it joins (accerl_jax.run.distributed.join)

LOOPS = ("auto", "anakin", "sequential", "sebulba")
JITTABLE_BACKENDS = ("gymnax:", "pgx:")  # --env prefixes of pure JAX envs (the Anakin loop steps them in its program)
SEBULBA_FLAGS = {"actor_threads": 1, "actor_batch": 0, "actor_device": "cpu", "queue_size": 2}
MAX_UPDATES = 2**31 - 1  # the optimizer's step counter is int32
# APPO's passes over each rollout where --epochs is 0 (its default). Measured on the main job (CartPole-v1,
# 16 envs x 16 steps, MLP(64, 64), full-batch passes, 200k steps, 2-core CPU): 8 solved all 8 seeds tried;
# 4 solved none of 4, 6 solved 4 of 4 but later (docs/RESULTS.md, "The default job").
APPO_EPOCHS = 8


@dataclasses.dataclass(frozen=True)
class Machine:
    """The machine facts a plan depends on; :meth:`current` reads them from JAX.

    Attributes:
      num_processes: processes in the run (multi-host: ``jax.process_count()``).
      process_id: this process's index in ``[0, num_processes)``; only 0 writes the run's files.
      local_devices: JAX devices of this process (``jax.local_device_count()``).
      backend: JAX's default platform name: ``"cpu"``, ``"gpu"`` or ``"tpu"``.
    """

    num_processes: int = 1
    process_id: int = 0
    local_devices: int = 1
    backend: str = "cpu"

    @classmethod
    def current(cls) -> "Machine":
        """This process's facts, from JAX (starts its backend: multi-host processes join the run first)."""
        return cls(jax.process_count(), jax.process_index(), jax.local_device_count(), jax.default_backend())


@dataclasses.dataclass(frozen=True)
class Folder:
    """The run folder as found on disk before planning (:func:`accerl_jax.run.build.read_folder` reads it).

    Attributes:
      logdir: the folder the run writes (``--logdir``, the default one, or the resumed run's own);
        None on a multi-host process other than 0, which writes into a temporary folder.
      is_file: ``logdir`` exists and is a file.
      taken: names of run files (and ``checkpoints/``) already in ``logdir``, sorted.
      resume: the ``--resume`` checkpoint (:class:`~accerl_jax.run.checkpoint.ResumePoint`, its JSON record
        read and checked for damage by :func:`~accerl_jax.run.checkpoint.find_checkpoint`), or None.
    """

    logdir: str | None = None
    is_file: bool = False
    taken: tuple[str, ...] = ()
    resume: ResumePoint | None = None


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
    # The compressor's compress() takes the learner's outputs as its teacher (Compressor.takes_teacher;
    # False for --compressor auto, whose distilling candidates run their own teacher pass).
    takes_teacher: bool = False
    logdir: str | None = None  # Folder.logdir
    resume: ResumePoint | None = None  # Folder.resume


def config_record(cfg: Config) -> dict:
    """``cfg`` as a checkpoint records it: a JSON-ready dict (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def make_loss_config(cfg: Config) -> learner_lib.LossConfig:
    """The learner's :class:`~accerl_jax.learner.LossConfig` for ``cfg``, with ``--loss auto`` and
    ``--epochs 0`` resolved: ``auto`` is ``appo``, or ``actor-critic`` with ``--corrector retrace`` (APPO
    needs state-value advantages); epochs 0 is :data:`APPO_EPOCHS` with ``appo``, 1 with ``actor-critic``.
    The rules are the losses' own (:func:`accerl_jax.learner.loss_conflict`).

    Raises:
      ConfigError: for a bad ``--loss`` or a combination the losses do not accept (``appo`` with
        ``retrace``; ``--epochs``/``--minibatches`` other than 1 without ``appo``).
    """
    loss = cfg.loss
    if loss == "auto":
        loss = "search" if cfg.agent == "search" else "actor-critic" if cfg.corrector == "retrace" else "appo"
    if (loss == "search") != (cfg.agent == "search"):
        raise ConfigError(f"bad --loss {cfg.loss!r} with --agent {cfg.agent}: loss 'search' trains the search agent "
                          "and only it; use --loss auto")
    epochs = cfg.epochs or (APPO_EPOCHS if loss == "appo" else 1)
    conflict = learner_lib.loss_conflict(loss, cfg.corrector, epochs, cfg.minibatches)
    rule = conflict and conflict[0]
    if rule == "loss":
        raise ConfigError(f"bad --loss {cfg.loss!r}; expected one of {', '.join(learner_lib.LOSSES)} or auto")
    if rule == "passes-without-appo":
        settings = {"epochs": cfg.epochs, "minibatches": cfg.minibatches}
        given = " ".join(f"{flag(name)} {value}" for name, value in settings.items() if value not in (0, 1))
        why = "" if cfg.loss != "auto" else " (--agent search)" if loss == "search" else \
            " (--loss auto with --corrector retrace)"
        fix = "" if loss == "search" else ", or use --loss appo (not with retrace)"
        raise ConfigError(f"bad {given} with --loss {loss}{why}: it takes one gradient step per rollout; "
                          f"drop the flag{fix}")
    if conflict is not None:
        raise ConfigError(f"bad --loss/--corrector combination: {conflict[1]}")
    if cfg.minibatch_unit != "columns" and loss != "appo":
        raise ConfigError(f"bad --minibatch-unit {cfg.minibatch_unit} with --loss {loss}: only APPO draws "
                          "minibatches; use --loss appo, or drop the flag")
    if cfg.normalize_advantages and loss != "appo":
        raise ConfigError(f"bad --normalize-advantages with --loss {loss}: it normalises APPO's minibatch "
                          "advantages; use --loss appo, or drop the flag")
    if cfg.clip_value and loss != "appo":
        raise ConfigError(f"bad --clip-value with --loss {loss}: it clips APPO's value loss around the values "
                          "the update starts from; use --loss appo, or drop the flag")
    return learner_lib.LossConfig(
        corrector=cfg.corrector, discount=cfg.discount, lambda_=cfg.lambda_,
        clip_rho_threshold=cfg.clip_rho_threshold, clip_pg_rho_threshold=cfg.clip_pg_rho_threshold,
        value_coef=cfg.value_coef, entropy_coef=cfg.entropy_coef, loss=loss, ppo_clip=cfg.ppo_clip,
        epochs=epochs, minibatches=cfg.minibatches, n_step=cfg.n_step, search_target=cfg.search_target,
        normalize_advantages=cfg.normalize_advantages, clip_value=cfg.clip_value, minibatch_unit=cfg.minibatch_unit,
        value_target="outcome" if cfg.env.startswith("pgx:") else "n-step",
    )


def check_flags(cfg: Config, num_processes: int = 1) -> None:
    """The checks the flags alone (and the process count) decide: numbers, names, combinations that do
    not depend on the loop; nothing is built or written.

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
    check_search(cfg)
    replicas.check_sweep(cfg)
    if cfg.sweep and cfg.agent == "search" and "discount" in dict(replicas.parse_sweep(cfg.sweep)):
        raise ConfigError(f"bad --sweep {' '.join(cfg.sweep)} with --agent search: the search itself discounts "
                          "with --discount, a constant of its program; sweep the other values, or run one "
                          "--discount per run")
    if cfg.loop not in LOOPS:
        raise ConfigError(f"bad --loop {cfg.loop!r}; expected one of {', '.join(LOOPS)}")
    if cfg.compressor == "auto":
        if cfg.distill_async:
            raise ConfigError("bad --distill-async with --compressor auto: auto runs its candidates' distillation "
                              "itself, synchronously; drop the flag")
        if cfg.distill_minibatches != 1:
            raise ConfigError(f"bad --distill-minibatches {cfg.distill_minibatches} with --compressor auto: auto's "
                              "candidates (some without a distill stage) distil in full batches; drop the flag, or "
                              "name the compressor (e.g. --compressor distill:small)")
    rows = cfg.num_envs * cfg.rollout_length
    if cfg.distill_minibatches > rows:
        raise ConfigError(f"bad --distill-minibatches {cfg.distill_minibatches}: an update distils {rows} rows "
                          f"(--num-envs {cfg.num_envs} x --rollout-length {cfg.rollout_length}), too few to split "
                          f"that many ways; use at most {rows}")
    if cfg.env.startswith("envpool:"):
        try:  # the last replica's block of env seeds must fit envpool's int seed
            envpool_seed(cfg.seed + cfg.num_seeds - 1, cfg.num_envs * num_processes)
        except ValueError as err:
            raise ConfigError(str(err)) from None


def check_search(cfg: Config) -> None:
    """Refuse what the search agent (``--agent search``, :mod:`accerl_jax.search`) cannot run; the loop and
    the env's action space are checked where they are known (:func:`choose_loop`, :func:`make_plan`).

    Raises:
      ConfigError: a pgx env with another agent or an unknown game (:data:`accerl_jax.config.PGX_GAMES`);
        an env that is neither gymnax nor pgx (the search steps the env's own model), ``--corrector retrace``
        (the search's loss uses no corrector; retrace would only add a Q head); ``--distill-children`` without
        ``--agent search`` or with ``--compressor auto``; ``--learner-children`` without ``--agent search``, with
        ``--compressor none`` or ``auto``, or with ``--normalize-observations``. ``--compressor auto`` runs:
        its gate resolves it to one compressor before training (:mod:`accerl_jax.run.auto_gate`).
    """
    if cfg.env.startswith("pgx:"):
        game = cfg.env.partition(":")[2]
        if game not in PGX_GAMES:
            raise ConfigError(f"bad --env {cfg.env!r}: unknown pgx game {game!r}; expected pgx:<game> with <game> one "
                              f"of {', '.join(PGX_GAMES)}")
        if cfg.agent != "search":
            raise ConfigError(f"bad --agent {cfg.agent} for --env {cfg.env}: two-player games are learned by self-play "
                              "with the search agent only; use --agent search (or --preset connect4)")
    if cfg.distill_children and (cfg.agent != "search" or cfg.compressor == "auto"):
        why = (f"--agent {cfg.agent} has no search tree" if cfg.agent != "search"
               else "--compressor auto picks its compressor itself")
        raise ConfigError(f"bad --distill-children {cfg.distill_children}: it distils the student on search roots' "
                          f"children, and {why}; use it with --agent search and a distill compressor "
                          "(e.g. --compressor distill:small), or drop it")
    if cfg.learner_children:
        why = (f"--agent {cfg.agent} has no search tree" if cfg.agent != "search"
               else "with --compressor none every node is the learner's already" if cfg.compressor == "none"
               else "--compressor auto picks its compressor itself" if cfg.compressor == "auto"
               else "the actor's observations would be normalised for the compressed network only"
               if cfg.normalize_observations else None)
        if why is not None:
            raise ConfigError(f"bad --learner-children: the learner's network evaluates the compressed search's root "
                              f"children, and {why}; use it with --agent search and a fixed compressor (e.g. "
                              "--compressor distill:small), or drop it")
    if cfg.agent != "search":
        return
    if not cfg.env.startswith(JITTABLE_BACKENDS):
        raise ConfigError(f"bad --env {cfg.env!r} with --agent search: the search steps the environment's own "
                          "model, which only gymnax and pgx envs expose; use a gymnax:<id> or pgx:<game> env")
    if cfg.corrector == "retrace":
        raise ConfigError("bad --corrector retrace with --agent search: the search's loss takes no corrector and "
                          "retrace would add an unused Q head; leave --corrector out")


def check_config(cfg: Config, num_processes: int = 1, local_devices: int = 1) -> str:
    """The part of :func:`make_plan` that needs no environment: :func:`check_flags`, then the loop the
    flags choose and its checks (:func:`choose_loop`, without the network's family: :func:`make_plan`
    may still move a conv net on CPU to the sequential loop). Nothing is built or written.

    Returns:
      the loop: ``"anakin"``, ``"sequential"`` or ``"sebulba"``.

    Raises:
      ConfigError: naming the bad flag and value and what is accepted.
    """
    check_flags(cfg, num_processes)
    return choose_loop(cfg, num_processes=num_processes, local_devices=local_devices)


def check_multi_host(cfg: Config, loop: str) -> None:
    """Refuse what a run of several processes cannot do with ``loop``.

    Raises:
      ConfigError: the Anakin loop with an envpool env or ``--num-seeds`` > 1;
        ``--resume`` with the sequential loop (its actors keep process-local env state, which a checkpoint
        does not hold; Sebulba's host envs restart on a resume in every loop).
    """
    if loop == "anakin":
        if not cfg.env.startswith(JITTABLE_BACKENDS):
            raise ConfigError(f"bad --loop anakin for {cfg.env} with several processes: envpool's XLA step cannot "
                              "be partitioned over the processes' devices; use --loop sequential")
        if cfg.num_seeds > 1:
            raise ConfigError(f"bad --num-seeds {cfg.num_seeds} with several processes: train the seeds one "
                              "multi-host run at a time (--num-seeds 1)")
        if cfg.sweep:
            raise ConfigError(f"bad --sweep {' '.join(cfg.sweep)} with several processes: train one value per "
                              "multi-host run (its own flags), or sweep on one process")
    elif loop == "sequential" and cfg.resume is not None:
        raise ConfigError(f"bad --resume {cfg.resume!r} with several processes and --loop {loop}: only a "
                          "multi-host run of the Anakin loop (gymnax envs) or the Sebulba loop (envpool) can be "
                          "resumed (the sequential loop's actors keep process-local env state); start a new run")


def choose_loop(cfg: Config, *, num_processes: int = 1, local_devices: int = 1, family: str | None = None,
                backend: str | None = None) -> str:
    """The loop ``cfg.loop`` names, ``auto`` resolved, and the refusals of what that loop cannot run.

    ``auto``: ``anakin`` for gymnax envs (``sequential`` with ``--distill-async``), ``sebulba`` for envpool
    (``sequential`` for auto's candidates with several processes: ``--compressor auto
    --auto-min-actor-share 0``); a conv net (``family`` ``"cnn"`` or ``"impala"``,
    :func:`accerl_jax.platform.xla.is_conv`) on CPU (``backend``
    ``"cpu"``) with one seed moves from Anakin to the sequential loop: its gradient steps inside one
    XLA:CPU program run many times slower than as separate calls (docs/DESIGN.md, "Known XLA:CPU
    pitfall"). ``family`` None (the network not known yet, :func:`check_config`) skips that rule.

    Raises:
      ConfigError: a loop that cannot run what ``cfg`` asks for (``--num-seeds`` > 1 outside Anakin;
        see :func:`check_anakin`, :func:`check_sebulba` and, with several processes, :func:`check_multi_host`).
    """
    jittable = cfg.env.startswith(JITTABLE_BACKENDS)
    loop = cfg.loop
    # auto's candidates run from the start: the gate is off. With it on, the run is what the gate resolves
    # to, if it does (refused after its count otherwise: accerl_jax.run.build.count_gate).
    candidates = cfg.compressor == "auto" and cfg.auto_min_actor_share <= 0
    if loop == "auto":
        if cfg.env.startswith("envpool:"):
            # Sebulba on any number of processes, but auto's candidates across processes (each process's
            # compressor thread would decide alone; refuse_running_candidates): the sequential loop, where the
            # processes agree.
            loop = "sebulba" if num_processes == 1 or not candidates else "sequential"
        elif cfg.agent == "search":
            loop = "anakin"  # the search runs inside the Anakin program only (for now)
        elif cfg.distill_async and replicas.count(cfg) == 1:
            loop = "sequential"  # asynchronous distillation runs in a host thread
        elif replicas.count(cfg) == 1 and xla.is_conv(family) and backend == "cpu":
            loop = "sequential"
        else:
            loop = "anakin"
    if cfg.num_seeds > 1 and loop != "anakin":
        raise ConfigError(f"bad --num-seeds {cfg.num_seeds} with --loop {cfg.loop}: several seeds at once are "
                          "trained by vmap of the Anakin loop's program; use --loop anakin with a gymnax env, or "
                          "--num-seeds 1")
    if cfg.sweep and loop != "anakin":
        chosen = f" (here {loop})" if cfg.loop == "auto" else ""
        raise ConfigError(f"bad --sweep {' '.join(cfg.sweep)} with --loop {cfg.loop}{chosen}: a sweep is trained by vmap "
                          "of the Anakin loop's program; use --loop anakin with a gymnax env, or one value per run")
    if cfg.agent == "search" and loop != "anakin":
        raise ConfigError(f"bad --loop {cfg.loop} with --agent search: the search runs in the Anakin loop only; "
                          "use --loop anakin or auto")
    check_normalize(cfg, loop, jittable)
    if candidates:
        refuse_running_candidates(cfg, "--auto-min-actor-share 0", loop, num_processes)
    if loop == "anakin":
        check_anakin(cfg, jittable, local_devices)
    check_sebulba(cfg, loop)
    if num_processes > 1:
        check_multi_host(cfg, loop)
    return loop


def normalize_flags(cfg: Config) -> list[str]:
    """The normalisation flags ``cfg`` sets (``--normalize-observations``, ``--normalize-rewards``), in that order."""
    return [f for f, on in (("--normalize-observations", cfg.normalize_observations),
                            ("--normalize-rewards", cfg.normalize_rewards)) if on]


def refuse_running_candidates(cfg: Config, why: str, loop: str, num_processes: int) -> None:
    """Refuse what a run of auto's candidates (:class:`~accerl_jax.compressor.auto.AutoCompressor`) cannot
    do: each seed or sweep value of one vmapped program would take its own compression decisions, the
    candidates do not carry normalisation statistics, and in the Sebulba ``loop`` of several processes each
    process's compressor thread would decide alone. ``why``: why the run runs the candidates.

    Raises:
      ConfigError: ``--num-seeds`` > 1, ``--sweep``, ``--normalize-observations`` or ``--normalize-rewards``;
        the Sebulba loop with ``num_processes`` > 1.
    """
    if loop == "sebulba" and num_processes > 1:
        raise ConfigError(f"bad --compressor auto with --loop sebulba and several processes ({why}): each process's "
                          "compressor thread would take its decisions alone, and the processes must agree; "
                          "use a fixed --compressor, or --loop sequential")
    if cfg.num_seeds > 1:
        raise ConfigError(f"bad --num-seeds {cfg.num_seeds} with --compressor auto ({why}): each seed takes its own "
                          "compression decisions, so the seeds cannot share one vmapped program; run the seeds "
                          "one at a time (--num-seeds 1) or use a fixed --compressor")
    if cfg.sweep:
        raise ConfigError(f"bad --sweep {' '.join(cfg.sweep)} with --compressor auto ({why}): each run takes its "
                          "own compression decisions, so the runs cannot share one vmapped program; use a fixed "
                          "--compressor")
    flags = normalize_flags(cfg)
    if flags:
        raise ConfigError(f"bad {flags[0]} with --compressor auto ({why}): auto's candidates do not carry "
                          "normalisation statistics; use a fixed --compressor")


def check_normalize(cfg: Config, loop: str, jittable: bool) -> None:
    """Refuse ``--normalize-observations`` / ``--normalize-rewards`` where they are not implemented:
    the Anakin loop with a gymnax env, the sequential loop and the Sebulba loop carry the statistics
    (:mod:`accerl_jax.normalize`), with the actor-critic agent (and, for ``--compressor auto``, a run its
    gate resolves to one compressor: :func:`refuse_running_candidates`).

    Raises:
      ConfigError: either flag with the Anakin loop and an envpool env or ``--agent search``
        (``--compressor auto``: :func:`refuse_running_candidates`).
    """
    flags = normalize_flags(cfg)
    if not flags:
        return
    why = (f"--loop anakin and --env {cfg.env}" if loop == "anakin" and not jittable
           else "--agent search" if cfg.agent == "search" else None)
    if why is not None:
        raise ConfigError(f"bad {flags[0]} with {why}: normalisation is supported by the Anakin loop with a gymnax "
                          "env and by the sequential and Sebulba loops, with the actor-critic agent")


def check_anakin(cfg: Config, jittable: bool, local_devices: int = 1) -> None:
    """Refuse what the Anakin loop cannot run.

    ``jittable`` is False for a host (envpool) env, which the loop steps through envpool's XLA interface.

    Raises:
      ConfigError: ``--distill-async`` (a host thread cannot run inside the jitted program); for
        envpool: ``--num-seeds`` > 1 (``vmap`` cannot copy the one host pool), more than one
        local device (XLA cannot partition envpool's side-effecting step over devices), or a task with
        64-bit arrays (:func:`accerl_jax.envs.envpool_env.check_xla`).
    """
    if cfg.distill_async:
        raise ConfigError("bad --distill-async with --loop anakin: asynchronous distillation runs in a host "
                          "thread, which cannot run inside the Anakin loop's jitted program; drop --distill-async "
                          "(distillation then runs inside the program) or use --loop sequential")
    if jittable:
        return
    if cfg.sweep:
        raise ConfigError(f"bad --sweep {' '.join(cfg.sweep)} with --loop anakin and {cfg.env}: the Anakin loop "
                          "steps envpool's one host pool through its XLA interface, which vmap cannot copy per "
                          "run; use a gymnax env, or one value per run")
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


def config_differences(saved: dict, current: dict, saved_processes: int = 1, processes: int = 1) -> list[str]:
    """``--flag saved -> current`` for each field that matters to the computation and differs (all but
    :data:`~accerl_jax.run.checkpoint.RESUME_MAY_CHANGE`); a field the saved configuration lacks (written by
    an older version) counts as its default.

    ``--num-envs`` and ``--num-processes`` are compared as the global batch they make (``--num-envs`` x
    process count; ``saved_processes`` and ``processes`` are the process counts of the checkpoint's run and
    of this one): one process of 8 envs resumes as two of 4. The device count is not part of the
    configuration (the learner's batch is the same on any number of local devices)."""
    # A checkpoint written before a field existed ran with that field's default, except --loop: such runs
    # ran the sequential loop (the loops were added with the field), and --reward-clip of envpool runs.
    defaults = {f.name: f.default for f in dataclasses.fields(Config)}
    defaults["loop"] = "sequential"
    if str(saved.get("env", "")).startswith("envpool:"):
        defaults["reward_clip"] = False  # envpool runs before --reward-clip trained on raw rewards
    saved = {**{k: v for k, v in defaults.items() if k in current}, **saved}
    diffs = []
    saved_batch, batch = saved.get("num_envs", 0) * saved_processes, current.get("num_envs", 0) * processes
    if saved_batch != batch:
        def layout(envs, n):
            return f"{envs} x {n} process{'es' if n != 1 else ''} = {envs * n}"

        fix = (f"give --num-envs {saved_batch // processes}" if saved_batch % processes == 0 else
               f"use a process count that divides {saved_batch}")
        diffs.append(f"global batch --num-envs x processes {layout(saved.get('num_envs'), saved_processes)} "
                     f"(checkpoint) vs {layout(current.get('num_envs'), processes)} (now): a resumed run keeps the "
                     f"learner's global batch; {fix}")
    for name in sorted(set(saved) | set(current)):
        if name in RESUME_MAY_CHANGE or name in LAYOUT_FIELDS:
            continue
        if saved.get(name) != current.get(name):
            diffs.append(f"{flag(name)} {saved.get(name)!r} (checkpoint) vs {current.get(name)!r} (now)")
    return diffs


def resume_changes(saved: dict, current: dict) -> list[str]:
    """``--flag saved -> current`` for each setting of the saved run that a resume may change and
    ``current`` changes (the budget, :data:`~accerl_jax.run.checkpoint.RUN_CADENCE_FIELDS`, --return-window);
    a field ``saved`` lacks (an older version's record) is not named."""
    names = [n for n in ("total_steps", "log_every", "checkpoint_every", "keep_checkpoints", "on_nan", "return_window")
             if n in saved and n in current and saved[n] != current[n]]
    return [f"{flag(n)} {saved[n]!r} -> {current[n]!r}" for n in names]


def check_resume(cfg: Config, point: ResumePoint, num_processes: int = 1) -> None:
    """Refuse a ``--resume`` checkpoint ``point`` written by another configuration: ``cfg`` must equal the
    checkpoint's except for :data:`~accerl_jax.run.checkpoint.RESUME_MAY_CHANGE` and the split of the global
    batch over ``num_processes`` processes (:func:`config_differences`).

    Raises:
      ConfigError: naming every difference and how to resume with the run's own settings.
    """
    meta = point.meta
    # Checkpoints record the process count of the run that wrote them; older ones only its flag.
    saved_processes = meta.get("extra", {}).get("num_processes") or meta["config"].get("num_processes") or 1
    diffs = config_differences(meta["config"], config_record(cfg), int(saved_processes), num_processes)
    if diffs:
        raise ConfigError(f"bad --resume {cfg.resume!r}: checkpoint {point.step} was written by a different configuration "
                          f"({'; '.join(diffs)}); resume it with its own settings (--resume alone takes them; "
                          "--total-steps may grow, and logging flags may change)")


def check_folder(cfg: Config, folder: Folder, num_processes: int = 1) -> None:
    """The run folder's checks: a ``--resume`` checkpoint's configuration (:func:`check_resume`), else
    a new run's ``logdir`` (:func:`accerl_jax.run.folder.refuse_taken`; none on a multi-host process other than 0).

    Raises:
      ConfigError: from those two.
    """
    if folder.resume is not None:
        check_resume(cfg, folder.resume, num_processes)
    elif folder.logdir is not None:
        refuse_taken(folder.logdir, folder.is_file, folder.taken, cfg.overwrite)


def check_budget(cfg: Config, completed: int, num_updates: int, steps_per_update: int) -> None:
    """Refuse a ``--resume`` whose ``--total-steps`` leaves nothing to do: a checkpoint that has
    ``completed`` updates continues only up to a budget of more (``num_updates``, of ``steps_per_update``
    agent steps each). A larger budget than the checkpoint's run had extends it.

    Raises:
      ConfigError: naming the budget, the updates already done and the smallest budget that continues.
    """
    if completed < num_updates:
        return
    more = (completed + 1) * steps_per_update
    if completed == num_updates:
        raise ConfigError(f"bad --resume {cfg.resume!r}: that run already finished all {num_updates} updates of "
                          f"--total-steps {cfg.total_steps}; nothing to resume (--total-steps {more} or more extends it)")
    raise ConfigError(f"bad --total-steps {cfg.total_steps} with --resume {cfg.resume!r}: a budget of {num_updates} "
                      f"update{'s' if num_updates != 1 else ''}, fewer than the {completed} its checkpoint has done; a "
                      f"resumed run continues, so give --total-steps {more} or more")


def make_spec(cfg: Config, env: EnvInfo) -> networks.NetworkSpec:
    """The learner's network for ``env``'s observations and actions: ``--network``'s family
    (:func:`accerl_jax.networks.default_spec`; ``auto``: MLP for vectors, CNN for images; a Q head with
    ``--corrector retrace``), widths from ``--hidden-sizes`` if given, the MLP's ``--activation``.

    Raises:
      ConfigError: observations no network family takes, a ``--network`` that does not take ``env``'s
        observations (a conv net on vectors, images too small) or its actions, ``--hidden-sizes`` of the
        wrong length for the family (:func:`accerl_jax.networks.check_widths`), or ``--activation`` other
        than relu on a conv family.
    """
    try:
        spec = networks.default_spec(env.obs_shape, env.num_actions, env.channels_first,
                                     action_dim=env.action_dim, q_head=cfg.corrector == "retrace",
                                     network=cfg.network)
    except ValueError as err:
        if cfg.network == "auto":
            raise ConfigError(f"bad --env {cfg.env!r}: {err}") from None
        raise ConfigError(f"bad --network {cfg.network!r} for {cfg.env}: {err}") from None
    if cfg.hidden_sizes:
        try:
            networks.check_widths(spec.family, cfg.hidden_sizes)
        except ValueError:
            raise ConfigError(f"bad --hidden-sizes {' '.join(map(str, cfg.hidden_sizes))} for {cfg.env} (the "
                              f"{spec.family} network): expected {networks.WIDTHS_MEANING[spec.family]}, e.g. "
                              f"{' '.join(map(str, spec.widths))}") from None
        spec = dataclasses.replace(spec, widths=tuple(cfg.hidden_sizes))
    try:
        networks.check_activation(spec.family, cfg.activation)
    except ValueError:
        raise ConfigError(f"bad --activation {cfg.activation} for {cfg.env} (the {spec.family} network): it sets "
                          "the MLP's hidden layers (--network mlp); the conv networks use ReLU, drop the flag") from None
    return dataclasses.replace(spec, activation=cfg.activation)


def make_plan(cfg: Config, env: EnvInfo, machine: Machine | None = None, folder: Folder | None = None) -> Plan:
    """The :class:`Plan` for ``cfg`` on environments described by ``env`` (this process's
    ``env.num_envs``), on ``machine`` (default: one process, one CPU device) with the run folder ``folder``
    (default: none, nothing about it checked). Pure: reads and writes nothing, builds nothing but the
    compressor's abstract dry run.

    Checks, in order: the flags (:func:`check_flags`); the run folder (:func:`check_folder`); the device
    layout (:func:`first_learner_device`, ``--num-envs`` over the learner's devices and minibatches); the
    env's facts (Retrace needs discrete actions; the budget fits the update counter); the network
    (:func:`make_spec`); the loop, chosen once (:func:`choose_loop`); a ``--resume``'s budget
    (:func:`check_budget`); the compressor (:func:`check_compressors`).

    Raises:
      ConfigError: any bad setting or combination (module docstring).
    """
    machine = machine or Machine()
    n_proc = machine.num_processes
    check_flags(cfg, n_proc)
    if folder is not None:
        check_folder(cfg, folder, n_proc)
    first = first_learner_device(cfg, machine.local_devices, machine.backend)
    n_dev = machine.local_devices - first
    transitions = cfg.minibatch_unit == "transitions" and cfg.minibatches > 1  # APPO's minibatches of single steps
    split = learner_lib.batch_conflict(env.num_envs, n_dev, cfg.minibatches, cfg.rollout_length if transitions else None)
    if split == "devices":
        raise ConfigError(f"bad --num-envs {env.num_envs}: must be a multiple of the {n_dev} local devices"
                          + (" of the learner (cpu:0 is the actor's)" if first else ""))
    if split == "minibatches" and transitions:
        raise ConfigError(f"bad --num-envs {env.num_envs} with --rollout-length {cfg.rollout_length}: their "
                          f"{env.num_envs * cfg.rollout_length} transitions must be a multiple of --minibatches "
                          f"{cfg.minibatches} x {n_dev} devices = {n_dev * cfg.minibatches} (--minibatch-unit "
                          "transitions)")
    if split == "minibatches":
        raise ConfigError(f"bad --num-envs {env.num_envs}: must be a multiple of --minibatches {cfg.minibatches} "
                          f"x {n_dev} devices = {n_dev * cfg.minibatches}")
    if env.continuous and cfg.agent == "search":
        raise ConfigError(f"bad --agent search for {cfg.env}: the search needs discrete actions; this env has "
                          "continuous actions")
    if env.continuous and cfg.corrector == "retrace":
        raise ConfigError(f"bad --corrector retrace for {cfg.env}: Retrace needs discrete actions (a Q head over "
                          "all actions); this env has continuous actions; use vtrace, is or none")
    steps_per_update = env.num_envs * cfg.rollout_length * n_proc
    num_updates = max(1, cfg.total_steps // steps_per_update)
    if num_updates > MAX_UPDATES:
        raise ConfigError(f"bad --total-steps {cfg.total_steps}: more than {MAX_UPDATES} updates; use a smaller budget")
    spec = make_spec(cfg, env)
    loop = choose_loop(cfg, num_processes=n_proc, local_devices=machine.local_devices, family=spec.family,
                       backend=machine.backend)
    resume = folder.resume if folder is not None else None
    if resume is not None:
        check_budget(cfg, resume.meta["extra"]["completed"], num_updates, steps_per_update)
        if cfg.compressor == "auto" and saved_resolution(resume.meta) is None:
            raise ConfigError(f"bad --resume {cfg.resume!r} with --compressor auto: that run ran auto's candidates "
                              "(its cost-split gate did not resolve auto to one compressor), whose actor parameters "
                              "change structure with each decision, so it cannot be resumed; start a new run, or "
                              "resume a run whose gate resolved auto (its summary's auto_gate.resolved) or with a "
                              "fixed --compressor")
    takes_teacher = check_compressors(cfg, spec, env.obs_dtype)
    return Plan(loop=loop, loss=make_loss_config(cfg), spec=spec, auto=cfg.compressor == "auto",
                num_processes=n_proc, process_id=machine.process_id, local_devices=n_dev, first_learner_device=first,
                steps_per_update=steps_per_update, num_updates=num_updates, takes_teacher=takes_teacher,
                logdir=folder.logdir if folder is not None else None, resume=resume)


def saved_resolution(meta: dict) -> str | None:
    """The compressor that a ``--compressor auto`` run's cost-split gate resolved it to
    (:mod:`accerl_jax.run.auto_gate`; ``none``, or a search run's pick), read from a checkpoint's metadata
    (``meta["extra"]["auto_gate"]["resolved"]``): a resumed run keeps it rather than deciding again (a pick
    is timed, and could differ). None where the run ran auto's candidates, or for a fixed compressor."""
    return (meta.get("extra", {}).get("auto_gate") or {}).get("resolved")


def distill_kwargs(cfg: Config, *, auto_candidate: bool = False) -> dict:
    """The distillation flags of ``cfg`` as :func:`~accerl_jax.compressor.make_compressor`'s keyword
    arguments: all of them for the run's ``--compressor``; for an ``auto`` candidate
    (``auto_candidate=True``) its steps and learning rate only (the candidates distil at the roots, in full
    batches, in the caller's thread; :func:`check_flags` refuses the other flags with ``auto``)."""
    kwargs = {"distill_steps": cfg.distill_steps, "distill_learning_rate": cfg.distill_learning_rate}
    if not auto_candidate:
        kwargs.update(distill_async=cfg.distill_async, distill_children=cfg.distill_children,
                      distill_sibling_coef=cfg.distill_sibling_coef, distill_minibatches=cfg.distill_minibatches)
    return kwargs


def make_checked_compressor(name: str, spec: networks.NetworkSpec, learner_apply, obs_dtype: str = "float32",
                            **kwargs) -> Compressor:
    """:func:`~accerl_jax.compressor.make_compressor` for the ``--compressor`` spec ``name`` (``kwargs``:
    its distillation settings), refused as a ConfigError where it is malformed or, for a chain with a
    registered stage, does not fit ``spec`` (:func:`check_compressor`; the built-in stages fit every
    network family the trainer builds: tests/test_compressor.py's conformance grid).

    Raises:
      ConfigError: the parser's or the dry run's reason.
    """
    try:
        compressor = make_compressor(name, spec, learner_apply, **kwargs)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if uses_registered(name):
        check_compressor(compressor, spec, name, obs_dtype)
    return compressor


def check_compressors(cfg: Config, spec: networks.NetworkSpec, obs_dtype: str = "float32") -> bool:
    """Check ``--compressor`` (with ``auto``: each of ``--auto-candidates``) on the learner's network
    ``spec`` (:func:`make_checked_compressor`; closures only, nothing compiled).

    Returns:
      whether the run's compressor takes the learner's outputs as its teacher
      (:attr:`~accerl_jax.compressor.Compressor.takes_teacher`; False for ``auto``).

    Raises:
      ConfigError: a malformed spec or candidate list, or a compressor that does not fit ``spec``.
    """
    learner_apply = networks.make_apply(spec)
    if cfg.compressor != "auto":
        return make_checked_compressor(cfg.compressor, spec, learner_apply, obs_dtype,
                                       **distill_kwargs(cfg)).takes_teacher
    try:
        candidates = parse_candidates(cfg.auto_candidates)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    for name in candidates:
        make_checked_compressor(name, spec, learner_apply, obs_dtype, **distill_kwargs(cfg, auto_candidate=True))
    return False  # AutoCompressor.takes_teacher


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
