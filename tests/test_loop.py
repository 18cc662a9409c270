"""The training loop's early stops and log-folder claim (in-process, tiny budgets)."""
from __future__ import annotations

import json
import math

import jax.numpy as jnp
import pytest

from accerl_jax import learner
from accerl_jax.platform import speed
from accerl_jax import run_training, run_training_result
from accerl_jax.run import folder as run_folder
from accerl_jax.run import build as run_lib
from accerl_jax.config import Config, ConfigError
from actor_hooks import interrupt
from tiny_config import tiny_config


def tiny(tmp_path, **kw) -> Config:
    """A 6-update run in ``tmp_path/run``."""
    return tiny_config(tmp_path / "run", updates=6, **kw)


def test_claim_logdir_is_exclusive(tmp_path):
    logdir = str(tmp_path / "run")
    run_folder.claim_logdir(logdir)
    with pytest.raises(ConfigError, match="already holds a run"):
        run_folder.claim_logdir(logdir)


def test_default_logdirs_differ_for_identical_configs():
    cfg = Config()
    assert run_lib.default_logdir(cfg) != run_lib.default_logdir(cfg)


@pytest.mark.parametrize("which", ["anakin", "sequential"])
def test_non_finite_loss_stops_run_and_summary_is_strict_json(tmp_path, monkeypatch, which):
    real = learner.make_update

    def poisoned(*args, **kwargs):
        update = real(*args, **kwargs)

        def wrapped(state, batch, hyper=None):
            state, metrics, *outputs = update(state, batch, hyper)  # outputs: the teacher's, for distillation
            return (state, dict(metrics, loss=jnp.float32(math.nan)), *outputs)

        wrapped.hyper = update.hyper
        return wrapped

    monkeypatch.setattr(learner, "make_update", poisoned)
    cfg = tiny(tmp_path, loop=which)
    summary = run_training(cfg)
    assert summary["stopped"] == "diverged"
    assert summary["updates"] == 1  # stopped at the first non-finite loss, logged at once
    with open(f"{cfg.logdir}/metrics.csv") as f:
        assert len(f.readlines()) == 2  # header + the diverged update
    with open(f"{cfg.logdir}/summary.json") as f:
        text = f.read()
    assert "NaN" not in text
    assert json.loads(text)["stopped"] == "diverged"


@pytest.mark.parametrize("which, done", [("sequential", 3), ("anakin", 2)])
def test_interrupt_stops_run_and_writes_summary(tmp_path, monkeypatch, which, done):
    """Ctrl-C during rollout 4 abandons it (Anakin: its whole chunk, updates 3-4) and keeps what finished."""
    interrupt(monkeypatch, at=4)
    cfg = tiny(tmp_path, loop=which)
    summary = run_training(cfg)
    assert summary["stopped"] == "interrupted"
    assert summary["updates"] == done and summary["total_env_steps"] == done * 64
    assert summary["kl_learner_actor"] is not None
    with open(f"{cfg.logdir}/summary.json") as f:
        assert json.load(f)["stopped"] == "interrupted"
    with open(f"{cfg.logdir}/metrics.csv") as f:
        last = f.readlines()[-1].split(",")
    assert last[0] == str(done)  # the interrupted run's last update has its own row


def test_interrupt_during_final_measurement_still_writes_summary(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(speed, "policy_speedup", interrupted)
    cfg = tiny(tmp_path)
    summary = run_training(cfg)
    assert summary["stopped"] == "interrupted" and summary["actor_policy_speedup"] is None
    assert summary["updates"] == 6
    with open(f"{cfg.logdir}/summary.json") as f:
        assert json.load(f)["updates"] == 6


def test_interrupt_while_a_chunk_is_dispatched_ahead_counts_the_chunk_in_flight(tmp_path, monkeypatch):
    """Anakin with one-update chunks (--checkpoint-every 1) runs two chunks in flight: Ctrl-C while chunk 3
    is dispatched ahead (chunk 2 running) keeps chunk 2, as one chunk at a time would, and drops chunk 3."""
    interrupt(monkeypatch, at=3)
    cfg = tiny(tmp_path, loop="anakin", checkpoint_every=1)
    summary = run_training(cfg)
    assert summary["stopped"] == "interrupted" and summary["updates"] == 2
    with open(f"{cfg.logdir}/metrics.csv") as f:
        assert [line.split(",")[0] for line in f.readlines()[1:]] == ["2"]  # --log-every 2: one row


def test_interrupt_before_first_update_frees_the_folder(tmp_path, monkeypatch):
    interrupt(monkeypatch, at=1)
    cfg = tiny(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        run_training(cfg)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("where", ["make_actor", "init_params"])
def test_interrupt_during_setup_frees_the_claimed_folder(tmp_path, monkeypatch, where):
    """A signal after the folder is claimed but before training starts (building, compiling) frees it too."""

    def interrupting(*args, **kwargs):
        raise KeyboardInterrupt

    target = run_lib if where == "make_actor" else run_lib.networks
    monkeypatch.setattr(target, where, interrupting)
    with pytest.raises(KeyboardInterrupt):
        run_training(tiny(tmp_path))
    assert not (tmp_path / "run").exists()
    monkeypatch.undo()
    assert run_training(tiny(tmp_path))["updates"] > 0  # the folder can be used again


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("learning_rate", 1e-300, "representable in float32"),
        ("entropy_coef", 1e300, "representable in float32"),
        ("num_envs", 10**20, "bad --num-envs"),
        ("rollout_length", 10**20, "bad --rollout-length"),
        ("distill_steps", 3_000_000_000, "bad --distill-steps"),
        ("return_window", 10**20, "bad --return-window"),
    ],
)
def test_out_of_range_settings_are_config_errors(tmp_path, field, value, message):
    cfg = tiny(tmp_path)
    setattr(cfg, field, value)
    with pytest.raises(ConfigError, match=message):
        run_training(cfg)
    assert not (tmp_path / "run").exists()


def test_compressed_run_refreshes_actor_policy_and_hands_back_params(tmp_path, monkeypatch):
    """int8 needs observations at init (the loop passes the first ones); every refresh of the actor's
    policy logs KL/agreement; ``run_training_result`` returns the trained params."""
    refreshes = []
    real = run_lib.Monitor._refresh_tags  # a refresh's TensorBoard tags, in its row's event or one of its own

    def spy(self, update, divergence):
        refreshes.append((update, float(divergence["kl_learner_actor"]), float(divergence["action_agreement"])))
        return real(self, update, divergence)

    monkeypatch.setattr(run_lib.Monitor, "_refresh_tags", spy)
    final = run_training_result(tiny(tmp_path, compressor="prune:0.5+int8"))
    summary = final.summary
    assert summary["stopped"] is None
    # The policy is refreshed at every update; every --log-every-th refresh (here 2) is logged.
    assert [u for u, _, _ in refreshes] == list(range(2, summary["updates"] + 1, 2))
    assert all(math.isfinite(kl) and kl >= -1e-6 and 0.0 <= a <= 1.0 for _, kl, a in refreshes)
    assert summary["actor_params"] < summary["learner_params"]
    assert final.obs.shape == (8 * 8, 4)
