"""Which settings of the main job reach CartPole's return 475 soonest? Whole processes side by side.

Each configuration is a set of flags added to ``python -m accerl_jax.train`` (the main job). For each seed
every configuration runs once, in a rotated order, so that a busy spell of a shared machine falls on all
of them alike. Every run uses the compilation cache (``--compile-cache``, a folder shared by the sweep and
filled by a first, untimed run of each configuration), so compilation is not what the sweep compares.

Per run, from :func:`peer_purejaxrl.run_ours`: the whole process's seconds, the start-up, the seconds from
process start to the first logged mean return >= 475 (None: never), the final return. Per configuration:
the median time to 475 over the seeds that reached it and how many did; a configuration that misses a
seed is not the fast choice, whatever its median.

Usage: python experiments/sweep_defaults.py [--seeds 0 1 2] [--out FILE.json]
       [--config NAME "FLAGS" ...]   (default: the main job against the settings it replaced)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_purejaxrl import TARGET, run_ours  # noqa: E402  (one run of the main job, timed from process start)
from throughput_sebulba import write_outputs  # noqa: E402

# name -> flags. The main job's defaults, the settings they replaced (IMPALA's actor-critic, MLP(256, 256),
# 800k steps, distill:small; and the same uncompressed), and APPO with fewer epochs or the old network.
CONFIGS = {
    "default": "",
    "default+distill:small": "--compressor distill:small",
    "appo-4-epochs": "--epochs 4",
    "appo-mlp256": "--hidden-sizes 256 256",
    "old-default": "--loss actor-critic --hidden-sizes 256 256 --total-steps 800000 --compressor distill:small",
    "old-default-none": "--loss actor-critic --hidden-sizes 256 256 --total-steps 800000",
}


def to_markdown(result: dict) -> str:
    lines = [f"# The main job's settings, CartPole-v1 ({result['host']}, {result['cpu_count']} CPUs, "
             f"seeds {result['seeds']})", "",
             "| configuration | flags | reached 475 | to 475 from process start, median s (per seed) | "
             "whole process, median s | final returns |", "|---|---|---:|---|---:|---|"]
    for name, c in result["configs"].items():
        runs = c["runs"]
        ttt = [r["time_to_target_s"] for r in runs]
        reached = [t for t in ttt if t is not None]
        per_seed = ", ".join("never" if t is None else f"{t:.1f}" for t in ttt)
        median = f"{np.median(reached):.1f}" if reached else "-"
        rets = ", ".join("-" if r["final_return"] is None else f"{r['final_return']:.0f}" for r in runs)
        lines.append(f"| {name} | `{c['flags'] or '(none)'}` | {len(reached)} of {len(runs)} | {median} ({per_seed}) | "
                     f"{np.median([r['process_s'] for r in runs]):.1f} | {rets} |")
    lines += ["", "Every run loaded its compiled programs from the sweep's compilation cache (filled by one untimed "
              "run per configuration first)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--config", nargs=2, action="append", metavar=("NAME", "FLAGS"),
                   help="a configuration (repeatable); default: the CONFIGS of this file")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                 "sweep_defaults.json"))
    args = p.parse_args(argv)
    configs = dict(args.config) if args.config else CONFIGS
    runs: dict[str, list] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "xla")
        for name, flags in configs.items():  # fill the cache (the budget is in the programs: the same flags)
            run_ours(args.seeds[0], shlex.split(flags), cache, tmp)
        names = list(configs)
        for k, seed in enumerate(args.seeds):
            for name in names[k % len(names):] + names[:k % len(names)]:
                runs[name].append(dict(seed=seed, **run_ours(seed, shlex.split(configs[name]), cache, tmp)))
                print(name, runs[name][-1], flush=True)
    result = {"host": platform.node(), "cpu_count": os.cpu_count(), "seeds": args.seeds, "target": TARGET,
              "command": "python experiments/sweep_defaults.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
              "configs": {name: {"flags": configs[name], "runs": r} for name, r in runs.items()}}
    md = to_markdown(result)
    print(md)
    write_outputs(args.out, result, md)
    return result


if __name__ == "__main__":
    main()
