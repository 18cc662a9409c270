"""The cost split of one update, and the Amdahl ceiling on what actor compression can save
(docs/DESIGN.md, "Where compression can pay").

An update is a rollout with the acting (compressed) policy, a learner update and a compression.
:func:`flops` counts one piece's floating-point operations with XLA's cost analysis (no compile);
:func:`time_pieces` times each compiled piece alone, interleaved; :func:`amdahl` turns either into
shares: in a fused single-device program, a faster actor saves at most the uncompressed actor's share of
an update (Amdahl's law, Amdahl 1967), and the compressed run pays its compression on top.
"""
from __future__ import annotations

import hashlib
import os
import time
from typing import Any, Callable

import jax
import numpy as np
from jax.extend import core as jex_core

from accerl_jax.platform import compile_cache


def _unrolled(jaxpr):
    """``jaxpr`` (a ``ClosedJaxpr`` or ``Jaxpr``) with every ``lax.scan`` in it, nested ones included,
    marked to be fully unrolled when lowered."""
    if isinstance(jaxpr, jex_core.ClosedJaxpr):
        return jex_core.ClosedJaxpr(_unrolled(jaxpr.jaxpr), jaxpr.consts)
    is_jaxpr = lambda v: isinstance(v, (jex_core.ClosedJaxpr, jex_core.Jaxpr))  # noqa: E731
    eqns = []
    for eqn in jaxpr.eqns:
        params = {}
        for name, value in eqn.params.items():
            if is_jaxpr(value):
                value = _unrolled(value)
            elif isinstance(value, tuple) and value and all(is_jaxpr(v) for v in value):  # cond's branches
                value = tuple(_unrolled(v) for v in value)
            params[name] = value
        if eqn.primitive.name == "scan":
            params["unroll"] = params["length"]
        eqns.append(eqn.replace(params=params))
    return jaxpr.replace(eqns=eqns)


def flops(fn: Callable, *args) -> float:
    """Floating-point operations of one call of ``fn(*args)``, by XLA's cost analysis
    (``jax.stages.Lowered.cost_analysis``, the HLO cost analysis of the lowered program; nothing is
    compiled or run).

    XLA's analysis counts the body of a loop once, whatever its trip count; every ``lax.scan`` (also a
    ``fori_loop`` with static bounds, which JAX lowers as one) is therefore unrolled in the analysed copy,
    so a rollout of ``T`` steps counts ``T`` policy forward passes. A ``while_loop`` with a traced trip
    count still counts its body once.

    Args:
      fn: a traceable function (jitted or not).
      args: its arguments, arrays or ``jax.ShapeDtypeStruct`` (only their shapes and dtypes are used).

    Returns:
      FLOPs (a float, as XLA reports them; 0 for a program without arithmetic), or NaN where the backend
      reports no cost analysis.
    """
    return flops_and_shape(fn, *args)[0]


# FLOPs of programs already analysed in this process, by their jaxpr's text (which holds every shape):
# lowering is most of the cost, and a process often trains the same shapes again (experiments, tests).
_ANALYSED: dict[str, float] = {}
# The same, kept on disk beside the compiled programs where the compilation cache is on (--compile-cache):
# a later process counting the same program at the same JAX version and device reads the number instead
# of lowering the unrolled program again (--compressor auto's gate counts before training).
STORE_DIR = "accerl_flops"
COUNT_VERSION = 1  # part of the stored counts' key: change it when the way a program is counted (_unrolled) changes


def _stored_path(key: str) -> str | None:
    folder = compile_cache.folder_in_use()
    return None if folder is None else os.path.join(folder, STORE_DIR, key)


def _read_stored(key: str) -> float | None:
    path = _stored_path(key)
    try:
        with open(path, encoding="utf-8") as f:
            return float(f.read())
    except (TypeError, OSError, ValueError):  # no cache, no entry, or a damaged one: count again
        return None


