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
    """

    name: str
    num_envs: int
    obs_shape: tuple[int, ...]
    obs_dtype: str
    num_actions: int
    channels_first: bool
    jittable: bool
    max_episode_steps: int
