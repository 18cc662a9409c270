"""The sequential stepper: actor rollout, learner update and compression as separate jitted calls, one after
the other, each timed apart (``--loop sequential``; the ``loop_throughput`` benchmark measures it against the
Anakin loop and the bare program). The actor runs the compressed parameters made ``--policy-lag`` updates
before the latest; the policy is re-compressed every ``--compress-every`` updates. The non-finite guard is
fused into the learner update's program (:class:`~accerl_jax.run.guard.UpdateGuard`). It yields one
:class:`~accerl_jax.run.driver.Step` per update; the :class:`~accerl_jax.run.driver.Driver` does the rest.

``--normalize-observations`` / ``--normalize-rewards`` (:mod:`accerl_jax.normalize`): as in the Anakin
loop, the actor acts on observations normalised with the statistics the update starts with, the learner
and the compressor get the rollout normalised with the same statistics, and the statistics then take the
rollout's raw observations and rewards (:class:`~accerl_jax.loops.shared.LearnerNormalizer`); so the two
loops compute the same run. Host (envpool) envs restart on ``--resume``, and so do their discounted returns.
"""
from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np

from accerl_jax import normalize
from accerl_jax.run import checkpoint
from accerl_jax.platform.clock import StageClock
from accerl_jax.run.driver import Bad, Episodes, Events, Final, Refresh, Step
from accerl_jax.run.guard import UpdateGuard
from accerl_jax.loops import pieces, shared
from accerl_jax.loops.auto import AutoControl
from accerl_jax.run.build import DIVERGENCE_SAMPLES, REFRESH_SAMPLES, Run, policy_versions, teacher_kwargs


