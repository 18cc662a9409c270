"""The :class:`~accerl_jax.run.driver.Driver` alone, driving a fake stepper (no training: a small class that
yields :class:`~accerl_jax.run.driver.Step` records) through Monitor rows and events, checkpoints, signal
deferral, the divergence stop, a failure save, resume and several seeds; and the one-way stepper contract:
no module under ``accerl_jax/loops/`` writes the Monitor, a checkpoint or the summary."""
from __future__ import annotations

import ast
import csv
import json
import os
import pathlib
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import accerl_jax
from accerl_jax.run import checkpoint
from accerl_jax.config import Config
from accerl_jax.run.driver import Bad, Driver, Episodes, Events, Final, Refresh, Step
from accerl_jax.monitor import Monitor
from accerl_jax.run.build import setup
from accerl_jax.run.signals import Interrupted, StopSignals

T, B = 8, 4  # rollout length, envs: one update is 32 env steps


def tiny(logdir, **kw) -> Config:
    kw = {"total_steps": T * B * 6, "num_envs": B, "rollout_length": T, "log_every": 2, "checkpoint_every": 0,
          "logdir": str(logdir), "progress": False, "loop": "sequential", **kw}
    return Config(**kw)


def build(cfg: Config):
    """A real run (setup only: nothing is compiled but the env's reset) and its fake stepper's snapshot."""
    run = setup(cfg)
    if run.plan.resume is None:
        carry = run.actor.reset(run.k_actor)
        if cfg.num_seeds == 1:
            actor_params, comp_state = run.compressor.init(run.params, run.k_comp, carry.obs)
            snap = checkpoint.TrainState(run.state, (actor_params,), comp_state, carry)
        else:  # the Anakin loop's run holds shapes only; its state has a leading seed axis
            seeds = lambda x: jnp.zeros((cfg.num_seeds,) + x.shape, x.dtype)  # noqa: E731
            state = jax.tree.map(seeds, run.state)
            snap = checkpoint.TrainState(state, (state.params,), (), jax.tree.map(seeds, carry))
    else:
        snap = run.restored
    return run, snap


class FakeStepper:
    """Yields one Step per update: update ``u`` of seed ``k`` ends one episode of return ``u + 10 k`` in its
    last env step; every step measures 0.5 s of ``actor`` and 0.25 s of ``learner``; update 2 refreshes
    (logged with its events) and takes an auto decision; ``bad_at`` diverges, ``fail_at`` raises,
    ``signal_at`` sends SIGTERM to this process right after yielding that update (0: SIGINT before the
    first update). ``hold`` > 0: each step is yielded that many seconds after its outputs were "read" (as
    the Anakin stepper's, whose dispatch ahead waits on several devices), carrying that moment as
    ``done_at`` (the readings in ``self.done``)."""

    def __init__(self, run, snap, *, bad_at=None, fail_at=None, signal_at=None, hold=0.0):
        self.run, self.snap, self.seeds = run, snap, run.cfg.num_seeds
        self.hold, self.done = hold, {}
        self.bad_at, self.fail_at, self.signal_at = bad_at, fail_at, signal_at
        self.completed = run.start_update
        self.closed = 0
        self.rows: list[int] = []

    def steps(self, driver):
        run = self.run
        if self.signal_at == 0 and driver.keep_going(run.start_update):
            os.kill(os.getpid(), signal.SIGINT)  # not armed yet: raises Interrupted here
        for it in range(run.start_update + 1, run.plan.num_updates + 1):
            if not driver.keep_going(it - 1):
                return
            if it == self.fail_at:
                raise RuntimeError("the stepper broke")
            episodes = []
            for k in range(self.seeds):
                finished = np.zeros((T, B), bool)
                finished[-1, 0] = True
                episodes.append(Episodes(np.full((T, B), it + 10.0 * k, np.float32), finished,
                                         np.full((T, B), T, np.int32)))
            bad = Bad("rewards", it, 0) if it == self.bad_at else None
            refreshes = (Refresh(it, [{"kl_learner_actor": 0.125 * (k + 1)} for k in range(self.seeds)]),) if it == 2 else ()
            decisions = ({"update": it, "switched": False, "chosen": "none", "trigger": "periodic", "reason": "fake",
                          "chosen_index": 0, "candidates": {"none": {"kl": 0.0, "speedup_vs_none": 1.0}}},) if it == 2 else ()
            self.completed = it
            if self.hold:
                self.done[it] = time.perf_counter()
                time.sleep(self.hold)
            yield Step(it, 1, [{"loss": np.float32(it), "grad_norm": np.float32(1.0), "kl_learner_actor": np.float32(0.0)}] * self.seeds, episodes,
                       None if bad else self.snap, bad,
                       events=Events({"actor": 0.5, "learner": 0.25}, refreshes, decisions),
                       done_at=self.done.get(it))
            if it == self.signal_at:
                os.kill(os.getpid(), signal.SIGTERM)  # armed: only requests a stop

    def row(self, update):
        self.rows.append(update)
        return [{"row_field": float(update)} for _ in range(self.seeds)]

    def env_seconds(self, update):
        return None

    def extra(self):
        return {"skipped_updates": [0] * self.seeds if self.seeds > 1 else 0, "fake_completed": self.completed}

    def final(self):
        return [Final(self.run.state if self.seeds == 1 else jax.tree.map(lambda x: x[k], self.snap.learner),
                      jax.tree.map(lambda x: x[k], self.snap.actor_params[0]) if self.seeds > 1 else self.snap.actor_params[0],
                      None) for k in range(self.seeds)]

    def fields(self, times):
        return {"loop": "fake", "times_seen": dict(times)}

    def cost_split(self):
        return {}

    def close(self):
        self.closed += 1
        return Events({"compress": 1.0})  # e.g. a worker thread's last seconds


