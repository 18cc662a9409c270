"""The learner batch over all devices of all processes.

The learner's batch axis ``B`` is split over a 1-D mesh of devices (:mod:`accerl_jax.learner`); device
``d`` of a mesh of ``D`` devices trains on columns ``[d * B/D, (d + 1) * B/D)``. Two pieces make that
batch the same however the devices are spread over processes, and whatever their number:

* :func:`env_group_ids` -- the envs of a jittable (gymnax) actor are
  :class:`~accerl_jax.actor.ShardedActor` groups, each with its own key ``fold_in(key, g)`` for its
  global index ``g``, laid out group after group along the batch axis. Every env is its own group, so
  env ``g``'s rollout depends only on ``g``: one device stepping all ``B`` envs, ``D`` devices stepping
  ``B/D`` each (the carry sharded along the batch axis, the rollout under ``shard_map``), or ``P``
  processes stepping their own columns, all produce the same rollouts.
* :func:`make_global_update` -- with several processes and the sequential loop, each contributes its
  local rollout as its shard of the global batch (:func:`jax.make_array_from_process_local_data`) and the update runs over the
  global mesh (its collectives cross processes); parameters stay replicated. The assembly of global
  arrays runs on the host, *around* the jitted update (:meth:`GlobalUpdate.host_wrap`), never inside a
  traced function; callers take and return process-local learner state, so the rest of the loop
  (compressor, actor, logging, checkpoints) is the same as with one process.

Hence, for a given actor policy, a run of P processes with ``L`` devices and ``--num-envs b`` each
collects the same rollouts as a single-process run with ``--num-envs P * b`` on any number of devices
dividing it, and its updates equal that run's to float tolerance of the cross-device sums. A compressor
that learns from observations (distillation) sees the global batch's observations in both loops: the
Anakin loop runs on global arrays (:mod:`accerl_jax.loops.anakin_program`), the sequential loop gathers
them from every process (:class:`accerl_jax.loops.sequential.SequentialStepper`).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from accerl_jax.actor import ShardedActor  # noqa: F401  (re-exported: the actor half of this module)
from accerl_jax.learner import AXIS, LearnerState
from accerl_jax.types import Rollout


def local_shard_ids(mesh: Mesh) -> list[int]:
    """Positions in ``mesh`` (1-D) of this process's devices, in mesh order."""
    pid = jax.process_index()
    return [i for i, d in enumerate(mesh.devices.flat) if d.process_index == pid]


def local_devices(mesh: Mesh) -> list:
    """This process's devices of ``mesh`` (1-D), in mesh order: those at :func:`local_shard_ids`."""
    return [mesh.devices.flat[i] for i in local_shard_ids(mesh)]


def env_group_ids(mesh: Mesh, num_envs: int) -> list[int]:
    """Global indices of the envs this process steps, one env per group, in the order of its batch columns.

    Args:
      mesh: the learner's 1-D mesh (all processes' devices).
      num_envs: this process's envs (``--num-envs``); the global batch is ``B = num_envs * process_count``.

    Returns:
      ``num_envs`` ints: for each of this process's mesh positions ``d`` (mesh order), the columns
      ``d * B/D, ..., (d + 1) * B/D - 1`` that device ``d`` trains on.

    Raises:
      ValueError: if ``B`` is not a multiple of the mesh's ``D`` devices.
    """
    d_total = mesh.devices.size
    b = num_envs * jax.process_count()
    if b % d_total:
        raise ValueError(f"global batch {b} is not a multiple of the {d_total} learner devices")
    per = b // d_total
    return [d * per + j for d in local_shard_ids(mesh) for j in range(per)]


