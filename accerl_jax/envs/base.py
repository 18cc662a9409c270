"""The one environment-adapter interface both backends implement (gymnax-like, batched).

``reset(key) -> (state, obs)`` and ``step(state, action) -> (state, Transition)``, with
:class:`accerl_jax.types.Transition` hiding the backends' auto-reset differences (docs/DESIGN.md,
"Conventions"): ``next_obs`` is always the true next observation, ``terminated``/``truncated`` are
separate, and a transition that is not an MDP transition has ``valid = False``.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class EnvInfo:
    """Static facts about a batched environment.

    Attributes:
      name: the ``--env`` string, e.g. ``"gymnax:CartPole-v1"``.
      num_envs: ``B``, environments stepped together.
      obs_shape: shape of one observation.
      obs_dtype: numpy dtype name of observations (``"float32"`` or ``"uint8"``).
      num_actions: number of discrete actions ``A``.
      channels_first: True for envpool Atari frames ``[4, 84, 84]``.
      jittable: True when ``reset``/``step`` are pure JAX functions (may run inside ``lax.scan``);
        False for host environments stepped from Python.
      max_episode_steps: time limit, in agent steps.
      action_shape: ``()`` for discrete actions; ``(D,)`` for a continuous action vector (then
        ``num_actions`` is 0).
      action_low, action_high: continuous only, the ``D`` per-dimension bounds (floats). The adapters
        *clip* each action to them before stepping the environment; the actor stores the unclipped
        sample and its log-prob, so the importance ratios stay those of the Gaussian (cleanrl's
        ``ClipAction`` convention).
      xla_step: True when ``step`` (not ``reset``) may run inside a jitted program although the env is
        a host one: envpool's XLA interface (:class:`accerl_jax.envs.envpool_env.EnvpoolXlaEnv`).
      delayed_reset: True when every transition's ``next_obs`` equals its ``obs`` (envpool: the step that
        ends an episode returns the final observation, the reset comes with the next step), so a
        rollout's truncated steps bootstrap from the next row's ``obs``; False when the adapter resets
        in the same step (gymnax), truncating only at ``max_episode_steps``.
      reward_clip: True when a transition's ``reward`` (what the learner trains on) is ``sign`` of the
        environment's reward, while ``episode_return`` sums the raw rewards (envpool Atari with
        ``--reward-clip``).
    """

    name: str
    num_envs: int
    obs_shape: tuple[int, ...]
    obs_dtype: str
    num_actions: int
    channels_first: bool
    jittable: bool
    max_episode_steps: int
    action_shape: tuple[int, ...] = ()
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    xla_step: bool = False
    delayed_reset: bool = False
    reward_clip: bool = False

    @property
    def continuous(self) -> bool:
        """True for a continuous action vector."""
        return bool(self.action_shape)

    def bootstrap_slots(self, rollout_length: int) -> int:
        """``K``, the final-observation slots per column of a rollout of ``T = rollout_length`` steps
        (:attr:`accerl_jax.types.Rollout.bootstrap_obs`): the most truncated steps rows ``0 .. T-2`` of
        one column can hold.

        0 with ``delayed_reset`` (the final observation is the next row's ``obs``). Otherwise a column
        truncates at most once every ``max_episode_steps`` rows (the time limit is the only truncation
        and the episode restarts in the same step), so ``K = (T - 2) // max_episode_steps + 1``: 1 for
        every ``T <= max_episode_steps + 1``, ``T - 1`` for a limit of one step.
        """
        if self.delayed_reset or rollout_length < 2:
            return 0
        return min(rollout_length - 1, (rollout_length - 2) // max(self.max_episode_steps, 1) + 1)

    @property
    def action_dim(self) -> int:
        """``D`` for continuous actions, 0 for discrete."""
        return int(self.action_shape[0]) if self.action_shape else 0


def did_you_mean(name: str, known, backend: str) -> str:
    """`` (did you mean --env <backend>:<id>?)`` for the known id closest to the unknown ``name`` (the same
    id in another case first, then the closest spelling, case-insensitive, by :mod:`difflib`), or ``""``."""
    import difflib

    by_lower = {}
    for k in sorted(known):
        by_lower.setdefault(k.lower(), k)
    match = by_lower.get(name.lower())
    if match is None:
        close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.75)
        match = by_lower[close[0]] if close else None
    return f" (did you mean --env {backend}:{match}?)" if match else ""
