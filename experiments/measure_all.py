"""Re-measure every committed table, each twice, on the code at hand.

Runs the commands in :data:`TABLES` one after another, in this order, each once into ``OUT/run1/`` and
then again, unchanged, into ``OUT/run2/`` (the rerun that a quoted number needs), and writes
``OUT/measure_all.json``: per command the exact argv, start time (UTC), wall seconds, exit code and the
1-minute load average before and after (``os.getloadavg``), plus the git revision and the machine.
``docs/RESULTS.md`` is written by hand from the two runs; a number that moves by more than its noise
between them is quoted with both values.

    python experiments/measure_all.py --out experiments/results/cpu-2core [--only NAME ...] [--skip NAME ...]

Nothing is written outside ``--out`` (every script below is given its output place).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

PY = sys.executable
HERE = os.path.dirname(os.path.abspath(__file__))
ACTOR_METHODS_MLP = ("none,mask:0.9,prune:0.5,prune:0.75,int8,bf16,distill:small,distill:small+int8,distill:tiny,"
                     "distill:tiny+int8,prune:0.5+int8,prune:0.75+distill")
ACTOR_METHODS_CNN = "none,prune:0.5,int8,bf16,distill:small,distill:small+int8,distill:tiny"
TRAIN_METHODS = "none,distill:tiny,distill:small,auto"


def tables(run: str, out: str) -> list[tuple[str, list[str]]]:
    """(name, argv) of every table; ``run`` is ``run1`` or ``run2``, outputs go under ``out/run``.

    The actor-time teachers are trained by the first run and restored by the second (``--checkpoint``),
    so both time the same policies."""
    d = os.path.join(out, run)
    ck = os.path.join(out, "teachers")
    x = lambda name: os.path.join(HERE, name)  # noqa: E731
    return [
        ("actor_time_cartpole", [PY, x("actor_time.py"), "--env", "gymnax:CartPole-v1", "--num-envs", "1024",
                                 "--methods", ACTOR_METHODS_MLP, "--train-steps", "400000", "--distill-steps", "2000",
                                 "--rounds", "5", "--repeats", "3", "--checkpoint", os.path.join(ck, "cartpole"),
                                 # the network and teacher of RESULTS section 1 (the defaults before APPO)
                                 "--hidden-sizes", "256", "256", "--loss", "actor-critic",
                                 "--out", os.path.join(d, "actor_time_cartpole.json")]),
        ("paper_tables_classic", [PY, x("paper_tables.py"), "--envs", "cartpole", "acrobot", "--seeds", "3",
                                  "--methods", TRAIN_METHODS, "--skip-actor-time",
                                  "--results-dir", os.path.join(d, "paper_tables_classic")]),
        ("solve_cartpole", [PY, x("solve_cartpole.py"), "--seeds", "0", "1", "2",
                            "--out", os.path.join(d, "solve_cartpole.json")]),
        ("throughput", [PY, x("throughput.py"), "--only", "core", "--out", os.path.join(d, "throughput_cpu.json")]),
        ("learner_forward", [PY, x("learner_forward.py"), "--out", os.path.join(d, "learner_forward.json")]),
        ("export_sizes", [PY, x("export_sizes.py"), "--out", os.path.join(d, "export_sizes")]),
        ("actor_time_breakout_minatar", [PY, x("actor_time.py"), "--env", "gymnax:Breakout-MinAtar",
                                         "--num-envs", "1024", "--methods", ACTOR_METHODS_CNN,
                                         "--train-steps", "150000", "--distill-steps", "1000",
                                         "--fit-samples", "2048", "--held-samples", "2048", "--rollout-length", "8",
                                         "--rounds", "3", "--repeats", "2",
                                         "--checkpoint", os.path.join(ck, "minatar"),
                                         "--out", os.path.join(d, "actor_time_breakout_minatar.json")]),
        ("paper_tables_minatar", [PY, x("paper_tables.py"), "--envs", "minatar", "--seeds", "3",
                                  "--methods", "none,distill:small", "--skip-actor-time",
                                  "--results-dir", os.path.join(d, "paper_tables_minatar")]),
        ("throughput_sebulba", [PY, x("throughput_sebulba.py"), "--updates", "32", "--repeats", "2",
                                "--out", os.path.join(d, "throughput_sebulba_cpu.json")]),
        ("corrector_ablation", [PY, x("corrector_ablation.py"), "--envs", "cartpole",
                                "--out", os.path.join(d, "corrector_ablation")]),
        ("distill_overlap", [PY, x("distill_overlap.py"), "--out", os.path.join(d, "distill_overlap.json")]),
        ("actor_bound", [PY, x("actor_bound.py"), "--out", os.path.join(d, "actor_bound.json")]),
    ]


def git_rev() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder of the two runs and the manifest")
    p.add_argument("--only", nargs="+", default=None, help="table names to run (default: all, in order)")
    p.add_argument("--skip", nargs="+", default=(), help="table names to leave out")
    p.add_argument("--runs", nargs="+", default=("run1", "run2"), choices=("run1", "run2"))
    args = p.parse_args()
    names = [n for n, _ in tables("run1", args.out)]
    for n in list(args.only or ()) + list(args.skip):
        if n not in names:
            p.error(f"unknown table {n!r}; known: {', '.join(names)}")
    manifest_path = os.path.join(args.out, "measure_all.json")
    os.makedirs(args.out, exist_ok=True)
    manifest = {"git_rev": git_rev(), "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                                  "python": platform.python_version()}, "commands": []}
    if os.path.exists(manifest_path):  # a later invocation adds to the earlier ones' record
        with open(manifest_path) as f:
            manifest = {**json.load(f), **{k: v for k, v in manifest.items() if k != "commands"}}
    for name in names:
        if (args.only and name not in args.only) or name in args.skip:
            continue
        for run in args.runs:
            argv = dict(tables(run, args.out))[name]
            os.makedirs(os.path.join(args.out, run), exist_ok=True)
            log = os.path.join(args.out, run, f"{name}.log")
            entry = {"name": name, "run": run, "argv": [os.path.relpath(a) if os.path.isabs(a) and a != PY
                                                         else a for a in argv],
                     "start_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                     "load_1min_before": os.getloadavg()[0], "git_rev": git_rev()}
            print(f"[{entry['start_utc']}] {name} {run} (load {entry['load_1min_before']:.2f}) ...", flush=True)
            t0 = time.perf_counter()
            with open(log, "w") as f:
                rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT).returncode
            entry.update(wall_s=round(time.perf_counter() - t0, 1), returncode=rc,
                         load_1min_after=os.getloadavg()[0])
            print(f"    exit {rc} after {entry['wall_s']} s (load {entry['load_1min_after']:.2f})", flush=True)
            manifest["commands"].append(entry)
            with open(manifest_path, "w") as f:
                json.dump(manifest, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
