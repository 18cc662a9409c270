"""Command line: ``python -m accerl_jax.train [--env ...] [--compressor ...] ...``; ``--help`` lists the common flags, ``--help-all`` every flag.

Bad settings exit with status 2 and a message naming the bad value (no traceback), before anything is
written. Ctrl-C (SIGINT) or SIGTERM stops training at the end of the update in flight (a second signal
abandons it), saves a checkpoint, writes the summary of what ran, and exits with status 130 (SIGINT) or
143 (SIGTERM); ``--resume <logdir>`` continues the run. A run whose loss, gradients or parameters became
non-finite writes its summary, keeps its last good checkpoint and exits with status 1.
"""
from __future__ import annotations

import os
import signal
import sys

from accerl_jax.tools import cli, presets
from accerl_jax.config import Config, ConfigError
from accerl_jax.run.signals import exit_code


def plot_command(summary: dict) -> str:
    """The command that plots a finished run: its folder, or for ``--num-seeds`` > 1 its seeds' folders
    (drawn as one curve, the mean over seeds, with their min-max band; with ``--sweep`` one curve per
    combination of values)."""
    seeds = summary.get("num_seeds", 1)
    if seeds > 1 and summary.get("seeds"):  # each replica's folder (--num-seeds: seed<k>; --sweep: <values>-seed<k>)
        folders = [p["logdir"] for p in summary["seeds"]]
    else:
        folders = ([os.path.join(summary["logdir"], f"seed{k}") for k in range(seeds)] if seeds > 1
                   else [summary["logdir"]])
    return "python -m accerl_jax.plot " + " ".join(folders)


def parse_config(argv: list[str]) -> Config:
    """The configuration of a command line: :class:`Config`'s defaults, then ``--preset``'s, then the
    ``--config`` file's, then the flags given (tyro; ``--help`` and ``--help-all`` print and exit).

    Raises:
      ConfigError: an unknown flag, an unknown preset or a bad settings file.
    """
    cli.check_flags(argv)  # before --config or --resume are read: an unknown flag is named first
    argv = cli.resume_run_folder(argv)  # --resume RUN/checkpoints: the run RUN
    cfg = cli.parse(argv, presets.base_config(argv), prog="python -m accerl_jax.train")
    cli.check_sweep_flags(argv, cfg)
    return cfg


def out_of_memory(err: BaseException) -> str | None:
    """The one-line error for XLA running out of memory (``Out of memory allocating N bytes`` on XLA:CPU,
    ``RESOURCE_EXHAUSTED`` on accelerators): the sizes that set the run's arrays; None for another error."""
    text = str(err)
    if "out of memory" not in text.lower() and "RESOURCE_EXHAUSTED" not in text:
        return None
    line = next((part.strip() for part in text.split(":") if "memory" in part.lower()), text.splitlines()[0])
    return (f"out of memory ({line.rstrip('.')}): the run's arrays grow with --num-envs x --rollout-length and "
            "with --hidden-sizes; give smaller values (a run stopped after its first update kept its last "
            "checkpoint: --resume continues it)")


def resume_line(cfg: Config) -> str | None:
    """The line a ``--resume`` prints before its first log block: the run folder, the checkpoint it continues
    from (update and env step) and the budget it continues to; None for a new run, for a multi-host process
    other than 0, and for a resume that training will refuse (its budget already done, or no checkpoint:
    the refusal is the one line then). Plain file reads (:func:`accerl_jax.run.checkpoint.find_checkpoint`)."""
    if cfg.resume is None or (cfg.process_id or 0) != 0:
        return None
    from accerl_jax.run import checkpoint

    try:
        point = checkpoint.find_checkpoint(cfg.resume, "--resume", latest_only=True)
    except ConfigError:
        return None
    extra = point.meta.get("extra", {})
    completed = int(extra.get("completed", point.step))
    per_update = cfg.num_envs * cfg.rollout_length * (cfg.num_processes or 1)
    if completed >= cfg.total_steps // per_update:
        return None
    steps = (extra.get("monitor") or {}).get("env_steps")
    at = f", env step {int(steps):,}" if steps is not None else ""
    return (f"resuming {point.logdir} from checkpoint {point.step} (update {completed:,}{at}); continuing to "
            f"--total-steps {cfg.total_steps:,} (update {cfg.total_steps // per_update:,})")


