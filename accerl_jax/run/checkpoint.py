"""Checkpoints of a training run: save, find, check and restore them.

A checkpoint holds everything a run needs to continue exactly where it stopped (:class:`TrainState`):
the learner state (params, optimizer state, update counter), the compressor's state (whatever pytree
it is: masks, distillation student and its optimizer, quantization statistics), the actor's parameters
and the actor's carry (environment state, current observations and PRNG key). Beside it, as JSON: the
run's configuration (for the compatibility check on resume), the bookkeeping of the loop and the
Monitor (``extra``: update counter, env steps, episode returns window, stage times, wall time), and
one record per array leaf (path, shape, dtype, SHA-256 of its bytes).

Writing uses orbax-checkpoint's :class:`~orbax.checkpoint.CheckpointManager` (synchronous saves, the
last ``keep`` kept): orbax writes each checkpoint into a temporary folder and renames it when it is
finished, so a checkpoint is either whole or absent; a half-written temporary folder is never listed
as a checkpoint. A checkpoint damaged *after* it was written (a truncated or altered file) is refused
on restore: orbax fails to read a truncated file, and the per-leaf SHA-256 catches the rest.

A multi-host run's arrays may span several processes' devices: :func:`host_leaves` gathers them before
they are written (every process saves at the same updates; only process 0's folder is kept), so a
checkpoint holds the same arrays as a single process's with the same global batch. On ``--resume``
every process reads the run's checkpoint (the run folder must be on a file system all hosts share).

Host environments (envpool) cannot be saved: for them only the actor's PRNG key is kept, and a resumed
run restarts those environments (episodes in progress at the checkpoint are lost; nothing else is).

The API is loop-agnostic, so that any loop (the Anakin/host loop of :mod:`accerl_jax.run.training`, a future
Sebulba loop) can call it: :class:`Checkpointer` ``.save(step, state, extra)`` / ``.restore(step,
template)``, :func:`find_checkpoint` to read ``--resume``'s record before anything is written (whether
its configuration may be resumed is the plan's check: :func:`accerl_jax.run.plan.check_resume`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import time
from typing import Any, NamedTuple, Optional

import jax
import numpy as np

from accerl_jax.config import ConfigError
from accerl_jax.run.folder import CHECKPOINT_DIR
FORMAT = 1
# Fields that control how a run is run, not what it computes: they may differ when it is resumed (every
# process of a multi-host run resumes the checkpoint process 0 wrote, with its own --process-id).
RUN_CONTROL_FIELDS = frozenset(
    {"logdir", "resume", "overwrite", "progress", "log_every", "checkpoint_every", "keep_checkpoints", "on_nan",
     "wandb", "wandb_project", "coordinator_address", "process_id", "preset", "config", "cost_split",
     "compile_cache"}
)
# Fields a resumed run may change besides those: the budget (to extend a run; the learning rate then
# follows the schedule of the new budget) and what only reports (the window of final_return_mean).
RESUME_MAY_CHANGE = RUN_CONTROL_FIELDS | {"total_steps", "return_window"}
# The run-control fields that are the run's own cadence: ``--resume RUN`` alone keeps the saved values (a
# flag given with it overrides them). The others (folders, progress, W&B, addresses, cache) are this
# invocation's own and take this command line's flags or defaults.
RUN_CADENCE_FIELDS = frozenset({"log_every", "checkpoint_every", "keep_checkpoints", "on_nan"})
PER_INVOCATION_FIELDS = RUN_CONTROL_FIELDS - RUN_CADENCE_FIELDS
# The layout of the global batch: --num-envs counts one process's environments, so these may change
# together on resume as long as --num-envs x processes (the learner's batch) stays the same.
LAYOUT_FIELDS = ("num_envs", "num_processes")


class TrainState(NamedTuple):
    """Everything on device that a run continues from (any pytrees; see the module docstring)."""

    learner: Any  # accerl_jax.learner.LearnerState
    actor_params: Any  # the last --policy-lag + 1 compressed parameter sets, oldest first (a tuple)
    compressor: Any  # compressor state, dict keyed by stage name
    actor: Any  # ActorCarry (jittable envs) or only its PRNG key (host envs)
    # accerl_jax.normalize.NormState (--normalize-observations / --normalize-rewards), else None (no leaves)
    normalizer: Any = None


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """A finished checkpoint to continue from. ``meta`` is its JSON record (config, extra, leaves)."""

    logdir: str
    step: int
    meta: dict


@contextlib.contextmanager
def _quiet_absl():
    """orbax logs warnings through absl (e.g. for read-only managers); keep them off the user's screen."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _manager(logdir: str, keep: Optional[int] = None, read_only: bool = False, asynchronous: bool = False):
    import orbax.checkpoint as ocp

    root = os.path.abspath(os.path.join(logdir, CHECKPOINT_DIR))
    multihost = {}
    if jax.process_count() > 1:  # multi-host: each process's manager is its own (only process 0 keeps its files)
        pid = jax.process_index()
        multihost["multiprocessing_options"] = ocp.options.MultiprocessingOptions(primary_host=pid, active_processes={pid})
        if not read_only:  # orbax does not create the folder for a subset of processes
            os.makedirs(root, exist_ok=True)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, enable_async_checkpointing=asynchronous and not read_only and not multihost,
        create=not read_only and not multihost,
        read_only=read_only, **multihost
    )
    return ocp.CheckpointManager(root, options=options, item_names=("state", "meta"))


