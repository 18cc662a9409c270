"""The paper's two tables (AcceRL, arXiv 2211.15023), reproduced on the machine at hand.

For each environment (gymnax ``CartPole-v1``, ``Acrobot-v1``, ``Breakout-MinAtar``; envpool ``Pong-v5``
only with ``--with-pong``, actor-time table only), with the uncompressed baseline ``none`` in the same run:

1. **Actor-time table**: actor time per environment step (env stepping + policy inference) of each
   compression method and its reduction factor against ``none`` in its fastest XLA configuration,
   measured by ``experiments/actor_time.py`` (imported and called; its own JSON, markdown and bar chart
   are written beside this report). Fidelity (KL, agreement) is measured on the teacher: the training
   table's baseline run (seed 0), or, for an env without a training table (Pong), a policy that script
   trains for ``teacher_steps`` steps.
2. **Training-time table**: for the baseline, each method and ``auto``, over ``--seeds`` seeds, each run
   the real trainer (:func:`accerl_jax.loop.train`, in this process, runs interleaved seed by seed so
   machine noise is shared): the wall time to the first ``metrics.csv`` row whose ``return_mean`` (mean of
   the last 100 episodes) reaches the target, the final return at the fixed step budget, and the whole
   run's wall time to its last update (compilation included; with ``--compile-cache``, the default of
   ``--quick``, only seed 0 of each method compiles), each with its reduction in % against the baseline; and whether
   the method's mean final return is within the baseline's seed spread (≥ the lowest baseline seed). Beside
   each time-to-target reduction: the Amdahl ceiling from the runs' own ``summary.json`` cost split, the
   most any actor compression can cut from an update of the loop (seed 0 times each piece of an update
   alone after training, ``--cost-split``; the other seeds count their FLOPs).

Targets: CartPole 475 and Acrobot −100 (gymnasium's reward thresholds); Breakout-MinAtar 5.0, chosen because
the uncompressed learner reaches it on a 2-core CPU within the 200k-step budget (an untrained policy scores ~0.5),
not a published score (those come after millions of steps). A time to target is the median over seeds; when more than half the seeds miss, it is "not
reached" and no reduction is claimed.

Outputs (:func:`output_paths`), in ``--results-dir``, else beside ``--out``, else under
``experiments/results/<host tag>/`` (host tag e.g. ``cpu-2core``): the JSON (``--out``, else
``paper_tables[_quick].json``), the markdown report of the same name (both tables, the paper's figures matched
or not, the plots), ``training_<env>[_quick].png`` (return against wall time, mean over seeds) and the
actor-time files ``actor_time_<env>[_quick].{json,md,png}``. Nothing is written anywhere else.

Usage:
  python experiments/paper_tables.py --quick                      # a few minutes on a 2-core CPU
  python experiments/paper_tables.py --envs cartpole acrobot      # the full budgets (slow on a CPU)
  python experiments/paper_tables.py --with-pong                  # adds envpool Pong-v5's actor-time table
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import actor_time  # noqa: E402  (experiments/actor_time.py: the actor-time measurement, reused as is)

from accerl_jax.config import Config  # noqa: E402
from accerl_jax.loop import train  # noqa: E402
from accerl_jax.monitor import atomic_write_json  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
ISSUE_ACTOR_FACTOR = 4.13  # the paper's best actor-time reduction
ISSUE_TRAINING_PCT = 40.3  # the paper's best whole-training-time reduction (%)


@dataclasses.dataclass(frozen=True)
class EnvSetup:
    env: str
    target: float | None  # return to reach (None: actor-time table only)
    target_note: str
    train: dict  # Config fields of the training runs
    steps: int  # training budget (agent steps)
    actor_envs: int  # environments of the actor-time table
    teacher_steps: int  # agent steps of the actor-time table's teacher
    quick_steps: int
    quick_actor_envs: int
    quick_teacher_steps: int


ENVS = {  # full budgets: CartPole's default job solves it in 800k steps; Acrobot passed -100 at ~128k steps here
    "cartpole": EnvSetup("gymnax:CartPole-v1", 475.0, "gymnasium's reward threshold; the maximum is 500",
                         {"num_envs": 16, "rollout_length": 16}, 800_000, 1024, 200_000, 24_576, 128, 16_384),
    "acrobot": EnvSetup("gymnax:Acrobot-v1", -100.0, "gymnasium's reward threshold; an untrained policy scores -500",
                        {"num_envs": 16, "rollout_length": 16}, 250_000, 1024, 200_000, 24_576, 128, 16_384),
    "minatar": EnvSetup("gymnax:Breakout-MinAtar", 5.0,
                        "chosen: the uncompressed learner reaches it within 200k steps on a 2-core CPU; untrained ~0.5",
                        {"num_envs": 16, "rollout_length": 16}, 200_000, 1024, 150_000, 12_288, 64, 8_192),
    "pong": EnvSetup("envpool:Pong-v5", None, "actor-time table only (training to a target needs a GPU or hours)",
                     {"num_envs": 16, "rollout_length": 16}, 0, 16, 25_600, 0, 8, 2_048),
}
TRAIN_METHODS = ["none", "int8", "distill:tiny", "distill:small", "distill:small+int8", "prune:0.5+distill", "auto"]
QUICK_TRAIN_METHODS = ["none", "distill:tiny", "auto"]
ACTOR_METHODS = "none,mask:0.9,prune:0.5,int8,bf16,distill:tiny,distill:small,distill:small+int8,prune:0.5+distill"
QUICK_ACTOR_METHODS = "none,int8,distill:tiny"
QUICK_AUTO_CANDIDATES = "none,int8,distill:tiny"  # fewer candidates to compile in --quick


def machine_note(load: dict) -> str:
    """What the report says about the machine: its cores and the measured 1-minute load averages at the
    start and at the last save (this run's own jobs add about 1-2 on a CPU; more means other jobs ran)."""
    return (f"{os.cpu_count()} CPU cores, 1-min load average {load['start']:.1f} at the start and "
            f"{load['last']:.1f} at the end (this run alone adds ~1-2); ratios are from one process, side by side")


def host_tag() -> str:
    """``<backend>-<n>core`` on CPU (e.g. ``cpu-2core``), ``<backend>-<device kind>`` otherwise."""
    backend = jax.default_backend()
    if backend == "cpu":
        return f"cpu-{os.cpu_count()}core"
    return f"{backend}-{jax.devices()[0].device_kind}".lower().replace(" ", "_")


def read_curve(logdir: str) -> list[dict]:
    """``metrics.csv`` rows as ``{env_steps, wall_time_s, return_mean}`` (return NaN before any episode)."""
    with open(os.path.join(logdir, "metrics.csv"), newline="") as f:
        return [{"env_steps": int(float(r["env_steps"])), "wall_time_s": float(r["wall_time_s"]),
                 "return_mean": float(r["return_mean"]) if r["return_mean"] not in ("", "nan") else float("nan")}
                for r in csv.DictReader(f)]


def time_to_target(curve: list[dict], target: float) -> float | None:
    """Wall seconds of the first row with ``return_mean >= target`` (None if never)."""
    for row in curve:
        if np.isfinite(row["return_mean"]) and row["return_mean"] >= target:
            return row["wall_time_s"]
    return None


def save_teacher(params, info: dict, path: str) -> None:
    """Save learner ``params`` (orbax) where ``experiments/actor_time.py --checkpoint`` restores them, with
    ``info`` (the run's steps and return) beside them as ``<path>.json``."""
    import orbax.checkpoint as ocp

    ckpt = ocp.StandardCheckpointer()
    ckpt.save(os.path.abspath(path), params)
    ckpt.wait_until_finished()
    atomic_write_json(path.rstrip("/") + ".json", info)


def train_one(setup: EnvSetup, method: str, seed: int, steps: int, quick: bool, teacher_path: str | None = None) -> dict:
    """One training run; returns its final return, wall time, time to target and (thinned) curve.

    With ``teacher_path``, the trained learner parameters are saved there (:func:`save_teacher`).
    """
    extra = {}
    if method == "auto" and quick:
        extra = {"auto_candidates": QUICK_AUTO_CANDIDATES, "auto_every": 50}
    with tempfile.TemporaryDirectory() as tmp:
        # Seed 0 also times each piece of an update alone after training (--cost-split; every run counts
        # their FLOPs): the ceiling beside the reductions. Neither delays the rows a time to target is read from.
        cfg = Config(env=setup.env, compressor=method, total_steps=steps, seed=seed, log_every=5, progress=False,
                     logdir=os.path.join(tmp, "run"), checkpoint_every=0, cost_split=seed == 0, **setup.train, **extra)
        final: dict = {}
        summary = train(cfg, trained=final if teacher_path else None)
        curve = read_curve(cfg.logdir)
    if teacher_path:
        save_teacher(final["learner_params"], {
            "source": f"the training table's {method} run, seed {seed}", "total_env_steps": summary["total_env_steps"],
            "final_return_mean": summary["final_return_mean"], "num_envs": summary["num_envs"]}, teacher_path)
    ttt = time_to_target(curve, setup.target)
    keep = max(1, len(curve) // 100)
    run = {
        # Wall time to the last update's row: the run's final policy-speed measurement is not training.
        "seed": seed, "final_return": summary["final_return_mean"],
        "wall_time_s": curve[-1]["wall_time_s"] if curve else summary["wall_time_s"],
        "run_wall_time_s": summary["wall_time_s"],
        "time_to_target_s": ttt, "env_steps": summary["total_env_steps"],
        "actor_time_s": summary["actor_time_s"], "learner_time_s": summary["learner_time_s"],
        "compress_time_s": summary["compress_time_s"], "kl_learner_actor": summary["kl_learner_actor"],
        "actor_policy_speedup": summary["actor_policy_speedup"],
        **ceiling_of(summary),
        "curve": curve[::keep] + ([curve[-1]] if curve and (len(curve) - 1) % keep else []),
    }
    if method == "auto":
        run["auto_decisions"] = [{k: d[k] for k in ("update", "trigger", "chosen", "switched")}
                                 for d in summary["auto_decisions"]]
        run["auto_running"] = summary["auto_running"]
        run["auto_candidates"] = cfg.auto_candidates
        # Anakin loop only: host seconds in decisions, and the periodic evaluations skipped as having nothing to gain.
        run["auto_decide_s"] = summary.get("auto_decide_s")
        run["auto_skipped_evaluations"] = summary.get("auto_skipped_evaluations")
    return run


def ceiling_of(summary: dict) -> dict:
    """The run's own cost split (summary.json ``cost_split``): ``ceiling``, the largest fraction of an
    uncompressed update that any actor compression can save in this loop, and ``ceiling_source``
    (``"timed"``: each piece timed alone; ``"flops"``: XLA's FLOP counts); None when the run has none."""
    split = summary.get("cost_split") or {}
    return {"ceiling": split.get("ceiling"), "ceiling_source": split.get("ceiling_source"),
            "actor_share": split.get("actor_share")}


def row_ceiling(runs: list[dict]) -> tuple[float | None, str | None]:
    """A method's ceiling: the mean over its runs of the timed ones, where any run timed its pieces, else
    of the FLOPs ones; and which it is."""
    for source in ("timed", "flops"):
        values = [r["ceiling"] for r in runs if r.get("ceiling_source") == source and r.get("ceiling") is not None]
        if values:
            return float(np.mean(values)), source
    return None, None


def aggregate(runs: list[dict]) -> dict:
    finals = [r["final_return"] for r in runs if r["final_return"] is not None]
    ttts = [r["time_to_target_s"] if r["time_to_target_s"] is not None else float("inf") for r in runs]
    median_ttt = float(np.median(ttts)) if ttts else float("inf")
    ceiling, source = row_ceiling(runs)
    return {
        "ceiling": ceiling, "ceiling_source": source,
        "final_return_mean": float(np.mean(finals)) if finals else None,
        "final_return_std": float(np.std(finals)) if finals else None,
        "final_return_min": float(np.min(finals)) if finals else None,
        "final_return_max": float(np.max(finals)) if finals else None,
        "reached": int(sum(np.isfinite(ttts))),
        "seeds": len(runs),
        "time_to_target_median_s": median_ttt if np.isfinite(median_ttt) else None,
        "wall_time_mean_s": float(np.mean([r["wall_time_s"] for r in runs])),
    }


def compare(table: dict) -> None:
    """Add the reductions in % against the baseline and the within-spread flag to every method's row."""
    base = table["methods"]["none"]
    for row in table["methods"].values():
        b, m = base["time_to_target_median_s"], row["time_to_target_median_s"]
        row["time_to_target_reduction_pct"] = 100 * (b - m) / b if b and m is not None else None
        row["wall_time_reduction_pct"] = 100 * (base["wall_time_mean_s"] - row["wall_time_mean_s"]) / base["wall_time_mean_s"]
        lo = base["final_return_min"]
        row["within_baseline_spread"] = (row["final_return_mean"] is not None and lo is not None
                                         and row["final_return_mean"] >= lo)


def actor_table(name: str, setup: EnvSetup, out_dir: str, quick: bool, methods: str,
                teacher_steps: int | None = None, teacher: str | None = None) -> dict:
    """Run experiments/actor_time.py for one env and keep what the table needs. ``teacher``: an orbax
    folder of trained learner params (the training table's baseline); else actor_time.py trains one."""
    suffix = "_quick" if quick else ""
    path = os.path.join(out_dir, f"actor_time_{name}{suffix}.json")
    teacher_steps = teacher_steps or (setup.quick_teacher_steps if quick else setup.teacher_steps)
    argv = ["--env", setup.env, "--num-envs", str(setup.quick_actor_envs if quick else setup.actor_envs),
            "--methods", methods, "--out", path, "--train-steps", str(teacher_steps)]
    if teacher:
        argv += ["--checkpoint", teacher]
    if quick:
        argv += ["--distill-steps", "200", "--fit-rollouts", "2", "--fit-samples", "2048", "--held-samples", "1024",
                 "--rounds", "2", "--repeats", "2", "--rollout-length", "8"]
    out = actor_time.main(argv)
    steps_per_rollout = out["num_envs"] * out["setup"]["rollout_length"]
    rows = {}
    for m, r in out["methods"].items():
        rows[m] = {"actor_us_per_step": 1e6 / r["sps"], "reduction_factor": r["speedup_vs_none"], "kl": r["kl"],
                   "agreement": r["agreement"], "xla_config": r["xla_config"], "share_of_ceiling": r["share_of_ceiling"],
                   "forward_speedup": r["forward_speedup"]}
    return {"env": setup.env, "num_envs": out["num_envs"], "ceiling_us_per_step": 1e6 / out["ceiling_sps"],
            "rollout_steps": steps_per_rollout, "teacher": out["setup"]["teacher"], "methods": rows,
            "command": "python experiments/actor_time.py " + " ".join(argv), "file": os.path.relpath(path, RESULTS)}


def targets(result: dict) -> dict:
    """The paper's figures per env: best actor reduction with KL <= 0.05 and agreement >= 95%, and the best
    wall-time-to-target reduction among methods whose final return is within the baseline's spread."""
    out = {}
    for name in list(dict.fromkeys([*result["training"], *result["actor_time"]])):
        row: dict = {}
        a = result["actor_time"].get(name)
        if a:
            faithful = {m: r for m, r in a["methods"].items() if m != "none" and r["kl"] <= 0.05 and r["agreement"] >= 0.95}
            best = max(faithful, key=lambda m: faithful[m]["reduction_factor"], default=None)
            row["actor"] = {"best": best, "factor": faithful[best]["reduction_factor"] if best else None,
                            "met": bool(best and faithful[best]["reduction_factor"] >= ISSUE_ACTOR_FACTOR)}
        t = result["training"].get(name)
        if t:
            ok = {m: r for m, r in t["methods"].items()
                  if m != "none" and r["within_baseline_spread"] and r["time_to_target_reduction_pct"] is not None}
            best = max(ok, key=lambda m: ok[m]["time_to_target_reduction_pct"], default=None)
            row["training"] = {"best": best, "reduction_pct": ok[best]["time_to_target_reduction_pct"] if best else None,
                               "met": bool(best and ok[best]["time_to_target_reduction_pct"] >= ISSUE_TRAINING_PCT)}
        out[name] = row
    return out


def _fmt(x, spec: str, missing: str = "—") -> str:
    return missing if x is None else format(x, spec)


def markdown(result: dict) -> str:
    q = " (--quick: tiny budgets, for the format, not for conclusions)" if result["quick"] else ""
    cache = ("JAX's persistent compilation cache was on: seed 0 of each method compiled, later seeds loaded the "
             "compiled programs" if result["compile_cache"] else "every run compiled its own programs")
    lines = [f"# The paper's tables on `{result['host']}`{q}", "",
             f"Generated by `{result['command']}` in {result['runtime_s'] / 60:.1f} min; {result['machine_note']}; "
             f"{cache}.", ""]
    if not result["actor_time"]:
        lines += ["## 1. Actor time per environment step", "",
                  "Not run in this invocation (--skip-actor-time); see the `actor_time_*` tables (1024 envs, trained "
                  "teachers, experiments/actor_time.py).", ""]
    else:
        lines += _actor_lines(result)
    return _training_lines(result, lines)


def _actor_lines(result: dict) -> list[str]:
    lines = ["## 1. Actor time per environment step", "",
              "Reduction factor = actor time of `none` in its fastest XLA configuration ÷ the method's "
              "(experiments/actor_time.py; fastest of interleaved timed rollouts).", "",
              "| env (envs) | method | actor µs / step | reduction factor | KL (nats) | agreement | XLA config |",
              "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for name, a in result["actor_time"].items():
        lines.append(f"| {a['env']} ({a['num_envs']}) | ceiling (random actions, no policy) | "
                     f"{a['ceiling_us_per_step']:.3f} | | | | |")
        for m, r in a["methods"].items():
            lines.append(f"| | `{m}` | {r['actor_us_per_step']:.3f} | {r['reduction_factor']:.2f}x | {r['kl']:.4f} | "
                         f"{100 * r['agreement']:.1f}% | {r['xla_config']} |")
    lines += ["", "Teachers (fidelity is measured on their held observations): " + "; ".join(
        f"{a['env']}: {a['teacher'].get('total_env_steps', '?')} steps, return {_fmt(a['teacher'].get('final_return_mean'), '.1f')}"
        for a in result["actor_time"].values()) + "."]
    if result["quick"]:
        lines += ["With --quick the teachers are barely trained (near-uniform policies), so KL and agreement say "
                  "little here; the actor_time_* tables (experiments/actor_time.py) measure fidelity on trained teachers."]
    lines += [""]
    return lines


def ceiling_cell(row: dict) -> str:
    """The ceiling column's cell of a method's row: ``≤ 23.3%``, marked ``(FLOPs)`` when counted, not timed."""
    if row.get("ceiling") is None:
        return "—"
    return f"≤ {100 * row['ceiling']:.1f}%" + (" (FLOPs)" if row.get("ceiling_source") == "flops" else "")


def _training_lines(result: dict, lines: list[str]) -> str:
    lines += ["## 2. Training time", "",
              "Time to target: median over seeds of the wall time (compilation included) to the first logged "
              "update whose mean return over the last 100 episodes reaches the target; \"—\" when more than half "
              "the seeds missed it. Reductions are against `none`. Within spread: the method's mean final return "
              "≥ the lowest baseline seed's. Amdahl ceiling: the most any actor compression can cut from an update "
              "of this loop (the uncompressed actor's share of actor + learner, from the runs' own summaries: "
              "timed, each piece of an update timed alone, or, marked FLOPs, from XLA's FLOP counts).", "",
              "| env (target, budget) | method | final return mean ± std | within spread | reached | time to target (s) "
              "| reduction | Amdahl ceiling | wall time at budget (s) | reduction |",
              "| --- | --- | ---: | :---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, t in result["training"].items():
        first = True
        for m, r in t["methods"].items():
            head = f"{t['env']} ({t['target']:g}, {t['steps']:,} steps)" if first else ""
            first = False
            lines.append(
                f"| {head} | `{m}` | {_fmt(r['final_return_mean'], '.1f')} ± {_fmt(r['final_return_std'], '.1f')} | "
                f"{'yes' if r['within_baseline_spread'] else 'no'} | {r['reached']}/{r['seeds']} | "
                f"{_fmt(r['time_to_target_median_s'], '.1f')} | {_fmt(r['time_to_target_reduction_pct'], '+.1f')}{'%' if r['time_to_target_reduction_pct'] is not None else ''} | "
                f"{ceiling_cell(r)} | "
                f"{r['wall_time_mean_s']:.1f} | {r['wall_time_reduction_pct']:+.1f}% |")
    if result["quick"]:
        lines += ["", "With --quick the budgets are far below what reaches any target, and most of each run's wall "
                  "time is compilation (seed 0) and start-up, so the reductions say nothing about training speed."]
    lines += ["", "Targets of the environments: " + "; ".join(f"{t['env']}: {t['target']:g} ({t['target_note']})"
                                                        for t in result["training"].values())]
    autos = [(t["env"], r) for t in result["training"].values() for r in t["methods"].get("auto", {}).get("runs", [])]
    if autos:
        lines += ["", "`auto` decisions (candidate running at the end, switches): " + "; ".join(
            f"{env} seed {r['seed']}: {r['auto_running']} ({sum(d['switched'] for d in r['auto_decisions'])} switches, "
            f"{len(r['auto_decisions'])} decisions)" for env, r in autos)]
    lines += ["", "## Against the paper's best figures", "",
              f"Actor time reduced ≥ {ISSUE_ACTOR_FACTOR}x (best method with KL ≤ 0.05 and agreement ≥ 95%) and time "
              f"to target reduced ≥ {ISSUE_TRAINING_PCT}% at equal final return (within the baseline's spread), on at "
              "least two environments.", "",
              "| env | best actor method | factor | met | best training method | reduction | met |",
              "| --- | --- | ---: | :---: | --- | ---: | :---: |"]
    for name, row in result["targets"].items():
        a, t = row.get("actor", {}), row.get("training", {})
        lines.append(f"| {name} | {a.get('best') or '—'} | {_fmt(a.get('factor'), '.2f')} | {'yes' if a.get('met') else 'no'} | "
                     f"{t.get('best') or '—'} | {_fmt(t.get('reduction_pct'), '+.1f')} | {'yes' if t.get('met') else 'no'} |")
    lines += [""]
    for name in result["training"]:
        lines.append(f"![{name}](training_{name}{result['suffix']}.png)")
    for name, a in result["actor_time"].items():
        lines.append(f"![{name} actor time]({os.path.basename(a['file']).replace('.json', '.png')})")
    return "\n".join(lines) + "\n"


def plot_training(result: dict, out_dir: str) -> None:
    """Per env: return against env steps (mean over seeds) and against wall time (each seed a line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name, t in result["training"].items():
        fig, (by_steps, by_time) = plt.subplots(1, 2, figsize=(12, 4))
        for i, (m, r) in enumerate(t["methods"].items()):
            color = f"C{i}"
            curves = [([p["env_steps"] for p in run["curve"]],
                       [p["wall_time_s"] for p in run["curve"]],
                       np.array([np.nan if p["return_mean"] is None else p["return_mean"] for p in run["curve"]], float))
                      for run in r["runs"]]
            grid = np.linspace(0, t["steps"], 50)
            ys = [np.interp(grid, xs, np.where(np.isfinite(v), v, np.nan), left=np.nan) for xs, _, v in curves if len(xs)]
            with np.errstate(all="ignore"):
                import warnings

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    by_steps.plot(grid, np.nanmean(ys, axis=0), color=color, label=m)
            for j, (_, wall, v) in enumerate(curves):
                by_time.plot(wall, v, color=color, alpha=0.7, label=m if j == 0 else None)
        for ax in (by_steps, by_time):
            ax.axhline(t["target"], color="gray", linestyle="--", label="target")
            ax.set_ylabel("return (mean of last 100 episodes)")
        by_steps.set(xlabel="env steps", title=f"{t['env']}: mean over seeds")
        by_time.set(xlabel="wall time (s, compilation included)", title="each seed")
        by_steps.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f"training_{name}{result['suffix']}.png"), dpi=90)
        plt.close(fig)


def output_paths(out: str | None, results_dir: str | None, quick: bool, host: str) -> tuple[str, str]:
    """``(folder, json_path)`` of a run's outputs: the JSON at ``out`` if given, else
    ``paper_tables[_quick].json`` in the folder; the folder is ``results_dir`` if given, else ``out``'s
    folder, else ``experiments/results/<host>/`` (the committed tables: written only when no place is given)."""
    folder = results_dir or (os.path.dirname(os.path.abspath(out)) if out else os.path.join(RESULTS, host))
    return folder, out or os.path.join(folder, f"paper_tables{'_quick' if quick else ''}.json")


def report_path(json_path: str) -> str:
    """The markdown report written beside ``json_path``: the same name, ``.md``."""
    return os.path.splitext(json_path)[0] + ".md"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny budgets: a few minutes on a 2-core CPU")
    p.add_argument("--out", default=None, help="write the JSON here (and, without --results-dir, every other "
                   "output beside it) instead of experiments/results/<host tag>/")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--envs", nargs="+", default=["cartpole", "acrobot", "minatar"], choices=[e for e in ENVS if e != "pong"])
    p.add_argument("--with-pong", action="store_true", help="add envpool Pong-v5's actor-time table")
    p.add_argument("--methods", default=None, help="training-table methods, comma-separated (baseline none is always run)")
    p.add_argument("--actor-methods", default=None, help="actor-time-table methods, comma-separated")
    p.add_argument("--steps", type=int, default=None, help="override every env's training budget (agent steps)")
    p.add_argument("--teacher-steps", type=int, default=None, help="override the actor-time teachers' training steps")
    p.add_argument("--skip-actor-time", action="store_true")
    p.add_argument("--results-dir", default=None, help="folder of the outputs; default --out's folder, else "
                   "experiments/results/<host tag>/")
    p.add_argument("--compile-cache", action=argparse.BooleanOptionalAction, default=None,
                   help="JAX's persistent compilation cache in a fresh temporary folder (default: on with --quick)")
    p.add_argument("--redraw", default=None, metavar="JSON",
                   help="only rewrite the markdown report and plots of an earlier run's JSON, beside it")
    args = p.parse_args(argv)
    if args.redraw:
        with open(args.redraw) as f:
            result = json.load(f)
        out_dir = os.path.dirname(os.path.abspath(args.redraw))
        result["targets"] = targets(result)
        plot_training(result, out_dir)
        with open(report_path(args.redraw), "w") as f:
            f.write(markdown(result))
        return result
    t0 = time.perf_counter()
    cache = args.quick if args.compile_cache is None else args.compile_cache
    if cache:  # seed 0 of each method compiles; later seeds load the same programs from the cache
        jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="paper_tables_xla_"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    methods = args.methods.split(",") if args.methods else (QUICK_TRAIN_METHODS if args.quick else TRAIN_METHODS)
    methods = ["none"] + [m for m in methods if m != "none"]
    actor_methods = args.actor_methods or (QUICK_ACTOR_METHODS if args.quick else ACTOR_METHODS)
    out_dir, path = output_paths(args.out, args.results_dir, args.quick, host_tag())
    os.makedirs(out_dir, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    result = {
        "host": host_tag(), "quick": args.quick, "suffix": suffix, "seeds": args.seeds,
        "command": "python experiments/paper_tables.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "backend": jax.default_backend(),
                    "jax": jax.__version__},
        "load_average": {"start": os.getloadavg()[0]},  # 1-min load average; this run itself adds ~1-2 on a CPU
        "machine_note": "",
        "compile_cache": cache,
        "actor_time": {}, "training": {},
    }

    def save() -> None:  # after every table, so an interrupted long run keeps what it measured
        result["runtime_s"] = time.perf_counter() - t0
        result["load_average"]["last"] = os.getloadavg()[0]
        result["machine_note"] = machine_note(result["load_average"])
        result["targets"] = targets(result)
        atomic_write_json(path, result)
        plot_training(result, out_dir)
        with open(report_path(path), "w") as f:
            f.write(markdown(result))

    # The training table's baseline (seed 0) is the actor-time table's teacher: a policy trained at the full budget.
    teachers = tempfile.mkdtemp(prefix="paper_tables_teachers_")
    trained_teachers: dict = {}
    for name in args.envs:
        setup = ENVS[name]
        steps = args.steps or (setup.quick_steps if args.quick else setup.steps)
        runs: dict = {m: [] for m in methods}
        for seed in range(args.seeds):
            for m in methods:
                keep = None if args.skip_actor_time or (m, seed) != ("none", 0) else os.path.join(teachers, name)
                runs[m].append(train_one(setup, m, seed, steps, args.quick, keep))
                if keep:
                    trained_teachers[name] = keep
                r = runs[m][-1]
                print(f"[{time.perf_counter() - t0:6.0f}s] {setup.env} {m} seed {seed}: return "
                      f"{_fmt(r['final_return'], '.1f')}, wall {r['wall_time_s']:.1f} s, to target "
                      f"{_fmt(r['time_to_target_s'], '.1f', 'not reached')}", flush=True)
        table = {"env": setup.env, "target": setup.target, "target_note": setup.target_note, "steps": steps,
                 "flags": setup.train, "methods": {m: {**aggregate(rs), "runs": rs} for m, rs in runs.items()}}
        compare(table)
        result["training"][name] = table
        save()
    # The actor-time tables after the training tables: a long run stopped early keeps the training tables.
    for name in list(args.envs) + (["pong"] if args.with_pong else []):
        setup = ENVS[name]
        if not args.skip_actor_time:
            result["actor_time"][name] = actor_table(name, setup, out_dir, args.quick, actor_methods, args.teacher_steps,
                                                     trained_teachers.get(name))
            print(f"[{time.perf_counter() - t0:6.0f}s] actor-time table of {setup.env} done", flush=True)
            save()
    save()
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
