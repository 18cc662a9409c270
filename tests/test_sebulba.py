"""The Sebulba loop and its faults: rollout assembly from asynchronous envpool
results, a tiny envpool CartPole run with versioned rollouts, and injected faults in an actor thread, in
envpool's recv and in the learner, each of which must stop the run within seconds with the original
error after saving a checkpoint that resumes.
"""
from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from accerl_jax import async_actor
from accerl_jax import run_training
from accerl_jax.run import checkpoint
from accerl_jax.async_actor import AsyncActor, RolloutAssembler
from accerl_jax.config import Config, ConfigError
from accerl_jax.envs.envpool_env import AsyncEnvpoolEnv
from accerl_jax.loops import sebulba
from accerl_jax.run.plan import choose_loop
from accerl_jax.types import Transition
from tiny_config import tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAULT_BOUND_S = 10.0  # from the injected fault to the exception reaching the caller


tiny = functools.partial(tiny_config, updates=8, num_envs=4, env="envpool:CartPole-v1", loop="sebulba",
                         compressor="none", checkpoint_every=0)


def checkpoint_steps(logdir) -> list[int]:
    path = os.path.join(logdir, checkpoint.CHECKPOINT_DIR)
    return sorted(int(n) for n in os.listdir(path) if n.isdigit()) if os.path.isdir(path) else []


def no_worker_threads() -> bool:
    deadline = time.perf_counter() + 5
    while time.perf_counter() < deadline:
        if not any(t.name.startswith("accerl-actor") or t.name == "accerl-compress" for t in threading.enumerate()):
            return True
        time.sleep(0.05)
    return False


# ---------------------------------------------------------------- rollout assembly


def test_assembler_cuts_per_env_trajectories_from_random_subsets():
    """Environments come back in random subsets and orders (as envpool's recv returns them): every column
    of every rollout is T consecutive steps of one environment, and the version is the oldest used."""
    rng = np.random.default_rng(0)
    b, t, m = 5, 4, 2
    asm = RolloutAssembler(b, t)
    step = np.zeros(b, int)  # steps env e has taken; its observation after k steps is [e, k]
    sent_version = {}  # (env, step) -> version of the policy that chose that action
    version, popped = 0, []
    first = rng.permutation(b)
    for chunk in (first[:m], first[m:2 * m], first[2 * m:]):  # initial observations, no transition yet
        obs = np.stack([chunk, step[chunk]], 1).astype(np.float32)
        asm.act(chunk, obs, 100 * chunk + step[chunk], -step[chunk].astype(np.float32), version)
        for e in chunk:
            sent_version[(e, 0)] = version
    for i in range(400):
        ids = rng.choice(b, size=m, replace=False)  # every env is always in flight; any subset may finish
        step[ids] += 1
        obs = np.stack([ids, step[ids]], 1).astype(np.float32)
        tr = Transition(obs=obs, next_obs=obs, reward=step[ids].astype(np.float32), terminated=np.zeros(m, bool),
                        truncated=np.zeros(m, bool), valid=np.ones(m, bool),
                        episode_return=np.zeros(m, np.float32), episode_length=step[ids].astype(np.int32))
        asm.record(ids, tr)
        version += i % 7 == 0
        asm.act(ids, obs, 100 * ids + step[ids], -step[ids].astype(np.float32), version)
        for e in ids:
            sent_version[(e, step[e])] = version
        out = asm.pop()
        if out is not None:
            popped.append(out)
    assert len(popped) >= 10
    for k, (r, v) in enumerate(popped):
        assert r.obs.shape == (t, b, 2) and r.action.shape == (t, b)
        ks = k * t + np.arange(t)[:, None]  # [T, 1]: global step index of each row
        np.testing.assert_array_equal(r.obs[..., 0], np.broadcast_to(np.arange(b), (t, b)))
        np.testing.assert_array_equal(r.obs[..., 1], np.broadcast_to(ks, (t, b)))
        # Nothing ended: the next observations are the next rows' obs and, for the last row, bootstrap_obs.
        assert r.bootstrap_obs.shape == (t, b, 2)  # K = T - 1 slots by default
        np.testing.assert_array_equal(r.bootstrap_obs[-1, :, 1], np.broadcast_to(ks[-1] + 1, (b,)))
        np.testing.assert_array_equal(r.action, 100 * np.arange(b)[None] + ks)
        np.testing.assert_array_equal(r.log_prob, -np.broadcast_to(ks, (t, b)).astype(np.float32))
        np.testing.assert_array_equal(r.reward, np.broadcast_to(ks + 1, (t, b)).astype(np.float32))
        assert v == min(sent_version[(e, s)] for e in range(b) for s in range(k * t, k * t + t))


