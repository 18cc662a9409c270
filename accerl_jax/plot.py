"""Plots of one or several runs from their logs: ``python -m accerl_jax.plot RUN_DIR [RUN_DIR ...] [--out DIR]``.

Reads each run folder's ``metrics.csv`` (and ``summary.json``, when the run has finished, for its
configuration) and writes three PNG files (matplotlib) into ``--out`` (default: the run folder for one
run, ``plots/`` for several):

* ``returns.png``: the recent mean episode return, one column of panels per env (each with its own y
  axis), against env steps above and wall time below. Runs whose configurations differ only by ``--seed``
  (and by how they were run: log folder, progress, ...) form one group, drawn as the mean over seeds with
  the min-max spread shaded, on the steps (or seconds) all of its seeds reached. A group's label is the
  setting that tells it from the other groups of its env, as its flag (``--lambda 0.9``; two at most),
  else its folder's name, then how many seeds it holds.
* ``time_breakdown.png``: where the time went, one stacked bar per run: the cumulative seconds of each
  Monitor stage (:data:`accerl_jax.monitor.STAGES`; the actor's share split into env stepping and
  inference, compression into distillation and the rest) and the wall time left over. In pipelined
  loops stages overlap, so a bar may be longer than the wall time (marked).
* ``divergence.png``: how far the actor's (compressed, stale) policy μ is from the learner's π over
  training: KL(π ‖ μ), greedy-action agreement, mean |log ρ| and the fraction of ratios clipped at ρ̄.

Each figure has one legend, beside its panels (constrained layout fits it into the figure).

The command line is parsed as evaluate's and export's are (:class:`Args`, tyro). Bad input (an unknown flag, a
missing folder, a folder without ``metrics.csv`` or with no row in it) exits with status 2 and a one-line
message.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
import sys
from typing import Annotated, Optional

import numpy as np
import tyro

from accerl_jax.run.checkpoint import RUN_CONTROL_FIELDS
from accerl_jax.config import flag
from accerl_jax.monitor import STAGES

# Config fields that do not change what a run computes, and the seed: runs differing only in these group.
IGNORED_FIELDS = RUN_CONTROL_FIELDS | {"seed"}
# Stacked-bar segments: (label, function of the last row's cumulative stage seconds).
SEGMENTS = (
    ("env stepping", lambda t: t["env"]),
    ("policy inference", lambda t: t["inference"]),
    ("actor (other)", lambda t: max(t["actor"] - t["env"] - t["inference"], 0.0)),
    ("transfer", lambda t: t["transfer"]),
    ("queue wait", lambda t: t["queue_wait"]),
    ("learner", lambda t: t["learner"]),
    ("distillation", lambda t: t["distill"]),
    ("compression (other)", lambda t: max(t["compress"] - t["distill"], 0.0)),
    # The Anakin loop: actor, learner and compression in one program, timed as the host's wait for it.
    ("fused program (actor + learner + compression)", lambda t: t["fused_wait"]),
)
DPI = 90  # of the PNG files
GRID_POINTS = 200  # points of the common x grid on which a group's seeds are averaged
MIN_SHARED_RANGE = 0.5  # seeds form a band where the x range they share is >= this share of the range they span
MAX_LABEL_SETTINGS = 2  # a group differing from the others of its env in more settings is labelled by its folder
NO_RETURN = "no episode finished yet"  # a group (or panel) without a finite return_mean
UNKNOWN_ENV = "env unknown (no summary.json yet)"  # the panel of runs that have not finished
SEED_SUFFIX = re.compile(r"(^|[-_.])(s|seed)?[-_.]*$")  # 'quickstart-s' (the common start of -s0, -s1) -> 'quickstart'


class PlotError(ValueError):
    """A run folder cannot be plotted; the message names it and why."""


@dataclasses.dataclass
class RunLog:
    """One run's logs: ``columns`` maps each metrics.csv column to a float64 array over logged rows (NaN for
    empty cells); ``config`` is summary.json's configuration (None while the run has no summary)."""

    path: str
    columns: dict
    config: dict | None

    @property
    def name(self) -> str:
        return os.path.basename(os.path.normpath(self.path))

    def get(self, key: str) -> np.ndarray | None:
        return self.columns.get(key)


