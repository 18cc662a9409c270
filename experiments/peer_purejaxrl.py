"""The default job against PureJaxRL's PPO on CartPole, whole processes side by side (../shared/peers.md).

Each round runs, for one seed, interleaved so that load on a shared machine falls on all alike:

- ``default``: ``python -m accerl_jax.train`` (the README's main job) with an empty compilation cache
  (``--compile-cache`` a fresh folder: a first run on a machine), then ``default, rerun``: the same
  command again on that cache (every later run);
- ``compressed`` and ``compressed, rerun``: the same with ``--compressor`` ``--compressed`` (default
  ``distill:small``; the default job itself runs ``none``);
- ``purejaxrl``: ``purejaxrl/ppo.py``'s ``make_train`` with its own CartPole-v1 config (``DEBUG`` off),
  jitted and called once, in its own virtual environment (the pins in ../shared/peers.md).

Recorded per process: the whole process's wall seconds (interpreter start to exit, as a user waits),
the final return, and for accerl_jax the seconds from process start to the first logged mean return of
at least 475 (``startup_before_train_s`` + the metrics row's ``wall_time_s``). PureJaxRL logs nothing
while it trains, so its time to a solved policy is its whole process (if its final return is at least
475). Times to 475 are medians over the runs that reached it; ratios are of medians.

Usage: python experiments/peer_purejaxrl.py --purejaxrl PATH/TO/purejaxrl --python PATH/TO/venv/bin/python
       [--seeds 0 1 2] [--out experiments/results/cpu-2core/peer_purejaxrl.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import paper_tables  # noqa: E402  (its metrics.csv reader and time-to-target rule)
from throughput_sebulba import write_outputs  # noqa: E402

TARGET = 475.0
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# PureJaxRL's CartPole-v1 config (purejaxrl/ppo.py's __main__), with its per-episode host printing off.
PUREJAXRL_RUN = """
import json, sys, time
start = time.perf_counter()
sys.path.insert(0, ".")
import jax
from ppo import make_train
config = {"LR": 2.5e-4, "NUM_ENVS": 4, "NUM_STEPS": 128, "TOTAL_TIMESTEPS": 5e5, "UPDATE_EPOCHS": 4,
          "NUM_MINIBATCHES": 4, "GAMMA": 0.99, "GAE_LAMBDA": 0.95, "CLIP_EPS": 0.2, "ENT_COEF": 0.01,
          "VF_COEF": 0.5, "MAX_GRAD_NORM": 0.5, "ACTIVATION": "tanh", "ENV_NAME": "CartPole-v1",
          "ANNEAL_LR": True, "DEBUG": False}
imported = time.perf_counter()
out = jax.block_until_ready(jax.jit(make_train(config))(jax.random.PRNGKey(int(sys.argv[1]))))
returns = out["metrics"]["returned_episode_returns"]  # [updates, steps, envs]
print(json.dumps({"final_return": float(returns[-1].mean()), "import_s": imported - start,
                  "train_s": time.perf_counter() - imported}))
