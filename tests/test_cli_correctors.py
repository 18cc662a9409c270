"""Smoke tests of the main job with every corrector and loss, continuous-action envs, the
policy lag, and the combinations that are refused (ConfigError, exit 2, nothing written).

The command lines run in-process through :func:`accerl_jax.train.main`, the entry point's whole code path
(``python -m accerl_jax.train`` is ``sys.exit(main())``; tests/test_cli.py runs the real subprocess), which
saves a start-up of several seconds per command."""
from __future__ import annotations

import re

import numpy as np
import pytest

from accerl_jax import train as train_cli
from accerl_jax.config import Config, ConfigError
from accerl_jax.envs import make_env
from accerl_jax import run_training
from test_cli import check_outputs, run_cli


def main(capsys, *args: str) -> tuple[int, str, str]:
    """``python -m accerl_jax.train *args`` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = train_cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "args",
    [
        ("--corrector", "retrace"),
        ("--corrector", "is", "--clip-rho-threshold", "2.0", "--compressor", "mask:0.5"),
        ("--loss", "appo", "--epochs", "2", "--minibatches", "2", "--compressor", "fakequant:8"),
        ("--env", "gymnax:Pendulum-v1", "--compressor", "fakequant:8", "--loss", "appo", "--epochs", "2"),
    ],
    ids=["retrace", "is", "appo", "pendulum-appo"],
)
def test_cli_corrector_and_loss_smoke(tmp_path, capsys, args):
    logdir = str(tmp_path / "run")
    code, _, err = main(capsys, "--total-steps", "1024", "--num-envs", "8", "--rollout-length", "16", "--log-every",
                        "4", "--logdir", logdir, "--no-progress", *args)
    assert code == 0, err[-3000:]
    summary = check_outputs(logdir, 1024)
    cfg = summary["config"]
    # --loss auto (the default) resolves to appo, or actor-critic with retrace; --epochs 0 to 8 or 1.
    loss = cfg["loss"] if cfg["loss"] != "auto" else "actor-critic" if cfg["corrector"] == "retrace" else "appo"
    assert summary["corrector"] == cfg["corrector"] and summary["loss"] == loss
    assert summary["epochs"] == (cfg["epochs"] or (8 if loss == "appo" else 1))
    assert summary["minibatches"] == cfg["minibatches"]
    assert np.isfinite(summary["kl_learner_actor"])
    if "appo" in args or "retrace" not in args:
        assert summary["loss"] == "appo"
    if "gymnax:Pendulum-v1" in args:
        assert summary["episodes"] == 0 or summary["final_return_mean"] < 0  # Pendulum rewards are negative


def test_cli_halfcheetah_smoke(tmp_path, capsys):
    logdir = str(tmp_path / "run")
    # 2 envs x 24 steps x 42 updates = 2016 steps: each env finishes one 1000-step (truncated) episode.
    code, _, err = main(capsys, "--env", "envpool:HalfCheetah-v4", "--compressor", "mask:0.5", "--total-steps",
                        "2016", "--num-envs", "2", "--rollout-length", "24", "--log-every", "14", "--logdir", logdir,
                        "--no-progress")
    assert code == 0, err[-3000:]
    summary = check_outputs(logdir, 2016)
    assert summary["episodes"] == 2
    assert summary["learner_network"]["action_dim"] == 6


def test_continuous_env_adapters_expose_bounds_and_clip():
    import jax
    import jax.numpy as jnp

    env = make_env("gymnax:Pendulum-v1", 2)
    info = env.info
    assert info.continuous and info.action_shape == (1,) and info.num_actions == 0
    assert info.action_low == (-2.0,) and info.action_high == (2.0,)
    state, _ = env.reset(jax.random.PRNGKey(0))
    _, big = env.step(state, jnp.full((2, 1), 100.0))
    _, at_bound = env.step(state, jnp.full((2, 1), 2.0))
    np.testing.assert_array_equal(big.obs, at_bound.obs)
    np.testing.assert_array_equal(big.reward, at_bound.reward)
    hc = make_env("envpool:HalfCheetah-v4", 2, seed=3)
    assert hc.info.action_shape == (6,) and hc.info.action_low == (-1.0,) * 6 and hc.info.max_episode_steps == 1000
    s, _ = hc.reset()
    _, t_big = hc.step(s, np.full((2, 6), 50.0))
    hc2 = make_env("envpool:HalfCheetah-v4", 2, seed=3)
    s2, _ = hc2.reset()
    _, t_bound = hc2.step(s2, np.full((2, 6), 1.0))
    np.testing.assert_allclose(t_big.obs, t_bound.obs)
    assert make_env("gymnax:CartPole-v1", 2).info.continuous is False


def test_policy_lag_makes_the_actor_stale(tmp_path):
    """With no compressor the actor's policy equals the learner's (KL 0) unless it lags an update."""
    base = dict(total_steps=2048, num_envs=8, rollout_length=16, compressor="none", log_every=16, progress=False)
    fresh = run_training(Config(**base, logdir=str(tmp_path / "lag0")))
    stale = run_training(Config(**base, policy_lag=1, logdir=str(tmp_path / "lag1")))
    assert fresh["kl_learner_actor"] == 0.0 and fresh["action_agreement"] == 1.0
    assert stale["kl_learner_actor"] > 0.0 and stale["policy_lag"] == 1


def test_gaussian_policy_distils_into_a_student(tmp_path):
    """distill:small on a continuous env: the student tracks the Gaussian teacher."""
    summary = run_training(Config(env="gymnax:Pendulum-v1", compressor="distill:small", total_steps=4096, num_envs=16,
                                  rollout_length=16, distill_steps=8, log_every=4, progress=False,
                                  logdir=str(tmp_path / "run")))
    assert summary["compressor"] == "distill:small" and summary["updates"] == 16
    assert summary["actor_params"] < summary["learner_params"] / 4
    assert 0.0 <= summary["kl_learner_actor"] < 0.05  # the student starts at a different mean; it is pulled in


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(env="gymnax:Pendulum-v1", corrector="retrace", compressor="none"), "discrete actions"),
        (dict(loss="appo", corrector="retrace"), "retrace"),
        (dict(loss="ppo"), "--loss"),
        (dict(loss="actor-critic", epochs=2), "bad --epochs 2 with --loss actor-critic: it takes one gradient step"),
        (dict(loss="actor-critic", minibatches=2), "bad --minibatches 2 with --loss actor-critic"),
        (dict(corrector="retrace", epochs=2),  # --loss auto is actor-critic with retrace
         "bad --epochs 2 with --loss actor-critic (--loss auto with --corrector retrace)"),
        (dict(loss="appo", minibatches=3), "--minibatches 3"),
        (dict(policy_lag=-1), "--policy-lag"),
        (dict(ppo_clip=1.5), "--ppo-clip"),
        (dict(corrector="retrace2"), "retrace"),
    ],
)
def test_bad_combinations_raise_config_error_and_write_nothing(tmp_path, kwargs, message):
    logdir = tmp_path / "run"
    with pytest.raises(ConfigError, match=re.escape(message)):
        run_training(Config(total_steps=256, num_envs=16, progress=False, logdir=str(logdir), **kwargs))
    assert not logdir.exists()


def test_a_report_cut_short_keeps_the_runs_exit_status(tmp_path, capsys, monkeypatch):
    """The summary printed into a pipe whose reader stopped (``| head``): the run and its files are
    complete, so the exit status is the run's (0), not a traceback."""
    closed = []

    def cut(summary):
        raise BrokenPipeError

    monkeypatch.setattr(train_cli, "_report", cut)
    monkeypatch.setattr(train_cli, "_stdout_closed", lambda: closed.append(True))
    logdir = tmp_path / "run"
    code, _, err = main(capsys, "--total-steps", "64", "--num-envs", "4", "--rollout-length", "8", "--logdir",
                        str(logdir), "--no-progress")
    assert code == 0 and closed == [True] and "Traceback" not in err
    assert (logdir / "summary.json").exists()


def test_cli_refused_combination_exits_2(tmp_path, capsys):
    code, _, err = main(capsys, "--env", "gymnax:Pendulum-v1", "--corrector", "retrace", "--logdir", str(tmp_path / "r"))
    assert code == 2
    assert "Traceback" not in err and "retrace" in err
    help_text = run_cli("--help").stdout
    for flag in ("--loss", "--policy-lag", "--epochs", "--minibatches", "--ppo-clip"):
        assert flag in help_text, flag