def load_run(path: str) -> RunLog:
    """Read ``<path>/metrics.csv`` (and ``summary.json`` if present).

    Raises:
      PlotError: if ``path`` is not a folder, has no ``metrics.csv``, or the file has no logged row.
    """
    if not os.path.isdir(path):
        raise PlotError(f"bad RUN_DIR {path!r}: no such folder")
    csv_path = os.path.join(path, "metrics.csv")
    if not os.path.isfile(csv_path):
        raise PlotError(f"bad RUN_DIR {path!r}: it has no metrics.csv (not a run folder, or the run has not "
                        "logged yet)")
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise PlotError(f"bad RUN_DIR {path!r}: metrics.csv has no rows yet (the run has not logged an update)")

    def number(v):
        try:
            return float(v)
        except (TypeError, ValueError):
            return float("nan")

    columns = {k: np.array([number(r.get(k)) for r in rows]) for k in rows[0]}
    config = None
    summary_path = os.path.join(path, "summary.json")
    if os.path.isfile(summary_path):
        with open(summary_path) as f:
            config = json.load(f).get("config")
    return RunLog(path, columns, config)


def env_of(run: RunLog) -> str:
    """The run's ``--env`` (from summary.json), or :data:`UNKNOWN_ENV` for a run without a summary yet."""
    return str(run.config.get("env", UNKNOWN_ENV)) if run.config is not None else UNKNOWN_ENV


def flag_value(field: str, value) -> str:
    """One setting as a command line gives it: ``lambda_``, 0.9 -> ``--lambda 0.9``; ``anneal_lr``, False ->
    ``--no-anneal-lr``; ``hidden_sizes``, [64, 64] -> ``--hidden-sizes 64 64``; None -> ``--<flag> unset``."""
    name = flag(field)
    if isinstance(value, bool):
        return name if value else "--no-" + name[2:]
    if isinstance(value, (list, tuple)):
        return f"{name} {' '.join(str(v) for v in value)}".rstrip()
    return f"{name} {'unset' if value is None else value}"


def folder_label(members: list[RunLog]) -> str:
    """A group's name from its folders: one run's folder name; for several, the start their names share
    without a trailing seed marker (``quickstart-s0``, ``quickstart-s1`` -> ``quickstart``); for ``seed0``,
    ``seed1`` ... (a ``--num-seeds`` run's) the folder that holds them; else the names (up to 3 short ones) or
    the first and how many more."""
    names = [run.name for run in members]
    if len(names) == 1:
        return names[0]
    stem = SEED_SUFFIX.sub("", os.path.commonprefix(names))
    if stem:
        return stem
    parents = {os.path.basename(os.path.dirname(os.path.normpath(run.path))) for run in members}
    if all(re.fullmatch(r"seed\d+", name) for name in names) and len(parents) == 1 and "" not in parents:
        return parents.pop()
    return ", ".join(names) if len(names) <= 3 and sum(map(len, names)) <= 40 else f"{names[0]} +{len(names) - 1} more"


def seeds_note(members: list[RunLog]) -> str:
    """`` (3 seeds)`` for a group of runs with distinct ``--seed``; `` (2 runs, seed 0)`` for repeats of one
    seed; empty for one run."""
    n = len(members)
    if n == 1:
        return ""
    seeds = {None if run.config is None else run.config.get("seed") for run in members}
    if len(seeds) == n:
        return f" ({n} seeds)"
    if len(seeds) == 1:
        return f" ({n} runs, seed {seeds.pop()})"
    return f" ({n} runs, {len(seeds)} seeds)"


