"""``python -m accerl_jax.plot`` on synthetic run folders (a metrics.csv and a summary.json each, no training):
one panel per env, short legend labels in the command line's flag names, legends beside the axes (never on
a curve), seed counts that count seeds, and a KL axis without negative ticks."""
from __future__ import annotations

import csv
import dataclasses
import json
import warnings

import numpy as np
import pytest

from accerl_jax import plot
from accerl_jax.config import Config


def write_run(folder, returns, kl=None, **settings):
    """A finished run's folder: metrics.csv (update, env_steps, wall_time_s, return_mean, a stage time and,
    given ``kl``, kl_learner_actor per row) and summary.json holding Config(**settings) as a run writes it."""
    folder.mkdir(parents=True)
    n = len(returns)
    rows = {"update": np.arange(1, n + 1) * 10, "env_steps": np.arange(1, n + 1) * 2560.0,
            "wall_time_s": 2.0 + np.arange(n) * 0.5, "return_mean": returns,
            "time_fused_wait_s": np.arange(n) * 0.3}
    if kl is not None:
        rows["kl_learner_actor"] = kl
    with open(folder / "metrics.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(rows)
        writer.writerows(zip(*rows.values()))
    config = dataclasses.asdict(Config(logdir=str(folder), **settings))
    with open(folder / "summary.json", "w") as f:
        json.dump({"config": config}, f)
    return str(folder)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """MinAtar runs of two --lambda values, two seeds each (returns 0-4); a MuJoCo run differing in many
    settings (returns near -300); a CartPole run twice with seed 0."""
    tmp_path = tmp_path_factory.mktemp("runs")
    ramp = np.linspace(0.0, 1.0, 12)
    minatar = dict(env="gymnax:Breakout-MinAtar", learning_rate=5e-4, epochs=4)
    return [
        write_run(tmp_path / "minatar-lam95-s0", 4 * ramp, lambda_=0.95, seed=0, **minatar),
        write_run(tmp_path / "minatar-lam95-s1", 3 * ramp, lambda_=0.95, seed=1, **minatar),
        write_run(tmp_path / "minatar-lam1-s0", 2 * ramp, lambda_=1.0, seed=0, **minatar),
        write_run(tmp_path / "minatar-lam1-s1", 1 * ramp, lambda_=1.0, seed=1, **minatar),
        write_run(tmp_path / "mujoco", -300 + 50 * ramp, kl=np.r_[-2.94e-9, np.full(11, 1e-3)],
                  env="envpool:HalfCheetah-v4", lambda_=0.95, epochs=10, minibatches=4, num_envs=8,
                  learning_rate=3e-4, compressor="distill:small"),
        write_run(tmp_path / "cartpole-a", 500 * ramp, seed=0),
        write_run(tmp_path / "cartpole-b", 500 * ramp, seed=0),
    ]


@pytest.fixture(scope="module")
def plotted(folders, tmp_path_factory):
    """``plot.plot_runs(folders)``: the PNG paths, each figure as it was saved (by file name), the warnings."""
    figures = {}
    save = plot._save

    def keep(fig, out, name):
        figures[name] = fig
        return save(fig, out, name)

    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings(record=True) as caught:
        mp.setattr(plot, "_save", keep)
        warnings.simplefilter("always")
        paths = plot.plot_runs(folders, str(tmp_path_factory.mktemp("plots")))
    return paths, figures, [str(w.message) for w in caught]


def assert_legend_beside_axes(fig):
    """The figure's one legend overlaps no axes' data area (each axes' own rectangle, in display pixels, as
    the figure was last drawn)."""
    assert len(fig.legends) == 1 and not any(ax.get_legend() for ax in fig.axes)
    legend = fig.legends[0].get_window_extent()
    for ax in fig.axes:
        assert not legend.overlaps(ax.get_window_extent()), (legend, ax.get_window_extent(), ax.get_title())


def test_labels_are_short_and_in_flag_names(folders):
    labels = [label for label, _ in plot.group_runs([plot.load_run(f) for f in folders])]
    # MinAtar: only --lambda differs between its groups; MuJoCo is alone in its env (its folder's name);
    # CartPole's two runs share seed 0: two runs of one seed, not "2 seeds".
    assert labels == ["--lambda 0.95 (2 seeds)", "--lambda 1.0 (2 seeds)", "mujoco", "cartpole (2 runs, seed 0)"]
    assert not any("=" in label or "lambda_" in label or "epochs" in label for label in labels)


def test_folder_labels_drop_the_seed_marker_and_settings_show_as_flags(tmp_path):
    run = lambda name: plot.RunLog(str(tmp_path / name), {}, None)  # noqa: E731
    assert plot.folder_label([run("quickstart-s0"), run("quickstart-s1")]) == "quickstart"
    assert plot.folder_label([run("big/seed0"), run("big/seed1")]) == "big"  # a --num-seeds run's folders
    assert plot.folder_label([run("a-x"), run("b-y")]) == "a-x, b-y"
    assert plot.folder_label([run(f"{k}-{'x' * 12}") for k in "abcd"]) == f"a-{'x' * 12} +3 more"
    assert plot.folder_label([run("ppos0"), run("ppos1")]) == "ppos"  # an 's' ends a word here, no seed marker
    assert [plot.flag_value(*kv) for kv in (("lambda_", 0.9), ("anneal_lr", False), ("hidden_sizes", [64, 64]),
                                             ("wandb_project", None), ("num_envs", 8))] == [
        "--lambda 0.9", "--no-anneal-lr", "--hidden-sizes 64 64", "--wandb-project unset", "--num-envs 8"]


def test_returns_has_one_panel_per_env_and_a_legend_beside_them(folders, plotted):
    groups = plot.group_runs([plot.load_run(f) for f in folders])
    fig = plotted[1]["returns.png"]
    envs = ["gymnax:Breakout-MinAtar", "envpool:HalfCheetah-v4", "gymnax:CartPole-v1"]
    top, bottom = np.asarray(fig.axes).reshape(2, 3)  # fig.subplots(2, n_envs): row 0 env steps, row 1 wall time
    assert [ax.get_title() for ax in top] == envs
    assert [ax.get_xlabel() for ax in top] == ["env steps"] * 3
    assert all(ax.get_xlabel().startswith("wall time") for ax in bottom)
    # Each env's groups in its own column: MinAtar's two, MuJoCo's one, CartPole's one; and a y range each.
    assert [len(ax.lines) for ax in top] == [2, 1, 1]
    minatar, mujoco, cartpole = (ax.get_ylim() for ax in top)
    assert minatar[1] < 10 and mujoco[0] < -250 and mujoco[1] < 0 and cartpole[1] > 400
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [label for label, _ in groups]


def test_plot_runs_writes_three_pngs_without_layout_warnings_and_legends_off_the_axes(plotted):
    paths, figures, caught = plotted
    assert not [w for w in caught if "layout" in w.lower()], caught
    assert [p.rsplit("/", 1)[-1] for p in paths] == list(figures) == ["returns.png", "time_breakdown.png",
                                                                         "divergence.png"]
    for path in paths:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    for fig in figures.values():
        assert_legend_beside_axes(fig)


def test_kl_is_drawn_at_least_zero_without_negative_ticks(plotted):
    """A KL estimate of -2.94e-9 (float32 rounding of two equal policies) is drawn as 0, on an axis from 0."""
    kl = plotted[1]["divergence.png"].axes[0]
    assert kl.get_yscale() == "symlog" and kl.get_ylim()[0] == 0.0
    assert len(kl.lines) == 1 and np.nanmin(kl.lines[0].get_ydata()) == 0.0
    low, high = kl.get_ylim()
    shown = [t for t in kl.get_yticks() if low <= t <= high]
    assert shown and min(shown) == 0.0


def test_seeds_sharing_a_sliver_of_wall_time_are_drawn_each_not_as_a_band():
    """Seed 0 compiled for 8 s, seed 1 loaded its programs from the cache: their wall times share 0.6 s of 12 s,
    where a band would average seed 1's start with seed 0's end; each seed gets its own curve there."""
    from matplotlib.figure import Figure

    steps = np.array([8.0, 16.0, 24.0])
    slow = plot.RunLog("s0", {"env_steps": steps, "wall_time_s": np.array([8.0, 12.0, 14.0]),
                              "return_mean": np.array([20.0, 400.0, 500.0])}, {"seed": 0})
    fast = plot.RunLog("s1", {"env_steps": steps, "wall_time_s": np.array([2.0, 5.0, 8.6]),
                              "return_mean": np.array([25.0, 380.0, 500.0])}, {"seed": 1})
    assert plot.seed_band([slow, fast], "wall_time_s") is None and plot.seed_band([slow, fast], "env_steps")
    ax_steps, ax_wall = Figure().subplots(1, 2)
    assert plot.draw_group(ax_steps, [slow, fast], "env_steps", "C0", "g") == 1
    assert plot.draw_group(ax_wall, [slow, fast], "wall_time_s", "C0", "g") == 2


def test_a_run_without_a_finished_episode_is_named_and_its_panel_says_so(tmp_path):
    """HalfCheetah's episodes last 1000 steps: a short run logs no return yet. Its panel says so and the
    legend still names it; the other env's panel draws as usual."""
    steps = np.array([2560.0, 5120.0])
    runs = [plot.RunLog(str(tmp_path / "halfcheetah"), {"env_steps": steps, "wall_time_s": np.array([1.0, 2.0]),
                                                        "return_mean": np.full(2, np.nan)},
                        {"env": "envpool:HalfCheetah-v4", "seed": 0}),
            plot.RunLog(str(tmp_path / "cartpole"), {"env_steps": steps, "wall_time_s": np.array([1.0, 2.0]),
                                                     "return_mean": np.array([20.0, 40.0])},
                        {"env": "gymnax:CartPole-v1", "seed": 0})]
    fig = plot.returns_figure(plot.group_runs(runs))
    cheetah, cartpole = fig.axes[:2]
    assert [t.get_text() for t in cheetah.texts] == [plot.NO_RETURN] and not cartpole.texts
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [f"halfcheetah: {plot.NO_RETURN}", "cartpole"]


def test_the_command_line_parses_like_evaluates_and_refuses_an_unknown_flag_in_one_line(folders, tmp_path, capsys):
    assert plot.main(["--outt", str(tmp_path), folders[0]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--outt" in err and "--out" in err
    assert plot.main([]) == 2 and "no RUN_DIR given" in capsys.readouterr().err
    assert plot.main([folders[5], folders[6], "--out", str(tmp_path / "o")]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "o" / name) for name in
                                               ("returns.png", "time_breakdown.png", "divergence.png")]


def test_a_run_without_summary_yet_is_labelled_by_its_folder_in_a_panel_of_its_own(tmp_path):
    steps = np.array([2560.0, 5120.0])
    columns = {"env_steps": steps, "wall_time_s": np.array([1.0, 2.0]), "return_mean": np.array([20.0, 40.0])}
    runs = [plot.RunLog(str(tmp_path / "running"), columns, None),
            plot.RunLog(str(tmp_path / "done"), columns, {"env": "gymnax:CartPole-v1", "seed": 0})]
    assert [label for label, _ in plot.group_runs(runs)] == ["running", "done"]
    fig = plot.returns_figure(plot.group_runs(runs))
    assert [ax.get_title() for ax in fig.axes[:2]] == [plot.UNKNOWN_ENV, "gymnax:CartPole-v1"]
