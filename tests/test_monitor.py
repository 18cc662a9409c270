"""The Monitor's metrics and sinks, W&B on request, and ``python -m accerl_jax.plot``.

Two tiny CartPole runs (seeds 0 and 1, ``--policy-lag 1``, the default distillation compressor; the
first with a stand-in ``wandb`` module) are shared by the tests that need a real run.
"""
from __future__ import annotations

import csv
import functools
import json
import math
import os
import shutil
import sys
import types

import numpy as np
import pytest

from accerl_jax import plot, train
from accerl_jax import run_training
from accerl_jax.run import folder as run_folder
from accerl_jax.config import ConfigError
from accerl_jax.monitor import Monitor, print_summary, require_wandb, tensorboard_tag
from accerl_jax.monitor.summary import FIDELITY_LEGEND, STEPS_LEGEND
from tiny_config import tiny_config

UPDATES = 6


def update_learning_rate(update: int, updates: int, steps_per_update: int, rate: float = 1e-3) -> float:
    """The ``learning_rate`` logged for ``update`` (1-based) of a run of ``updates``: the mean over its
    ``steps_per_update`` optimizer steps (APPO's epochs x minibatches; 1 for the actor-critic) of the rate
    annealed linearly from ``rate`` to 0 over all ``updates * steps_per_update`` steps (optax counts from 0)."""
    first = (update - 1) * steps_per_update
    mean_step = first + (steps_per_update - 1) / 2
    return rate * (1 - mean_step / (updates * steps_per_update))


NEW_METRICS = ("abs_log_rho_mean", "rho_clipped_frac", "c_clipped_frac", "learning_rate", "grad_norm", "loss",
               "policy_lag_versions", "length_mean", "kl_learner_actor", "action_agreement", "time_distill_s")


# The sequential loop: it times every stage (the Anakin loop's one fused program reports fused_wait_s);
# a distilled student acts, so that compression and distillation take time to log.
tiny = functools.partial(tiny_config, updates=UPDATES, loop="sequential", compressor="distill:small")


class FakeWandb:
    """A stand-in ``wandb`` module recording ``init`` arguments and logged rows."""

    def __init__(self):
        self.inits, self.logged, self.finished = [], [], 0

    def module(self):
        mod = types.ModuleType("wandb")
        mod.init = self.init
        return mod

    def init(self, **kwargs):
        self.inits.append(kwargs)
        return types.SimpleNamespace(log=self.logged.append, finish=self.finish)

    def finish(self):
        self.finished += 1


def read_csv(logdir) -> list[dict]:
    with open(os.path.join(logdir, "metrics.csv")) as f:
        return list(csv.DictReader(f))


