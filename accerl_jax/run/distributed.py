"""Multi-host training through JAX's own multi-controller runtime.

One process per host; every process runs the same program. :func:`resolve` reads the three settings
(``--coordinator-address``, ``--num-processes``, ``--process-id``, or the environment variables
``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``) and checks them; :func:`initialize`
calls :func:`jax.distributed.initialize` (on CPU with JAX's gloo collectives over TCP), which must happen
before anything touches a JAX device. :class:`SetupVote` lets every process learn, before any of them
writes a file, whether all of them accepted their settings (through the coordinator's key-value store).
No home-made RPC (docs/DESIGN.md, "Scale").
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
from typing import Mapping, Optional

from accerl_jax.config import Config, ConfigError, flag

ENV_VARS = {"coordinator_address": "JAX_COORDINATOR_ADDRESS", "num_processes": "JAX_NUM_PROCESSES",
            "process_id": "JAX_PROCESS_ID"}
MAX_PROCESSES = 65536
# Flags that may differ between the processes of one run.
# (Only process 0 writes, reads its own --logdir/--resume path and reports to W&B.)
PER_PROCESS = frozenset({"process_id", "progress", "coordinator_address", "logdir", "resume", "wandb",
                         "wandb_project", "compile_cache"})
VOTE_TIMEOUT_S = 300  # how long a process waits for the others to finish checking their settings


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The multi-host settings of this process."""

    coordinator_address: str  # HOST:PORT of process 0's coordinator
    num_processes: int
    process_id: int  # in [0, num_processes)


def resolve(cfg: Config, environ: Mapping[str, str] = os.environ) -> Optional[Cluster]:
    """The :class:`Cluster` that ``cfg`` (or, for unset flags, ``environ``) describes; None for one process.

    Raises:
      ConfigError: when only some of the three settings are given, a number is not an integer in range
        (``num_processes`` in [1, 65536], ``process_id`` in [0, num_processes)), or the address is not
        ``HOST:PORT`` with a resolvable host and a port in [1, 65535]. Nothing is contacted.
    """
    values, sources = {}, {}
    for field, var in ENV_VARS.items():
        value, source = getattr(cfg, field), flag(field)
        if value is None and environ.get(var, "").strip():
            value, source = environ[var].strip(), var
        values[field], sources[field] = value, source
    given = [f for f in ENV_VARS if values[f] is not None]
    if not given:
        return None
    if len(given) < len(ENV_VARS):
        missing = [f"{flag(f)} (or {ENV_VARS[f]})" for f in ENV_VARS if values[f] is None]
        have = ", ".join(f"{sources[f]} {values[f]!r}" for f in given)
        raise ConfigError(f"bad multi-host settings: {have} given without {' and '.join(missing)}; give all three, "
                          "or none for a single process")
    numbers = {}
    for field in ("num_processes", "process_id"):
        try:
            numbers[field] = int(values[field])
        except (TypeError, ValueError):
            raise ConfigError(f"bad {sources[field]} {values[field]!r}; expected an integer") from None
    n, pid = numbers["num_processes"], numbers["process_id"]
    if not 1 <= n <= MAX_PROCESSES:
        raise ConfigError(f"bad {sources['num_processes']} {n}; expected an integer in [1, {MAX_PROCESSES}]")
    if not 0 <= pid < n:
        raise ConfigError(f"bad {sources['process_id']} {pid}; expected an integer in [0, {n - 1}] "
                          f"(the processes are numbered from 0 to num-processes - 1 = {n - 1})")
    address = str(values["coordinator_address"])
    check_address(address, sources["coordinator_address"])
    return Cluster(address, n, pid)


def check_address(address: str, source: str = "--coordinator-address") -> None:
    """Check that ``address`` is ``HOST:PORT`` (``[IPv6]:PORT`` too) with a resolvable host.

    Raises:
      ConfigError: naming the address and what is accepted.
    """
    host, sep, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    expected = "HOST:PORT with a port in [1, 65535], e.g. host0:1234 or 10.0.0.1:1234"
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"bad {source} {address!r}; expected {expected}")
    try:
        socket.getaddrinfo(host, int(port))
    except (socket.gaierror, UnicodeError) as err:
        raise ConfigError(f"bad {source} {address!r}: cannot resolve host {host!r} ({err}); expected {expected}") from None


def join(cfg: Config, environ: Mapping[str, str] = os.environ) -> Optional[Cluster]:
    """:func:`resolve`, the plan's checks of the flags for that many processes
    (:func:`accerl_jax.run.plan.check_config`) and :func:`initialize`: call it first, before anything touches a
    JAX device (importing gymnax does). Returns the :class:`Cluster`, or None for one process.

    Raises:
      ConfigError: from those three, all raised before anything is written or contacted.
    """
    cluster = resolve(cfg, environ)
    if cluster is not None:
        from accerl_jax.run.plan import check_config  # touches no device

        check_config(cfg, cluster.num_processes)
        initialize(cluster)
    return cluster