def group_runs(runs: list[RunLog]) -> list[tuple[str, list[RunLog]]]:
    """Group runs that differ only in :data:`IGNORED_FIELDS` (seeds, folders, logging) and label each group
    for the legend, by the settings that tell it from the other groups of its env (envs are panels of their
    own): those settings as flags (``--lambda 0.9``, ``--compressor none``) where at most
    :data:`MAX_LABEL_SETTINGS` differ, else (and for a group alone in its env, or a run without a
    summary.json yet) its folder name (:func:`folder_label`); then how many seeds (:func:`seeds_note`).

    Returns:
      ``(label, runs)`` per group, in order of first appearance; every group's runs share one env.
    """
    groups: dict = {}
    for run in runs:
        key = (("path", run.path),) if run.config is None else tuple(
            sorted((k, json.dumps(v, sort_keys=True)) for k, v in run.config.items() if k not in IGNORED_FIELDS))
        groups.setdefault(key, []).append(run)
    keyed = [dict(k) for k in groups]
    envs = [env_of(members[0]) for members in groups.values()]
    labelled = []
    for key, env, members in zip(keyed, envs, groups.values()):
        rivals = [k for k, e in zip(keyed, envs) if e == env and "path" not in k]
        varying = [f for f in sorted({f for k in rivals for f in k})
                   if f != "env" and len({k.get(f) for k in rivals}) > 1]
        if "path" in key or len(rivals) < 2 or not varying or len(varying) > MAX_LABEL_SETTINGS:
            label = folder_label(members)
        else:
            label = " ".join(flag_value(f, json.loads(key[f])) if f in key else f"{flag(f)} unset" for f in varying)
        labelled.append((label + seeds_note(members), members))
    return labelled


def _finite_curves(members: list[RunLog], x_key: str, y_key: str):
    """Each run's finite ``(x, y)`` points; None if some run has no finite point yet."""
    curves = []
    for run in members:
        x, y = run.get(x_key), run.get(y_key)
        if x is None or y is None:
            return None
        ok = np.isfinite(x) & np.isfinite(y)
        if not ok.any():
            return None
        curves.append((x[ok], y[ok]))
    return curves


def seed_band(members: list[RunLog], x_key: str, y_key: str = "return_mean"):
    """Mean and min/max of ``y_key`` over the runs in ``members``, linearly interpolated onto a common grid
    of ``x_key`` from the largest first to the smallest final x any of them reached. Returns ``(x, mean,
    lo, hi)``; None if some run has no finite ``y_key`` yet or the range the runs share is less than
    :data:`MIN_SHARED_RANGE` of the range they span together (e.g. wall times of seeds run one after
    another, one of them compiling longer: a band there would average one seed's start with another's end)."""
    curves = _finite_curves(members, x_key, y_key)
    if curves is None:
        return None
    start = max(c[0][0] for c in curves)
    stop = min(c[0][-1] for c in curves)
    span = max(c[0][-1] for c in curves) - min(c[0][0] for c in curves)
    if len(curves) > 1 and not (stop > start and stop - start >= MIN_SHARED_RANGE * span):
        return None
    grid = np.linspace(start, stop, GRID_POINTS) if stop > start else np.array([stop])
    ys = np.stack([np.interp(grid, cx, cy) for cx, cy in curves])
    return grid, ys.mean(0), ys.min(0), ys.max(0)


def draw_group(ax, members: list[RunLog], x_key: str, color: str, label: str, y_key: str = "return_mean") -> int:
    """Draw one group on ``ax``: the mean over its runs with a min-max band (:func:`seed_band`), or, where
    their ``x_key`` ranges overlap too little for a band, each run's own curve (thin, the first one labelled). Returns
    the number of lines drawn (0 while a run has nothing to draw)."""
    band = seed_band(members, x_key, y_key)
    if band is not None:
        x, mean, lo, hi = band
        ax.plot(x, mean, color=color, label=label)
        if len(members) > 1:
            ax.fill_between(x, lo, hi, color=color, alpha=0.2, linewidth=0)
        return 1
    curves = _finite_curves(members, x_key, y_key)
    for k, (x, y) in enumerate(curves or []):
        ax.plot(x, y, color=color, linewidth=0.8, label=f"{label} (each seed: ranges differ)" if k == 0 else None)
    return len(curves or [])


