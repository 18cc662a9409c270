"""Checkpoints that resume exactly, determinism, signals, and the non-finite guard.

In-process runs use gymnax CartPole with tiny budgets (8 updates of 8 envs x 8 steps), in both the Anakin
loop (the default for gymnax) and the sequential loop where it is cheap; the signal tests send real
signals to a real ``python -m accerl_jax.train`` subprocess (the Anakin loop).
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from accerl_jax import run_training
from accerl_jax.run import checkpoint, guard
from accerl_jax import learner as learner_lib
from accerl_jax.config import Config, ConfigError
from accerl_jax.run.signals import Interrupted, StopSignals
from actor_hooks import hook_actor
from tiny_config import tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UPDATES = 8
SUMMARY_NUMBERS = ("updates", "total_env_steps", "episodes", "final_return_mean", "returns_averaged",
                   "kl_learner_actor", "action_agreement", "skipped_updates")


tiny = functools.partial(tiny_config, updates=UPDATES, checkpoint_every=4)


def steps(logdir) -> list[int]:
    return sorted(int(n) for n in os.listdir(os.path.join(logdir, checkpoint.CHECKPOINT_DIR)) if n.isdigit())


def metric_rows(logdir) -> list[dict]:
    with open(os.path.join(logdir, "metrics.csv")) as f:
        return list(csv.DictReader(f))


def assert_same_leaves(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for path in a:
        np.testing.assert_array_equal(a[path], b[path], err_msg=path)


def poison_updates(monkeypatch, at: set[int], what: str) -> None:
    """Make learner updates number ``at`` (1-based) produce a NaN in ``what`` ('params' or 'grad_norm').

    The poison is traced into the guarded update (a wrapper of :func:`accerl_jax.run.guard.guard_update`): it
    compares the traced update number, so it works inside one jitted program (the Anakin scan) as in the
    sequential loop.
    """
    numbers = jnp.asarray(sorted(at), jnp.int32)
    real = guard.guard_update

    def guard_update(update, on_nan):
        def guarded(state, batch, update_number, hyper=None):
            def poisoned(s, b, h=None):
                s, metrics, *outputs = update(s, b, h)
                hit = jnp.any(update_number == numbers)
                if what == "params":
                    s = s._replace(params=jax.tree.map(lambda p: jnp.where(hit, p * jnp.nan, p), s.params))
                else:
                    metrics = dict(metrics, **{what: jnp.where(hit, jnp.float32(jnp.nan), metrics[what])})
                return (s, metrics, *outputs)

            return real(poisoned, on_nan)(state, batch, update_number, hyper)

        return guarded

    monkeypatch.setattr(guard, "guard_update", guard_update)


LOOPS = ("anakin", "sequential")


@pytest.fixture(scope="module", params=["anakin", pytest.param("sequential", marks=pytest.mark.slow)])
def reference(request, tmp_path_factory):
    """An uninterrupted run of UPDATES updates in each loop: its summary and its final checkpoint's arrays.
    The sequential loop's variants are slow-marked (the default suite's budget); its resume with
    --policy-lag/--compress-every and its NaN guard stay in the default suite below."""
    logdir = tmp_path_factory.mktemp("ref") / "run"
    summary = run_training(tiny(logdir, loop=request.param))
    return summary, checkpoint.read_leaves(str(logdir), UPDATES), str(logdir)


def test_same_seed_and_flags_give_the_same_run(reference, tmp_path):
    ref_summary, ref_leaves, ref_dir = reference
    summary = run_training(tiny(tmp_path / "again", loop=ref_summary["loop"]))
    for key in SUMMARY_NUMBERS:
        assert summary[key] == ref_summary[key], key
    assert ref_summary["episodes"] > 0 and ref_summary["final_return_mean"] > 0
    assert_same_leaves(checkpoint.read_leaves(str(tmp_path / "again"), UPDATES), ref_leaves)
    assert steps(ref_dir) == [4, 8]
    # The second run compiles nothing: every program comes from the persistent compilation cache (the
    # session's, conftest.py; --compile-cache auto follows $JAX_COMPILATION_CACHE_DIR).
    assert summary["compile_cache"] == os.environ["JAX_COMPILATION_CACHE_DIR"]
    assert summary["compile_cache_misses"] == 0 and summary["compile_cache_hits"] > 0, summary
    # The learner's key (APPO's minibatch order) is the seed's and is checkpointed, so a resume keeps it.
    np.testing.assert_array_equal(ref_leaves[".learner.key"], learner_lib.learner_key(0))


def test_stop_and_resume_equals_uninterrupted_run(reference, tmp_path, monkeypatch):
    ref_summary, ref_leaves, _ = reference
    which = ref_summary["loop"]
    logdir = tmp_path / "run"
    # A real SIGINT to this process during rollout 3: the update (Anakin: the chunk of updates 3-4) finishes,
    # is saved, and the run stops.
    stop_at = 3 if which == "sequential" else 4
    hook_actor(monkeypatch, 3, lambda: os.kill(os.getpid(), signal.SIGINT))
    first = run_training(tiny(logdir, checkpoint_every=0, loop=which))
    assert first["stopped"] == "interrupted" and first["exit_signal"] == "SIGINT"
    assert first["updates"] == stop_at and steps(logdir) == [stop_at]
    monkeypatch.undo()
    summary = run_training(tiny(None, resume=str(logdir), checkpoint_every=0, loop=which))
    assert summary["stopped"] is None and summary["resumed_from_update"] == stop_at
    for key in SUMMARY_NUMBERS:
        assert summary[key] == ref_summary[key], key
    assert summary["wall_time_s"] > first["wall_time_s"]  # the summary covers both sessions
    assert_same_leaves(checkpoint.read_leaves(str(logdir), UPDATES), ref_leaves)  # bitwise, every array
    updates = [int(r["update"]) for r in metric_rows(logdir)]
    assert updates == sorted({2, stop_at, 4, 6, 8})  # appended, no update twice
    with open(os.path.join(logdir, "metrics.jsonl")) as f:
        assert [json.loads(line)["update"] for line in f] == updates  # the JSONL sink continues the same way
    assert float(metric_rows(logdir)[-1]["env_steps"]) == 8 * 8 * UPDATES


def test_resume_extends_the_budget_and_replaces_the_tensorboard_steps_after_its_checkpoint(reference, tmp_path):
    """``--resume RUN --total-steps LARGER`` continues to the new budget. The run is the reference with its
    last checkpoint removed (stopped after update 8 was logged, before it was saved): the resumed session
    logs updates 6 and 8 again, and TensorBoard shows each env step once, this session's value. A budget
    below the updates done, or one already finished, is refused."""
    from test_monitor import read_tensorboard, update_learning_rate

    ref_summary, _, ref_dir = reference
    which = ref_summary["loop"]
    logdir = tmp_path / "run"
    shutil.copytree(ref_dir, logdir)
    shutil.rmtree(logdir / checkpoint.CHECKPOINT_DIR / str(UPDATES))
    with pytest.raises(ConfigError, match="a budget of 3 updates, fewer than the 4 its checkpoint has done"):
        run_training(tiny(None, resume=str(logdir), total_steps=8 * 8 * 3, loop=which))
    summary = run_training(tiny(None, resume=str(logdir), total_steps=8 * 8 * 10, loop=which))
    assert summary["stopped"] is None and summary["resumed_from_update"] == 4 and summary["updates"] == 10
    assert summary["total_env_steps"] == 8 * 8 * 10 and steps(logdir) == [4, 8, 10]
    rows = metric_rows(logdir)
    assert [int(r["update"]) for r in rows] == [2, 4, 6, 8, 10]
    # The learning rate follows the schedule of the new budget (linear to 0 over 10 updates' optimizer steps).
    k = summary["epochs"] * summary["minibatches"]
    assert float(rows[-1]["learning_rate"]) == pytest.approx(update_learning_rate(10, 10, k), rel=1e-5)
    raw = read_tensorboard(logdir)["losses/loss"]
    assert [s for s, _ in raw] == [128, 256, 384, 512, 384, 512, 640]  # the first session's events stay in its file
    shown = read_tensorboard(logdir, purge=True)
    assert [s for s, _ in shown["losses/loss"]] == [128, 256, 384, 512, 640]
    np.testing.assert_allclose([v for _, v in shown["losses/loss"]], [float(r["loss"]) for r in rows], rtol=1e-6)
    with pytest.raises(ConfigError, match="already finished all 10 updates"):
        run_training(tiny(None, resume=str(logdir), total_steps=8 * 8 * 10, loop=which))


@pytest.mark.parametrize("which", LOOPS)
def test_resume_with_policy_lag_keeps_the_stale_actor_params(tmp_path, monkeypatch, which):
    """With --policy-lag 1 the actor runs the previous update's policy: a resume must restore both sets.
    Re-compressing every 3 updates, the resumed run must also continue the refresh schedule."""
    flags = dict(policy_lag=1, checkpoint_every=0, compress_every=3, loop=which)
    straight = tmp_path / "straight"
    ref = run_training(tiny(straight, **flags))
    logdir = tmp_path / "run"
    stop_at = 3 if which == "sequential" else 4
    hook_actor(monkeypatch, 3, lambda: os.kill(os.getpid(), signal.SIGINT))
    first = run_training(tiny(logdir, **flags))
    assert first["updates"] == stop_at and steps(logdir) == [stop_at]
    monkeypatch.undo()
    summary = run_training(tiny(None, resume=str(logdir), **flags))
    for key in SUMMARY_NUMBERS:
        assert summary[key] == ref[key], key
    # The acting policy's lag behind the learner, in versions (refresh after updates 3 and 6, one set stale).
    assert [float(r["policy_lag_versions"]) for r in metric_rows(straight)] == [1.0, 3.0, 2.0, 1.0]
    leaves = checkpoint.read_leaves(str(logdir), UPDATES)
    assert any(path.startswith(".actor_params[1]") for path in leaves)  # both actor parameter sets were saved
    assert_same_leaves(leaves, checkpoint.read_leaves(str(straight), UPDATES))


def test_keep_last_k_checkpoints(tmp_path):
    run_training(tiny(tmp_path / "run", checkpoint_every=1, keep_checkpoints=2))
    assert steps(tmp_path / "run") == [7, 8]


@pytest.mark.parametrize("which", LOOPS)
def test_nan_parameters_stop_and_keep_last_good_checkpoint(tmp_path, monkeypatch, which):
    poison_updates(monkeypatch, {3}, "params")
    logdir = tmp_path / "run"
    summary = run_training(tiny(logdir, checkpoint_every=2, loop=which))
    assert summary["stopped"] == "diverged"
    assert summary["stop_reason"].startswith("non-finite parameters at update 3")
    assert steps(logdir) == [2] and summary["last_checkpoint"].endswith(os.path.join("checkpoints", "2"))
    good = checkpoint.read_leaves(str(logdir), 2)
    assert all(np.isfinite(v).all() for v in good.values() if v.dtype.kind == "f")


@pytest.mark.parametrize("which", LOOPS)
def test_nan_gradients_skipped_and_counted(tmp_path, monkeypatch, which):
    poison_updates(monkeypatch, {3, 5}, "grad_norm")
    logdir = tmp_path / "run"
    summary = run_training(tiny(logdir, on_nan="skip", loop=which))
    assert summary["stopped"] is None and summary["updates"] == UPDATES
    assert summary["skipped_updates"] == 2
    assert float(metric_rows(logdir)[-1]["skipped_updates"]) == 2
    leaves = checkpoint.read_leaves(str(logdir), UPDATES)
    # Skipped updates kept the previous learner state: its optimizer steps count the other updates only.
    assert int(leaves[".learner.step"]) == (UPDATES - 2) * summary["epochs"] * summary["minibatches"]


def test_stop_signals_first_requests_second_abandons():
    with StopSignals() as stop:
        with pytest.raises(Interrupted) as err:  # not armed: nothing to save yet, stop at once
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        assert err.value.signum == signal.SIGTERM
        stop.armed, stop.requested = True, None
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
        assert stop.requested == signal.SIGINT  # the first signal only asks to stop
        with pytest.raises(Interrupted):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def _start_cli(logdir, *extra):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    args = ["--total-steps", str(8 * 8 * 200), "--num-envs", "8", "--rollout-length", "8", "--log-every", "2",
            "--checkpoint-every", "0", "--no-progress", *extra]
    return subprocess.Popen([sys.executable, "-m", "accerl_jax.train", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), args


def _signal_after_first_row(proc, logdir, signum) -> tuple[int, str]:
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        path = os.path.join(logdir, "metrics.csv")
        if os.path.exists(path) and len(open(path).readlines()) >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=240)
    return proc.returncode, err


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_real_signal_saves_checkpoint_and_resumes(tmp_path, signum, code):
    logdir = str(tmp_path / "run")
    proc, args = _start_cli(logdir, "--logdir", logdir)
    rc, err = _signal_after_first_row(proc, logdir, signum)
    assert rc == code, err[-3000:]
    assert f"interrupted by {signal.Signals(signum).name}" in err and "Traceback" not in err
    with open(os.path.join(logdir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["stopped"] == "interrupted" and 2 <= summary["updates"] < 200
    assert steps(logdir) == [summary["updates"]]
    assert int(metric_rows(logdir)[-1]["update"]) == summary["updates"]  # logs flushed to the last update
    if signum != signal.SIGTERM:
        return  # one resume is enough; SIGTERM's run resumes below
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "accerl_jax.train", *args, "--resume", logdir], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(os.path.join(logdir, "summary.json")) as f:
        final = json.load(f)
    assert final["updates"] == 200 and final["total_env_steps"] == 8 * 8 * 200
    assert final["resumed_from_update"] == summary["updates"]
    updates = [int(r["update"]) for r in metric_rows(logdir)]
    assert updates == sorted(set(updates)) and updates[-1] == 200


@pytest.mark.parametrize("which", ["sequential", pytest.param("anakin", marks=pytest.mark.slow)])  # ~25 s
def test_envpool_run_resumes_with_restarted_envs(tmp_path, monkeypatch, which):
    """Host envs cannot be saved: only the actor's key is; the resumed run restarts the envs and finishes
    (the Anakin loop steps the pool through envpool's XLA interface; the Sebulba loop's resume:
    tests/test_sebulba.py)."""
    cfg = dict(env="envpool:CartPole-v1", total_steps=4 * 16 * 6, num_envs=4, rollout_length=16,
               compressor="mask:0.5", loop=which)
    logdir = tmp_path / "run"
    hook_actor(monkeypatch, 3, lambda: os.kill(os.getpid(), signal.SIGINT))
    first = run_training(tiny(logdir, **cfg))
    stop_at = 3 if which == "sequential" else 4  # Anakin: the chunk of updates 3-4 finishes
    assert first["stopped"] == "interrupted" and first["updates"] == stop_at
    monkeypatch.undo()
    summary = run_training(tiny(None, resume=str(logdir), **cfg))
    assert summary["stopped"] is None and summary["updates"] == 6 and summary["total_env_steps"] == 4 * 16 * 6
    assert summary["resumed_from_update"] == stop_at and summary["loop"] == which
    assert summary["episodes"] > first["episodes"] and np.isfinite(summary["final_return_mean"])
    assert list(checkpoint.read_leaves(str(logdir), 6))[-1] == ".actor"  # the key, not the host env state


def test_config_of_an_older_checkpoint_counts_missing_fields_as_defaults():
    """A checkpoint written before a flag existed resumes if the flag is at its default; --loop then must
    be the sequential loop those runs ran."""
    from accerl_jax.run.plan import config_differences

    current = dataclasses.asdict(Config(loop="sequential"))
    old = {k: v for k, v in current.items() if k not in ("loop", "num_seeds", "queue_size")}
    assert config_differences(old, current) == []
    assert config_differences(old, dict(current, loop="anakin")) == ["--loop 'sequential' (checkpoint) vs 'anakin' (now)"]
    assert config_differences(old, dict(current, num_seeds=2)) == ["--num-seeds 1 (checkpoint) vs 2 (now)"]


def test_resume_may_change_the_budget_and_the_split_of_the_global_batch_over_processes():
    from accerl_jax.run.plan import config_differences

    saved = dataclasses.asdict(Config(num_envs=8))
    assert config_differences(saved, dict(saved, total_steps=10**9, return_window=5, log_every=1)) == []
    assert config_differences(saved, dict(saved, num_envs=4, num_processes=2), 1, 2) == []
    assert config_differences(dict(saved, num_envs=4), dict(saved, num_envs=8), 2, 1) == []
    (diff,) = config_differences(saved, dict(saved, num_envs=8, num_processes=2), 1, 2)
    assert "8 x 1 process = 8 (checkpoint) vs 8 x 2 processes = 16 (now)" in diff and "--num-envs 4" in diff
    assert "divides 8" in config_differences(saved, dict(saved, num_envs=3), 1, 3)[0]
    assert config_differences(saved, dict(saved, seed=1)) == ["--seed 0 (checkpoint) vs 1 (now)"]


def test_stop_reason_names_the_quantity_update_seed_loss_and_gradient_norm():
    from accerl_jax.run.guard import stop_reason

    m = {"loss": float("nan"), "grad_norm": 2.5}
    assert stop_reason("loss", 7, m) == "non-finite loss at update 7 (loss nan, grad_norm 2.5)"
    assert stop_reason("gradients", 7, m, " of seed 3") == "non-finite gradients at update 7 of seed 3 (loss nan, grad_norm 2.5)"


@pytest.mark.parametrize("on_nan", ["stop", "skip"])
def test_diverged_student_is_named_and_never_a_normal_finish(tmp_path, on_nan):
    """A student whose distillation diverges (an extreme --distill-learning-rate) poisons the behaviour
    log_prob: the guard names the compressed actor, not the learner's loss, and --on-nan skip stops after
    guard.MAX_SKIP_STREAK + 1 consecutive skips instead of finishing as if healthy."""
    summary = run_training(tiny(tmp_path / "run", compressor="distill:tiny", distill_learning_rate=1e30,
                                on_nan=on_nan))
    assert summary["stopped"] == "diverged"
    last = 2 if on_nan == "stop" else 1 + guard.MAX_SKIP_STREAK + 1  # skip: the update that ended the streak
    assert f"non-finite compressed actor parameters at update {last}" in summary["stop_reason"]
    assert "the learner did not" in summary["stop_reason"]
    if on_nan == "skip":
        assert summary["stop_reason"].startswith(f"{guard.MAX_SKIP_STREAK + 1} consecutive updates skipped")
        assert summary["updates"] == 2 + guard.MAX_SKIP_STREAK


def test_diverged_student_is_named_in_the_sebulba_loop_too(tmp_path):
    """Sebulba's actors run the compressor's parameters in their own threads: a student that diverged is
    named as the cause there too (its NaN behaviour log_prob is the symptom), not the learner."""
    summary = run_training(tiny(tmp_path / "run", env="envpool:CartPole-v1", compressor="distill:tiny",
                                distill_learning_rate=1e30, on_nan="stop"))
    assert summary["loop"] == "sebulba" and summary["stopped"] == "diverged"
    assert "non-finite compressed actor parameters at update" in summary["stop_reason"]
    assert "the learner did not" in summary["stop_reason"]


def test_most_updates_skipped_is_not_a_normal_finish(tmp_path, monkeypatch):
    poison_updates(monkeypatch, {1, 2, 4, 5, 7}, "grad_norm")  # 5 of 8, never more than 2 in a row
    summary = run_training(tiny(tmp_path / "run", on_nan="skip"))
    assert summary["updates"] == UPDATES and summary["skipped_updates"] == 5
    assert summary["stopped"] == "diverged" and summary["stop_reason"].startswith("5 of 8 updates skipped")


def test_guard_names_the_first_bad_input_before_the_learner():
    from accerl_jax.types import Rollout

    fields = {f: jnp.zeros((2, 3)) for f in Rollout._fields}
    fields["valid"] = jnp.ones((2, 3), bool)
    metrics = {"loss": jnp.float32(jnp.nan), "grad_norm": jnp.float32(jnp.nan)}
    params = {"w": jnp.zeros(2)}

    def cause(**bad):
        batch = Rollout(**dict(fields, **{k: v * jnp.nan for k, v in bad.items()}))
        return guard.quantity(int(guard.first_bad(guard.finite_flags(metrics, params, batch))))

    assert cause(reward=fields["reward"]) == "rewards"
    assert cause(obs=fields["obs"], reward=fields["reward"]) == "observations"
    assert cause(log_prob=fields["log_prob"]) == "behaviour log_prob"
    assert cause() == "loss"
    nan_actor = {"w": jnp.full(2, jnp.nan)}
    assert guard.quantity(int(guard.refine(jnp.int32(guard.LOG_PROB), nan_actor))) == "compressed actor parameters"
    assert int(guard.refine(jnp.int32(guard.FINITE), nan_actor)) == guard.FINITE


def test_resume_by_folder_alone_keeps_the_runs_log_and_checkpoint_cadence(tmp_path, capsys):
    """``--resume RUN`` alone continues with the run's own --log-every, --checkpoint-every and
    --keep-checkpoints (not the defaults); one given with it overrides, and the run says so in one line."""
    from accerl_jax import train

    run = str(tmp_path / "run")
    small = ["--num-envs", "4", "--rollout-length", "8", "--hidden-sizes", "16", "--no-progress"]
    assert train.main(small + ["--total-steps", str(32 * 4), "--log-every", "3", "--checkpoint-every", "3",
                               "--keep-checkpoints", "5", "--logdir", run]) == 0
    assert steps(run) == [3, 4]
    capsys.readouterr()
    assert train.main(["--resume", run, "--total-steps", str(32 * 10), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert [int(r["update"]) for r in metric_rows(run)] == [3, 4, 6, 9, 10]  # every 3 updates, and at each end
    assert steps(run) == [3, 4, 6, 9, 10]  # checkpoint-every 3, 5 kept (the defaults: only 10 added, 3 kept)
    assert "resume: --total-steps 128 -> 320 (the run's own otherwise)" in out.splitlines(), out
    assert train.main(["--resume", run, "--total-steps", str(32 * 12), "--log-every", "1", "--no-progress"]) == 0
    changed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("resume: ")]
    assert changed == ["resume: --total-steps 320 -> 384, --log-every 3 -> 1 (the run's own otherwise)"]
    assert [int(r["update"]) for r in metric_rows(run)][5:] == [11, 12]
    assert steps(run) == [4, 6, 9, 10, 12]


@pytest.mark.parametrize("which", LOOPS)
def test_stop_and_resume_with_normalisation_equals_uninterrupted_run(tmp_path, monkeypatch, which):
    # --normalize-observations/--normalize-rewards: the running statistics and the per-env discounted
    # returns are in the checkpoint, so a killed and resumed run is bitwise the uninterrupted one.
    norm = dict(normalize_observations=True, normalize_rewards=True, checkpoint_every=0, loop=which)
    ref = run_training(tiny(tmp_path / "ref", **norm))
    ref_leaves = checkpoint.read_leaves(str(tmp_path / "ref"), UPDATES)
    assert float(ref_leaves[".normalizer.obs.count"]) == pytest.approx(8 * 8 * UPDATES, abs=1e-3)
    assert float(ref_leaves[".normalizer.reward.m2"]) > 0 and np.any(ref_leaves[".normalizer.returns"] != 0)
    logdir = tmp_path / "run"
    hook_actor(monkeypatch, 3, lambda: os.kill(os.getpid(), signal.SIGINT))
    first = run_training(tiny(logdir, **norm))
    stop_at = 3 if which == "sequential" else 4  # the Anakin loop stops at the end of the chunk (--log-every 2)
    assert first["stopped"] == "interrupted" and steps(logdir) == [stop_at]
    monkeypatch.undo()
    summary = run_training(tiny(None, resume=str(logdir), **norm))
    assert summary["resumed_from_update"] == stop_at
    for key in SUMMARY_NUMBERS:
        assert summary[key] == ref[key], key
    assert_same_leaves(checkpoint.read_leaves(str(logdir), UPDATES), ref_leaves)
