"""The tests' tiny training configuration: a few updates of a few environments, no progress bar.

Each test file fixes its own defaults once (``tiny = functools.partial(tiny_config, updates=..., ...)``);
a keyword given at the call overrides them.
"""
from __future__ import annotations

from accerl_jax.config import Config


def tiny_config(logdir, *, updates: int, num_envs: int = 8, rollout_length: int = 8, **kw) -> Config:
    """A :class:`~accerl_jax.config.Config` of ``updates`` updates (``total_steps`` = ``num_envs`` x
    ``rollout_length`` x ``updates`` unless given), logging every 2 updates into ``logdir`` (a path, or None
    for a ``--resume`` that continues in the run's own folder), without the progress bar; ``kw``: any other
    field."""
    fields = dict(num_envs=num_envs, rollout_length=rollout_length, log_every=2, progress=False,
                  logdir=None if logdir is None else str(logdir))
    fields.update(kw)
    fields.setdefault("total_steps", num_envs * rollout_length * updates)
    return Config(**fields)