def drive(run, stepper):
    with StopSignals() as stop:
        return Driver(run, stop).drive(stepper).summary


def rows(logdir) -> list[dict]:
    with open(os.path.join(logdir, "metrics.csv")) as f:
        return list(csv.DictReader(f))


def test_rows_events_checkpoints_and_summary(tmp_path, monkeypatch):
    refreshes = []
    real = Monitor.log_refresh
    monkeypatch.setattr(Monitor, "log_refresh", lambda self, u, d: refreshes.append((u, self.env_steps)) or real(self, u, d))
    run, snap = build(tiny(tmp_path / "run", checkpoint_every=3))
    stepper = FakeStepper(run, snap)
    summary = drive(run, stepper)
    assert summary["stopped"] is None and summary["updates"] == 6 and summary["loop"] == "fake"
    assert stepper.closed == 1 and run.outputs.claimed  # a new run claimed its folder, which it keeps
    r = rows(run.outputs.logdir)
    assert [int(float(x["update"])) for x in r] == [2, 4, 6] and stepper.rows == [2, 4, 6]
    # The stage seconds the steps carried, summed by the driver; the close's come after the last row.
    assert [float(x["time_actor_s"]) for x in r] == [1.0, 2.0, 3.0]
    assert [float(x["time_learner_s"]) for x in r] == [0.5, 1.0, 1.5]
    assert float(r[-1]["time_compress_s"]) == 0.0 and summary["compress_time_s"] == 1.0
    assert summary["times_seen"]["compress"] == 1.0 and summary["actor_time_s"] == 3.0
    assert [float(x["row_field"]) for x in r] == [2.0, 4.0, 6.0] and float(r[-1]["loss"]) == 6.0
    assert float(r[-1]["return_mean"]) == pytest.approx(np.mean(range(1, 7))) and summary["episodes"] == 6
    # The refresh and the decision are written before their step's episodes are counted (env steps of update 1).
    assert refreshes == [(2, T * B)]
    with open(os.path.join(run.outputs.logdir, "decisions.jsonl")) as f:
        decisions = [json.loads(line) for line in f]
    assert [(d["update"], d["env_steps"]) for d in decisions] == [(2, T * B)]
    assert checkpoint.finished_steps(run.outputs.logdir) == [3, 6]
    record = checkpoint.read_record(run.outputs.logdir, 3)["extra"]
    assert record["completed"] == 3 and record["fake_completed"] == 3
    assert json.load(open(os.path.join(run.outputs.logdir, "summary.json")))["updates"] == 6


