"""Plots of one or several runs from their logs: ``python -m accerl_jax.plot RUN_DIR [RUN_DIR ...] [--out DIR]``.

Reads each run folder's ``metrics.csv`` (and ``summary.json``, when the run has finished, for its
configuration) and writes three PNG files (matplotlib) into ``--out`` (default: the run folder for one
run, ``plots/`` for several):

* ``returns.png``: the recent mean episode return against env steps and against wall time. Runs whose
  configurations differ only by ``--seed`` (and by how they were run: log folder, progress, ...) form one
  group, drawn as the mean over seeds with the min-max spread shaded, on the steps (or seconds) all of its
  seeds reached; other runs are overlaid, labelled by the settings that differ between them.
* ``time_breakdown.png``: where the time went, one stacked bar per run: the cumulative seconds of each
  Monitor stage (:data:`accerl_jax.monitor.STAGES`; the actor's share split into env stepping and
  inference, compression into distillation and the rest) and the wall time left over. In pipelined
  loops stages overlap, so a bar may be longer than the wall time (marked).
* ``divergence.png``: how far the actor's (compressed, stale) policy μ is from the learner's π over
  training: KL(π ‖ μ), greedy-action agreement, mean |log ρ| and the fraction of ratios clipped at ρ̄.

Bad input (a missing folder, a folder without ``metrics.csv`` or with no row in it) exits with status 2
and a one-line message.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import sys

import numpy as np

from accerl_jax.checkpoint import RUN_CONTROL_FIELDS
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
GRID_POINTS = 200  # points of the common x grid on which a group's seeds are averaged


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


def group_runs(runs: list[RunLog]) -> list[tuple[str, list[RunLog]]]:
    """Group runs that differ only in :data:`IGNORED_FIELDS` (seeds); label each group by the settings that
    differ between groups (or env and compressor if there is one group). Runs without a summary are
    their own group, labelled by folder name. Order: first appearance."""
    groups: dict = {}
    for run in runs:
        key = (("path", run.path),) if run.config is None else tuple(
            sorted((k, json.dumps(v, sort_keys=True)) for k, v in run.config.items() if k not in IGNORED_FIELDS))
        groups.setdefault(key, []).append(run)
    keyed = [dict(k) for k in groups]
    varying = sorted({k for d in keyed for k in d if k != "path" and len({e.get(k) for e in keyed}) > 1})
    labelled = []
    for key, members in zip(keyed, groups.values()):
        if "path" in key:
            label = members[0].name
        else:
            fields = varying or ["env", "compressor"]
            label = " ".join(f"{k}={json.loads(key[k])}" for k in fields if k in key)
        if len(members) > 1:
            label += f" ({len(members)} seeds)"
        labelled.append((label, members))
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
    lo, hi)``; None if some run has no finite ``y_key`` yet or the runs' ``x_key`` ranges have less than
    two points in common (e.g. wall times of seeds run one after another, one of them compiling longer)."""
    curves = _finite_curves(members, x_key, y_key)
    if curves is None:
        return None
    start = max(c[0][0] for c in curves)
    stop = min(c[0][-1] for c in curves)
    if len(curves) > 1 and not stop > start:
        return None
    grid = np.linspace(start, stop, GRID_POINTS) if stop > start else np.array([stop])
    ys = np.stack([np.interp(grid, cx, cy) for cx, cy in curves])
    return grid, ys.mean(0), ys.min(0), ys.max(0)


def draw_group(ax, members: list[RunLog], x_key: str, color: str, label: str, y_key: str = "return_mean") -> int:
    """Draw one group on ``ax``: the mean over its runs with a min-max band (:func:`seed_band`), or, where
    their ``x_key`` ranges do not overlap, each run's own curve (thin, the first one labelled). Returns
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


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_returns(groups, out: str) -> str:
    """``returns.png``: return vs env steps and vs wall time, one line (mean, min-max band) per group."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for i, (label, members) in enumerate(groups):
        color = f"C{i % 10}"
        for ax, x_key in zip(axes, ("env_steps", "wall_time_s")):
            draw_group(ax, members, x_key, color, label)
    axes[0].set(title="episode return (recent mean; band: min-max over seeds)", xlabel="env steps", ylabel="return")
    axes[1].set(title="episode return against wall time", xlabel="wall time (s, incl. compile)")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    return _save(fig, out, "returns.png")


def stage_seconds(run: RunLog) -> dict:
    """The last row's cumulative seconds per Monitor stage and of the Anakin loop's fused program
    (``fused_wait``; 0 for a stage the run did not log)."""
    return {s: float(np.nan_to_num(run.get(f"time_{s}_s")[-1])) if run.get(f"time_{s}_s") is not None else 0.0
            for s in (*STAGES, "fused_wait")}


def plot_time(runs: list[RunLog], out: str) -> str:
    """``time_breakdown.png``: one horizontal stacked bar of stage seconds per run, wall time marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.5 * len(runs)))
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
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _save(fig, out, "time_breakdown.png", tight=False)  # the legend sits outside: bbox_inches fits it


def plot_divergence(runs: list[RunLog], out: str) -> str:
    """``divergence.png``: KL(π ‖ μ), agreement, mean |log ρ| and the share of Σρ clipping removes against env steps."""
    plt = _pyplot()
    panels = (("kl_learner_actor", "KL(π_learner ‖ μ_actor) (nats)"), ("action_agreement", "greedy-action agreement"),
              ("abs_log_rho_mean", "mean |log ρ| over valid steps"),
              ("rho_clipped_mass", "share of Σρ removed by clipping at ρ̄"))
    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    for ax, (key, title) in zip(axes.flat, panels):
        for i, run in enumerate(runs):
            y = run.get(key)
            if y is not None and np.isfinite(y).any():
                ax.plot(run.get("env_steps"), y, color=f"C{i % 10}", label=run.name)
        ax.set(title=title, xlabel="env steps")
        if key == "kl_learner_actor":
            ax.set_yscale("symlog", linthresh=1e-6)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged by these runs", ha="center", va="center", transform=ax.transAxes)
    return _save(fig, out, "divergence.png")


def _save(fig, out: str, name: str, tight: bool = True) -> str:
    import matplotlib.pyplot as plt

    if tight:
        fig.tight_layout()
    path = os.path.join(out, name)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m accerl_jax.plot",
        description="Plot learning curves (runs differing only by seed as mean and min-max spread), where the "
                    "time went, and the actor's divergence, from run folders' metrics.csv, as PNG files.")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run folders (each with metrics.csv)")
    parser.add_argument("--out", default=None, help="output folder (default: the run folder for one run, "
                                                    "'plots' for several)")
    args = parser.parse_args(argv)
    try:
        paths = plot_runs(args.run_dirs, args.out)
    except PlotError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
