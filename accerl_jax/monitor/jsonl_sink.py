"""JSON Lines files: ``metrics.jsonl`` (the CSV's rows, with keys a loop adds after the first row, which
the CSV header cannot keep) and ``decisions.jsonl`` (one line per ``--compressor auto`` decision). Strict
JSON: NaN and inf are written as ``null``."""
from __future__ import annotations

import json

from accerl_jax.monitor.files import Flusher, finite_or_none


class JsonlSink:
    """Writes rows as JSON lines to ``path``, flushed as ``metrics.csv`` is
    (:class:`~accerl_jax.monitor.files.Flusher`); ``append``: continue the file."""

    def __init__(self, path: str, append: bool = False):
        self._file = open(path, "a" if append else "w")
        self._flush = Flusher(self._file)

    def write(self, row: dict) -> None:
        self._file.write(json.dumps(finite_or_none(row), allow_nan=False) + "\n")
        self._flush.maybe()

    def flush(self) -> None:
        """Write what is buffered to the file now."""
        self._flush.now()

    def close(self) -> None:
        self._file.close()


def append_line(path: str, record: dict) -> None:
    """Append ``record`` as one JSON line (keys sorted) to ``path``, opening and closing the file."""
    with open(path, "a") as f:
        f.write(json.dumps(finite_or_none(record), sort_keys=True) + "\n")
