"""Thread plumbing of the Sebulba stepper: the first failure of any thread, the newest value with its
version, and a thread that hands its exception to the learner."""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Iterable

import jax

from accerl_jax.platform.clock import StageClock


class Failure:
    """The first exception raised in any thread (the rest are consequences)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        self.where: str | None = None

    def record(self, where: str, err: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error, self.where = err, where


class Latest:
    """The newest value with its version; readers never wait for writers."""

    def __init__(self, value, version: int):
        self._cond = threading.Condition()
        self.item = (value, version)  # replaced whole: a reader sees a consistent pair without the lock

    def publish(self, value, version: int) -> None:
        with self._cond:
            self.item = (value, version)
            self._cond.notify_all()

    def wait_newer(self, version: int, timeout: float):
        """The item if its version is newer than ``version`` (waiting up to ``timeout`` s), else None."""
        with self._cond:
            self._cond.wait_for(lambda: self.item[1] > version, timeout)
            return self.item if self.item[1] > version else None


class WorkerFailed(Exception):
    """Raised in the learner when a worker thread has failed (its error is in ``Failure``)."""


def take(q: queue.Queue, failure: Failure, poll_s: float):
    """The next item of ``q`` (waiting for it); raises :class:`WorkerFailed` as soon as a thread has failed."""
    while failure.error is None:
        try:
            return q.get(timeout=poll_s)
        except queue.Empty:
            continue
    raise WorkerFailed


def wait_for_version(box: Latest, version: int, failure: Failure, poll_s: float) -> None:
    """Wait until ``box`` holds ``version`` or newer; raises :class:`WorkerFailed` as soon as a thread has failed."""
    while box.item[1] < version:
        if failure.error is not None:
            raise WorkerFailed
        box.wait_newer(version - 1, poll_s)


def thread(name: str, body: Callable[[], None], failure: Failure, stopping: threading.Event) -> threading.Thread:
    def target():
        try:
            body()
        except BaseException as err:  # noqa: BLE001  (handed to the learner, which re-raises it)
            failure.record(name, err)
            stopping.set()

    return threading.Thread(target=target, name=name, daemon=True)


def feed(rollouts: Iterable, sharding, out: queue.Queue, stopping: threading.Event, clock: StageClock,
         put_wait: StageClock, poll_s: float) -> None:
    """An actor thread's loop: copy each ``(rollout, version, seconds)`` of ``rollouts`` to the learner's
    devices (``sharding``) and put it, with its version and stage seconds (``transfer`` added), into the
    bounded queue ``out``, looking for ``stopping`` every ``poll_s`` while the queue is full. The actor's
    own seconds go to ``clock["actor"]``, the seconds waited for room to ``put_wait["put"]``."""
    mark = time.perf_counter()
    for local, version, seconds in rollouts:
        start = time.perf_counter()
        on_learner = jax.block_until_ready(jax.device_put(local, sharding))
        ready = time.perf_counter()
        while not stopping.is_set():
            try:
                out.put((on_learner, version, dict(seconds, transfer=ready - start)), timeout=poll_s)
                break
            except queue.Full:
                continue
        waited = time.perf_counter() - ready
        put_wait.add("put", waited)
        clock.add("actor", time.perf_counter() - mark - waited)
        mark = time.perf_counter()
