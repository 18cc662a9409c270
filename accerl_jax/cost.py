"""The cost split of one update, and the Amdahl ceiling on what actor compression can save
(docs/DESIGN.md, "Where compression can pay").

An update is a rollout with the acting (compressed) policy, a learner update and a compression.
:func:`time_pieces` times each compiled piece alone, interleaved, and :func:`amdahl` turns the seconds
into shares: in a fused single-device program, a faster actor saves at most the uncompressed actor's
share of an update (Amdahl's law, Amdahl 1967), and the compressed run pays its compression on top.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import jax
import numpy as np


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


def amdahl(actor_s: float, uncompressed_actor_s: float, learner_s: float, compress_s: float) -> dict:
    """Per-update cost split and the ceiling on the saving of actor compression.

    Args:
      actor_s: seconds of one rollout with the acting (compressed) policy.
      uncompressed_actor_s: seconds of the same rollout with the learner's own policy.
      learner_s: seconds of one learner update.
      compress_s: seconds of one compression (0 for ``none``).

    Returns:
      dict of floats: the four inputs (``*_s_per_update``); ``update_s`` = actor + learner + compression;
      ``actor_share`` = actor / update; ``ceiling`` = uncompressed actor / (uncompressed actor + learner),
      the largest fraction of an uncompressed update any actor compression can save (the actor taking no
      time and compression costing nothing); ``predicted_saving`` = 1 - update / (uncompressed actor +
      learner), the fraction this compressor saves (negative: it costs more than it saves).
    """
    update = actor_s + learner_s + compress_s
    base = uncompressed_actor_s + learner_s
    return {
        "actor_s_per_update": actor_s,
        "uncompressed_actor_s_per_update": uncompressed_actor_s,
        "learner_s_per_update": learner_s,
        "compress_s_per_update": compress_s,
        "update_s": update,
        "actor_share": actor_s / update if update > 0 else float("nan"),
        "ceiling": uncompressed_actor_s / base if base > 0 else float("nan"),
        "predicted_saving": 1.0 - update / base if base > 0 else float("nan"),
    }
