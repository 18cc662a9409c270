"""Whole-file writes: a reader of ``summary.json`` (or any file written here) sees the old file or the
whole new one, never half of it; JSON strict (no NaN)."""
from __future__ import annotations

import json
import os
import time

import numpy as np


def finite_or_none(x):
    """Replace non-finite floats (anywhere in nested dicts/lists) by None: strict JSON has no NaN."""
    if isinstance(x, float):
        return x if np.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_or_none(v) for v in x]
    return x


def atomic_write(path: str, data: bytes | str) -> None:
    """Write ``data`` to ``path`` via a temporary file and ``os.replace``: a reader sees the old file or the
    whole new one, never half of it."""
    tmp = f"{path}.tmp"
    with open(tmp, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(tmp, path)


def atomic_write_json(path: str, payload: dict) -> None:
    """Write ``payload`` as strict JSON (NaN/inf as null) to ``path`` (:func:`atomic_write`)."""
    atomic_write(path, json.dumps(finite_or_none(payload), indent=2, sort_keys=True, allow_nan=False))


# Seconds between flushes of the run's row files (metrics.csv, metrics.jsonl) while it runs. A flush per
# row cost ~0.5 ms of host time per row (two files), beside Anakin chunks of ~4 ms at the default job's
# shapes on the 2-core CPU, whose host work slows the program on the other core; a reader tailing the
# files sees rows at most this late. Checkpoints and the run's end flush at once.
FLUSH_EVERY_S = 1.0


class Flusher:
    """Flushes ``file`` when :meth:`maybe` is called at least :data:`FLUSH_EVERY_S` seconds after the last
    flush, and at :meth:`now`."""

    def __init__(self, file):
        self.file, self.last = file, time.monotonic()

    def maybe(self) -> None:
        if time.monotonic() - self.last >= FLUSH_EVERY_S:
            self.now()

    def now(self) -> None:
        if not self.file.closed:
            self.file.flush()
        self.last = time.monotonic()
