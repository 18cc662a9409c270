"""What every stepper does alike: the learner update it runs, the state a checkpoint saves, the actor's
carry on ``--resume``, the divergence of the actor's policy from the learner's, and (for the steppers that
update from the host: sequential and Sebulba) the normalisation statistics the learner holds."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from accerl_jax import normalize
from accerl_jax.run import checkpoint, shards
from accerl_jax.run.build import Run


def learner_update(run: Run) -> Callable:
    """The learner update a loop runs: ``run.teacher_update`` when the compressor takes the learner's
    outputs at the rollout's observations as its teacher's (no second teacher forward pass), else
    ``run.update``. The teacher update returns those outputs after its metrics."""
    return run.update if run.teacher_update is None else run.teacher_update


def snapshot(run: Run, learner, lagged, comp_state, *, carry=None, key=None, normalizer=None) -> checkpoint.TrainState:
    """What a checkpoint saves: the learner state, the lagged compressed parameter sets (oldest first),
    the compressor state and the actor's ``carry`` -- all of it for jittable envs, only its PRNG key for
    host envs (:func:`accerl_jax.run.checkpoint.host_key_only`) -- or, where the loop keeps no carry (its
    actors are threads), the actors' base ``key``; and the ``normalizer`` statistics
    (:class:`accerl_jax.normalize.NormState`, None without normalisation)."""
    saved = key if carry is None else checkpoint.host_key_only(carry, run.info.jittable)
    return checkpoint.TrainState(learner, tuple(lagged), comp_state, saved, normalizer)


def resumed_carry(run: Run, saved):
    """The actor's carry of a ``--resume``: the saved one for jittable envs; host envs cannot be saved,
    so they restart (:meth:`reset`) and only the actor's PRNG key (``saved``) continues."""
    return saved if run.info.jittable else run.actor.reset(run.k_actor)._replace(key=saved)


def divergence(run: Run, learner_params, actor_params, obs, samples: int) -> dict:
    """KL(π_learner ‖ π_actor) and greedy-action agreement (``run.divergence``'s dict of [] scalars) on the
    first ``samples`` of ``obs [..., *obs_shape]`` (flattened to ``[N, *obs_shape]``)."""
    held = obs.reshape((-1,) + tuple(run.info.obs_shape))[:samples]
    return run.divergence(run.learner_logits(learner_params, held), run.actor_logits(actor_params, held))


class LearnerNormalizer:
    """The ``--normalize-observations`` / ``--normalize-rewards`` statistics
    (:class:`accerl_jax.normalize.NormState`) of a stepper whose learner updates from the host (the
    sequential and Sebulba loops; the Anakin loop carries them in its program's state), replicated on
    ``run.state_mesh``, where the learner's state lives. The learner normalises each rollout with the
    statistics it was acted with and then updates them from the raw rollout (:meth:`learner_view`); with
    several processes from the global batch (gathered, a collective), so that they stay the same on every
    process. Without normalisation :attr:`state` stays None and :meth:`learner_view` only gathers the
    observations.
    """

    def __init__(self, run: Run):
        cfg = run.cfg
        self.run, self.processes = run, run.plan.num_processes
        self.normalizing = cfg.normalize_observations or cfg.normalize_rewards
        self.state = None  # the statistics, set by start
        if self.normalizing:
            self._normalize = jax.jit(normalize.normalize_rollout)
            self._normalize_obs = jax.jit(normalize.normalize_obs)
            self._update = jax.jit(lambda n, r: normalize.update_from_rollout(
                n, r["obs"], r["reward"], r["terminated"] | r["truncated"], r["valid"], cfg.discount))

    def start(self, restart_returns: bool) -> None:
        """Set :attr:`state`: a new run's initial statistics over the global batch's ``--num-envs`` x
        processes environments, or a ``--resume`` checkpoint's; ``restart_returns``: the environments
        restart on resume (host envs), so their discounted returns start again from 0."""
        if not self.normalizing:
            return
        run, cfg = self.run, self.run.cfg
        norm = (run.restored.normalizer if run.plan.resume is not None else normalize.init_state(
            run.info.obs_shape, cfg.num_envs * self.processes, cfg.normalize_observations, cfg.normalize_rewards))
        if restart_returns and norm.returns is not None:
            norm = norm._replace(returns=jnp.zeros_like(norm.returns))
        self.state = jax.device_put(norm, NamedSharding(run.state_mesh, P()))

    def actor_params(self, params):
        """What the actor's policy takes: ``(params, observation statistics)`` with
        ``--normalize-observations`` (its apply is :func:`accerl_jax.normalize.normalized_apply`'s), else
        ``params``."""
        return (params, self.state.obs) if self.run.cfg.normalize_observations else params

    def learner_view(self, rollout):
        """``(rollout as the learner trains on it, the global batch's observations as the learner sees them
        [T, B, ...])``: with normalisation, both normalised with the statistics before this update, which
        are then updated from the global batch's raw rollout. Several processes: the statistics and the
        compressor learn from the observations of every process (gathered, a collective); one process:
        ``B`` is this rollout's."""
        fields = ("obs", "reward", "terminated", "truncated", "valid") if self.normalizing else ("obs",)
        raw = shards.gather_columns({k: getattr(rollout, k) for k in fields})
        if not self.normalizing:
            return rollout, raw["obs"]
        before = self.state
        rollout, self.state = self._normalize(before, rollout), self._update(before, raw)
        return rollout, rollout.obs if self.processes == 1 else self._normalize_obs(before.obs, raw["obs"])
