"""Smoke tests of the real entry point (``python -m accerl_jax.train``) and of ``run_training``.

Tiny budgets; the full default job (solving CartPole) is the ``slow``-marked test at the end.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from accerl_jax import train as train_cli
from accerl_jax.config import Config
from accerl_jax import run_training

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIRED_KEYS = {
    "env", "compressor", "corrector", "seed", "total_env_steps", "wall_time_s", "actor_time_s",
    "env_time_s", "inference_time_s", "learner_time_s", "compress_time_s", "final_return_mean",
    "episodes", "steps_per_s", "actor_policy_speedup",
}


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "accerl_jax.train", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )


def check_outputs(logdir: str, expected_steps: int) -> dict:
    with open(os.path.join(logdir, "summary.json")) as f:
        summary = json.load(f)
    assert REQUIRED_KEYS <= set(summary), REQUIRED_KEYS - set(summary)
    assert summary["total_env_steps"] == expected_steps
    # The Anakin loop's stages run inside one program: its time is the host's wait for that program.
    stages = (("fused_wait_s",) if summary.get("loop") == "anakin"
              else ("actor_time_s", "learner_time_s", "compress_time_s"))
    for key in ("wall_time_s", "steps_per_s", *stages):
        assert summary[key] > 0, key
    assert 0 <= summary["env_time_s"] <= summary["actor_time_s"]
    assert summary["inference_time_s"] >= 0
    busy = (summary["actor_time_s"], summary["learner_time_s"], summary["compress_time_s"])
    # Sebulba's actor, learner and compressor threads overlap: only each stage alone is bounded by the wall.
    assert (max(busy) if summary.get("loop") == "sebulba" else sum(busy)) <= summary["wall_time_s"], busy
    assert summary["actor_policy_speedup"] > 0
    with open(os.path.join(logdir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    assert rows and int(rows[-1]["env_steps"]) == expected_steps
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(logdir))
    assert os.path.getsize(os.path.join(logdir, "curves.png")) > 0
    return summary


def test_cli_gymnax_smoke(tmp_path):
    logdir = str(tmp_path / "run")
    proc = run_cli("--total-steps", "1024", "--num-envs", "8", "--rollout-length", "8",
                   "--log-every", "4", "--logdir", logdir, "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = check_outputs(logdir, 1024)
    # The defaults: --compressor auto's gate keeps none (the learner's own policy acts: speedup 1 by
    # definition), APPO with 8 epochs, MLP(64, 64).
    assert summary["env"] == "gymnax:CartPole-v1" and summary["compressor"] == "none"
    assert summary["auto_gate"]["resolved"] == "none"
    assert summary["actor_params"] == summary["learner_params"] and summary["actor_policy_speedup"] == 1.0
    assert (summary["loss"], summary["epochs"], summary["minibatches"]) == ("appo", 8, 1)
    assert summary["learner_network"]["widths"] == [64, 64]
    assert summary["episodes"] > 0 and summary["final_return_mean"] > 0
    assert "Compressor auto kept none: the actor is" in proc.stdout and "actor speed" in proc.stdout
    # Every printed line within 80 columns but for the run folder's path (the outputs line had been 231).
    assert f"outputs: {logdir}\n" in proc.stdout and f"plot with: python -m accerl_jax.plot {logdir}\n" in proc.stdout
    import unicodedata

    def columns(line: str) -> int:  # ρ̄ is two code points in one column
        return sum(not unicodedata.combining(c) for c in line)

    assert all(columns(line.replace(logdir, "")) <= 80 for line in proc.stdout.splitlines()), proc.stdout


def test_cli_envpool_smoke(tmp_path):
    logdir = str(tmp_path / "run")
    proc = run_cli("--env", "envpool:CartPole-v1", "--total-steps", "512", "--num-envs", "4",
                   "--rollout-length", "16", "--compressor", "mask:0.5", "--logdir", logdir, "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = check_outputs(logdir, 512)
    assert summary["env_time_source"] == "measured"
    assert summary["episodes"] > 0


def test_cli_envpool_atari_smoke(tmp_path):
    logdir = str(tmp_path / "run")
    proc = run_cli("--env", "envpool:Pong-v5", "--total-steps", "32", "--num-envs", "2",
                   "--rollout-length", "8", "--compressor", "distill:tiny", "--distill-steps", "1",
                   "--logdir", logdir, "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = check_outputs(logdir, 32)
    assert summary["learner_network"]["family"] == "cnn"
    assert summary["final_return_mean"] is None  # no Pong episode ends in 16 steps


@pytest.mark.parametrize("compressor", ["none", "fakequant:8", "distill:small+fakequant:8"])
def test_train_compressors_and_no_correction(tmp_path, compressor):
    cfg = Config(total_steps=512, num_envs=8, rollout_length=8, compressor=compressor, corrector="none",
                 logdir=str(tmp_path / "run"), progress=False)
    summary = run_training(cfg)
    check_outputs(cfg.logdir, 512)
    assert summary["compressor"] == compressor and summary["corrector"] == "none"
    assert np.isfinite(summary["kl_learner_actor"])
    if compressor == "none":
        assert summary["kl_learner_actor"] == pytest.approx(0.0, abs=1e-6)
        assert summary["action_agreement"] == 1.0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env", "CartPole-v1"], "bad --env 'CartPole-v1'"),
        (["--env", "gymnax:NoSuchEnv"], "unknown gymnax environment 'NoSuchEnv'"),
        (["--compressor", "mask:1.5"], "bad --compressor 'mask:1.5'"),
        (["--compressor", "zip:3"], "unknown kind 'zip'"),
        (["--corrector", "retrace2"], "bad --corrector 'retrace2'"),
        (["--num-envs", "0"], "bad --num-envs 0"),
        (["--discount", "1.5"], "bad --discount 1.5"),
        (["--learning-rate", "inf"], "bad --learning-rate inf; expected a finite number"),
        (["--seed", "4294967296"], "bad --seed 4294967296"),
        (["--lambda", "-1"], "bad --lambda -1.0"),
        (["--compressor", "fakequant:8.0"], "'8.0' is not an integer"),
        (["--compressor", "distill:small+distill:tiny"], "distill appears more than once"),
        (["--total-steps", str(10**21)], "more than 2147483647 updates"),
        (["--env", "envpool:MiniGrid-Empty-5x5-v0"], "structured (dict/tuple) observation space"),
    ],
)
def test_cli_bad_input_exits_2_without_traceback(tmp_path, capsys, args, message):
    """In-process through :func:`accerl_jax.train.main`, the entry point's whole code path (``python -m
    accerl_jax.train`` is ``sys.exit(main())``); the real subprocess exits 2 the same way in the tests below
    and in tests/test_bad_input.py."""
    logdir = tmp_path / "run"
    capsys.readouterr()
    code = train_cli.main(["--total-steps", "64", *args, "--logdir", str(logdir), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert "Traceback" not in err
    assert not logdir.exists()  # nothing written for a rejected run


def test_cli_unwritable_logdir_exits_2(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("keep")
    proc = run_cli("--total-steps", "64", "--logdir", str(blocker / "run"), "--no-progress")
    assert proc.returncode == 2 and "cannot write there" in proc.stderr and "Traceback" not in proc.stderr
    assert blocker.read_text() == "keep"


def test_cli_refuses_to_overwrite_a_run(tmp_path):
    logdir = tmp_path / "run"
    logdir.mkdir()
    (logdir / "summary.json").write_text('{"keep": true}')
    proc = run_cli("--total-steps", "64", "--logdir", str(logdir), "--no-progress")
    assert proc.returncode == 2 and "already holds a run" in proc.stderr
    assert (logdir / "summary.json").read_text() == '{"keep": true}'
    assert sorted(os.listdir(logdir)) == ["summary.json"]


def test_a_budget_under_one_update_says_it_trains_one(tmp_path, capsys):
    """--total-steps rounds down to whole updates, but never to none: a budget under one update trains one,
    and says so (it had silently trained 256 env steps for --total-steps 100)."""
    args = ["--num-envs", "4", "--rollout-length", "8", "--loop", "sequential", "--no-progress"]
    assert train_cli.main(["--total-steps", "20", *args, "--logdir", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "--total-steps 20 is less than one update: training one, 32 env steps" in out
    with open(tmp_path / "a" / "summary.json") as f:
        assert json.load(f)["total_env_steps"] == 32
    assert train_cli.main(["--total-steps", "40", *args, "--logdir", str(tmp_path / "b")]) == 0
    assert "less than one update" not in capsys.readouterr().out  # rounded down to 32: as documented


def test_help_into_a_reader_that_stops_early_exits_0_without_a_traceback():
    """``python -m accerl_jax.train --help | head``: the reader closes the pipe after a few lines."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "accerl_jax.train", "--help"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.read(200)  # the help's first lines, then the reader is gone
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_cli_help_lists_flags():
    proc = run_cli("--help")
    assert proc.returncode == 0
    for flag in ("--env", "--compressor", "--corrector", "--total-steps", "--num-envs", "--seed", "--logdir"):
        assert flag in proc.stdout


