"""``--compressor auto``'s one wiring, the same in every loop: :class:`AutoControl` calls the controller
(:meth:`AutoCompressor.adapt <accerl_jax.compressor.auto.AutoCompressor.adapt>`) after each compression
of the running candidate and keeps its decisions for the stepper's next :class:`~accerl_jax.run.driver.Step`
(the driver logs them). What differs per loop is only where the running policy's statistics come from
and how a switch reaches the actor -- each stepper's one hook:

* sequential: after each compression, measured on the update's rollout; the actor runs the returned
  parameters (:meth:`AutoCompressor.actor_apply <accerl_jax.compressor.auto.AutoCompressor.actor_apply>`
  dispatches on their key);
* Sebulba: the same, in the compressor thread, on the versions it compresses (``since``);
* Anakin: between chunks, measured inside the chunk's program; a switch swaps the chunk program and the
  state's compressor (:class:`~accerl_jax.loops.anakin_auto.AutoChunks`).
"""
from __future__ import annotations

import threading
from typing import Callable

from accerl_jax.compressor.auto import AutoCompressor, AutoState


class AutoControl:
    """Calls ``--compressor auto``'s controller and collects its decisions (module docstring); thread-safe
    (the Sebulba compressor thread decides while the learner takes the decisions).

    Args:
      auto: the run's :class:`~accerl_jax.compressor.auto.AutoCompressor` (``run.compressor``).
    """

    def __init__(self, auto: AutoCompressor):
        self.auto = auto
        self._lock = threading.Lock()
        self._decisions: list[dict] = []

    def adapt(self, update: int, params, state: AutoState, actor_params, obs, measure: Callable[[bool], dict],
              since: int | None = None):
        """:meth:`AutoCompressor.adapt <accerl_jax.compressor.auto.AutoCompressor.adapt>` (same arguments
        and return), keeping the decision taken, if any, for :meth:`take_decisions`."""
        actor_params, state, decision = self.auto.adapt(update, params, state, actor_params, obs, measure, since)
        if decision is not None:
            with self._lock:
                self._decisions.append(decision)
        return actor_params, state, decision

    def after_rollout(self, update: int, params, state: AutoState, actor_params, rollout, obs=None, rho_params=None,
                      since: int | None = None):
        """:meth:`adapt` with the triggers measured on the update's ``rollout``
        (:meth:`AutoCompressor.rollout_measure <accerl_jax.compressor.auto.AutoCompressor.rollout_measure>`;
        the sequential loop and the Sebulba compressor thread). ``obs`` ``[T, B, ...]``: the observations to
        measure and warm on (default ``rollout.obs``); ``rho_params``: the learner parameters the update
        computed ρ with (default ``params``)."""
        obs = rollout.obs if obs is None else obs
        measure = self.auto.rollout_measure(params, actor_params, state, rollout, obs=obs, rho_params=rho_params)
        return self.adapt(update, params, state, actor_params, obs, measure, since)

    def take_decisions(self) -> tuple:
        """The decisions taken since the last call, oldest first (dicts, for :class:`~accerl_jax.run.driver.Events`)."""
        with self._lock:
            out, self._decisions = tuple(self._decisions), []
        return out

    def summary(self, state: AutoState) -> dict:
        """The run summary's auto fields (:meth:`AutoCompressor.summary
        <accerl_jax.compressor.auto.AutoCompressor.summary>`) with ``state`` the running one."""
        return self.auto.summary(state)