class GlobalUpdate:
    """A learner update over the global mesh of several processes, fed with process-local data.

    Args:
      update: ``update(state, batch) -> (state, metrics)`` from :func:`accerl_jax.learner.make_update`
        with ``mesh`` spanning every process's devices (traceable).
      mesh: that mesh.

    Calling it with ``(state, rollout)`` runs ``update`` on the global arrays: ``state`` is a process-local
    :class:`~accerl_jax.learner.LearnerState` (the same on every process), ``rollout`` this process's
    ``[T, b, ...]`` share of the batch (its devices' columns, in mesh order). Every process must call it,
    in the same order. The global batch is ``[T, num_processes * b, ...]``; the returned state and ``[]``
    metrics are process-local copies of the replicated results.

    A caller that jits more around the update (:class:`accerl_jax.run.guard.UpdateGuard`) jits
    :attr:`traced` (global arrays in and out) and wraps the jitted program with :meth:`host_wrap`, which
    converts on the host: :func:`jax.make_array_from_process_local_data` cannot run inside a trace.
    """

    def __init__(self, update: Callable, mesh: Mesh):
        self.traced = update
        self.hyper = getattr(update, "hyper", None)  # the update's default hyperparameters
        self._replicated = NamedSharding(mesh, P())
        self._batch = NamedSharding(mesh, P(None, AXIS))
        self._call = self.host_wrap(update)

    def _global_batch(self, x) -> jax.Array:
        x = jnp.asarray(x)
        shape = (x.shape[0], x.shape[1] * jax.process_count()) + x.shape[2:]
        return jax.make_array_from_process_local_data(self._batch, x, shape)

    def _global_replicated(self, x) -> jax.Array:
        x = jnp.asarray(x)
        return jax.make_array_from_process_local_data(self._replicated, x, x.shape)

    def host_wrap(self, fn: Callable) -> Callable:
        """``fn(state, batch, *rest) -> outputs`` over global arrays (jitted) as a function of process-local
        ones: ``state`` and ``rest`` (arrays or pytrees, equal on every process) become replicated global
        arrays, ``batch`` (``[T, b, ...]`` leaves) this process's columns of the global batch; a replicated
        output leaf comes back as this process's copy, any other (e.g. the learner's outputs at the global
        batch's observations, ``[T, B, ...]``) gathered whole onto every process (process order, as
        :func:`jax.experimental.multihost_utils.process_allgather` ``tiled=True``)."""
        def local(x):
            if x.is_fully_replicated:
                return x.addressable_data(0)
            from jax.experimental import multihost_utils

            return jnp.asarray(multihost_utils.process_allgather(x, tiled=True))

        def wrapped(state, batch, *rest):
            out = fn(jax.tree.map(self._global_replicated, state), jax.tree.map(self._global_batch, batch),
                     *jax.tree.map(self._global_replicated, rest))
            return jax.tree.map(local, out)

        return wrapped

    def __call__(self, state: LearnerState, rollout: Rollout, hyper: dict | None = None):
        return self._call(state, rollout, self.hyper if hyper is None else hyper)


def make_global_update(update: Callable, mesh: Mesh) -> GlobalUpdate:
    """``update`` (built over the global ``mesh``) taking process-local inputs: :class:`GlobalUpdate`."""
    return GlobalUpdate(update, mesh)


def gather_columns(tree):
    """Every process's ``[T, b, ...]`` leaves of ``tree`` as the global batch's ``[T, P * b, ...]``, process
    after process (the columns' order in a mesh of the processes' devices in process order, as
    :class:`GlobalUpdate` lays out the batch). A collective: every process must call it with the same
    structure and shapes, in the same order. One process: ``tree`` unchanged."""
    if jax.process_count() == 1:
        return tree
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(tree)  # [P, T, b, ...] numpy leaves
    return jax.tree.map(lambda x: jnp.asarray(np.concatenate(list(x), axis=1)), gathered)


def params_digest(params) -> str:
    """SHA-256 (hex, first 16 digits) of the parameters' bytes, leaf by leaf: equal digests on two
    processes mean bitwise-equal parameters."""
    import hashlib

    h = hashlib.sha256()
    for leaf in jax.tree.leaves(jax.device_get(params)):
        h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return h.hexdigest()[:16]