def test_async_envpool_rollouts_are_consecutive_and_mark_reset_steps():
    """Real envpool CartPole in async mode (4 envs, recv batches of 2): within and across rollouts each
    column continues its environment; the step after an episode's end is envpool's reset step (invalid)."""
    env = AsyncEnvpoolEnv("CartPole-v1", 4, 2, seed=3)
    rng = np.random.default_rng(0)

    def act(params, obs, key):  # random actions: long runs of short episodes
        return rng.integers(0, 2, len(obs)), np.zeros(len(obs), np.float32), key

    actor = AsyncActor(env, act, rollout_length=16, key=None)
    got = []
    for rollout, version, seconds in actor.rollouts(lambda: (None, 0), lambda: len(got) >= 4):
        got.append(rollout)
        assert version == 0 and seconds["env"] > 0
    assert got[0].valid[0].all()  # an env's initial observation is not recorded as a transition
    done_total = 0
    for k, r in enumerate(got):
        # envpool returns the final observation and resets a step later: only the last row's next
        # observation is not in obs (K = 0), and the packing checked that truncated rows' equal the next obs.
        assert r.bootstrap_obs.shape == (1,) + r.obs.shape[1:]
        if k:
            np.testing.assert_array_equal(got[k - 1].bootstrap_obs[-1], r.obs[0])
        done = (r.terminated | r.truncated) & r.valid
        np.testing.assert_array_equal(r.valid[1:], ~done[:-1])
        done_total += done.sum()
        np.testing.assert_array_equal(r.reward[~r.valid], 0.0)
    assert done_total >= 4  # random CartPole episodes last ~20 steps


# ---------------------------------------------------------------- the loop


def test_sebulba_trains_with_versioned_rollouts_stops_on_sigint_and_resumes(tmp_path, monkeypatch, capsys):
    """A signal stops every thread and saves; the resumed run trains to its budget with rollouts whose
    policy lag stays within the bound (--queue-size + 4)."""
    logdir = tmp_path / "run"
    cfg = dict(queue_size=1, total_steps=12 * 4 * 8, compressor="mask:0.5")
    inject_in_actor(monkeypatch, at=5, action=lambda: os.kill(os.getpid(), signal.SIGINT))
    first = run_training(tiny(logdir, **cfg))
    assert first["stopped"] == "interrupted" and first["exit_signal"] == "SIGINT" and first["updates"] >= 2
    assert checkpoint_steps(logdir) == [first["updates"]]
    assert no_worker_threads()
    monkeypatch.undo()
    summary = run_training(tiny(None, resume=str(logdir), **cfg))
    assert summary["loop"] == "sebulba" and summary["stopped"] is None and summary["updates"] == 12
    assert summary["resumed_from_update"] == first["updates"] and summary["total_env_steps"] == 12 * 4 * 8
    assert summary["episodes"] > 0 and summary["actor_batch"] == 2 and summary["actor_device"].startswith("cpu")
    assert 0 <= summary["policy_lag_mean"] <= summary["policy_lag_max"] <= summary["queue_size"] + 4
    for stage in ("env", "inference", "learner", "compress"):
        assert summary[f"{stage}_time_s"] > 0, stage
    with open(os.path.join(summary["logdir"], "metrics.csv")) as f:
        header = f.readline().strip().split(",")
        lags = [float(line.split(",")[header.index("policy_lag_versions")]) for line in f]
    assert len(lags) >= 6 and all(0 <= lag <= 5 for lag in lags)  # every 2nd update, and the stop
    # The fidelity the summary reports is the one measured during training (the logged rows), not only the
    # one after the final re-sync: the masked, lagged actor's KL is above 0 while it trained.
    assert summary["kl_during_max"] >= summary["kl_during_mean"] > 0
    assert summary["lag_during_max"] == max(lags) and summary["lag_during_mean"] == pytest.approx(sum(lags) / len(lags))
    from accerl_jax.monitor import print_summary

    print_summary(summary)
    (during,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("during training")]
    assert f"KL {summary['kl_during_mean']:.3g} mean" in during
    assert checkpoint_steps(logdir)[-1] == 12
    assert no_worker_threads()


