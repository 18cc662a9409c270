"""The run folder's life: which files are a run's, the lock held while a run writes its folder, removal
(``--overwrite``, a run stopped before its first update) and trimming the logged rows back to a checkpoint
on ``--resume``.

A run folder (``--logdir``) holds the Monitor's outputs (:data:`RUN_FILES` and TensorBoard's
``events.out.*``), the checkpoints (``<logdir>/checkpoints/<update>/``, written by
:mod:`accerl_jax.run.checkpoint`) and the lock file :data:`LOCK_FILE`. Nothing else in the folder is ever
touched. The lock is an exclusive ``flock`` (POSIX), which the OS drops when the process ends however it
ends, so a killed run never blocks its own resume.
"""
from __future__ import annotations

import csv
import json
import os

from accerl_jax.config import ConfigError

CHECKPOINT_DIR = "checkpoints"  # inside the run's logdir: <logdir>/checkpoints/<update>/
RUN_FILES = ("summary.json", "metrics.csv", "metrics.jsonl", "curves.png", "decisions.jsonl")  # with TensorBoard's events.out.*
LOCK_FILE = ".lock"


def is_run_file(name: str) -> bool:
    """True for a file name a run writes into its logdir (:data:`RUN_FILES` or TensorBoard events)."""
    return name in RUN_FILES or name.startswith("events.out")


def folder_facts(logdir: str) -> tuple[bool, tuple[str, ...]]:
    """``(is_file, taken)`` of ``logdir`` as it is on disk now (:class:`~accerl_jax.run.plan.Folder` records them):
    whether it is a file, and the run files (and ``checkpoints/``) already in it, sorted."""
    if os.path.exists(logdir) and not os.path.isdir(logdir):
        return True, ()
    if not os.path.isdir(logdir):
        return False, ()
    return False, tuple(sorted(f for f in os.listdir(logdir) if is_run_file(f) or f == CHECKPOINT_DIR))


def refuse_taken(logdir: str, is_file: bool, taken: tuple[str, ...] | list[str], overwrite: bool = False) -> None:
    """The rule on a run folder's facts (:func:`folder_facts`): refuse a ``logdir`` that is a file
    (``is_file``) or already holds a run (``taken``) unless ``overwrite``, so that nothing saved is
    overwritten. The plan applies it before anything is built (:func:`accerl_jax.run.plan.make_plan`).

    Raises:
      ConfigError: naming the folder and what is in the way.
    """
    if is_file:
        raise ConfigError(f"bad --logdir {logdir!r}: it is a file; expected a folder")
    if taken and not overwrite:
        raise ConfigError(
            f"bad --logdir {logdir!r}: it already holds a run ({', '.join(taken)}); choose a new folder, "
            f"continue it with --resume {logdir}, or replace it with --overwrite"
        )


def check_logdir(logdir: str, overwrite: bool = False) -> None:
    """:func:`refuse_taken` on the folder as it is on disk now.

    Raises:
      ConfigError: naming the folder and what is in the way.
    """
    refuse_taken(logdir, *folder_facts(logdir), overwrite)


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


class RunLock:
    """An exclusive ``flock`` on ``<logdir>/.lock`` held while a run writes its folder; the OS drops it
    when the process ends, however it ends, so a killed run never blocks its own resume."""

    def __init__(self, logdir: str):
        import fcntl

        self._file = open(os.path.join(logdir, LOCK_FILE), "a")
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._file.close()
            raise ConfigError(f"bad --logdir {logdir!r}: another process is writing this run now; "
                              "wait for it to stop, or choose another folder") from None

    def release(self) -> None:
        self._file.close()  # closing the file releases the lock


def lock_run(logdir: str) -> RunLock:
    """Take the run folder's :class:`RunLock`. Raises ConfigError if another process holds it."""
    return RunLock(logdir)


def remove_run(logdir: str, keep_lock: bool = False) -> None:
    """Delete what a run wrote into ``logdir`` (its outputs, checkpoints and, unless ``keep_lock``, its lock
    file; nothing else). Keep the lock file when this process holds its lock (:func:`lock_run`): deleting
    it would let another process lock a new file of the same name beside it."""
    import shutil

    if not os.path.isdir(logdir):
        return
    for name in os.listdir(logdir):
        path = os.path.join(logdir, name)
        if name == CHECKPOINT_DIR and os.path.isdir(path):
            shutil.rmtree(path)
        elif (is_run_file(name) or (name == LOCK_FILE and not keep_lock)) and not os.path.isdir(path):
            os.remove(path)


def free_claim(logdir: str) -> None:
    """Free a new run's folder claimed by :func:`claim_logdir` (a run stopped before its first update
    finished), for a rerun: what the run wrote is removed (:func:`remove_run`), and the folder itself
    if nothing else is left in it."""
    remove_run(logdir)
    if os.path.isdir(logdir) and not os.listdir(logdir):
        os.rmdir(logdir)


def trim_metrics(logdir: str, last_update: int) -> None:
    """Drop rows of ``<logdir>/metrics.csv`` and ``metrics.jsonl`` after ``last_update`` (logged after the
    checkpoint a run resumes from, so they will be logged again); each rewritten atomically, untouched if
    nothing to drop. A JSONL line cut short by a crash is dropped too."""
    path = os.path.join(logdir, "metrics.csv")
    if os.path.exists(path):
        with open(path, newline="") as f:
            lines = f.read().splitlines(keepends=True)
        if lines:
            rows = list(csv.reader(lines[1:]))
            keep = [line for line, row in zip(lines[1:], rows) if row and int(float(row[0])) <= last_update]
            if len(keep) != len(lines) - 1:
                _replace_lines(path, [lines[0], *keep])
    path = os.path.join(logdir, "metrics.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            lines = f.read().splitlines(keepends=True)
        keep = [line for line in lines if (update := _jsonl_update(line)) is not None and update <= last_update]
        if len(keep) != len(lines):
            _replace_lines(path, keep)


def _jsonl_update(line: str) -> int | None:
    """The ``update`` of one metrics.jsonl line; None for a line that is not a complete JSON row."""
    if not line.endswith("\n"):
        return None
    try:
        return int(json.loads(line)["update"])
    except (ValueError, KeyError, TypeError):
        return None


def _replace_lines(path: str, lines: list[str]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", newline="") as f:
        f.writelines(lines)
    os.replace(tmp, path)


__all__ = ["CHECKPOINT_DIR", "LOCK_FILE", "RUN_FILES", "RunLock", "check_logdir", "claim_logdir", "folder_facts", "is_run_file", "refuse_taken",
           "lock_run", "remove_run", "trim_metrics"]
