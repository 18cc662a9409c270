"""Does the default job solve CartPole within 60 s on this machine? Runs it on several seeds.

Each seed runs the real entry point (``python -m accerl_jax.train``, default settings) in a fresh
process, so compilation and start-up are included. Records per seed the final return, the run's own
``wall_time_s`` (from the start of training setup, compilation included), the whole process time
(imports included), steps/s and the actor's policy speedup; writes them as JSON.

Usage: python experiments/solve_cartpole.py [--seeds 0 1 2] [--out experiments/results/solve_cartpole.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

TARGET_RETURN = 475.0
TIME_LIMIT_S = 60.0


def run_seed(seed: int, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        logdir = os.path.join(tmp, "run")
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "accerl_jax.train", "--seed", str(seed), "--logdir", logdir, "--no-progress", *extra],
            capture_output=True, text=True,
        )
        process_s = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"seed {seed} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        with open(os.path.join(logdir, "summary.json")) as f:
            s = json.load(f)
    return {
        "seed": seed,
        "final_return_mean": s["final_return_mean"],
        "wall_time_s": s["wall_time_s"],
        "process_time_s": process_s,
        "total_env_steps": s["total_env_steps"],
        "steps_per_s": s["steps_per_s"],
        "actor_policy_speedup": s["actor_policy_speedup"],
        "solved": s["final_return_mean"] is not None and s["final_return_mean"] >= TARGET_RETURN,
        "within_time": process_s <= TIME_LIMIT_S,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "solve_cartpole.json"))
    parser.add_argument("extra", nargs="*", help="extra flags for accerl_jax.train (after --)")
    args = parser.parse_args()
    runs = []
    for seed in args.seeds:
        r = run_seed(seed, args.extra)
        runs.append(r)
        print(f"seed {seed}: return {r['final_return_mean']:.1f}, wall {r['wall_time_s']:.1f} s, "
              f"process {r['process_time_s']:.1f} s, {r['steps_per_s']:,.0f} steps/s, "
              f"policy speedup {r['actor_policy_speedup']:.2f}x", flush=True)
    result = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "command": "python -m accerl_jax.train --seed S " + " ".join(args.extra),
        "target_return": TARGET_RETURN,
        "time_limit_s": TIME_LIMIT_S,
        "runs": runs,
        "all_solved_within_time": all(r["solved"] and r["within_time"] for r in runs),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"all solved within {TIME_LIMIT_S:.0f} s: {result['all_solved_within_time']}  ->  {args.out}")


if __name__ == "__main__":
    main()
