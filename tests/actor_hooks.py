"""Test hooks on the training loop's Actor: run an action (e.g. send a signal, raise) at a given rollout.

In the sequential loop every rollout is a host call of ``actor.rollout``; in the Anakin loop rollouts run
inside the jitted chunk of updates, so the hook fires on the host just before the chunk that holds the
rollout (a chunk ends at every --log-every / --checkpoint-every multiple).
"""
from __future__ import annotations

from accerl_jax.run import build as run_lib
from accerl_jax.loops import anakin


def hook_actor(monkeypatch, at: int, action) -> None:
    """Call ``action()`` at the start of rollout number ``at`` (1-based, counted in this session), then roll
    out as usual (Anakin: at the start of the chunk holding that rollout)."""
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

    real_chunk = anakin.make_chunk

    def make_chunk(run):
        chunk, done = real_chunk(run), {"n": 0}

        def wrapped(state, length):
            first = done["n"] + 1
            done["n"] += length
            if first <= at <= done["n"]:
                action()
            return chunk(state, length)

        return wrapped

    monkeypatch.setattr(run_lib, "make_actor", make)
    monkeypatch.setattr(anakin, "make_chunk", make_chunk)


def interrupt(monkeypatch, at: int) -> None:
    """Raise KeyboardInterrupt at the start of rollout number ``at`` (1-based), as a Ctrl-C would."""

    def stop():
        raise KeyboardInterrupt

    hook_actor(monkeypatch, at, stop)