def test_distillation_takes_the_learners_outputs_as_the_teacher(tmp_path, monkeypatch):
    """The compressor thread distils on the learner's own outputs at the rollout's observations
    (--distill-reuse-teacher, the default): every ``compress`` call gets ``teacher`` = (policy outputs,
    values), one row per observation, so no second teacher pass runs."""
    from accerl_jax.run import build as run_lib

    real, seen = run_lib.make_run_compressor, []

    def spy(*args, **kwargs):
        c = real(*args, **kwargs)

        def compress(params, state, obs, **kw):
            seen.append((obs.shape[0], [x.shape[0] for x in kw["teacher"]]) if "teacher" in kw else None)
            return c.compress(params, state, obs, **kw)

        return c._replace(compress=compress)

    monkeypatch.setattr(run_lib, "make_run_compressor", spy)
    summary = run_training(tiny(tmp_path / "run", compressor="distill:tiny", distill_steps=1, total_steps=4 * 8 * 4))
    assert summary["stopped"] is None and summary["updates"] == 4
    assert seen and all(s == (8 * 4, [8 * 4, 8 * 4]) for s in seen), seen


def test_auto_loop_is_sebulba_for_envpool_and_flags_are_checked():
    assert choose_loop(Config(env="envpool:Pong-v5")) == "sebulba"
    assert choose_loop(Config(env="gymnax:CartPole-v1")) != "sebulba"
    bad = [
        (dict(env="gymnax:CartPole-v1", loop="sebulba"), "bad --loop sebulba for --env 'gymnax:CartPole-v1'"),
        (dict(env="envpool:CartPole-v1", loop="sequential", actor_threads=2), "bad --actor-threads 2 with --loop sequential"),
        (dict(env="envpool:CartPole-v1", num_envs=6, actor_threads=4), "bad --num-envs 6: must be a multiple of --actor-threads 4"),
        (dict(env="envpool:CartPole-v1", num_envs=8, actor_threads=2, actor_batch=5), "bad --actor-batch 5: at most the 4"),
        (dict(env="envpool:CartPole-v1", policy_lag=1), "bad --policy-lag 1 with --loop sebulba"),
        (dict(env="envpool:CartPole-v1", actor_device="tpu9"), "bad --actor-device 'tpu9'; expected 'cpu', 'learner' or 'cpu-apart'"),
        (dict(env="envpool:CartPole-v1", actor_device="cpu-apart"), "bad --actor-device cpu-apart on 1 CPU device"),
        (dict(env="envpool:CartPole-v1", queue_size=0), "bad --queue-size 0"),
    ]
    for kw, message in bad:
        with pytest.raises(ConfigError, match=None) as err:
            run_training(Config(progress=False, logdir="/nonexistent/never-written", **kw))
        assert message in str(err.value), (kw, str(err.value))


# ---------------------------------------------------------------- injected faults


def inject_in_actor(monkeypatch, at: int, action) -> dict:
    """Call ``action()`` in the actor thread when it starts on rollout number ``at`` (1-based). With
    --queue-size 1 the actor can only start rollout 5 after the learner took rollout 3, i.e. after at
    least 2 updates completed."""
    real, when = AsyncActor.rollouts, {}

    def rollouts(self, *args, **kwargs):
        for n, item in enumerate(real(self, *args, **kwargs), 1):
            yield item
            if n == at - 1:
                when["t"] = time.perf_counter()
                action()

    monkeypatch.setattr(async_actor.AsyncActor, "rollouts", rollouts)
    return when


def assert_checkpoint_resumes(logdir, least: int = 1):
    """One checkpoint (of the last completed update, >= ``least``), from which the run finishes."""
    steps = checkpoint_steps(logdir)
    assert len(steps) == 1 and steps[0] >= least, steps
    resumed = run_training(tiny(None, resume=str(logdir), queue_size=1))
    assert resumed["stopped"] is None and resumed["updates"] == 8 and resumed["resumed_from_update"] == steps[0]


def train_until_fault(logdir, error: type, match: str, when: dict):
    """Train until the injected fault (raised at ``when["t"]``) reaches the caller as ``error``; assert it
    took under FAULT_BOUND_S and left no worker thread. Returns pytest's ExceptionInfo."""
    with pytest.raises(error, match=match) as err:
        run_training(tiny(logdir, queue_size=1))
    elapsed = time.perf_counter() - when["t"]
    assert elapsed < FAULT_BOUND_S, f"took {elapsed:.1f} s from the fault to the error"
    assert no_worker_threads()
    return err


def test_actor_thread_exception_stops_run_with_original_error(tmp_path, monkeypatch):
    logdir = tmp_path / "run"

    def fail():
        raise ZeroDivisionError("injected actor fault")

    when = inject_in_actor(monkeypatch, at=5, action=fail)
    err = train_until_fault(logdir, ZeroDivisionError, "injected actor fault", when)
    assert any(frame.name == "fail" for frame in err.traceback)  # the actor thread's own traceback
    monkeypatch.undo()
    assert_checkpoint_resumes(logdir, least=2)