def initialize(cluster: Cluster) -> None:
    """Join the multi-host run: :func:`jax.distributed.initialize` (blocks until all processes joined).
    Does nothing if this process already joined ``cluster``.

    CPU devices use JAX's gloo collectives (TCP; the default of jax 0.10, set explicitly here).

    Raises:
      ConfigError: if JAX refuses (a different run already joined, a JAX device already in use, the
        coordinator's port taken, or the other processes not joining within JAX's timeout, 300 s).
    """
    import jax

    if jax.distributed.is_initialized():
        if (jax.process_count(), jax.process_index()) != (cluster.num_processes, cluster.process_id):
            raise ConfigError(f"bad multi-host settings: this process already joined a run as process "
                              f"{jax.process_index()} of {jax.process_count()}, not {cluster.process_id} of "
                              f"{cluster.num_processes}")
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    print(f"process {cluster.process_id} of {cluster.num_processes}: joining the multi-host run at "
          f"{cluster.coordinator_address} (waits for every process to start)", flush=True)
    try:
        jax.distributed.initialize(cluster.coordinator_address, cluster.num_processes, cluster.process_id)
    except Exception as err:  # jax raises RuntimeError, ValueError or its own XlaRuntimeError
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        raise ConfigError(f"cannot join the multi-host run at --coordinator-address {cluster.coordinator_address!r} "
                          f"as process {cluster.process_id} of {cluster.num_processes}: {first}") from None


class SetupVote:
    """Every process publishes whether its setup succeeded; :meth:`agree` waits for all of them.

    A setting only one process refuses (e.g. process 0's ``--logdir`` already holds a run) then stops every
    process with the same :class:`ConfigError` before any of them writes a file, instead of leaving the
    others waiting in the first collective. So do flags that differ between the processes (other than
    :data:`PER_PROCESS`): the processes would run different programs and fail inside a collective. Each
    vote has its own keys (the n-th vote of a process is the n-th of every process), so that the
    processes can train several runs one after the other.
    """

    _votes = 0  # votes started by this process

    def __init__(self, cfg: Config):
        import jax
        from jax._src import distributed as _dist  # the coordinator's key-value store (as multihost_utils uses)

        self._client = _dist.global_state.client
        self._pid, self._n = jax.process_index(), jax.process_count()
        self._voted = False
        # As the other processes will read them: through JSON (a tuple flag arrives as a list).
        self._flags = json.loads(json.dumps({k: v for k, v in dataclasses.asdict(cfg).items() if k not in PER_PROCESS}))
        self._round = SetupVote._votes
        SetupVote._votes += 1

    def _key(self, pid: int) -> str:
        return f"accerl_jax/setup/{self._round}/{pid}"

    def refuse(self, reason: str) -> None:
        """Publish this process's ConfigError (once; later calls are ignored)."""
        if not self._voted:
            self._voted = True
            self._client.key_value_set(self._key(self._pid), "error:" + reason)

    def agree(self) -> None:
        """Publish success and wait for every process's vote.

        Raises:
          ConfigError: with another process's reason, if one refused its settings.
        """
        if not self._voted:
            self._voted = True
            self._client.key_value_set(self._key(self._pid), "ok:" + json.dumps(self._flags, sort_keys=True))
        votes = [self._client.blocking_key_value_get(self._key(pid), VOTE_TIMEOUT_S * 1000) for pid in range(self._n)]
        for pid, vote in enumerate(votes):
            if vote.startswith("error:"):
                raise ConfigError(f"process {pid} of the multi-host run refused its settings: {vote[len('error:'):]}")
        for pid, vote in enumerate(votes):
            theirs = json.loads(vote[len("ok:"):])
            differ = [f"{flag(k)} {self._flags[k]!r} (process {self._pid}) vs {theirs.get(k)!r} (process {pid})"
                      for k in sorted(self._flags) if theirs.get(k) != self._flags[k]]
            if differ:
                raise ConfigError(f"bad multi-host settings: the processes were given different flags: "
                                  f"{'; '.join(differ)}; give every process the same flags (only --process-id "
                                  "differs)")


def from_process_0(tree):
    """Process 0's ``tree`` of host numbers on every process (a collective: every process must call it,
    with a tree of the same structure). Used where each process measures something a decision depends
    on (e.g. ``--compressor auto``'s timings and divergences), so that all of them decide alike.

    Returns:
      ``tree`` with process 0's values, as Python floats.
    """
    import jax
    from jax.experimental import multihost_utils

    return jax.tree.map(float, multihost_utils.broadcast_one_to_all(jax.tree.map(float, tree)))


def wait_for_all(name: str) -> None:
    """Block until every process of a multi-host run has called this with the same ``name`` (a barrier;
    :func:`jax.experimental.multihost_utils.sync_global_devices`). A run ends with it, so that no process
    goes on (e.g. to ``--resume`` the run) before process 0 has written its last checkpoint and summary."""
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)