def test_a_row_is_timed_when_its_outputs_were_read_not_when_it_is_logged(tmp_path):
    """A step logged later than its outputs reached the host (Step.done_at; the Anakin stepper on several
    devices, whose dispatch of the chunk ahead waits for the chunk in flight) gets the earlier moment as its
    row's wall_time_s, so a time to a target is not a chunk late."""
    run, snap = build(tiny(tmp_path / "run"))
    stepper = FakeStepper(run, snap, hold=0.3)
    drive(run, stepper)
    start = run.outputs.monitor.start
    r = rows(run.outputs.logdir)
    assert [int(float(x["update"])) for x in r] == [2, 4, 6]
    for x in r:
        assert float(x["wall_time_s"]) == pytest.approx(stepper.done[int(float(x["update"]))] - start, abs=1e-3)
    walls = [float(x["wall_time_s"]) for x in r]
    assert walls[1] - walls[0] == pytest.approx(stepper.done[4] - stepper.done[2], abs=1e-3) and walls[1] - walls[0] >= 0.6


def test_every_row_before_a_checkpoint_is_on_disk_when_it_is_saved(tmp_path, monkeypatch):
    """The row files are flushed once a second (a flush per row cost host time beside the program); a
    checkpoint flushes them first, so a run killed after it never resumes past rows that were lost."""
    from accerl_jax.monitor import files

    monkeypatch.setattr(files, "FLUSH_EVERY_S", 1e9)
    run, snap = build(tiny(tmp_path / "run", checkpoint_every=4, log_every=1))
    on_disk, real = [], run.outputs.saver.save
    monkeypatch.setattr(run.outputs.saver, "save", lambda step, *a, **k: on_disk.append(
        (step, [int(float(x["update"])) for x in rows(run.outputs.logdir)])) or real(step, *a, **k))
    drive(run, FakeStepper(run, snap))
    assert on_disk[0] == (4, [1, 2, 3, 4])


def test_signal_is_deferred_to_the_update_boundary_then_resumed(tmp_path):
    """SIGTERM after update 3 (armed): the step in flight finishes, the driver saves update 3, logs its row and
    summarises; a resumed run continues from it with the restored Monitor (rows, times) and bookkeeping."""
    cfg = tiny(tmp_path / "run")
    run, snap = build(cfg)
    summary = drive(run, FakeStepper(run, snap, signal_at=3))
    assert summary["stopped"] == "interrupted" and summary["exit_signal"] == "SIGTERM" and summary["updates"] == 3
    assert checkpoint.finished_steps(run.outputs.logdir) == [3]
    assert [int(float(x["update"])) for x in rows(run.outputs.logdir)] == [2, 3]

    run, snap = build(tiny(tmp_path / "run", resume=str(tmp_path / "run")))
    assert run.start_update == 3 and run.extra["fake_completed"] == 3
    stepper = FakeStepper(run, snap)
    summary = drive(run, stepper)
    assert summary["stopped"] is None and summary["updates"] == 6 and summary["resumed_from_update"] == 3
    r = rows(run.outputs.logdir)
    assert [int(float(x["update"])) for x in r] == [2, 3, 4, 6]
    assert float(r[-1]["time_actor_s"]) == 3.0  # the first session's seconds continue
    assert summary["episodes"] == 6 and summary["total_env_steps"] == 6 * T * B
    assert checkpoint.finished_steps(run.outputs.logdir) == [3, 6]


