"""The learner batch over all devices of all processes (issue 5, "Devices and hosts").

The learner's batch axis ``B`` is split over a 1-D mesh of devices (:mod:`accerl_jax.learner`); device
``d`` of the mesh trains on columns ``[d * B/D, (d + 1) * B/D)``. Two pieces make that batch the same
however the devices are spread over processes:

* :class:`ShardedActor` -- the envs of a jittable (gymnax) actor are split into one group per learner
  device; the group for mesh device ``d`` has ``B/D`` envs and its own key ``fold_in(key, d)``, so its
  rollout depends only on ``d``, not on which process steps it. A process steps the groups of its own
  devices together (``vmap``), and its rollout's columns are those of its devices, in mesh order.
* :func:`make_global_update` -- with several processes, each contributes its local rollout as its
  shard of the global batch (:func:`jax.make_array_from_process_local_data`) and the update runs over the
  global mesh (its collectives cross processes); parameters stay replicated. The assembly of global
  arrays runs on the host, *around* the jitted update (:meth:`GlobalUpdate.host_wrap`), never inside a
  traced function; callers take and return process-local learner state, so the rest of the loop
  (compressor, actor, logging, checkpoints) is the same as with one process.

Hence a run of P processes with ``L`` devices and ``--num-envs b`` each equals (to float tolerance of the
cross-device sums) a single-process run with ``P * L`` devices and ``--num-envs P * b``.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from accerl_jax import xla
from accerl_jax.actor import ActorCarry, AnakinActor
from accerl_jax.learner import AXIS, LearnerState
from accerl_jax.types import Rollout


def local_shard_ids(mesh: Mesh) -> list[int]:
    """Positions in ``mesh`` (1-D) of this process's devices, in mesh order."""
    pid = jax.process_index()
    return [i for i, d in enumerate(mesh.devices.flat) if d.process_index == pid]


class ShardedActor:
    """The jittable actor split into one env group per learner device (module docstring).

    Args:
      inner: an :class:`~accerl_jax.actor.AnakinActor` over ``B/D`` envs (one group).
      shard_ids: the mesh positions of the groups this process steps (:func:`local_shard_ids`).
      family: network family, for the compiler options.

    The carry's ``obs`` is ``[S * B/D, *obs_shape]`` (groups concatenated, as the rollout's columns);
    its ``env_state`` and ``key`` have a leading group axis ``[S]``. Methods as ``AnakinActor``.
    """

    def __init__(self, inner: AnakinActor, shard_ids: Sequence[int], family: str = "mlp"):
        self.inner = inner
        self.env = inner.env
        self.rollout_length = inner.rollout_length
        ids = jnp.asarray(shard_ids, jnp.uint32)
        s = len(shard_ids)

        def reset(key):
            carry = jax.vmap(lambda i: inner.reset(jax.random.fold_in(key, i)))(ids)
            return carry._replace(obs=_merge(carry.obs, 0))

        def split(carry: ActorCarry) -> ActorCarry:
            return carry._replace(obs=carry.obs.reshape((s, -1) + carry.obs.shape[1:]))

        def rollout(params, carry: ActorCarry):
            carry, ro = jax.vmap(inner._rollout, in_axes=(None, 0))(params, split(carry))
            # [S, T, b, ...] -> [T, S * b, ...]: group-major columns, as the mesh shards them.
            return carry._replace(obs=_merge(carry.obs, 0)), jax.tree.map(lambda x: _merge(x, 1), ro)

        self._reset = jax.jit(reset)
        self._rollout = xla.jit(rollout, family)
        self._env_only = jax.jit(lambda c: jax.tree.map(jnp.sum, jax.vmap(inner._env_only)(split(c))))
        self._env_only_compiled = False

    def reset(self, key: jax.Array) -> ActorCarry:
        return self._reset(key)

    def rollout(self, params, carry: ActorCarry) -> tuple[ActorCarry, Rollout, dict]:
        """One rollout of all groups: ``[T, S * B/D, ...]``; returns the new carry, it and ``{}``."""
        carry, rollout = self._rollout(params, carry)
        return carry, rollout, {}

    def time_env_only(self, carry: ActorCarry) -> float:
        """Wall seconds of ``T`` steps of all groups with random actions (see ``AnakinActor``)."""
        import time

        if not self._env_only_compiled:
            jax.block_until_ready(self._env_only(carry))
            self._env_only_compiled = True
        start = time.perf_counter()
        jax.block_until_ready(self._env_only(carry))
        return time.perf_counter() - start


def _merge(x: jax.Array, axis: int) -> jax.Array:
    """Move the leading group axis next to ``axis`` (the batch axis of the result) and merge them."""
    x = jnp.moveaxis(x, 0, axis)
    return x.reshape(x.shape[:axis] + (-1,) + x.shape[axis + 2:])


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

    A caller that jits more around the update (:class:`accerl_jax.guard.UpdateGuard`) jits
    :attr:`traced` (global arrays in and out) and wraps the jitted program with :meth:`host_wrap`, which
    converts on the host: :func:`jax.make_array_from_process_local_data` cannot run inside a trace.
    """

    def __init__(self, update: Callable, mesh: Mesh):
        self.traced = update
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
        arrays, ``batch`` (``[T, b, ...]`` leaves) this process's columns of the global batch; every output
        leaf must be replicated and comes back as this process's copy."""
        def wrapped(state, batch, *rest):
            out = fn(jax.tree.map(self._global_replicated, state), jax.tree.map(self._global_batch, batch),
                     *jax.tree.map(self._global_replicated, rest))
            return jax.tree.map(lambda x: x.addressable_data(0), out)

        return wrapped

    def __call__(self, state: LearnerState, rollout: Rollout):
        return self._call(state, rollout)


def make_global_update(update: Callable, mesh: Mesh) -> GlobalUpdate:
    """``update`` (built over the global ``mesh``) taking process-local inputs: :class:`GlobalUpdate`."""
    return GlobalUpdate(update, mesh)


def params_digest(params) -> str:
    """SHA-256 (hex, first 16 digits) of the parameters' bytes, leaf by leaf: equal digests on two
    processes mean bitwise-equal parameters."""
    import hashlib

    h = hashlib.sha256()
    for leaf in jax.tree.leaves(jax.device_get(params)):
        h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return h.hexdigest()[:16]