class SequentialStepper:
    """One update per step: rollout, guarded learner update, compression (module docstring)."""

    def __init__(self, run: Run):
        self.run = run
        self.guard = UpdateGuard(shared.learner_update(run), run.cfg.on_nan, skipped=run.extra.get("skipped_updates", 0),
                                 family=run.plan.spec.family)
        self.env_calibration = list(run.extra.get("env_calibration", []))  # seconds of one env-only rollout
        self.rollout = None
        self.lag = 0
        self.clock = StageClock()
        compress = run.compressor.compress
        if run.compressor.timed_stages:  # their own seconds (the "distill" stage); the chain blocks after each
            compress = functools.partial(compress, timer=self.clock.compressor_timer)
        self.compress = compress
        self.refreshes = 0  # refreshes of the actor's policy in this session
        self.auto = AutoControl(run.compressor) if run.plan.auto else None  # --compressor auto's one wiring
        self.norm = shared.LearnerNormalizer(run)
        # With --normalize-observations its policy takes (actor params, observation statistics) pairs.
        self.actor = (run.actor_with(normalize.normalized_apply(run.actor_apply)) if run.cfg.normalize_observations
                      else run.actor)

    def _start(self):
        run = self.run
        self.norm.start(restart_returns=not run.info.jittable)
        if run.plan.resume is None:
            carry = run.actor.reset(run.k_actor)
            with self.clock.time("compress"):  # first observations calibrate int8's activation ranges
                actor_params, comp_state = run.compressor.init(run.params, run.k_comp, carry.obs)
                jax.block_until_ready(actor_params)
            return run.state, (actor_params,), comp_state, carry
        state, lagged, comp_state, carry = run.restored[:4]
        return state, lagged, comp_state, shared.resumed_carry(run, carry)

    def _snapshot(self) -> checkpoint.TrainState:
        return shared.snapshot(self.run, self.state, self.lagged, self.comp_state, carry=self.carry,
                               normalizer=self.norm.state)

    def steps(self, driver):
        run, cfg, clock = self.run, self.run.cfg, self.clock
        auto = self.auto
        self.state, lagged, self.comp_state, self.carry = self._start()
        self.actor_params = lagged[-1]
        # The last policy_lag + 1 compressed parameter sets, oldest first; the actor runs the oldest.
        self.lagged = collections.deque(lagged, maxlen=cfg.policy_lag + 1)
        # The policy version (the update after which it was compressed; 0 = initial) of each set in lagged.
        versions = collections.deque(policy_versions(run.start_update, len(self.lagged), cfg.compress_every),
                                     maxlen=cfg.policy_lag + 1)
        for it in range(run.start_update + 1, run.plan.num_updates + 1):
            if not driver.keep_going(it - 1):
                return
            refreshes = []
            with clock.time("actor"):
                self.carry, rollout, actor_times = self.actor.rollout(self.norm.actor_params(self.lagged[0]),
                                                                      self.carry)
                jax.block_until_ready(rollout)
            # obs_global: the global batch's observations [T, B, ...] (several processes: gathered, so that every
            # process compresses (distils), and --compressor auto warms its candidates, on the same observations
            # and their actors stay identical); with normalisation both normalised as the learner sees them.
            rollout, obs_global = self.norm.learner_view(rollout)
            self.rollout = rollout
            for stage in ("env", "inference"):
                if f"{stage}_time_s" in actor_times:
                    clock.add(stage, actor_times[f"{stage}_time_s"])
            self.lag = it - 1 - versions[0]  # learner versions the acting policy is behind
            rho_params = self.state.params  # the parameters the update computes ρ with
            with clock.time("learner"):
                # bad: --on-nan stop's quantity; outputs: the learner's at rollout.obs (run.teacher_update)
                self.state, metrics, bad, *outputs = self.guard(self.state, rollout, it, self.lagged[0])
                jax.block_until_ready(self.state)
            metrics["policy_lag_versions"] = self.lag
            obs_flat = jnp.reshape(obs_global, (-1,) + tuple(run.info.obs_shape))
            teacher = teacher_kwargs(outputs, obs_flat.shape[0])
            previous = self.actor_params
            if it % cfg.compress_every == 0:
                with clock.time("compress"):
                    self.actor_params, self.comp_state = self.compress(self.state.params, self.comp_state, obs_flat,
                                                                       **teacher)
                    if auto is not None:  # may evaluate its candidates and switch (counted as compression)
                        self.actor_params, self.comp_state, _ = auto.after_rollout(
                            it, self.state.params, self.comp_state, self.actor_params, rollout, obs=obs_global,
                            rho_params=rho_params)
                    jax.block_until_ready(self.actor_params)
                versions.append(it)
            else:
                versions.append(versions[-1])
            self.lagged.append(self.actor_params)
            refreshed = self.actor_params is not previous
            self.refreshes += refreshed
            # Every --log-every-th refresh of the actor's policy logs its divergence (at every refresh it
            # would cost a forward pass of both policies per update).
            if refreshed and self.refreshes % cfg.log_every == 0:
                refreshes.append(Refresh(it, [shared.divergence(run, self.state.params, self.actor_params, obs_flat,
                                                                REFRESH_SAMPLES)]))
            yield Step(it, 1, [metrics], [Episodes.of_rollout(rollout)], None if bad is not None else self._snapshot(),
                       Bad(bad, it, 0, self.guard.streak) if bad is not None else None,
                       events=Events(clock.drain(), tuple(refreshes), auto.take_decisions() if auto is not None else ()))

    def row(self, update: int) -> list:
        run = self.run
        # The divergence of the policy the actor runs next (stale by --policy-lag updates) from the learner's.
        row = shared.divergence(run, self.state.params, self.lagged[0], self.rollout.obs, DIVERGENCE_SAMPLES)
        row["policy_lag_versions"] = self.lag
        if run.info.jittable:
            self.env_calibration.append(run.actor.time_env_only(self.carry))
        return [row]

    def env_seconds(self, update: int):
        # The fused actor's env share, calibrated so far (see AnakinActor.time_env_only).
        if not self.run.info.jittable:
            return None
        return float(np.median(self.env_calibration)) * update

    def extra(self) -> dict:
        return {"env_calibration": self.env_calibration, "skipped_updates": self.guard.skipped}

    def final(self) -> list:
        obs = None if self.rollout is None else self.rollout.obs
        return [Final(self.state, self.actor_params, obs)]

    def fields(self, times: dict) -> dict:
        return {"loop": "sequential", **(self.auto.summary(self.comp_state) if self.auto is not None else {})}

    def cost_split(self) -> dict:
        """The per-update cost split of this run's pieces (:func:`accerl_jax.loops.pieces.cost_split`) at
        the final state: FLOPs always, seconds of each piece alone with ``--cost-split`` (the stage times
        measured while training are in the summary either way); {} where the pieces cannot be split."""
        run = self.run
        if not pieces.has_pieces(run) or self.rollout is None:
            return {}
        return pieces.cost_split(run, self.state, self.lagged[0], self.comp_state, self.carry, timed=run.cfg.cost_split)

    def close(self) -> Events:
        return Events(self.clock.drain())
