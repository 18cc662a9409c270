"""The Sebulba stepper's compressor thread: it compresses the newest learner parameters it is given
(older ones are skipped), takes ``--compressor auto``'s decisions, and publishes each refreshed policy,
with its version, to the actor threads."""
from __future__ import annotations

import threading
import time
from typing import Callable

import jax

from accerl_jax.platform.clock import StageClock
from accerl_jax.run.driver import Refresh
from accerl_jax.loops import shared
from accerl_jax.loops.auto import AutoControl
from accerl_jax.loops.sebulba_threads import Latest
from accerl_jax.run.build import REFRESH_SAMPLES, Run


def compress_loop(run: Run, learner_box: Latest, comp_box: Latest, actor_box: Latest, to_actor: Callable,
                  stopping: threading.Event, clock: StageClock, refreshes: list, auto: AutoControl | None,
                  poll_s: float) -> None:
    """Run until ``stopping`` is set.

    Args:
      learner_box: ``((learner params, obs [T * B, ...], teacher keyword, rollout, ρ params), version)``
        from the learner, ``version`` = updates completed.
      comp_box: ``((actor params, compressor state), version)`` on the learner's devices; read at start,
        published after each compression.
      actor_box: the actors' copy (``to_actor(actor params)``), published when the policy changed.
      clock: gets the ``compress`` seconds; ``refreshes`` a :class:`~accerl_jax.run.driver.Refresh` of every
        ``--log-every``-th refresh; ``auto`` takes ``--compressor auto``'s decisions (None: another
        compressor); the learner yields the refreshes and decisions in its steps.
    """
    (params, comp_state), seen = comp_box.item
    refreshed = 0
    while not stopping.is_set():
        item = learner_box.wait_newer(seen, poll_s)
        if item is None:
            continue
        (learner_params, obs, teacher, rollout, rho_params), version = item
        start = time.perf_counter()
        new, comp_state = run.compressor.compress(learner_params, comp_state, obs, **teacher)
        if auto is not None:  # may evaluate its candidates and switch (counted as compression)
            new, comp_state, _ = auto.after_rollout(version, learner_params, comp_state, new, rollout,
                                                    rho_params=rho_params, since=seen)
        jax.block_until_ready(new)
        clock.add("compress", time.perf_counter() - start)
        seen, previous, params = version, params, new
        if new is not previous:  # a refreshed policy: the actors get it with its version
            refreshed += 1
            if refreshed % run.cfg.log_every == 0:
                refreshes.append(Refresh(version, [shared.divergence(run, learner_params, new, obs, REFRESH_SAMPLES)]))
            actor_box.publish(to_actor(new), version)
        comp_box.publish((new, comp_state), version)
