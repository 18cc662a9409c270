"""Test hooks on the training loop's Actor: run an action (e.g. send a signal, raise) at a given rollout."""
from __future__ import annotations

from accerl_jax import run as run_lib


def hook_actor(monkeypatch, at: int, action) -> None:
    """Call ``action()`` at the start of rollout number ``at`` (1-based), then roll out as usual."""
    real = run_lib.make_actor

    def make(*args, **kwargs):
        actor = real(*args, **kwargs)
        rollout, calls = actor.rollout, {"n": 0}

        def wrapped(params, carry):
            calls["n"] += 1
            if calls["n"] == at:
                action()
            return rollout(params, carry)

        actor.rollout = wrapped
        return actor

    monkeypatch.setattr(run_lib, "make_actor", make)


def interrupt(monkeypatch, at: int) -> None:
    """Raise KeyboardInterrupt at the start of rollout number ``at`` (1-based), as a Ctrl-C would."""

    def stop():
        raise KeyboardInterrupt

    hook_actor(monkeypatch, at, stop)
