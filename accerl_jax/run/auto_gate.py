"""``--compressor auto``'s cost-split gate: before training, decide whether compression can pay at all.

The most any actor compressor can save is the uncompressed actor's share of an update, the *ceiling*
(Amdahl's law; :func:`accerl_jax.platform.cost.amdahl`; docs/DESIGN.md, "Where compression can pay"). The
gate counts, at the run's shapes, the FLOPs of one rollout with the learner's own policy and of one learner
update (XLA's cost analysis of each lowered alone, nothing compiled: :func:`accerl_jax.platform.cost.flops`)
and compares the ceiling = actor / (actor + learner) with ``--auto-min-actor-share`` (default 0.5):

* below it, ``auto`` resolves to ``none`` for the whole run: the run *is* the ``--compressor none`` run
  (same parameters), and its counted FLOPs are the summary's cost split (no second count);
* at or above it, a model-free run runs :class:`~accerl_jax.compressor.auto.AutoCompressor` as before; a
  search run (``--agent search``, whose actor evaluates the network S + 1 times per env step and whose
  program cannot switch compressors) picks one fixed compressor before training: the candidate of
  ``--auto-candidates`` with the fastest forward pass at the actor's batch
  (:meth:`AutoCompressor.forward_seconds <accerl_jax.compressor.auto.AutoCompressor.forward_seconds>`),
  with no KL check (the learner is untrained then; the summary's search fidelity reports the divergence).

A run the gate resolved is that compressor's run; its checkpoints record the gate's decision, and a
``--resume`` keeps it without counting or timing again (:func:`accerl_jax.run.build.gate_auto`), so a
search run's timed pick cannot change under it.

Host (envpool) environments step outside XLA, whose cost analysis cannot count them: there the gate counts
the actor's network part (its ``T`` forward passes and samples, :class:`~accerl_jax.actor.NetworkOnlyEnv`),
the part a compressor shrinks; the env's host time would only lower the true share, so a run this count
keeps at ``none`` could not have gained. With several processes each process counts the same programs at
the global batch's shapes (nothing is run or exchanged), so all of them take the same decision.
``--auto-min-actor-share 0`` turns the gate off.

Why 0.5 (:data:`accerl_jax.config.Config.auto_min_actor_share`'s default): a student k times as fast as
the learner's network saves at most c (1 - 1/k) of an update with ceiling c; with the students' CPU
speedups (a few times at most: the per-configuration speedups in docs/RESULTS.md), a ceiling under 0.5
caps the saving below about 0.4, and auto's candidate timings, warm-ups and divergence checks cost more
than that on small runs.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from accerl_jax.platform import cost

# A search run's pick (pick_fastest) takes a compressed candidate only if its forward is this many times as
# fast as the uncompressed network's: below it, timing noise on a shared CPU would decide (the learner's and
# none's forward, the same network, were measured 1.22x apart at batch 8 on the 2-core test machine).
MIN_SPEEDUP = 1.1
FLOPS_SOURCE = ("XLA's cost analysis of the uncompressed actor's rollout and of the learner update, each lowered "
                "alone at the run's shapes before training (accerl_jax.platform.cost.flops; nothing compiled)")


def percent(x: float) -> str:
    """``x`` (a share, 0-1) as a percentage for messages: one decimal below 10%, whole percents above."""
    return f"{100 * x:.1f}%" if abs(x) < 0.1 else f"{100 * x:.0f}%"


def count_ceiling(rollout_fn: Callable, update: Callable, params, learner_state, carry) -> dict:
    """The FLOPs of one uncompressed update and its ceiling.

    Args:
      rollout_fn: ``(params, carry) -> (carry, rollout)``, the actor's traceable rollout with the
        learner's own policy (``T`` steps of ``B`` envs).
      update: the learner update ``(learner_state, rollout) -> ...`` the loop runs.
      params, learner_state, carry: the learner's parameters and state and the actor's carry; arrays or
        ``jax.ShapeDtypeStruct`` trees (only shapes and dtypes are read).

    Returns:
      :func:`accerl_jax.platform.cost.amdahl`'s dict (``unit="flops"``) of the ``none`` run: the actor is
      the uncompressed one and compression costs 0 FLOPs (``none``'s is the identity), so ``actor_share``
      = ``ceiling`` = uncompressed actor / (uncompressed actor + learner) -- what
      :func:`accerl_jax.loops.pieces.count_flops` counts for a ``--compressor none`` run.
    """
    actor, (_, rollout_shape) = cost.flops_and_shape(rollout_fn, params, carry)
    learner = cost.flops(update, learner_state, rollout_shape)
    return cost.amdahl(actor, actor, learner, 0.0, unit="flops")


def decide(min_share: float, ceiling: float | None, search: bool) -> str:
    """What the gate does: ``"none"`` (resolve to none), ``"auto"`` (run AutoCompressor as before) or
    ``"pick"`` (a search run: pick one compressor by forward speed). ``ceiling`` None: not counted
    (the gate not applied, or off with ``min_share`` 0)."""
    if ceiling is not None and ceiling < min_share:
        return "none"
    return "pick" if search else "auto"


def record(min_share: float, flops: dict | None, outcome: str, *, chosen: str | None = None, forward_s: dict | None = None, base_forward_s: float | None = None,
           batch: int | None = None) -> dict:
    """The gate's record for the summary (``auto_gate``): the threshold, the counted FLOPs and ceiling
    (None where not counted), the outcome (``"none"``, ``"auto"`` or ``"pick"``), the compressor it
    resolved to (None for ``"auto"``) and ``reason``, one sentence in words."""
    ceiling = None if flops is None else flops["ceiling"]
    if flops is None:
        counted = "without its cost-split gate (--auto-min-actor-share 0)"
    else:
        side = "below" if ceiling < min_share else "at least"
        counted = (f"the actor is {percent(ceiling)} of an update by FLOPs, {side} the {percent(min_share)} "
                   "where compression can pay")
    if outcome == "none":
        reason = f"auto kept none: {counted}"
    elif outcome == "pick":
        speed = "" if not forward_s or not base_forward_s else \
            f" ({base_forward_s / forward_s[chosen]:.2f}x the learner's forward speed)"
        how = (f"{chosen} had the fastest forward pass of --auto-candidates at the actor's batch of {batch}{speed}"
               if chosen != "none" else f"no candidate's forward pass at the actor's batch of {batch} was "
               f"{MIN_SPEEDUP:g}x as fast as the uncompressed one")
        sep = " " if flops is None else ": "
        reason = (f"auto chose {chosen} for the search actor{sep}{counted}; {how}, timed once before training, "
                  "kept for the whole run (no KL check: a search run cannot switch compressors)")
    else:
        reason = f"auto ran its candidates {counted}" if flops is None else f"auto ran its candidates: {counted}"
    out = {"min_actor_share": min_share, "applied": flops is not None, "ceiling": ceiling, "outcome": outcome,
           "resolved": chosen if outcome == "pick" else "none" if outcome == "none" else None, "reason": reason}
    if flops is not None:
        out.update(actor_flops_per_update=flops["actor_flops_per_update"],
                   learner_flops_per_update=flops["learner_flops_per_update"], flops_source=FLOPS_SOURCE)
    if forward_s:
        out.update(forward_s=dict(forward_s), base_forward_s=base_forward_s, forward_batch=batch)
    return out


def pick_fastest(auto_compressor, params, obs_shape: tuple, obs_dtype: str, batch: int, forwards: int):
    """The candidate of ``auto_compressor`` (:class:`~accerl_jax.compressor.auto.AutoCompressor`) with the
    fastest forward pass at the actor's ``batch``, timed on zeros (``forwards`` passes per timed scan; the
    time depends on shapes and dtypes only).

    A compressed candidate is chosen only if it is at least :data:`MIN_SPEEDUP` times as fast as the
    uncompressed network (the faster of ``none``'s time, where it is a candidate, and the learner's
    forward: the same network timed twice, so a slow timing of one cannot make a candidate look faster);
    otherwise ``none``: at small batches the forward times are within a few percent of each other and
    timing noise would decide.

    Returns:
      ``(spec, {spec: seconds per forward}, learner's seconds per forward)``.
    """
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), params)
    obs = jnp.zeros((forwards, batch) + tuple(obs_shape), obs_dtype)
    seconds = auto_compressor.forward_seconds(zeros, obs)
    base = auto_compressor.base_forward_s
    fastest = min(seconds, key=seconds.get)
    uncompressed = min(seconds.get("none", base), base)
    if fastest != "none" and seconds[fastest] * MIN_SPEEDUP > uncompressed:
        fastest = "none"
    return fastest, seconds, base
