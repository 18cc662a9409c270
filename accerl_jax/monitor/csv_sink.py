"""``metrics.csv``: one row per logged update; the header is the first row's keys. Flushed at most once
per :data:`~accerl_jax.monitor.files.FLUSH_EVERY_S` while the run goes on, at every checkpoint and at the
end (:class:`~accerl_jax.monitor.files.Flusher`)."""
from __future__ import annotations

import csv
import os

from accerl_jax.monitor.files import Flusher


class CsvSink:
    """Writes rows to the CSV file ``path``.

    ``append``: continue an existing file (a resumed run): its rows are read back into :attr:`rows` (as
    floats; NaN for empty cells) and its header is kept. Otherwise the file is started anew. Keys a row
    has beyond the header are left out; keys it lacks are written empty.
    """

    def __init__(self, path: str, append: bool = False):
        self._writer = None
        self.rows: list[dict] = []  # the rows already in the file when it was continued
        if append and os.path.exists(path):
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                self.rows = [{k: float(v) if v not in ("", None) else float("nan") for k, v in r.items()} for r in reader]
                fieldnames = reader.fieldnames
            self._file = open(path, "a", newline="")
            if fieldnames:
                self._writer = csv.DictWriter(self._file, fieldnames=fieldnames)
        else:
            self._file = open(path, "w", newline="")
        self._flush = Flusher(self._file)

    @property
    def closed(self) -> bool:
        return self._file.closed

    def write(self, row: dict) -> None:
        if self._writer is None:
            self._writer = csv.DictWriter(self._file, fieldnames=list(row))
            self._writer.writeheader()
        self._writer.writerow({k: row.get(k, "") for k in self._writer.fieldnames})
        self._flush.maybe()

    def flush(self) -> None:
        """Write what is buffered to the file now (a checkpoint calls it: rows before it are never lost)."""
        self._flush.now()

    def close(self) -> None:
        self._file.close()
