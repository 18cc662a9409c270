"""``--compressor auto`` in the Anakin loop: the controller (:class:`~accerl_jax.loops.auto.AutoControl`)
called on the host between chunks, one compiled chunk program per candidate (:mod:`accerl_jax.compressor.auto`)."""
from __future__ import annotations

import time
from typing import Callable

import jax
import jax.numpy as jnp

from accerl_jax.compressor.auto import AutoState
from accerl_jax.loops.auto import AutoControl
from accerl_jax.loops.anakin_program import AnakinState, ChunkEnd, make_chunk
from accerl_jax.loops.anakin_state import place_state
from accerl_jax.run.build import Run


class AutoChunks:
    """``--compressor auto`` in the Anakin loop: called as the chunk function ``(AnakinState, active) ->
    (AnakinState, ChunkOutput, ChunkEnd)``, it first takes the auto decision for the state it
    is given (the previous chunk's final state), then runs the chunk program of the candidate chosen.

    * One compiled chunk program per candidate (:meth:`AutoCompressor.candidate
      <accerl_jax.compressor.auto.AutoCompressor.candidate>`: the actor-params pytree differs per
      candidate), built when the candidate first runs and kept, so a switch back compiles nothing.
    * The decision is made on the host at chunk boundaries, from what the previous chunk measured at its
      end (``ChunkEnd``: KL(π_learner ‖ π_running) of the freshest compressed policy and ρ clipping of its
      last update), so checking the triggers costs no dispatch; an evaluation
      (:meth:`AutoCompressor.adapt <accerl_jax.compressor.auto.AutoCompressor.adapt>`, through the one
      wiring every loop shares, :class:`~accerl_jax.loops.auto.AutoControl`) runs only when a trigger fires. The first one runs before the first chunk (update 0, on the reset observations).
    * A switch keeps the learner state, env carry, update counter and the non-finite guard's counters;
      the new candidate's actor parameters (compressed from the current learner parameters by the
      evaluation) fill all ``--policy-lag + 1`` lagged sets (versions: the current update), and its own
      kept compressor state (e.g. a distillation student's) becomes the state's ``compressor``. The
      running candidate's state lives in the ``AnakinState``; the host's ``AutoState`` keeps the others.
    * Each decision is kept by the controller (``control``), whose decisions the stepper yields in its
      next step for the driver to log (``decisions.jsonl``, console, TensorBoard); all go to the summary.
    """

    def __init__(self, run: Run):
        self.run, self.auto = run, run.compressor
        self.control = AutoControl(run.compressor)
        self.programs: dict[int, Callable] = {}  # candidate index -> its compiled chunk program
        self.auto_state = None  # the host's AutoState; its entry for the running candidate is refreshed before use
        self.last_end: ChunkEnd | None = None  # what the previous chunk measured at its end
        self.decide_s = 0.0  # host seconds spent in decisions (evaluations, switches); the loop waits for them

    def program(self, i: int) -> Callable:
        """Candidate ``i``'s chunk program (built once; compiled at its first call)."""
        if i not in self.programs:
            self.programs[i] = make_chunk(self.run, clipping=self.auto.clip_fractions,
                                          compressor=self.auto.candidate(i))
        return self.programs[i]

    def __call__(self, s: AnakinState, active: int):
        if isinstance(s.compressor, AutoState):  # a new run's state: the host keeps every candidate's state
            self.auto_state = s.compressor
            s = s._replace(compressor=s.compressor.states[self.auto.keys[int(s.compressor.current)]])
            obs = s.carry.obs[None]
        else:
            obs = s.obs.reshape((self.run.cfg.rollout_length, -1) + tuple(self.run.info.obs_shape))  # the global batch's
        start = time.perf_counter()
        s = self._decide(s, obs)
        self.decide_s += time.perf_counter() - start
        new_state, out, end = self.program(int(self.auto_state.current))(s, active)
        self.last_end = end
        return new_state, out, end

    def _measured(self, update: int, st: AutoState) -> dict:
        """The running policy's trigger statistics measured at the end of the previous chunk; {} before the
        first chunk, and while the triggers are not due (they are fetched only when they may fire: a scalar
        copy each, already computed)."""
        if self.last_end is None or not self.auto.check_due(update, st):
            return {}
        end = jax.device_get((self.last_end.refresh_divergence["kl_learner_actor"], self.last_end.clipping))
        kl, (clipped, beyond) = end
        return {"kl": float(kl), "clip_fraction": float(clipped), "clip_fraction_margin": float(beyond)}

    def _decide(self, s: AnakinState, obs) -> AnakinState:
        auto, st = self.auto, self.auto_state
        st = st._replace(states={**st.states, auto.keys[int(st.current)]: s.compressor})
        update = int(jax.device_get(s.update))
        # Every chunk boundary is a check (since = one check period ago); the program measured the statistics.
        actor_params, st, decision = self.control.adapt(update, s.learner.params, st, s.actor_params[-1], obs,
                                                        lambda kl: self._measured(update, st),
                                                        since=update - auto.check_every)
        self.auto_state = st
        if decision is None or not decision["switched"]:
            return s
        return self.swap(s, actor_params, update)

    def swap(self, s: AnakinState, actor_params, update: int) -> AnakinState:
        """The Anakin loop's hook for a switch: the new candidate's ``actor_params`` fill every lagged set
        (versions: ``update``) and its kept state becomes the state's compressor; the next chunk runs the
        new candidate's program (``auto_state.current``)."""
        auto, st = self.auto, self.auto_state
        lag = self.run.cfg.policy_lag + 1
        s = s._replace(actor_params=(actor_params,) * lag, versions=jnp.full((lag,), update, jnp.int32),
                       compressor=st.states[auto.keys[int(st.current)]])
        return place_state(self.run, s)

    def summary(self) -> dict:
        """The summary's auto fields (as the sequential loop's, plus the programs compiled)."""
        return {**self.control.summary(self.auto_state), "auto_decide_s": self.decide_s,
                "auto_chunk_programs": sorted(self.auto.specs[i] for i in self.programs)}
