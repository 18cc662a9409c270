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

import shutil
from typing import Callable

from accerl_jax.platform import clock
from accerl_jax.run import distributed, folder as run_folder
from accerl_jax.config import Config, ConfigError
from accerl_jax.run.driver import Driver, Result
from accerl_jax.loops import STEPPERS
from accerl_jax.run.build import setup
from accerl_jax.run.signals import StopSignals


def run_training(cfg: Config, announce: Callable[[], None] | None = None) -> dict:
    """Run one training job and return its summary (also written to ``<logdir>/summary.json``):
    :func:`run_training_result`'s ``summary``.

    Raises:
      ConfigError, accerl_jax.run.signals.Interrupted: as :func:`run_training_result`.
    """
    return run_training_result(cfg, announce).summary


def run_training_result(cfg: Config, announce: Callable[[], None] | None = None) -> Result:
    """Run one training job; return its :class:`~accerl_jax.run.driver.Result`: the summary (also written to
    ``<logdir>/summary.json``) and the final state of its first seed (``learner_params``,
    ``actor_params`` and ``obs``, the last rollout's observations ``[T * B, *obs_shape]``), for
    experiments that study the trained policy.

    SIGINT/SIGTERM stop it at an update boundary (:mod:`accerl_jax.run.signals`); a checkpoint is saved and
    the summary has ``"stopped": "interrupted"`` and ``"exit_signal"``. ``announce`` is called once every
    setting has passed its checks, before training starts (the CLI prints its ``--resume`` line there, so
    that a refused resume prints the refusal alone).

    Raises:
      ConfigError: for any bad setting (env, compressor, corrector, loop, numeric value, log folder,
        --resume checkpoint), raised before anything is written.
      accerl_jax.run.signals.Interrupted: a signal before the first update of this session finished (a new
        run's folder is freed; a resumed run's checkpoints are untouched).
    """
    entered = clock.process_age()  # the start-up before this call (interpreter, imports, parsing)
    # Multi-host: join first (the CLI already has, before importing this module: gymnax touches devices).
    vote = distributed.SetupVote(cfg) if distributed.join(cfg) is not None else None
    with StopSignals() as stop:
        try:
            run = setup(cfg, before_write=vote.agree if vote else None)  # frees its claim if a signal stops it
        except ConfigError as err:
            if vote is not None:  # the other processes stop with it, before writing anything
                vote.refuse(str(err))
            raise
        if announce is not None:
            announce()
        driver = None
        try:
            driver = Driver(run, stop, entered)
            result = driver.drive(STEPPERS[run.plan.loop](run))
        except KeyboardInterrupt:
            # Stopped during setup or compilation (no update of this session finished): a new run's folder
            # is freed for a rerun.
            if run.outputs.claimed and (driver is None or driver.completed == run.start_update):
                run_folder.free_claim(run.outputs.logdir)
            raise
        if run.plan.num_processes > 1:  # process 0 has written the run's last checkpoint and summary
            distributed.wait_for_all("accerl_jax: run written")
        if run.plan.process_id != 0:  # multi-host processes other than 0 keep no files
            shutil.rmtree(run.outputs.logdir, ignore_errors=True)
            result.summary["logdir"] = None
        return result