def test_signal_before_the_first_update_frees_the_folder(tmp_path):
    cfg = tiny(tmp_path / "run")
    run, snap = build(cfg)
    stepper = FakeStepper(run, snap, signal_at=0)
    with pytest.raises(Interrupted):
        drive(run, stepper)
    assert stepper.closed == 1
    # The new run's folder is freed for a rerun: no checkpoints, rows or summary are left.
    left = sorted(os.listdir(run.outputs.logdir)) if os.path.isdir(run.outputs.logdir) else []
    assert not {"checkpoints", "metrics.csv", "summary.json", "decisions.jsonl"} & set(left), left


def test_divergence_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    run, snap = build(tiny(tmp_path / "run", checkpoint_every=2))
    summary = drive(run, FakeStepper(run, snap, bad_at=3))
    assert summary["stopped"] == "diverged" and summary["updates"] == 3
    assert summary["stop_reason"].startswith("non-finite rewards at update 3 (loss 3.0")
    assert checkpoint.finished_steps(run.outputs.logdir) == [2]  # the diverged state is never saved
    assert [int(float(x["update"])) for x in rows(run.outputs.logdir)] == [2, 3]  # the diverged update has its row


def test_failure_saves_the_last_completed_update(tmp_path):
    run, snap = build(tiny(tmp_path / "run"))
    stepper = FakeStepper(run, snap, fail_at=4)
    with pytest.raises(RuntimeError, match="the stepper broke"):
        drive(run, stepper)
    assert stepper.closed == 1
    assert checkpoint.finished_steps(run.outputs.logdir) == [3]
    record = checkpoint.read_record(run.outputs.logdir, 3)["extra"]
    assert record["fake_completed"] == 3 and record["monitor"]["times"]["compress"] == 1.0  # close's seconds saved
    assert not os.path.exists(os.path.join(run.outputs.logdir, "summary.json"))


def test_several_seeds(tmp_path):
    run, snap = build(tiny(tmp_path / "run", num_seeds=2, loop="anakin"))
    summary = drive(run, FakeStepper(run, snap))
    assert summary["updates"] == 6 and len(summary["seeds"]) == 2
    mean = np.mean(range(1, 7))
    assert summary["final_return_mean_per_seed"] == pytest.approx([mean, mean + 10])
    assert summary["total_env_steps"] == 2 * 6 * T * B and summary["env_steps_per_seed"] == 6 * T * B
    for k in range(2):
        r = rows(os.path.join(run.outputs.logdir, f"seed{k}"))
        assert [int(float(x["update"])) for x in r] == [2, 4, 6]
        assert float(r[-1]["return_mean"]) == pytest.approx(mean + 10 * k)
        own = json.load(open(os.path.join(run.outputs.logdir, f"seed{k}", "summary.json")))
        assert own["seed"] == run.cfg.seed + k and own["logdir"] == os.path.join(run.outputs.logdir, f"seed{k}")
        assert own["final_return_mean"] == pytest.approx(mean + 10 * k) and own["updates"] == 6
    assert float(rows(run.outputs.logdir)[-1]["return_mean"]) == pytest.approx(mean + 5)  # the mean over seeds


# -- the one-way contract -------------------------------------------------------------------------------------
LOOPS = pathlib.Path(accerl_jax.__file__).parent / "loops"
WRITERS = {"monitor", "saver", "lock", "Monitor", "Checkpointer", "summarize", "write_summary", "atomic_write",
           "atomic_write_json", "log_refresh", "log_decision", "add_time", "set_env_time", "record_episodes",
           "compressor_stage_time", "remove_run", "trim_metrics"}


def test_no_stepper_writes_the_monitor_a_checkpoint_or_the_summary():
    """No name, attribute or import under accerl_jax/loops/ reaches the Monitor, the checkpointer, the run's
    lock or the summary (docstrings and comments aside): the steppers yield what happened and the driver
    writes it."""
    files = sorted(LOOPS.glob("*.py"))
    assert len(files) >= 9
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                names = [node.attr]
            elif isinstance(node, ast.Name):
                names = [node.id]
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name.split(".")[-1] for a in node.names] + [(getattr(node, "module", None) or "").split(".")[-1]]
            else:
                continue
            found += [f"{path.name}:{node.lineno}: {n}" for n in names if n in WRITERS]
    assert not found, found
