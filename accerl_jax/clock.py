"""How long this process has been running: the start-up time a run reports (process start to its first
update: interpreter, imports, setup, compilation) is measured from it."""
from __future__ import annotations

import os
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
