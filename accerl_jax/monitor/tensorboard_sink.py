"""TensorBoard event files (tensorboardX): every row's scalars against env steps, grouped by tag."""
from __future__ import annotations

import math
import os
import time

from accerl_jax.monitor.files import Flusher

# TensorBoard groups (CleanRL-style namespaces): a row key's tag is "<group>/<key>"; keys not listed: "train/".
TENSORBOARD_GROUPS = {
    "charts": ("return_mean", "length_mean", "episodes", "env_steps", "steps_per_s", "wall_time_s"),
    "losses": ("loss", "pg_loss", "value_loss", "entropy", "vs_mean", "grad_norm", "learning_rate", "skipped_updates"),
    "ratios": ("rho_mean", "abs_log_rho_mean", "rho_clipped_frac", "c_clipped_frac", "rho_beyond_frac",
               "rho_clipped_mass"),
    "policy": ("kl_learner_actor", "action_agreement", "policy_lag_versions", "search_agreement", "search_tv"),
}
_TAG = {key: f"{group}/{key}" for group, keys in TENSORBOARD_GROUPS.items() for key in keys}


def tensorboard_tag(key: str) -> str:
    """The TensorBoard tag of a row key: ``charts/return_mean``, ``losses/loss``, ``time/learner`` (for
    ``time_learner_s``, seconds), ``ratios/...``, ``policy/...``; already grouped keys (``refresh/kl``) as
    they are; others ``train/<key>``."""
    if "/" in key:
        return key
    if key.startswith("time_") and key.endswith("_s"):
        return f"time/{key[5:-2]}"
    return _TAG.get(key, f"train/{key}")


class _EventsFile:
    """tensorboardX's ``EventsWriter`` as the file :class:`~accerl_jax.monitor.files.Flusher` flushes."""

    def __init__(self, writer):
        self.writer, self.closed = writer, False

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        if not self.closed:
            self.writer.close()  # flushes first
            self.closed = True


class TensorBoardSink:
    """An events file in ``logdir``, written in the calling thread.

    tensorboardX's ``SummaryWriter`` hands every event to a writer thread through a
    ``multiprocessing.Queue`` (each event pickled, piped and unpickled by two more threads); on a 2-core
    machine that work and those threads' wake-ups took the CPU from the Anakin program it ran beside (the
    default job's shapes trained at 0.86x of the bare program with it, 0.95x with no TensorBoard event
    at all: docs/RESULTS.md, "Loop overhead"). The same records are written here by tensorboardX's own
    ``EventsWriter`` (the writer its thread uses) in the caller's thread, ~0.05 ms per row, and flushed
    to disk as ``metrics.csv`` is (:class:`~accerl_jax.monitor.files.Flusher`: at most a second late while
    the run goes on, at once at :meth:`flush` and :meth:`close`). The file is named as ``SummaryWriter``
    names it.

    ``purge_step``: a resumed run's first env step after its checkpoint: TensorBoard hides the events of
    earlier sessions in ``logdir`` at this step and later (as tensorboardX ``SummaryWriter(purge_step=...)``,
    a ``SessionLog.START`` event), so the steps logged again after a resume appear once. None: no purge.
    """

    def __init__(self, logdir: str, purge_step: int | None = None):
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog

        os.makedirs(logdir, exist_ok=True)
        # The events file is named after the second it was opened in; the nanoseconds after it keep a session
        # resumed within the same second from overwriting the earlier one's file, and sort after it.
        self._file = _EventsFile(EventsWriter(os.path.join(logdir, "events"), f".{time.time_ns()}"))
        self._flush = Flusher(self._file)
        self._event = Event
        if purge_step is not None:
            self._write(Event(step=purge_step, file_version="brain.Event:2"))
            self._write(Event(step=purge_step, session_log=SessionLog(status=SessionLog.START)))

    def _write(self, event) -> None:
        event.wall_time = time.time()
        self._file.writer.write_event(event)
        self._flush.maybe()

    def _summary(self, summary, step: int) -> None:
        self._write(self._event(summary=summary, step=int(step)))

    def write(self, row: dict, step: int) -> None:
        """A logged row's scalars (all but ``update``) at env step ``step``."""
        self.add_scalars({k: v for k, v in row.items() if k != "update"}, step)

    def add_scalars(self, values: dict, step: int) -> None:
        """The finite ``values`` (row key or tag -> scalar) as one event at ``step``: one ``Summary`` proto
        with a ``Summary.Value`` per tag (the records of one ``add_scalar`` per tag, in one event)."""
        from tensorboardX.proto.summary_pb2 import Summary

        floats = ((k, float(v)) for k, v in values.items())
        tags = [Summary.Value(tag=tensorboard_tag(k), simple_value=v) for k, v in floats if math.isfinite(v)]
        self._summary(Summary(value=tags), step)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.add_scalars({tag: value}, step)

    def add_text(self, tag: str, text: str, step: int) -> None:
        from tensorboardX.summary import text as text_summary

        self._summary(text_summary(tag, text), step)

    def flush(self) -> None:
        """Write what is buffered to the file now."""
        self._flush.now()

    def close(self) -> None:
        """Flush and close the file (safe to call twice)."""
        self._file.close()
