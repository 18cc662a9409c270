"""The training loop's early stops and log-folder claim (in-process, tiny budgets)."""
from __future__ import annotations

import json
import math

import jax.numpy as jnp
import pytest

from accerl_jax import loop
from accerl_jax.config import Config, ConfigError


def tiny(tmp_path, **kw) -> Config:
    return Config(total_steps=8 * 8 * 6, num_envs=8, rollout_length=8, log_every=2,
                  logdir=str(tmp_path / "run"), progress=False, **kw)


def test_claim_logdir_is_exclusive(tmp_path):
    logdir = str(tmp_path / "run")
    loop.claim_logdir(logdir)
    with pytest.raises(ConfigError, match="already holds a run"):
        loop.claim_logdir(logdir)


def test_default_logdirs_differ_for_identical_configs():
    cfg = Config()
    assert loop.default_logdir(cfg) != loop.default_logdir(cfg)


def test_non_finite_loss_stops_run_and_summary_is_strict_json(tmp_path, monkeypatch):
    real = loop.learner_lib.make_update

    def poisoned(*args, **kwargs):
        update = real(*args, **kwargs)

        def wrapped(state, batch):
            state, metrics = update(state, batch)
            return state, dict(metrics, loss=jnp.float32(math.nan))

        return wrapped

    monkeypatch.setattr(loop.learner_lib, "make_update", poisoned)
    cfg = tiny(tmp_path)
    summary = loop.train(cfg)
    assert summary["stopped"] == "diverged"
    assert summary["updates"] == cfg.log_every  # stopped at the first log step
    with open(f"{cfg.logdir}/summary.json") as f:
        text = f.read()
    assert "NaN" not in text
    assert json.loads(text)["stopped"] == "diverged"


def test_interrupt_stops_run_and_writes_summary(tmp_path, monkeypatch):
    real = loop.make_actor

    def interrupting(*args, **kwargs):
        actor = real(*args, **kwargs)
        calls = {"n": 0}
        rollout = actor.rollout

        def wrapped(params, carry):
            calls["n"] += 1
            if calls["n"] == 4:
                raise KeyboardInterrupt
            return rollout(params, carry)

        actor.rollout = wrapped
        return actor

    monkeypatch.setattr(loop, "make_actor", interrupting)
    cfg = tiny(tmp_path)
    summary = loop.train(cfg)
    assert summary["stopped"] == "interrupted"
    assert summary["updates"] == 3 and summary["total_env_steps"] == 3 * 64
    assert summary["kl_learner_actor"] is not None
    with open(f"{cfg.logdir}/summary.json") as f:
        assert json.load(f)["stopped"] == "interrupted"