def returns_figure(groups):
    """The figure of ``returns.png``: one column of panels per env (in order of first appearance), the
    return against env steps above and against wall time below, one line per group (mean over its seeds,
    min-max band; :func:`draw_group`) in one colour across panels, and one legend for the figure, to the
    right of the panels (constrained layout keeps it off every axes)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter

    envs = list(dict.fromkeys(env_of(members[0]) for _, members in groups))
    fig = Figure(figsize=(1.5 + 4.2 * len(envs), 6.4), dpi=DPI, layout="constrained")
    axes = fig.subplots(2, len(envs), squeeze=False)
    for i, (label, members) in enumerate(groups):
        column = envs.index(env_of(members[0]))
        for ax, x_key in zip(axes[:, column], ("env_steps", "wall_time_s")):
            if not draw_group(ax, members, x_key, f"C{i % 10}", label) and x_key == "env_steps":
                ax.plot([], [], color=f"C{i % 10}", label=f"{label}: {NO_RETURN}")  # named in the legend all the same
    for column, env in enumerate(envs):
        top, bottom = axes[:, column]
        top.set(title=env, xlabel="env steps")
        bottom.set(xlabel="wall time (s, incl. compile)")
        top.xaxis.set_major_formatter(EngFormatter(sep=""))  # 200k, not 200000
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
            if not any(len(line.get_xdata()) for line in ax.lines):
                ax.set(xticks=[], yticks=[])
                ax.text(0.5, 0.5, NO_RETURN, ha="center", va="center", transform=ax.transAxes)
    axes[0, 0].set_ylabel("episode return (recent mean)")
    axes[1, 0].set_ylabel("episode return (recent mean)")
    handles, labels = [], []
    for ax in axes[0]:  # each group's line once (a group draws in its env's column only)
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.append(handle)
            labels.append(label)
    if handles:
        seeds = any(len(members) > 1 for _, members in groups)
        fig.legend(handles, labels, loc="outside right upper", fontsize=8, title_fontsize=8,
                   title="line: mean over seeds; band: min-max" if seeds else None)
    return fig


def plot_returns(groups, out: str) -> str:
    """``returns.png`` (:func:`returns_figure`)."""
    return _save(returns_figure(groups), out, "returns.png")


def stage_seconds(run: RunLog) -> dict:
    """The last row's cumulative seconds per Monitor stage and of the Anakin loop's fused program
    (``fused_wait``; 0 for a stage the run did not log)."""
    return {s: float(np.nan_to_num(run.get(f"time_{s}_s")[-1])) if run.get(f"time_{s}_s") is not None else 0.0
            for s in (*STAGES, "fused_wait")}


def time_figure(runs: list[RunLog]):
    """The figure of ``time_breakdown.png``: one horizontal stacked bar of stage seconds per run (labelled by
    its folder), wall time marked, the legend below the bars."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 2.4 + 0.5 * len(runs)), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    names = [run.name for run in runs]
    left = np.zeros(len(runs))
    times = [stage_seconds(run) for run in runs]
    walls = np.array([float(run.get("wall_time_s")[-1]) for run in runs])
    for i, (label, fn) in enumerate(SEGMENTS):
        width = np.array([fn(t) for t in times])
        if width.any():
            ax.barh(names, width, left=left, color=f"C{i}", label=label)
            left += width
    rest = np.maximum(walls - left, 0.0)
    ax.barh(names, rest, left=left, color="lightgray", label="other (compile, logging, ...)")
    ax.scatter(walls, names, marker="|", s=400, color="black", label="wall time", zorder=3)
    ax.set(title="where the time went (cumulative seconds per stage; pipelined stages overlap)", xlabel="seconds")
    ax.invert_yaxis()
    fig.legend(*ax.get_legend_handles_labels(), fontsize=8, loc="outside lower center", ncols=4, markerscale=0.4)
    return fig


def plot_time(runs: list[RunLog], out: str) -> str:
    """``time_breakdown.png`` (:func:`time_figure`)."""
    return _save(time_figure(runs), out, "time_breakdown.png")


