"""The AcceRL training entry point: Learner params -> Compressor -> Actor -> Corrector -> Learner, watched
by the Monitor (docs/DESIGN.md).

:func:`train` has two phases. *Setup* (:func:`accerl_jax.run.setup`) checks everything the user chose
(config, environment, compressor, log folder) and raises :class:`~accerl_jax.config.ConfigError` before
anything is written. *Training* then runs in the loop chosen by ``--loop`` (:mod:`accerl_jax.loops`);
Ctrl-C/SIGTERM or a non-finite loss stops it early, and the summary of what ran is still written
(``"stopped": "interrupted"`` / ``"diverged"``). Checkpoints, ``--resume``, the signal handling and the
non-finite guard live in :mod:`~accerl_jax.checkpoint`, :mod:`~accerl_jax.signals` and
:mod:`~accerl_jax.guard` (issue 7); the loops only call them.
"""
from __future__ import annotations

import os
import shutil

import jax

from accerl_jax import checkpoint, distributed
from accerl_jax import learner as learner_lib  # noqa: F401  (tests patch learner_lib.make_update)
from accerl_jax import speed  # noqa: F401  (tests patch speed.policy_speedup)
from accerl_jax.config import Config, ConfigError
from accerl_jax.loops import sebulba
from accerl_jax.loops.anakin import check_anakin, run_anakin
from accerl_jax.loops.sequential import run_sequential
from accerl_jax.run import check_logdir, claim_logdir, default_logdir, make_loss_config, setup  # noqa: F401
from accerl_jax.signals import StopSignals

LOOPS = ("auto", "anakin", "sequential", "sebulba")


def resolve_loop(cfg: Config) -> str:
    """The loop ``cfg.loop`` names (``auto``: ``anakin`` for jittable gymnax envs, ``sebulba`` for
    envpool; ``sequential`` for gymnax when ``--distill-async`` is set).

    Raises:
      ConfigError: for a name outside :data:`LOOPS`, ``--num-seeds`` > 1 with a loop other than anakin,
        or anakin with what it cannot run (:func:`accerl_jax.loops.anakin.check_anakin`).
    """
    if cfg.loop not in LOOPS:
        raise ConfigError(f"bad --loop {cfg.loop!r}; expected one of {', '.join(LOOPS)}")
    jittable = cfg.env.startswith("gymnax:")
    loop = cfg.loop
    if loop == "auto":
        if cfg.env.startswith("envpool:"):
            loop = "sebulba"
        else:
            # Asynchronous distillation runs in a host thread; auto switches at the Anakin chunk boundaries.
            loop = "anakin" if jittable and (not cfg.distill_async or cfg.num_seeds > 1) else "sequential"
    if cfg.num_seeds > 1 and loop != "anakin":
        raise ConfigError(f"bad --num-seeds {cfg.num_seeds} with --loop {cfg.loop}: several seeds at once are "
                          "trained by vmap of the Anakin loop's program; use --loop anakin with a gymnax env, or "
                          "--num-seeds 1")
    if loop == "anakin":
        check_anakin(cfg, jittable)
    return loop


def train(cfg: Config, *, trained: dict | None = None) -> dict:
    """Run one training job and return its summary (also written to ``<logdir>/summary.json``).

    ``trained``, if given, is filled with ``learner_params``, ``actor_params`` and ``obs`` (the last
    rollout's observations ``[T * B, *obs_shape]``), for experiments that study the trained policy.

    SIGINT/SIGTERM stop it at an update boundary (:mod:`accerl_jax.signals`); a checkpoint is saved and
    the summary has ``"stopped": "interrupted"`` and ``"exit_signal"``.

    Raises:
      ConfigError: for any bad setting (env, compressor, corrector, loop, numeric value, log folder,
        --resume checkpoint), raised before anything is written.
      accerl_jax.signals.Interrupted: a signal before the first update of this session finished (a new
        run's folder is freed; a resumed run's checkpoints are untouched).
    """
    claimed: list[str] = []  # the new run's folder while it holds no finished update
    # Multi-host: join first (the CLI already has, before importing this module: gymnax touches devices).
    vote = distributed.SetupVote() if distributed.join(cfg) is not None else None
    loop = "sequential" if vote is not None else resolve_loop(cfg)  # the loop multi-host runs support
    sebulba.check_config(cfg, loop)
    with StopSignals() as stop:
        try:
            try:
                run = setup(cfg, claimed, before_write=vote.agree if vote else None)
            except ConfigError as err:
                if vote is not None:  # the other processes stop with it, before writing anything
                    vote.refuse(str(err))
                raise
            if cfg.loop == "auto" and loop == "anakin" and cfg.num_seeds == 1 and run.spec.family == "cnn" \
                    and jax.default_backend() == "cpu":
                # Conv-net gradient steps inside one XLA:CPU program ran 17x slower than as separate calls
                # (Breakout-MinAtar, distill:small: 4.7 s vs 0.27 s per update; docs/DESIGN.md, "Known XLA:CPU
                # pitfall"): auto takes the faster, sequential loop there.
                loop = "sequential"
            loops = {"anakin": run_anakin, "sequential": run_sequential, "sebulba": sebulba.run_sebulba}
            summary = loops[loop](run, stop, trained, claimed)
            if not run.writer:  # multi-host processes other than 0 keep no files
                shutil.rmtree(run.logdir, ignore_errors=True)
                summary["logdir"] = None
            return summary
        except KeyboardInterrupt:
            for logdir in claimed:  # stopped during setup or compilation: free the folder for a rerun
                checkpoint.remove_run(logdir)
                if os.path.isdir(logdir) and not os.listdir(logdir):
                    os.rmdir(logdir)
            raise
