"""How long this process has been running (the start-up time a run reports, process start to its first
update: interpreter, imports, setup, compilation, is measured from it), and the stage clock a stepper
times its stages with."""
from __future__ import annotations

import contextlib
import os
import threading
import time

import accerl_jax


def process_age() -> float:
    """Seconds since this process started: from ``/proc/self/stat`` (its start in clock ticks since boot)
    and ``/proc/uptime`` on Linux (10 ms resolution); elsewhere, since :mod:`accerl_jax` was imported."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        # Fields after the command name (which may hold spaces); the start time is field 22 of the file.
        start_ticks = int(stat[stat.rindex(")") + 2:].split()[19])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - accerl_jax.IMPORTED_AT


class StageClock:
    """Seconds per training stage (``actor``, ``learner``, ``compress``, ...) measured by a stepper, drained
    into the :class:`~accerl_jax.run.driver.Step` it yields (the driver adds them to the Monitor's times).
    Thread-safe: worker threads may add to it while another thread drains it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._seconds: dict[str, float] = {}

    def add(self, stage: str, seconds: float) -> None:
        """Add ``seconds`` (wall, float) to ``stage``."""
        with self._lock:
            self._seconds[stage] = self._seconds.get(stage, 0.0) + seconds

    @contextlib.contextmanager
    def time(self, stage: str):
        """Add the wall seconds of the ``with`` body to ``stage``; the body must block on its outputs."""
        start = time.perf_counter()
        yield
        self.add(stage, time.perf_counter() - start)

    def compressor_timer(self, name: str):
        """The ``timer`` for a :func:`~accerl_jax.compressor.chain`'s stages: the ``distill`` stage's seconds
        go to the ``distill`` stage (also counted in ``compress``, the total); other stages are not split."""
        return self.time("distill") if name == "distill" else contextlib.nullcontext()

    def drain(self) -> dict[str, float]:
        """The seconds added since the last drain, ``{stage: seconds}``; the clock starts again from empty."""
        with self._lock:
            out, self._seconds = self._seconds, {}
        return out