def divergence_figure(runs: list[RunLog]):
    """The figure of ``divergence.png``: KL(π ‖ μ), agreement, mean |log ρ| and the share of Σρ clipping
    removes against env steps, one line per run (labelled by its folder), one legend right of the panels.

    KL is drawn at least 0 (symlog scale, linear below 1e-6): a KL estimate can come out a few 1e-9 below 0
    from float32 rounding when both policies are the same, which is 0."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter

    panels = (("kl_learner_actor", "KL(π_learner ‖ μ_actor) (nats)"), ("action_agreement", "greedy-action agreement"),
              ("abs_log_rho_mean", "mean |log ρ| over valid steps"),
              ("rho_clipped_mass", "share of Σρ removed by clipping at ρ̄"))
    fig = Figure(figsize=(12, 7), dpi=DPI, layout="constrained")
    axes = fig.subplots(2, 2)
    handles = {}
    for ax, (key, title) in zip(axes.flat, panels):
        for i, run in enumerate(runs):
            y = run.get(key)
            if y is not None and np.isfinite(y).any():
                if key == "kl_learner_actor":
                    y = np.maximum(y, 0.0)  # NaN stays NaN
                (line,) = ax.plot(run.get("env_steps"), y, color=f"C{i % 10}")
                handles.setdefault(run.name, line)
        ax.set(title=title, xlabel="env steps")
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        if key == "kl_learner_actor":
            ax.set_yscale("symlog", linthresh=1e-6)
            ax.set_ylim(bottom=0.0)
        if not ax.lines:
            ax.text(0.5, 0.5, "not logged by these runs", ha="center", va="center", transform=ax.transAxes)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside right upper", fontsize=8)
    return fig


def plot_divergence(runs: list[RunLog], out: str) -> str:
    """``divergence.png`` (:func:`divergence_figure`)."""
    return _save(divergence_figure(runs), out, "divergence.png")


def _save(fig, out: str, name: str) -> str:
    """Write ``fig`` as ``out/name`` (PNG at its own :data:`DPI`; constrained layout has fitted everything,
    legends included, into the figure); returns the path."""
    path = os.path.join(out, name)
    fig.savefig(path)
    return path


def plot_runs(run_dirs: list[str], out: str | None = None) -> list[str]:
    """Draw ``returns.png``, ``time_breakdown.png`` and ``divergence.png`` for ``run_dirs`` into ``out``
    (default: the run folder for one run, ``plots`` for several; created if missing).

    Returns:
      the paths of the three PNG files.

    Raises:
      PlotError: for a missing folder, one without ``metrics.csv`` or with no row, or an ``out`` that is a file.
    """
    if not run_dirs:
        raise PlotError("no RUN_DIR given; pass one or more run folders")
    runs = [load_run(p) for p in run_dirs]
    out = out if out is not None else (run_dirs[0] if len(run_dirs) == 1 else "plots")
    if os.path.exists(out) and not os.path.isdir(out):
        raise PlotError(f"bad --out {out!r}: it is a file; expected a folder")
    os.makedirs(out, exist_ok=True)
    return [plot_returns(group_runs(runs), out), plot_time(runs, out), plot_divergence(runs, out)]


@dataclasses.dataclass
class Args:
    """Plot run folders' logs as PNG files: returns (a panel per env), time breakdown, actor divergence."""

    run_dirs: Annotated[tyro.conf.Positional[list[str]], tyro.conf.arg(metavar="RUN_DIR", help_behavior_hint="(one or more)")]
    """Run folders (each with metrics.csv; summary.json, once the run has finished, for its settings)."""
    out: Annotated[Optional[str], tyro.conf.arg(metavar="DIR", help_behavior_hint=(
        "(default: unset: the run folder for one run, 'plots' for several)"))] = None
    """Output folder (created if missing)."""


def main(argv: list[str] | None = None) -> int:
    from accerl_jax.tools import cli
    from accerl_jax.config import ConfigError

    try:
        args = cli.parse_args(Args, argv, "python -m accerl_jax.plot")
        paths = plot_runs(args.run_dirs, args.out)
    except (ConfigError, PlotError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
