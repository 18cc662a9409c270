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

    @property
    def continuous(self) -> bool:
        """True for a continuous action vector."""
        return bool(self.action_shape)

    @property
    def action_dim(self) -> int:
        """``D`` for continuous actions, 0 for discrete."""
        return int(self.action_shape[0]) if self.action_shape else 0
