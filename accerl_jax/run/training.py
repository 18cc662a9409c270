"""The AcceRL training entry point: Learner params -> Compressor -> Actor -> Corrector -> Learner, watched
by the Monitor (docs/DESIGN.md).

A run is a **plan** (:mod:`accerl_jax.run.plan`: every check once, the loop and device layout chosen), a
**setup** that builds what the plan says (:func:`accerl_jax.run.build.setup`; a
:class:`~accerl_jax.config.ConfigError` is raised before anything is written), a **stepper** that only
produces updates (:mod:`accerl_jax.loops`: Anakin, sequential or Sebulba), and the **driver**
(:class:`accerl_jax.run.driver.Driver`) that owns the run's life around it: Monitor rows, checkpoints,
signals, the divergence stop, resume, teardown and the summary.
"""
from __future__ import annotations

import os
import shutil

from accerl_jax.platform import clock
from accerl_jax.run import distributed, folder as run_folder
from accerl_jax.config import Config, ConfigError
from accerl_jax.run.driver import Driver
from accerl_jax.loops import STEPPERS
from accerl_jax.run.build import setup
from accerl_jax.run.signals import StopSignals


def run_training(cfg: Config, *, trained: dict | None = None) -> dict:
    """Run one training job and return its summary (also written to ``<logdir>/summary.json``).

    ``trained``, if given, is filled with ``learner_params``, ``actor_params`` and ``obs`` (the last
    rollout's observations ``[T * B, *obs_shape]``), for experiments that study the trained policy.

    SIGINT/SIGTERM stop it at an update boundary (:mod:`accerl_jax.run.signals`); a checkpoint is saved and
    the summary has ``"stopped": "interrupted"`` and ``"exit_signal"``.

    Raises:
      ConfigError: for any bad setting (env, compressor, corrector, loop, numeric value, log folder,
        --resume checkpoint), raised before anything is written.
      accerl_jax.run.signals.Interrupted: a signal before the first update of this session finished (a new
        run's folder is freed; a resumed run's checkpoints are untouched).
    """
    entered = clock.process_age()  # the start-up before this call (interpreter, imports, parsing)
    claimed: list[str] = []  # the new run's folder while it holds no finished update
    # Multi-host: join first (the CLI already has, before importing this module: gymnax touches devices).
    vote = distributed.SetupVote(cfg) if distributed.join(cfg) is not None else None
    with StopSignals() as stop:
        try:
            try:
                run = setup(cfg, claimed, before_write=vote.agree if vote else None)
            except ConfigError as err:
                if vote is not None:  # the other processes stop with it, before writing anything
                    vote.refuse(str(err))
                raise
            result = Driver(run, stop, claimed, entered).drive(STEPPERS[run.plan.loop](run))
            summary = result.summary
            if trained is not None and result.obs is not None:
                trained.update(learner_params=result.learner_params, actor_params=result.actor_params, obs=result.obs)
            if not run.writer:  # multi-host processes other than 0 keep no files
                shutil.rmtree(run.logdir, ignore_errors=True)
                summary["logdir"] = None
            return summary
        except KeyboardInterrupt:
            for logdir in claimed:  # stopped during setup or compilation: free the folder for a rerun
                run_folder.remove_run(logdir)
                if os.path.isdir(logdir) and not os.listdir(logdir):
                    os.rmdir(logdir)
            raise