@pytest.mark.slow
def test_default_job_solves_cartpole(tmp_path):
    logdir = str(tmp_path / "run")
    proc = run_cli("--logdir", logdir, "--no-progress", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(logdir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["final_return_mean"] >= 475.0, summary
    assert summary["compressor"] == "none" and summary["actor_policy_speedup"] == 1.0, summary  # its own policy
    # The cost split of its pieces (FLOPs: no --cost-split) and its start-up, in the summary and the table:
    # the actor runs the learner's policy, and compression (the identity) does no work.
    flops = summary["cost_split"]["flops"]
    assert all(flops[f"{k}_flops_per_update"] > 0 for k in ("actor", "uncompressed_actor", "learner"))
    assert flops["actor_flops_per_update"] == flops["uncompressed_actor_flops_per_update"]
    assert flops["compress_flops_per_update"] == 0 and flops["predicted_saving"] == 0
    assert 0 < summary["startup_before_train_s"] < summary["startup_s"] < summary["wall_time_s"] + summary["startup_before_train_s"]
    assert "MFLOP/update" in proc.stdout and "first update done" in proc.stdout


@pytest.mark.parametrize("message", [
    "INTERNAL: Error dispatching computation: Error dispatching computation: Out of memory allocating 68722886532 bytes.",
    "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.",
])
def test_out_of_memory_is_one_line_naming_the_sizes(tmp_path, capsys, monkeypatch, message):
    """XLA's out-of-memory error (as XLA:CPU and GPUs word it), e.g. for --hidden-sizes 65536 65536, is one
    line with exit 2 instead of a traceback; any other runtime error still raises."""
    import jax

    from accerl_jax.run import training

    def fail(cfg, announce=None):
        raise jax.errors.JaxRuntimeError(message)

    monkeypatch.setattr(training, "run_training", fail)
    capsys.readouterr()
    assert train_cli.main(["--logdir", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: out of memory (Out of memory") and "--hidden-sizes" in err, err
    assert train_cli.out_of_memory(RuntimeError("INTERNAL: something else broke")) is None


@pytest.mark.parametrize("skipped, offered", [(0, True), (79, False)])
def test_a_diverged_run_is_offered_on_nan_skip_only_if_it_skipped_nothing(capsys, skipped, offered):
    """A run already skipping (--on-nan skip) is not told to try --on-nan skip: it is told skipping did not help."""
    summary = {"stopped": "diverged", "last_checkpoint": None, "skipped_updates": skipped,
               "stop_reason": "non-finite loss at update 80"}
    assert train_cli._exit_status(summary) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: training diverged: non-finite loss at update 80")
    assert "lower --learning-rate" in err
    assert err.endswith("or --on-nan skip") == offered
    assert ("Skipping did not help (79 updates skipped" in err) == (not offered)