"""


def time_to_target(logdir: str, before_train_s: float) -> float | None:
    """Seconds from process start to the first metrics row whose mean return reaches :data:`TARGET`."""
    in_run = paper_tables.time_to_target(paper_tables.read_curve(logdir), TARGET)
    return None if in_run is None else before_train_s + in_run


def run_ours(seed: int, extra: list[str], cache: str, tmp: str, python: str = sys.executable, cwd: str = REPO) -> dict:
    """One whole process of the main job (``python -m accerl_jax.train`` in ``cwd``, whose ``accerl_jax`` it
    imports) with ``extra`` flags and the compilation cache ``cache``."""
    logdir = os.path.join(tmp, f"run-{time.monotonic_ns()}")
    start = time.perf_counter()
    proc = subprocess.run([python, "-m", "accerl_jax.train", "--seed", str(seed), "--logdir", logdir,
                           "--no-progress", "--compile-cache", cache, *extra],
                          cwd=cwd, capture_output=True, text=True, timeout=900)
    process_s = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"accerl_jax seed {seed} {extra} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    with open(os.path.join(logdir, "summary.json")) as f:
        s = json.load(f)
    return {"process_s": process_s, "final_return": s["final_return_mean"], "startup_s": s["startup_s"],
            "startup_before_train_s": s["startup_before_train_s"],
            "time_to_target_s": time_to_target(logdir, s["startup_before_train_s"]),
            "compile_cache_hits": s["compile_cache_hits"], "compile_cache_misses": s["compile_cache_misses"]}


def run_purejaxrl(seed: int, python: str, purejaxrl: str) -> dict:
    start = time.perf_counter()
    proc = subprocess.run([python, "-c", PUREJAXRL_RUN, str(seed)], cwd=os.path.join(purejaxrl, "purejaxrl"),
                          capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=""))
    process_s = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"purejaxrl seed {seed} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    reached = out["final_return"] >= TARGET
    return {"process_s": process_s, "final_return": out["final_return"], "time_to_target_s": process_s if reached else None,
            "import_s": out["import_s"], "train_s": out["train_s"]}


def _median(runs: list[dict], key: str) -> float | None:
    """Median of ``key`` over the runs that have it (a run that never reached the target has None)."""
    values = [r[key] for r in runs if r[key] is not None]
    return float(np.median(values)) if values else None


def to_markdown(result: dict) -> str:
    lines = [f"# accerl_jax's default job vs PureJaxRL PPO, CartPole-v1 ({result['host']}, {result['cpu_count']} CPUs, "
             f"seeds {result['seeds']}, medians)", "",
             "| configuration | whole process (s) | to return 475 from process start (s) | final returns | "
             "process / PureJaxRL | to 475 / PureJaxRL |", "|---|---:|---:|---|---:|---:|"]
    peer = result["configs"]["purejaxrl"]
    for name, c in result["configs"].items():
        ratio = lambda k: f"{c[k] / peer[k]:.2f}" if c[k] is not None and peer[k] else "-"  # noqa: E731
        reached = sum(r["time_to_target_s"] is not None for r in c["runs"])
        ttt = ("-" if c["time_to_target_s"] is None else f"{c['time_to_target_s']:.1f}") + f" ({reached} of {len(c['runs'])})"
        rets = ", ".join("-" if r["final_return"] is None else f"{r['final_return']:.0f}" for r in c["runs"])
        lines.append(f"| {name} | {c['process_s']:.1f} | {ttt} | {rets} | {ratio('process_s')} | {ratio('time_to_target_s')} |")
    lines += ["", "Time to 475: median over the runs that reached it (how many did, in brackets). PureJaxRL logs "
              "nothing while training: its time to 475 is its whole process, if its final return reached 475. "
              "'rerun': the same command again with the compilation cache the first run filled (--compile-cache)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--purejaxrl", required=True, help="a checkout of luchris429/purejaxrl")
    p.add_argument("--python", required=True, help="the Python of PureJaxRL's own virtual environment")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--compressed", default="distill:small", help="the compressor run beside the default job")
    p.add_argument("--out", default=os.path.join(REPO, "experiments", "results", "cpu-2core", "peer_purejaxrl.json"))
    args = p.parse_args(argv)
    ours = {"default": [], args.compressed: ["--compressor", args.compressed]}
    runs: dict[str, list] = {k: [] for name in ours for k in (name, f"{name}, rerun")}
    runs["purejaxrl"] = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for name, extra in ours.items():
                cache = tempfile.mkdtemp(dir=tmp, prefix="xla-")  # empty: a first run on this machine
                for label in (name, f"{name}, rerun"):
                    runs[label].append(dict(seed=seed, **run_ours(seed, extra, cache, tmp)))
                    print(label, runs[label][-1], flush=True)
                shutil.rmtree(cache)
            runs["purejaxrl"].append(dict(seed=seed, **run_purejaxrl(seed, args.python, args.purejaxrl)))
            print("purejaxrl", runs["purejaxrl"][-1], flush=True)
    result = {"host": platform.node(), "cpu_count": os.cpu_count(), "seeds": args.seeds, "target": TARGET,
              "command": "python experiments/peer_purejaxrl.py " + " ".join(argv or sys.argv[1:]),
              "configs": {name: {"process_s": _median(r, "process_s"), "time_to_target_s": _median(r, "time_to_target_s"),
                                 "runs": r} for name, r in runs.items()}}
    md = to_markdown(result)
    print(md)
    write_outputs(args.out, result, md)
    return result


if __name__ == "__main__":
    main()