def _stdout_closed() -> None:
    """The reader of stdout went away (``--help | head``): send the rest of it nowhere, so that neither
    this print nor the interpreter's final flush raises (Python's advice for SIGPIPE, docs of ``signal``)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = parse_config(sys.argv[1:] if argv is None else list(argv))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # --help into a reader that stopped early: nothing went wrong
        _stdout_closed()
        return 0
    from accerl_jax.run import distributed

    try:
        distributed.join(cfg)  # multi-host: before the imports below touch a JAX device
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from accerl_jax.run.training import run_training  # heavy imports after --help has been served

    line = resume_line(cfg)
    try:  # the --resume line once its settings pass the checks (a refused resume prints the refusal alone)
        summary = run_training(cfg, announce=None if line is None else lambda: print(line, flush=True))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:  # jax.errors.JaxRuntimeError: what XLA raises when a computation fails
        message = out_of_memory(err)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # accerl_jax.run.signals.Interrupted carries the signal
        print("interrupted before the first update of this session finished; nothing to save (a new run's "
              "log folder was freed, a resumed run's checkpoints are unchanged)", file=sys.stderr)
        return exit_code(getattr(err, "signum", None))
    try:
        _report(summary)
    except BrokenPipeError:  # the run and its files are complete; only the printed report was cut short
        _stdout_closed()
    return _exit_status(summary)


def _report(summary: dict) -> None:
    """Print the summary table and where the outputs are."""
    from accerl_jax.monitor import print_summary

    print_summary(summary)
    if summary["num_processes"] > 1:  # multi-host: equal digests on every process = the same learner
        print(f"process {summary['process_id']} of {summary['num_processes']}: learner parameters digest "
              f"{summary['learner_params_digest']}")
        print(f"process {summary['process_id']} of {summary['num_processes']}: actor parameters digest "
              f"{summary['actor_params_digest']}")
    if summary["logdir"] is None:
        print("outputs: written by process 0 only")
    else:
        # Three lines, each within 80 columns but for the path itself.
        print(f"outputs: {summary['logdir']}\n  (summary.json, metrics.csv, metrics.jsonl, curves.png, TensorBoard "
              f"events)\nplot with: {plot_command(summary)}")


def diverged_message(summary: dict) -> str:
    """The one-line error of a diverged run: its cause, its last good checkpoint and what to try. ``--on-nan
    skip`` is offered only to a run that skipped no update; one that did is told that skipping did not help."""
    kept = summary["last_checkpoint"] or "none saved yet"
    skipped = summary.get("skipped_updates") or 0
    remedy = "a lower --learning-rate, smaller loss coefficients or --distill-learning-rate"
    if skipped:
        advice = (f"Skipping did not help ({skipped:,} update{'s' if skipped != 1 else ''} skipped under --on-nan "
                  f"skip): try {remedy}")
    else:
        advice = f"Try {remedy}, or --on-nan skip"
    return f"error: training diverged: {summary['stop_reason']}; last good checkpoint: {kept}. {advice}"


def _exit_status(summary: dict) -> int:
    """0 for a finished run; 130/143 (with how to resume) for an interrupted one, 1 for a diverged one."""
    if summary["stopped"] == "interrupted":
        if summary["logdir"] is None:  # multi-host: process 0 saved the run's checkpoint
            print(f"interrupted by {summary['exit_signal']} after update {summary['updates']}: process 0 saved the "
                  "checkpoint; continue with --resume <process 0's run folder> and the multi-host flags", file=sys.stderr)
        else:
            print(f"interrupted by {summary['exit_signal']} after update {summary['updates']}: checkpoint "
                  f"{summary['last_checkpoint']} saved; continue it with: python -m accerl_jax.train --resume "
                  f"{summary['logdir']}", file=sys.stderr)
        return exit_code(signal.Signals[summary["exit_signal"]])
    if summary["stopped"] == "diverged":
        print(diverged_message(summary), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