def read_jsonl(logdir) -> list[dict]:
    with open(os.path.join(logdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny runs differing only by seed; the first logs to a stand-in W&B."""
    root = tmp_path_factory.mktemp("monitor")
    fake = FakeWandb()
    saved = sys.modules.get("wandb")
    sys.modules["wandb"] = fake.module()
    try:
        first = run_training(tiny(root / "s0", policy_lag=1, wandb_project="p6"))
    finally:
        if saved is None:
            sys.modules.pop("wandb")
        else:
            sys.modules["wandb"] = saved
    second = run_training(tiny(root / "s1", policy_lag=1, seed=1))
    return root, (first, second), fake


def test_every_run_logs_the_issue_6_metrics(runs):
    root, (summary, _), _ = runs
    rows = read_csv(root / "s0")
    assert [int(r["update"]) for r in rows] == [2, 4, 6]
    for key in NEW_METRICS:
        assert key in rows[0], key
        assert all(math.isfinite(float(r[key])) for r in rows), key
    # --policy-lag 1: every logged update trained on a rollout of the policy one learner version old.
    assert {float(r["policy_lag_versions"]) for r in rows} == {1.0}
    lr = [float(r["learning_rate"]) for r in rows]
    assert lr[0] > lr[1] > lr[2] > 0  # annealed linearly to 0 over the 6 updates' optimizer steps
    k = summary["epochs"] * summary["minibatches"]
    np.testing.assert_allclose(lr, [update_learning_rate(u, UPDATES, k) for u in (2, 4, 6)], rtol=1e-5)
    for r in rows:
        assert 0 <= float(r["rho_clipped_frac"]) <= float(r["c_clipped_frac"]) <= 1  # ρ̄ = c̄ = 1 here: equal
        assert 0 <= float(r["rho_beyond_frac"]) <= float(r["rho_clipped_frac"])
        assert 0 <= float(r["rho_clipped_mass"]) < 1
        assert 0 < float(r["time_distill_s"]) <= float(r["time_compress_s"])  # distillation is part of compression
        assert float(r["length_mean"]) >= 1
    for key in ("abs_log_rho_mean", "rho_clipped_frac", "c_clipped_frac", "rho_beyond_frac", "rho_clipped_mass",
                "learning_rate", "distill_time_s", "final_length_mean"):
        assert summary[key] is not None and math.isfinite(summary[key]), key


def test_summary_table_says_what_its_numbers_are(runs, capsys):
    """A KL of 2e-5 is printed as such (not 0.0000), the notes under the table define its abbreviations once,
    and the title says which loop ran where (and, resumed, from where)."""
    _, (summary, _), _ = runs
    print_summary(dict(summary, kl_learner_actor=2.1e-5))
    out = capsys.readouterr().out
    assert "KL 2.1e-05 nats" in out and "0.0000" not in out
    flat = " ".join(out.split())
    for note in (STEPS_LEGEND, FIDELITY_LEGEND):
        assert flat.count(" ".join(note.split())) == 1
    for abbreviation in ("KL:", "agree:", "lag:", "steps/s:"):
        assert abbreviation in flat
    # CartPole's reward is 1 per step: the mean return of the recent episodes is their mean length.
    assert summary["final_length_mean"] == pytest.approx(summary["final_return_mean"])
    assert f"{summary['loop']} loop on {summary['learner_devices']} {summary['backend']} device(s)" in flat
    assert "resumed from" not in flat
    print_summary(dict(summary, resumed_from_update=1234))
    assert "resumed from update 1,234" in " ".join(capsys.readouterr().out.split())


def test_summary_table_never_rounds_a_stage_that_took_time_to_zero(runs, capsys):
    """A stage time under a second keeps its digits ("0.04 s", not "0.0 s"); the counted FLOPs of each piece
    of an update and their shares are shown too, labelled as counts."""
    _, (summary, _), _ = runs
    print_summary(dict(summary, actor_time_s=0.04, inference_time_s=0.003))
    rows = dict(line.split("  ", 1) for line in capsys.readouterr().out.splitlines() if line[:1].isalpha() and "  " in line)
    assert rows["actor"].strip().startswith("0.04 s") and "policy 0.003 s" in rows["actor"]
    flops = summary["cost_split"]["flops"]
    assert flops["actor_flops_per_update"] > 0 and summary["cost_split"]["ceiling_source"] == "flops"
    assert "learner" in rows["MFLOP/update"] and "ceiling" in rows["actor share"]


def test_summary_opens_with_its_verdict_and_fits_80_columns(runs, capsys):
    """Written to a file (as on a cluster), the summary has no row wider than 80 columns, and its first lines
    state the return, the training-only rate and what the compressor did, with the cost split's numbers."""
    _, (summary, _), _ = runs
    assert summary["training_steps_per_s"] > summary["steps_per_s"]  # compilation and start-up left out
    for variant in (summary, dict(summary, compressor="distill:small", actor_policy_speedup=1.41,
                                  cost_split=dict(summary["cost_split"], predicted_saving=-0.02))):
        print_summary(variant)
        out = capsys.readouterr().out
        lines = out.splitlines()
        assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
        head = " ".join(lines[:lines.index("")])  # the title and the verdict, before the table
        assert head.index(f"Return {summary['final_return_mean']:.1f}") < head.index("(training only)")
        assert f"{summary['training_steps_per_s']:,.0f} env steps/s" in head
        split = variant["cost_split"]
        assert f"Compressor {variant['compressor']}:" in head
        assert f"no compressor can save more than {100 * split['ceiling']:.1f}%" in head
    assert "1.41x the uncompressed speed" in head and "it costs 2.0% of an update" in head


def test_jsonl_has_the_csv_rows(runs):
    root, _, _ = runs
    rows, lines = read_csv(root / "s1"), read_jsonl(root / "s1")
    assert len(rows) == len(lines) == 3
    for row, line in zip(rows, lines):
        assert set(line) == set(row)
        for k, v in row.items():
            assert line[k] == pytest.approx(float(v), rel=1e-12), k


def test_wandb_gets_every_row_and_is_named_after_the_run(runs):
    root, _, fake = runs
    assert len(fake.inits) == 1 and fake.finished == 1
    init = fake.inits[0]
    assert init["project"] == "p6" and init["dir"] == str(root / "s0") and init["name"] == "s0"
    assert init["config"]["seed"] == 0 and init["resume"] == "allow" and init["id"]
    assert [row["update"] for row in fake.logged] == [2, 4, 6]
    assert fake.logged[-1]["abs_log_rho_mean"] == pytest.approx(float(read_csv(root / "s0")[-1]["abs_log_rho_mean"]))


def test_wandb_missing_is_a_config_error_before_anything_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(ConfigError, match="pip install wandb"):
        require_wandb()
    logdir = tmp_path / "run"
    assert train.main(["--wandb", "--logdir", str(logdir), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: bad --wandb") and "pip install wandb" in err and "Traceback" not in err
    assert not logdir.exists()


def test_wandb_id_survives_a_resume(tmp_path, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake.module())
    first = Monitor(str(tmp_path), 100, progress=False, wandb={"project": "p"})
    first.log(1, {"loss": 1.0})
    saved = first.state_dict()
    first.close()
    again = Monitor(str(tmp_path), 100, progress=False, append=True, wandb={"project": "p"})
    again.load_state_dict(saved)
    again.log(2, {"loss": 0.5})
    again.close()
    assert fake.inits[0]["id"] == fake.inits[1]["id"] == saved["wandb_id"]
    assert [r["update"] for r in read_jsonl(tmp_path)] == [1, 2]


def test_console_table_every_n_logs(tmp_path, capsys):
    monitor = Monitor(str(tmp_path), 100, progress=True, table_every=2)
    for update in range(1, 6):
        monitor.log(update, {"loss": 0.1 * update, "abs_log_rho_mean": float("nan")})
    monitor.close()
    out = capsys.readouterr().out
    tables = [line.split()[1] for line in out.splitlines() if line.startswith("update ")]
    assert tables == ["2", "4"]  # logs 2 and 4 print a table; 5 does not
    assert out.count("agree: share of observations") == 1  # the legend, under the first table only
    quiet = Monitor(str(tmp_path / "quiet"), 100, progress=False, table_every=1)
    quiet.log(1, {"loss": 1.0})
    quiet.close()
    assert "|log ρ|" not in capsys.readouterr().out


@pytest.mark.parametrize("seeds, word", [(0, "seed"), (2, "seed"), (2, "run")])
def test_progress_bar_and_console_table_say_when_steps_are_one_seeds(tmp_path, capsys, seeds, word):
    """With --num-seeds the run's Monitor counts one seed's steps: the bar's rate and the table's columns say
    "per seed" (a --sweep's replicas, which differ in more than their seed: "per run"); with one seed they
    say plain steps/s."""
    monitor = Monitor(str(tmp_path / f"s{seeds}"), 100, progress=True, table_every=1)
    monitor.seeds = [Monitor(str(tmp_path / f"s{seeds}" / f"seed{k}"), 100, progress=False) for k in range(seeds)]
    monitor.replica_word = word
    monitor.record_steps(50)
    monitor.log(1, {})
    monitor.close()
    for m in monitor.seeds:
        m.close()
    out = capsys.readouterr().out
    bar = [line for line in out.splitlines() if "50/100 steps" in line]
    assert bar and all((f"steps/s/{word}" in line) == bool(seeds) and "steps/s" in line for line in bar), out
    assert (f"steps/s/{word}" in out and f"env steps/{word}" in out) == bool(seeds), out
    assert (f"x{seeds} {word}s" in out) == bool(seeds), out
    other = {"seed": "run", "run": "seed"}[word]
    assert f"/{other}" not in out, out


def test_summary_steps_per_s_is_labelled_and_json_keeps_its_keys(runs, capsys):
    _, (summary, _), _ = runs
    assert summary["steps_per_s"] == pytest.approx(summary["total_env_steps"] / summary["wall_time_s"], rel=1e-3)
    assert summary["steps_per_s_per_seed"] == summary["steps_per_s"]  # one seed
    assert "whole run" in summary["steps_per_s_scope"] and "compilation" in summary["steps_per_s_scope"]
    print_summary(summary)
    flat = " ".join(capsys.readouterr().out.split())
    assert f"{summary['training_steps_per_s']:,.0f} training only, {summary['steps_per_s']:,.0f} whole run" in flat
    assert "compilation and start-up are excluded" in flat  # why the two rates differ


def read_tensorboard(logdir, purge: bool = False) -> dict:
    """``{tag: [(step, value), ...]}`` of the scalars in ``logdir``'s event files (in file-name order, as
    TensorBoard reads them), parsed from the TFRecord framing (length u64, crc u32, data, crc u32) and
    tensorboardX's Event proto.

    ``purge``: apply TensorBoard's restart rule (``EventAccumulator._CheckForRestartAndMaybePurge``): a
    ``SessionLog.START`` event at step S hides every scalar read before it at a step >= S."""
    import struct

    from tensorboardX.proto.event_pb2 import Event, SessionLog

    scalars: dict = {}
    for name in sorted(os.listdir(logdir)):
        if name.startswith("events.out.tfevents"):
            with open(os.path.join(logdir, name), "rb") as f:
                data = f.read()
            pos = 0
            while pos < len(data):
                (length,) = struct.unpack("<Q", data[pos:pos + 8])
                event = Event.FromString(data[pos + 12:pos + 12 + length])
                pos += 12 + length + 4
                if purge and event.HasField("session_log") and event.session_log.status == SessionLog.START:
                    scalars = {tag: [(s, v) for s, v in values if s < event.step] for tag, values in scalars.items()}
                for value in event.summary.value:
                    scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_resumed_monitor_hides_the_earlier_sessions_later_steps_in_tensorboard(tmp_path, monkeypatch):
    """A session resumed from env step 16 logs steps 24 and 32 again: with ``purge_step=17`` TensorBoard shows
    each step once, the resumed session's values after the checkpoint; its events file sorts after the
    first session's even when both start within the same second (same-named files used to overwrite it)."""
    import time

    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.5)  # both sessions in the same second
    first = Monitor(str(tmp_path), 1000, progress=False)
    for update, loss in enumerate((1.0, 2.0, 3.0), 1):
        first.record_episodes(np.zeros((1, 8)), np.zeros((1, 8), bool), 8)
        first.log(update, {"loss": loss})
    first.close()
    resumed = Monitor(str(tmp_path), 1000, progress=False, append=True, purge_step=17)
    resumed.load_state_dict(dict(first.state_dict(), env_steps=16))
    for update, loss in ((3, 30.0), (4, 40.0)):
        resumed.record_episodes(np.zeros((1, 8)), np.zeros((1, 8), bool), 8)
        resumed.log(update, {"loss": loss})
    resumed.close()
    assert len([n for n in os.listdir(tmp_path) if n.startswith("events.out")]) == 2
    assert read_tensorboard(str(tmp_path))["losses/loss"] == [(8, 1.0), (16, 2.0), (24, 3.0), (24, 30.0), (32, 40.0)]
    assert read_tensorboard(str(tmp_path), purge=True)["losses/loss"] == [(8, 1.0), (16, 2.0), (24, 30.0), (32, 40.0)]


def test_tensorboard_gets_every_finite_scalar_of_every_row_at_its_env_steps(tmp_path):
    monitor = Monitor(str(tmp_path), 1000, progress=False)
    monitor.record_episodes(np.full((2, 4), 3.0), np.eye(2, 4, dtype=bool), 8)
    monitor.log(1, {"loss": 0.5, "kl": float("nan")})
    monitor.log_refresh(1, {"kl_learner_actor": 0.25})
    monitor.record_episodes(np.zeros((2, 4)), np.zeros((2, 4), bool), 8)
    monitor.log(2, {"loss": 0.25, "kl": 0.125}, refresh={"kl_learner_actor": 0.5})  # in the row's own event
    monitor.close()
    tb = read_tensorboard(str(tmp_path))
    assert tb["losses/loss"] == [(8, 0.5), (16, 0.25)]
    assert tb["train/kl"] == [(16, 0.125)]  # NaN is not written; a key of no group goes to train/
    assert tb["charts/return_mean"] == [(8, 3.0), (16, 3.0)] and tb["charts/env_steps"] == [(8, 8.0), (16, 16.0)]
    assert tb["refresh/kl_learner_actor"] == [(8, 0.25), (16, 0.5)] and tb["refresh/update"] == [(8, 1.0), (16, 2.0)]
    assert monitor.refreshes == 2
    assert tb["time/learner"] == [(8, 0.0), (16, 0.0)]
    finite = {tensorboard_tag(k) for k, v in monitor.rows[-1].items() if math.isfinite(v)}
    assert "charts/update" not in tb and "charts/length_mean" not in tb and finite - {"train/update"} <= set(tb)
    assert all("/" in tag for tag in tb)  # every tag in a namespace


def test_tensorboard_tags_are_grouped_like_cleanrl():
    assert [tensorboard_tag(k) for k in ("return_mean", "loss", "rho_clipped_mass", "kl_learner_actor",
                                         "time_distill_s", "refresh/kl", "something_new")] == [
        "charts/return_mean", "losses/loss", "ratios/rho_clipped_mass", "policy/kl_learner_actor",
        "time/distill", "refresh/kl", "train/something_new"]


def test_row_files_are_flushed_once_a_second_and_at_flush(tmp_path, monkeypatch):
    """A flush per row cost host time beside the program: rows reach the disk at most FLUSH_EVERY_S late,
    and at once at :meth:`Monitor.flush` (every checkpoint) and at close."""
    from accerl_jax.monitor import files

    monkeypatch.setattr(files, "FLUSH_EVERY_S", 1e9)
    monitor = Monitor(str(tmp_path), 100, progress=False)
    monitor.log(1, {"loss": 1.0})
    monitor.log(2, {"loss": 2.0})
    assert read_csv(tmp_path) == [] and read_jsonl(tmp_path) == []  # buffered
    monitor.flush()
    assert [int(r["update"]) for r in read_csv(tmp_path)] == [1, 2] and len(read_jsonl(tmp_path)) == 2
    monkeypatch.setattr(files, "FLUSH_EVERY_S", 0.0)
    monitor.log(3, {"loss": 3.0})
    assert [int(r["update"]) for r in read_csv(tmp_path)] == [1, 2, 3] and len(read_jsonl(tmp_path)) == 3
    monkeypatch.setattr(files, "FLUSH_EVERY_S", 1e9)
    monitor.log(4, {"loss": 4.0})
    monitor.close()
    assert len(read_csv(tmp_path)) == 4 and len(read_jsonl(tmp_path)) == 4


def test_trim_metrics_drops_later_rows_of_csv_and_jsonl(tmp_path):
    monitor = Monitor(str(tmp_path), 100, progress=False)
    for update in (2, 4, 6):
        monitor.log(update, {"loss": float(update)})
    monitor.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"update": 8, "lo')  # a row cut short by a crash
    run_folder.trim_metrics(str(tmp_path), 4)
    assert [int(r["update"]) for r in read_csv(tmp_path)] == [2, 4]
    assert [r["update"] for r in read_jsonl(tmp_path)] == [2, 4]


def test_plot_two_runs_grouped_over_seeds(runs, tmp_path):
    root, _, _ = runs
    paths = plot.plot_runs([str(root / "s0"), str(root / "s1")], str(tmp_path / "out"))
    assert [os.path.basename(p) for p in paths] == ["returns.png", "time_breakdown.png", "divergence.png"]
    for path in paths:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    groups = plot.group_runs([plot.load_run(str(root / "s0")), plot.load_run(str(root / "s1"))])
    assert len(groups) == 1 and len(groups[0][1]) == 2 and "2 seeds" in groups[0][0]
    # A run with another compressor is its own group, labelled by the setting that differs.
    other = tmp_path / "other"
    shutil.copytree(root / "s1", other, ignore=shutil.ignore_patterns("checkpoints"))
    with open(other / "summary.json") as f:
        summary = json.load(f)
    summary["config"]["compressor"] = "none"
    with open(other / "summary.json", "w") as f:
        json.dump(summary, f)
    runs3 = [plot.load_run(str(p)) for p in (root / "s0", other, root / "s1")]
    labels = [label for label, _ in plot.group_runs(runs3)]
    assert labels == ["--compressor distill:small (2 seeds)", "--compressor none"]
    # The seed band: mean and min-max of the two seeds' returns at their common env steps.
    x, mean, lo, hi = plot.seed_band(runs3[::2], "env_steps")
    r0, r1 = (runs3[i].get("return_mean") for i in (0, 2))
    np.testing.assert_allclose(mean[[0, -1]], [(r0[0] + r1[0]) / 2, (r0[-1] + r1[-1]) / 2])
    assert np.all(lo <= mean) and np.all(mean <= hi)


def test_seeds_whose_wall_times_do_not_overlap_still_draw_both_panels():
    """Seeds run one after another (one compiling longer) share env steps but not wall seconds: the env-steps
    panel draws their band, the wall-time panel each seed's own curve (it used to be blank)."""
    import matplotlib.pyplot as plt

    steps = np.array([8.0, 16.0, 24.0])
    early = plot.RunLog("s0", {"env_steps": steps, "wall_time_s": np.array([1.0, 2.0, 3.0]),
                               "return_mean": np.array([10.0, 20.0, 30.0])}, {"seed": 0})
    late = plot.RunLog("s1", {"env_steps": steps, "wall_time_s": np.array([5.0, 6.0, 7.0]),
                              "return_mean": np.array([12.0, 22.0, 32.0])}, {"seed": 1})
    assert plot.seed_band([early, late], "wall_time_s") is None
    fig, (ax_steps, ax_wall) = plt.subplots(1, 2)
    assert plot.draw_group(ax_steps, [early, late], "env_steps", "C0", "g") == 1
    assert plot.draw_group(ax_wall, [early, late], "wall_time_s", "C0", "g") == 2
    assert [len(line.get_xdata()) for line in ax_wall.lines] == [3, 3]
    np.testing.assert_allclose(ax_steps.lines[0].get_ydata()[[0, -1]], [11.0, 31.0])
    plt.close(fig)


def test_plot_cli_errors_exit_2_with_one_line(tmp_path, capsys):
    assert plot.main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such folder" in err and str(tmp_path / "missing") in err
    assert plot.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no metrics.csv" in err
    with pytest.raises(SystemExit) as exc:
        plot.main(["--help"])
    assert exc.value.code == 0 and "RUN_DIR" in capsys.readouterr().out


def test_wandb_failure_warns_and_training_logs_go_on(tmp_path, monkeypatch, capsys):
    def init(**kwargs):
        raise RuntimeError("api_key not configured (no-tty)")

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    monitor = Monitor(str(tmp_path), 100, progress=False, wandb={"project": "p"})
    monitor.log(1, {"loss": 1.0})
    monitor.log(2, {"loss": 0.5})
    monitor.close()
    err = capsys.readouterr().err
    assert err.count("W&B logging is off") == 1 and "api_key not configured" in err
    assert [r["update"] for r in read_jsonl(tmp_path)] == [1, 2]


def test_the_anakin_loops_fused_program_is_a_stage_of_its_own_in_the_plots(tmp_path):
    """An Anakin run times its one fused program as a whole (time_fused_wait_s; its stages stay 0): the time
    breakdown shows it as its own segment instead of leaving it in 'other', and curves.png draws it."""
    anakin = plot.RunLog("anakin", {"time_actor_s": np.array([0.0, 0.0]), "time_fused_wait_s": np.array([1.0, 2.5]),
                                    "wall_time_s": np.array([3.0, 5.0])}, None)
    seconds = plot.stage_seconds(anakin)
    assert seconds["fused_wait"] == 2.5 and seconds["actor"] == seconds["learner"] == 0.0
    assert [label for label, fn in plot.SEGMENTS if fn(seconds) > 0] == [
        "fused program (actor + learner + compression)"]
    drawn = []
    monitor = Monitor(str(tmp_path), 100, progress=False)
    for update, fused in ((1, 1.0), (2, 2.5)):
        monitor.log(update, {"time_actor_s": 0.0, "time_learner_s": 0.0, "time_compress_s": 0.0,
                             "time_fused_wait_s": fused})
    import matplotlib.axes

    original = matplotlib.axes.Axes.plot

    def recording_plot(self, *args, label=None, **kwargs):
        drawn.append(label)
        return original(self, *args, label=label, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(matplotlib.axes.Axes, "plot", recording_plot)
        assert os.path.basename(monitor.plot("t")) == "curves.png"
    monitor.close()
    assert "fused program (actor + learner + compression)" in drawn
    assert not {"actor", "learner", "compress"} & set(drawn)  # stages that stayed 0 are not drawn


def test_a_nonfinite_episode_return_is_counted_apart_not_averaged(tmp_path):
    from accerl_jax.monitor import Monitor

    monitor = Monitor(str(tmp_path), total_steps=16, progress=False)
    returns = np.array([[3.0, np.nan, 5.0, np.inf]])
    monitor.record_episodes(returns, np.ones((1, 4), bool), 8, episode_length=np.full((1, 4), 2))
    assert monitor.episodes == 4 and monitor.episodes_nonfinite == 2
    assert monitor.return_mean == 4.0 and monitor.length_mean == 2.0
    assert monitor.state_dict()["episodes_nonfinite"] == 2
    monitor.close()


def test_curves_draw_the_kl_from_zero_even_when_rounding_puts_it_below():
    """KL(π ‖ μ) ≥ 0; float32 rounding can log two equal policies' KL a few 1e-9 below 0, which a symlog
    axis drew with negative ticks."""
    from accerl_jax.monitor.plots import curves_figure

    rows = [{"env_steps": 256 * (i + 1), "return_mean": 10.0 + i, "time_fused_wait_s": 0.1 * i,
             "kl_learner_actor": kl} for i, kl in enumerate([-2.9e-9, 0.0, 3e-4, float("nan"), 1e-2])]
    kl_axes = curves_figure(rows, "t").axes[2]
    kl_axes.figure.canvas.draw()
    assert kl_axes.get_ylim()[0] == 0.0
    assert min(t for t in kl_axes.get_yticks() if kl_axes.get_ylim()[0] <= t <= kl_axes.get_ylim()[1]) >= 0


def test_tensorboard_events_are_written_in_the_callers_thread_and_flushed_while_running(tmp_path, monkeypatch):
    """No writer thread or queue (they took the CPU from the Anakin program beside them), and rows reach the
    file while the run goes on, flushed as metrics.csv is (every FLUSH_EVERY_S seconds; 0 here: every row)."""
    import threading

    from accerl_jax.monitor import files
    from accerl_jax.monitor.tensorboard_sink import TensorBoardSink

    monkeypatch.setattr(files, "FLUSH_EVERY_S", 0.0)
    before = threading.active_count()
    sink = TensorBoardSink(str(tmp_path))
    sink.write({"update": 1, "loss": 0.5, "return_mean": float("inf")}, 8)
    sink.add_text("auto/decision", "kept none", 8)
    assert threading.active_count() == before
    # Flushed before close; inf not written; the text as tensorboardX's text plugin tags it.
    expected = {"losses/loss": [(8, 0.5)], "auto/decision/text_summary": [(8, 0.0)]}
    assert read_tensorboard(str(tmp_path)) == expected
    sink.close()
    sink.close()  # a second close does nothing
    assert read_tensorboard(str(tmp_path)) == expected


def test_a_checkpoints_flush_puts_the_tensorboard_rows_on_disk(tmp_path, monkeypatch):
    from accerl_jax.monitor import files

    monkeypatch.setattr(files, "FLUSH_EVERY_S", 3600.0)  # no timed flush during the test
    monitor = Monitor(str(tmp_path), 1000, progress=False)
    monitor.log(1, {"loss": 0.5})
    assert "losses/loss" not in read_tensorboard(str(tmp_path))  # buffered
    monitor.flush()  # what the driver calls before each checkpoint
    assert read_tensorboard(str(tmp_path))["losses/loss"] == [(0, 0.5)]
    monitor.close()


def test_progress_bar_rate_is_the_rate_since_its_previous_move(tmp_path):
    """The bar shows what training runs at now (as the summary's 'training only' rate), not the mean since
    the start with compilation in it: 100 steps in the first 10 s (compiling), then 400 in 2 s."""
    import time

    monitor = Monitor(str(tmp_path / "run"), 1000, progress=True)
    moves = []
    monitor._console.update = lambda **fields: moves.append(fields)
    monitor.start = time.perf_counter() - 10.0
    monitor.record_steps(100)
    monitor.progress()
    monitor.start -= 2.0  # two more seconds have passed
    monitor.record_steps(400)
    monitor.progress()
    monitor._console.update = lambda **fields: None
    monitor.close()
    assert moves[0]["sps"] == pytest.approx(10.0, rel=0.02)  # the first move: the mean so far
    assert moves[1]["sps"] == pytest.approx(200.0, rel=0.02) and moves[1]["completed"] == 500