def _store(key: str, value: float) -> None:
    path = _stored_path(key)
    if path is None:
        return
    try:  # written whole, then renamed: a reader never sees half a number
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(repr(value))
        os.replace(tmp, path)
    except OSError:  # the store only saves time
        pass


def flops_and_shape(fn: Callable, *args) -> tuple[float, Any]:
    """:func:`flops` and the shapes of ``fn``'s outputs (a pytree of ``jax.ShapeDtypeStruct``), from one trace.
    A count is kept in this process and, where the compilation cache is on, on disk beside it (keyed by the
    jaxpr's text, the JAX version and the device kind)."""
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    key = hashlib.sha256(str(closed).encode()).hexdigest()
    if key not in _ANALYSED:
        device = jax.devices()[0]
        disk_key = f"{key} {COUNT_VERSION} {jax.__version__} {device.platform} {device.device_kind}"
        disk_key = hashlib.sha256(disk_key.encode()).hexdigest()
        stored = _read_stored(disk_key)
        if stored is None:
            unrolled = _unrolled(closed)
            lowered = jax.jit(lambda *xs: jex_core.jaxpr_as_fun(unrolled)(*xs)).lower(*jax.tree.leaves(args))
            analysis = lowered.cost_analysis()
            if isinstance(analysis, (list, tuple)):  # older JAX: one dict per program
                analysis = analysis[0] if analysis else None
            # No "flops" entry: a program without arithmetic; no analysis at all: the backend has none.
            stored = float("nan") if analysis is None else float(analysis.get("flops", 0.0))
            _store(disk_key, stored)
        _ANALYSED[key] = stored
    return _ANALYSED[key], out_shape


def time_pieces(pieces: dict[str, Callable[[], Any]], repeats: int = 5) -> dict[str, float]:
    """Median wall seconds of one call of each piece.

    Args:
      pieces: name -> a zero-argument callable running one compiled piece (its result is blocked on).
        Each is called once first to compile and warm up; then the pieces are called in turn,
        ``repeats`` rounds, so that load on a shared machine falls on all of them alike.
      repeats: timed rounds (>= 1).

    Returns:
      name -> median seconds per call.

    Raises:
      ValueError: ``repeats < 1``.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for fn in pieces.values():
        jax.block_until_ready(fn())
    times: dict[str, list] = {name: [] for name in pieces}
    for _ in range(repeats):
        for name, fn in pieces.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}


def amdahl(actor_s: float, uncompressed_actor_s: float, learner_s: float, compress_s: float,
           unit: str = "s") -> dict:
    """Per-update cost split and the ceiling on the saving of actor compression.

    Args:
      actor_s: cost of one rollout with the acting (compressed) policy.
      uncompressed_actor_s: cost of the same rollout with the learner's own policy.
      learner_s: cost of one learner update.
      compress_s: cost of one compression (0 for ``none``).
      unit: what the costs count, used in the keys: ``"s"`` (seconds, :func:`time_pieces`) or
        ``"flops"`` (:func:`flops`).

    Returns:
      dict of floats: the four inputs (``actor_<unit>_per_update``, ...); ``update_<unit>`` = actor +
      learner + compression; ``actor_share`` = actor / update; ``ceiling`` = uncompressed actor /
      (uncompressed actor + learner), the largest fraction of an uncompressed update any actor compression
      can save (the actor taking no time and compression costing nothing); ``predicted_saving`` = 1 -
      update / (uncompressed actor + learner), the fraction this compressor saves (negative: it costs more
      than it saves).
    """
    update = actor_s + learner_s + compress_s
    base = uncompressed_actor_s + learner_s
    return {
        f"actor_{unit}_per_update": actor_s,
        f"uncompressed_actor_{unit}_per_update": uncompressed_actor_s,
        f"learner_{unit}_per_update": learner_s,
        f"compress_{unit}_per_update": compress_s,
        f"update_{unit}": update,
        "actor_share": actor_s / update if update > 0 else float("nan"),
        "ceiling": uncompressed_actor_s / base if base > 0 else float("nan"),
        "predicted_saving": 1.0 - update / base if base > 0 else float("nan"),
    }