def test_learner_exception_stops_run_with_original_error(tmp_path, monkeypatch):
    logdir = tmp_path / "run"
    when = {}

    class FailingGuard(sebulba.UpdateGuard):
        """The learner's guarded update (one jitted program) raises on its third call, in the learner."""

        calls = 0

        def __call__(self, state, batch, update_number: int = 0, actor_params=None):
            FailingGuard.calls += 1
            if FailingGuard.calls == 3:
                when["t"] = time.perf_counter()
                raise FloatingPointError("injected learner fault")
            return super().__call__(state, batch, update_number, actor_params)

    monkeypatch.setattr(sebulba, "UpdateGuard", FailingGuard)
    train_until_fault(logdir, FloatingPointError, "injected learner fault", when)
    assert checkpoint_steps(logdir) == [2]  # the update before the failed one
    monkeypatch.undo()
    assert_checkpoint_resumes(logdir, least=2)


def test_envpool_recv_exception_stops_run_with_original_error(tmp_path, monkeypatch):
    logdir = tmp_path / "run"
    real, calls, when = AsyncEnvpoolEnv.recv, {"n": 0}, {}

    def recv(self):
        calls["n"] += 1
        if calls["n"] == RECV_FAULT_AT:
            when["t"] = time.perf_counter()
            raise RuntimeError("injected envpool recv fault")
        return real(self)

    monkeypatch.setattr(AsyncEnvpoolEnv, "recv", recv)
    train_until_fault(logdir, RuntimeError, "injected envpool recv fault", when)
    monkeypatch.undo()
    assert_checkpoint_resumes(logdir)


# ~6 rollouts of 4 envs x 8 steps in recv batches of 2 (16 recvs each, + 2 initial): with --queue-size 1
# at least 2 updates have completed by then (see inject_in_actor).
RECV_FAULT_AT = 100
RECV_FAULT = textwrap.dedent(f"""
    import sys, time
    from accerl_jax.envs import envpool_env
    from accerl_jax import train
    real, calls = envpool_env.AsyncEnvpoolEnv.recv, {{"n": 0}}
    def recv(self):
        calls["n"] += 1
        if calls["n"] == {RECV_FAULT_AT}:
            print(f"FAULT_AT {{time.time()}}", file=sys.stderr, flush=True)
            raise RuntimeError("injected envpool recv fault")
        return real(self)
    envpool_env.AsyncEnvpoolEnv.recv = recv
    sys.exit(train.main(sys.argv[1:]))
""")


