"""SIGINT/SIGTERM handling for a training loop: stop at an update boundary, then save and exit cleanly.

While :class:`StopSignals` is armed, the first SIGINT or SIGTERM only *requests* a stop (``requested``
holds the signal number); the loop finishes the update in flight, saves a checkpoint, flushes its logs
and exits with ``128 + signal`` (130 for SIGINT, 143 for SIGTERM). A second signal abandons the update
in flight by raising :class:`Interrupted` (a ``KeyboardInterrupt``), and the loop saves its last
*completed* update. While ``deferring`` (the final saves and summary), every signal is only recorded.
Not armed (before the first update has completed: nothing to save), a signal raises
:class:`Interrupted` at once. Handlers are installed only in the main thread (Python's rule) and the
previous ones are restored on exit.
"""
from __future__ import annotations

import signal
import threading
from typing import Optional

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """Raised for a signal that must stop the loop at once; ``signum`` is the signal number."""

    def __init__(self, signum: Optional[int] = None):
        signum = int(signum or signal.SIGINT)
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_code(signum: Optional[int]) -> int:
    """Conventional shell exit status of a process stopped by ``signum`` (128 + n); SIGINT if None."""
    return 128 + int(signum or signal.SIGINT)


def signal_name(signum: Optional[int]) -> str:
    """``"SIGINT"``/``"SIGTERM"``; a bare KeyboardInterrupt (no signal recorded) counts as SIGINT."""
    return signal.Signals(signum or signal.SIGINT).name


class StopSignals:
    """Context manager turning SIGINT/SIGTERM into a stop request (see the module docstring)."""

    def __init__(self):
        self.requested: Optional[int] = None
        self.armed = False
        self.deferring = False
        self._previous = {}

    def _handle(self, signum, frame):
        if self.deferring:
            self.requested = self.requested or signum
            return
        if self.armed and self.requested is None:
            self.requested = signum
            return
        self.requested = self.requested or signum
        raise Interrupted(signum)

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()