def host_leaves(tree) -> list[np.ndarray]:
    """The leaves of ``tree`` as whole numpy arrays, however they are placed.

    A leaf of a multi-host run that spans other processes' devices (a global :class:`jax.Array`) is read
    from this process's copy when it is replicated, and otherwise gathered from every process
    (:func:`jax.experimental.multihost_utils.process_allgather`, a collective: every process must call
    this with the same tree, as every process saves at the same updates). So a checkpoint's arrays are
    the same whether one process or several wrote it.
    """
    out = []
    for x in jax.tree.leaves(tree):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if x.is_fully_replicated:
                x = x.addressable_data(0)
            else:
                from jax.experimental import multihost_utils

                x = multihost_utils.process_allgather(x, tiled=True)
        out.append(np.asarray(jax.device_get(x)))
    return out


def _leaf_key(i: int) -> str:
    return f"leaf_{i:05d}"


def _leaf_records(tree) -> list[dict]:
    """Path, shape and dtype of every leaf of ``tree`` (arrays or ShapeDtypeStructs)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [{"path": jax.tree_util.keystr(p), "shape": list(np.shape(x)), "dtype": str(np.dtype(x.dtype))}
            for p, x in flat]


def _digest(x: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()


def find_checkpoint(path: str, what: str, *, latest_only: bool = False, logdir: Optional[str] = None) -> ResumePoint:
    """Find a finished checkpoint and read its JSON record (configuration, bookkeeping, leaf records);
    writes nothing, and starts no JAX backend (plain file reads: :func:`finished_steps`,
    :func:`read_record`), so that a multi-host process can read ``--resume``'s settings before it calls
    :func:`jax.distributed.initialize`.

    Args:
      path: a run folder (its latest checkpoint) or a checkpoint folder ``<run>/checkpoints/<update>``.
      what: how the user gave ``path`` (``"--resume"``, ``"RUN_DIR"``), for the error messages.
      latest_only: refuse a checkpoint folder that is not the run's latest (resuming from it would
        overwrite later ones).
      logdir: if given, ``path`` must belong to this run folder (``--logdir`` with ``--resume``).

    Raises:
      ConfigError: ``bad <what> <path>: ...`` naming what is wrong (missing, not a run, no finished
        checkpoint, half-written, not the latest, unreadable or foreign record).
    """
    path_in = path
    path = os.path.normpath(path)
    if not os.path.isdir(path):
        problem = "it is a file" if os.path.exists(path) else "no such folder"
        raise ConfigError(f"bad {what} {path_in!r}: {problem}; expected a run folder holding "
                          f"{CHECKPOINT_DIR}/ or a checkpoint folder <run>/{CHECKPOINT_DIR}/<update>")
    parent = os.path.dirname(path)
    if os.path.basename(parent) == CHECKPOINT_DIR:
        run, name = os.path.dirname(parent), os.path.basename(path)
        if not name.isdigit():
            raise ConfigError(f"bad {what} {path_in!r}: not a finished checkpoint (a half-written one "
                              "is never used); expected <run>/checkpoints/<update>")
        step = int(name)
    else:
        run, step = path, None
    if not os.path.isdir(os.path.join(run, CHECKPOINT_DIR)):
        if os.path.isdir(os.path.join(os.path.dirname(run), CHECKPOINT_DIR)):  # a seed's or sweep run's own folder
            whole = os.path.dirname(path_in.rstrip(os.sep)) or "."
            how = "(all its runs resume together)" if what == "--resume" else "with --seed-index <its position>"
            raise ConfigError(f"bad {what} {path_in!r}: one run of --num-seeds or --sweep, whose checkpoints are its "
                              f"parent's; give {whole!r} {how}")
        raise ConfigError(f"bad {what} {path_in!r}: no {CHECKPOINT_DIR}/ folder there; expected a run folder "
                          "written with checkpoints, or one of its checkpoint folders")
    if logdir is not None and os.path.realpath(logdir) != os.path.realpath(run):
        raise ConfigError(f"bad --logdir {logdir!r} with {what} {path_in!r}: a resumed run continues in its "
                          f"own folder {run!r}; leave --logdir out or set it to that folder")
    try:
        steps = finished_steps(run)
    except OSError as err:
        raise ConfigError(f"bad {what} {path_in!r}: cannot read its checkpoints ({err})") from None
    if not steps:
        raise ConfigError(f"bad {what} {path_in!r}: no finished checkpoint in {os.path.join(run, CHECKPOINT_DIR)!r} "
                          "(a half-written one is never used)")
    latest = max(steps)
    if step is None:
        step = latest
    elif step not in steps:
        raise ConfigError(f"bad {what} {path_in!r}: not a finished checkpoint of that run (finished: "
                          f"{', '.join(map(str, sorted(steps)))})")
    elif latest_only and step != latest:
        raise ConfigError(f"bad {what} {path_in!r}: update {step} is not the run's latest checkpoint "
                          f"({latest}); resuming from it would overwrite later ones. Copy the run folder "
                          "and resume the copy, or resume the latest")
    try:
        meta = read_record(run, step)
    except (OSError, ValueError) as err:  # missing, unreadable or not JSON (json.JSONDecodeError, UnicodeDecodeError)
        raise ConfigError(f"bad {what} {path_in!r}: checkpoint {step} is damaged (its record cannot be "
                          f"read: {type(err).__name__}: {str(err).splitlines()[0][:200]})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or "config" not in meta:
        raise ConfigError(f"bad {what} {path_in!r}: checkpoint {step} has no accerl_jax record of format {FORMAT}")
    return ResumePoint(run, step, meta)


# orbax's layout of a checkpoint folder (orbax-checkpoint 0.12, local file systems): a save is written into
# ``<step>.orbax-checkpoint-tmp-<time>`` and renamed to ``<step>`` when it is finished; each item is a
# subfolder, and a JsonSave item's record is the file ``metadata`` in it.
META_ITEM = "meta"
JSON_ITEM_FILE = "metadata"


def finished_steps(run: str) -> list[int]:
    """The updates of the finished checkpoints of the run in folder ``run`` (``<run>/checkpoints/<update>/``),
    in increasing order, read from the folder's listing: what orbax's ``CheckpointManager.all_steps`` lists,
    without creating a manager (which starts JAX's backend: a multi-host process must not before it joins
    the run). A half-written checkpoint (orbax's temporary folder name) is not listed.

    Raises:
      OSError: the checkpoints folder cannot be listed.
    """
    root = os.path.join(run, CHECKPOINT_DIR)
    return sorted(int(name) for name in os.listdir(root)
                  if name.isdigit() and os.path.isdir(os.path.join(root, name)))


def read_record(run: str, step: int) -> Any:
    """The JSON record (``meta`` item) of checkpoint ``step`` of the run in folder ``run``, read as a plain
    file (no orbax manager, no JAX backend; see :func:`finished_steps`).

    Raises:
      OSError: the record is missing or unreadable.
      ValueError: it is not JSON (``json.JSONDecodeError``, ``UnicodeDecodeError``).
    """
    with open(os.path.join(run, CHECKPOINT_DIR, str(step), META_ITEM, JSON_ITEM_FILE), encoding="utf-8") as f:
        return json.load(f)


def _restore_leaves(manager, step: int, shapes: dict, bad: str) -> dict:
    """The saved leaves ``{leaf key: array}`` of checkpoint ``step`` shaped as ``shapes``.

    Raises:
      ConfigError: ``<bad> is damaged (...)`` when orbax cannot read them.
    """
    import orbax.checkpoint as ocp

    try:
        return manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(shapes))).state
    except Exception as err:
        raise ConfigError(f"{bad} is damaged ({type(err).__name__}: {str(err).splitlines()[0][:200]})") from None


def read_checked(point: ResumePoint, what: str) -> dict:
    """``{leaf path: numpy array}`` of checkpoint ``point``, each leaf checked against the SHA-256
    recorded when it was saved; no template needed (paths as in :class:`TrainState`, e.g.
    ``".learner.params['params']['dense_0']['kernel']"``).

    Raises:
      ConfigError: ``bad <what>: checkpoint ... is damaged`` (unreadable data or a digest mismatch).
    """

    _ignore_closed_loop_callbacks(os.path.join(point.logdir, CHECKPOINT_DIR))
    where = f"checkpoint {os.path.join(point.logdir, CHECKPOINT_DIR, str(point.step))!r}"
    records = point.meta.get("leaves")
    if not isinstance(records, list):
        raise ConfigError(f"bad {what}: {where} has no leaf records; it was not written by accerl_jax")
    shapes = {_leaf_key(i): np.zeros(tuple(r["shape"]), r["dtype"]) for i, r in enumerate(records)}
    with _quiet_absl():
        manager = _manager(point.logdir, read_only=True)
        try:
            items = _restore_leaves(manager, point.step, shapes, f"bad {what}: {where}")
        finally:
            manager.close()
    out = {}
    for i, record in enumerate(records):
        value = np.asarray(items[_leaf_key(i)])
        if _digest(value) != record["sha256"]:
            raise ConfigError(f"bad {what}: {where} is damaged (leaf {record['path']} does not match the SHA-256 "
                              "recorded when it was saved)")
        out[record["path"]] = value
    return out


def _ignore_closed_loop_callbacks(root: str) -> None:
    """Keep the orphaned reads of a failed restore of a checkpoint under ``root`` off the user's screen.

    After one read of a damaged checkpoint fails, orbax raises at once and the other tensorstore reads
    still in flight finish on their own: (1) into orbax's already-closed asyncio loop, which Python reports
    as an "Exception ignored" ``RuntimeError('Event loop is closed')`` traceback, and (2) as tasks whose
    exceptions nobody retrieves, which asyncio logs as "Task exception was never retrieved" (or "Future
    exception was never retrieved", for a bare future) when they are garbage-collected (at any later moment, so the filter stays for the process's life). Either would print
    tracebacks under our one-line error. Drop exactly those reports: (1) by message, (2) only when the
    record names a file under ``root`` (every other report still goes where it went).
    """
    import sys

    _ORPHAN_ROOTS.add(os.path.abspath(root))
    previous = sys.unraisablehook
    if not getattr(previous, "_accerl_closed_loop_filter", False):

        def hook(unraisable):
            exc = unraisable.exc_value
            if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
                return
            previous(unraisable)

        hook._accerl_closed_loop_filter = True
        sys.unraisablehook = hook
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, _OrphanedReadFilter) for f in asyncio_log.filters):
        asyncio_log.addFilter(_OrphanedReadFilter())


_ORPHAN_ROOTS: set = set()
# asyncio's words for a task (asyncio.tasks) and for a bare future (asyncio.futures) whose exception nobody read
_ORPHAN_MESSAGES = ("Task exception was never retrieved", "Future exception was never retrieved")


class _OrphanedReadFilter(logging.Filter):
    """Drops asyncio's "Task/Future exception was never retrieved" records of reads under a root in
    ``_ORPHAN_ROOTS`` (see :func:`_ignore_closed_loop_callbacks`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True
        if not message.startswith(_ORPHAN_MESSAGES):
            return True
        text = message + (repr(record.exc_info[1]) if record.exc_info else "")
        return not any(root in text for root in _ORPHAN_ROOTS)


class Checkpointer:
    """Saves and restores :class:`TrainState` checkpoints in ``<logdir>/checkpoints/<step>/``.

    Args:
      logdir: the run folder (must already exist).
      keep: how many of the latest checkpoints to keep (older ones are deleted after a save).
      config: the run's configuration as a JSON-able dict, stored with every checkpoint.

    ``seconds`` accumulates the wall time the caller spent saving (an asynchronous save's: until it returned);
    ``last_step`` is the last step saved or restored.

    A save with ``wait=False`` returns once the state is copied to the host, and orbax writes it in a
    background thread (one process only; several processes save synchronously): a checkpoint's ~27 ms of
    orbax's host work every ``--checkpoint-every`` updates had cost the Anakin loop 30% of its steady steps/s
    at CartPole's default shapes on 2 CPU cores. The checkpoint is still whole or absent (orbax writes it
    into a temporary folder and renames it when finished; :func:`finished_steps` does not list the
    temporary one); the next save, :meth:`wait` and :meth:`close` wait for it first.
    """

    def __init__(self, logdir: str, keep: int, config: dict):
        with _quiet_absl():
            self._manager = _manager(logdir, keep=keep, asynchronous=True)
        self.logdir = logdir
        self.config = config
        self.seconds = 0.0
        self.last_step: Optional[int] = None

    def save(self, step: int, state: TrainState, extra: dict, wait: bool = True) -> None:
        """Write checkpoint ``step`` (whole or absent); ``extra`` is JSON-able bookkeeping. ``wait``: return
        once it is on disk; else once its leaves are copied to the host (class docstring)."""
        import orbax.checkpoint as ocp

        start = time.perf_counter()
        # copies: the device buffers may be donated to the next program while orbax writes in the background
        leaves = [np.array(x, copy=True) for x in host_leaves(state)]
        records = _leaf_records(state)
        for record, leaf in zip(records, leaves):
            record["sha256"] = _digest(leaf)
        meta = {"format": FORMAT, "step": step, "config": self.config, "extra": extra, "leaves": records}
        items = {_leaf_key(i): leaf for i, leaf in enumerate(leaves)}
        with _quiet_absl():
            self._manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(items), meta=ocp.args.JsonSave(meta)), force=True)
            if wait:
                self._manager.wait_until_finished()
        self.last_step = step
        self.seconds += time.perf_counter() - start

    def wait(self) -> None:
        """Return once every checkpoint saved so far is on disk (an asynchronous save's error is raised here)."""
        start = time.perf_counter()
        with _quiet_absl():
            self._manager.wait_until_finished()
        self.seconds += time.perf_counter() - start

    def restore(self, point: ResumePoint, template: TrainState) -> tuple[TrainState, dict]:
        """Read checkpoint ``point.step`` into the structure of ``template``.

        ``template`` leaves may be arrays or ``jax.ShapeDtypeStruct``; restored leaves are put on the
        template leaf's sharding (device arrays) or returned as numpy (numpy template leaves).

        Returns:
          ``(state, extra)``.

        Raises:
          ConfigError: if the checkpoint's leaves do not match ``template`` (a different network,
            compressor or environment), or if its data is damaged (unreadable or SHA-256 mismatch).
        """
        # before reading: the reports can come while the error is raised
        _ignore_closed_loop_callbacks(os.path.join(point.logdir, CHECKPOINT_DIR))
        try:
            return self._restore(point, template)
        except ConfigError:
            self.close()  # an open manager left to interpreter shutdown prints asyncio tracebacks
            raise

    def _restore(self, point: ResumePoint, template: TrainState) -> tuple[TrainState, dict]:

        where = f"checkpoint {os.path.join(point.logdir, CHECKPOINT_DIR, str(point.step))!r}"
        records = point.meta["leaves"]
        expected = _leaf_records(template)
        if [(r["path"], r["shape"], r["dtype"]) for r in records] != [(r["path"], r["shape"], r["dtype"]) for r in expected]:
            for i, (got, want) in enumerate(zip(records, expected)):
                if (got["path"], got["shape"], got["dtype"]) != (want["path"], want["shape"], want["dtype"]):
                    break
            else:
                got = want = None
            detail = (f"leaf {got['path']} {got['dtype']}{got['shape']} vs {want['path']} {want['dtype']}{want['shape']} now"
                      if got else f"{len(records)} arrays vs {len(expected)} now")
            raise ConfigError(f"bad --resume: {where} does not fit this run's networks and state ({detail})")
        flat, treedef = jax.tree.flatten(template)
        shapes = {_leaf_key(i): np.zeros(tuple(r["shape"]), r["dtype"]) for i, r in enumerate(records)}
        # Another folder's checkpoint (a multi-host process other than 0 writes into its own folder but
        # resumes from the run's) is read through a read-only manager of that folder.
        own = os.path.realpath(point.logdir) == os.path.realpath(self.logdir)
        with _quiet_absl():
            manager = self._manager if own else _manager(point.logdir, read_only=True)
            try:
                items = _restore_leaves(manager, point.step, shapes, f"bad --resume: {where}")
            finally:
                if not own:
                    manager.close()
        leaves = []
        for i, (record, tmpl) in enumerate(zip(records, flat)):
            value = np.asarray(items[_leaf_key(i)])
            if _digest(value) != record["sha256"]:
                raise ConfigError(f"bad --resume: {where} is damaged (leaf {record['path']} does not match "
                                  "the SHA-256 recorded when it was saved)")
            if isinstance(tmpl, np.ndarray):
                leaves.append(value)
            else:
                leaves.append(jax.device_put(value, getattr(tmpl, "sharding", None)))
        self.last_step = point.step
        return jax.tree.unflatten(treedef, leaves), point.meta["extra"]

    def close(self) -> None:
        with _quiet_absl():
            self._manager.close()


def read_leaves(logdir: str, step: int) -> dict:
    """``{leaf path: numpy array}`` of checkpoint ``step`` of the run in ``logdir``, read without a
    template (for inspection and tests; paths as in :class:`TrainState`, e.g. ``"[0].params..."``)."""
    import orbax.checkpoint as ocp

    with _quiet_absl():
        manager = _manager(logdir, read_only=True)
        try:
            meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
            shapes = {_leaf_key(i): np.zeros(tuple(r["shape"]), r["dtype"]) for i, r in enumerate(meta["leaves"])}
            items = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(shapes))).state
        finally:
            manager.close()
    return {r["path"]: np.asarray(items[_leaf_key(i)]) for i, r in enumerate(meta["leaves"])}


def host_key_only(carry, jittable: bool):
    """What of an actor carry is saved: all of it for jittable envs, only the PRNG key for host envs."""
    return carry if jittable else carry.key


__all__ = [
    "CHECKPOINT_DIR", "Checkpointer", "ResumePoint", "TrainState", "RUN_CONTROL_FIELDS", "RESUME_MAY_CHANGE",
    "RUN_CADENCE_FIELDS", "PER_INVOCATION_FIELDS", "LAYOUT_FIELDS",
    "find_checkpoint", "finished_steps", "read_record", "read_checked", "host_leaves", "read_leaves",
    "host_key_only",
]