@pytest.mark.slow
def test_cli_envpool_recv_exception_exits_nonzero_with_traceback(tmp_path):
    """The real entry point: the original error and its traceback on stderr, a nonzero exit, within
    seconds of the fault, and a checkpoint that resumes."""
    logdir = str(tmp_path / "run")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    args = ["--env", "envpool:CartPole-v1", "--loop", "sebulba", "--compressor", "none", "--total-steps", "256",
            "--num-envs", "4", "--rollout-length", "8", "--log-every", "2", "--checkpoint-every", "0",
            "--queue-size", "1", "--no-progress", "--logdir", logdir]
    proc = subprocess.run([sys.executable, "-c", RECV_FAULT, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=240)
    ended = time.time()
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" in proc.stderr and "RuntimeError: injected envpool recv fault" in proc.stderr
    assert "in recv" in proc.stderr  # the frame that raised, from the actor thread
    fault_at = float(proc.stderr.split("FAULT_AT ")[1].split()[0])
    assert ended - fault_at < FAULT_BOUND_S + 5  # + the interpreter's exit
    assert_checkpoint_resumes(logdir)


def test_normalised_sebulba_run_publishes_statistics_to_actors_and_resumes_them(tmp_path, monkeypatch):
    """--normalize-observations/--normalize-rewards in Sebulba: the actors act with the learner's
    observation statistics (published with each policy), the checkpoint holds the statistics of every
    valid step seen, and --resume continues them (host envs restart, so their discounted returns do)."""
    seen_counts = []
    real_init = AsyncActor.__init__

    def init(self, env, act, rollout_length, key):
        def spying(params, obs, k):
            seen_counts.append(float(params[1].count))  # (actor params, observation statistics)
            return act(params, obs, k)

        real_init(self, env, spying, rollout_length, key)

    monkeypatch.setattr(AsyncActor, "__init__", init)
    norm = dict(normalize_observations=True, normalize_rewards=True)
    logdir = tmp_path / "run"
    run_training(tiny(logdir, updates=4, **norm))
    first = checkpoint.read_leaves(str(logdir), 4)
    count = float(first[".normalizer.obs.count"])
    # 4 updates of 4 envs x 8 steps, less envpool's reset steps (not valid, not counted).
    assert 0.8 * 4 * 32 <= count <= 4 * 32 and float(first[".normalizer.reward.count"]) == count
    assert np.all(first[".normalizer.obs.m2"] > 0)
    assert seen_counts[0] < 1 and 1 < max(seen_counts) <= count  # the actors got the learner's statistics
    monkeypatch.undo()
    run_training(tiny(None, resume=str(logdir), updates=8, **norm))
    final = checkpoint.read_leaves(str(logdir), 8)
    assert count + 0.8 * 4 * 32 <= float(final[".normalizer.obs.count"]) <= 8 * 32


def test_normalised_sequential_run_on_host_envs_keeps_statistics_across_resume(tmp_path):
    """The sequential loop normalises host (envpool) envs too: its checkpoint holds the statistics of every
    valid step seen, and --resume continues them while the envs, and their discounted returns, restart."""
    norm = dict(normalize_observations=True, normalize_rewards=True, loop="sequential")
    logdir = tmp_path / "run"
    first = run_training(tiny(logdir, updates=4, **norm))
    assert first["loop"] == "sequential" and first["updates"] == 4
    saved = checkpoint.read_leaves(str(logdir), 4)
    count = float(saved[".normalizer.obs.count"])
    # 4 updates of 4 envs x 8 steps, less envpool's reset steps (not valid, not counted).
    assert 0.8 * 4 * 32 <= count <= 4 * 32 and float(saved[".normalizer.reward.count"]) == count
    assert np.all(saved[".normalizer.obs.m2"] > 0) and np.any(saved[".normalizer.returns"] != 0)
    resumed = run_training(tiny(None, resume=str(logdir), updates=8, **norm))
    assert resumed["updates"] == 8 and np.isfinite(resumed["final_return_mean"])
    final = checkpoint.read_leaves(str(logdir), 8)
    assert count + 0.8 * 4 * 32 <= float(final[".normalizer.obs.count"]) <= 8 * 32


# ---------------------------------------------------------------- across processes

def test_two_processes_sebulba_interrupted_resumed_and_finished(tmp_path):
    """Sebulba across processes (JAX's multi-controller runtime): each process's actor thread feeds its
    shard of one global batch over the 4 learner devices. A SIGINT to process 0 alone stops both at the
    same update (exit 130, a checkpoint); fresh sessions ``--resume`` the run on both processes and finish
    its budget. At each stop both processes hold bitwise-equal learners and normalisation statistics (the
    statistics learn from the global batch); only process 0 writes."""
    from test_devices import _free_port, _launch
    from two_devices import device_env

    logdir = tmp_path / "run"
    (tmp_path / "out").mkdir()
    port = _free_port()
    cmds = [[sys.executable, "-c", f"import sebulba_hosts as t; t.main({pid}, {port}, {str(logdir)!r})"]
            for pid in range(2)]
    outs = _launch(cmds, [dict(device_env(2), TMPDIR=str(tmp_path)) for _ in range(2)], tmp_path / "out", timeout=240)
    results = [json.loads([ln for ln in o.splitlines() if ln.startswith("RESULT ")][-1][7:]) for o in outs]
    assert [r["codes"] for r in results] == [[130, 0], [130, 0]]
    for pid, out in enumerate(outs):
        assert len([ln for ln in out.splitlines() if ln.startswith("NORM ")]) == 2, out[-2000:]
    for prefix in ("NORM 0 ", "NORM 1 ", "process {pid} of 2: learner parameters digest "):
        seen = [[ln for ln in out.splitlines() if ln.startswith(prefix.format(pid=pid))] for pid, out in enumerate(outs)]
        assert all(seen) and [s[0].split()[-1] for s in seen][0] == [s[0].split()[-1] for s in seen][1], prefix
        if prefix.startswith("process"):  # the interrupted session's and the finished one's
            assert len(seen[0]) == len(seen[1]) == 2 and seen[0][1].split()[-1] == seen[1][1].split()[-1]
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["loop"] == "sebulba" and summary["num_processes"] == 2 and summary["learner_devices"] == 4
    assert summary["learner_batch"] == 8 and summary["stopped"] is None and summary["updates"] == 10
    assert 2 <= summary["resumed_from_update"] < 10 and summary["total_env_steps"] == 10 * 8 * 4
    assert checkpoint_steps(logdir)[-1] == 10
    assert sorted(os.listdir(tmp_path)) == ["out", "run"]  # process 1 left nothing behind
