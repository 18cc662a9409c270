"""Which distillation schedule makes the main job reach its target soonest? Time to return 475 on
CartPole, side by side with ``--compressor none``.

Each configuration is a set of extra flags for the main job (``python -m accerl_jax.train``, default
settings otherwise). Runs are whole processes, interleaved: for each repeat and seed every configuration
runs once, in a rotated order, so that a busy spell of a shared machine falls on all of them alike.
Per run: the time to target (``wall_time_s`` of the first ``metrics.csv`` row whose ``return_mean``
reaches it; from the start of setup, compilation included) and its env steps, the whole process time,
the final return and the largest logged ``kl_learner_actor`` (KL(π_learner ‖ π_actor) of the acting policy, nats). Per
configuration: the median time to target and its ratio to ``none``'s, each run paired with the ``none``
run of the same seed and repeat.

``--programs`` measures instead the per-update cost of each configuration's compiled Anakin chunk alone
(no host work, no compilation), in one process, configurations interleaved over ``--rounds``: ms per
update (median, minimum, and paired ratio to ``none`` per round) and XLA's cost-analysis FLOPs per
update (XLA counts a loop's body once, whatever its trip count: compare them only between programs with
the same loops).

Usage: python experiments/distill_schedule.py [--seeds 1 2 3] [--repeats 2] [--configs none small4 ...]
       [--programs [--rounds 8]] [--out experiments/results/distill_schedule.json]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

TARGET_RETURN = 475.0
# name -> accerl_jax.config.Config fields that differ from the main job's defaults.
CONFIGS = {
    "none": dict(compressor="none"),
    "small4": dict(compressor="distill:small", distill_steps=4),
    "small4-fresh": dict(compressor="distill:small", distill_steps=4, distill_reuse_teacher=False),
    "small2": dict(compressor="distill:small", distill_steps=2),
    "small1": dict(compressor="distill:small", distill_steps=1),
    "small4-every2": dict(compressor="distill:small", distill_steps=4, compress_every=2),
    "small2-every2": dict(compressor="distill:small", distill_steps=2, compress_every=2),
    "small1-every2": dict(compressor="distill:small", distill_steps=1, compress_every=2),
    "small2-every4": dict(compressor="distill:small", distill_steps=2, compress_every=4),
    "tiny4": dict(compressor="distill:tiny", distill_steps=4),
    "tiny2": dict(compressor="distill:tiny", distill_steps=2),
    "tiny1": dict(compressor="distill:tiny", distill_steps=1),
}


def flags(name: str) -> list[str]:
    """The command-line flags of configuration ``name``."""
    out = []
    for key, value in CONFIGS[name].items():
        flag = "--" + key.replace("_", "-")
        out += [flag if value else "--no-" + flag[2:]] if isinstance(value, bool) else [flag, str(value)]
    return out


def read_rows(logdir: str) -> list[dict]:
    with open(os.path.join(logdir, "metrics.csv"), newline="") as f:
        return list(csv.DictReader(f))


def _float(x: str) -> float:
    return float(x) if x not in ("", "nan", None) else float("nan")


def run_one(name: str, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        logdir = os.path.join(tmp, "run")
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "accerl_jax.train", "--seed", str(seed), "--logdir", logdir,
                               "--no-progress", "--checkpoint-every", "0", *flags(name)],
                              capture_output=True, text=True)
        process_s = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"{name} seed {seed} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        rows = read_rows(logdir)
        with open(os.path.join(logdir, "summary.json")) as f:
            summary = json.load(f)
    hit = next((r for r in rows if _float(r["return_mean"]) >= TARGET_RETURN), None)
    ttt = None if hit is None else _float(hit["wall_time_s"])
    kls = [_float(r["kl_learner_actor"]) for r in rows if "kl_learner_actor" in r]
    kls = [k for k in kls if np.isfinite(k)]
    return {"config": name, "seed": seed, "time_to_target_s": ttt, "process_s": process_s,
            # Samples to the target: separates sample efficiency from the time per update.
            "env_steps_to_target": None if hit is None else int(_float(hit["env_steps"])),
            "wall_time_s": summary["wall_time_s"], "final_return": summary["final_return_mean"],
            "max_kl_learner_actor": max(kls) if kls else None, "final_kl_learner_actor": summary["kl_learner_actor"],
            "load_1min": os.getloadavg()[0]}


def measure_programs(names: list[str], rounds: int, calls: int = 1) -> dict:
    """ms per update of each configuration's jitted Anakin chunk (``log_every`` = 10 updates a call)."""
    import jax

    from accerl_jax import run as run_lib
    from accerl_jax.config import Config
    from accerl_jax.loops import anakin_program as anakin, anakin_state

    built = {}
    for name in names:
        cfg = Config(**CONFIGS[name], progress=False, checkpoint_every=0,
                     logdir=tempfile.mkdtemp(prefix=f"distill-schedule-{name}-"))
        run = run_lib.setup(cfg, [])
        fn = anakin.make_chunk(run)
        state = anakin_state.place_state(run, anakin_state.initial_state(run, cfg.seed))
        length = anakin.chunk_length(run)
        cost = fn.jitted.lower(state, length).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        state = jax.block_until_ready(fn(state, length)[0])  # compile and warm up
        built[name] = [run, fn, state, length, float(cost.get("flops", float("nan"))) / length]
    ms = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            run, fn, state, length, _ = built[name]
            start = time.perf_counter()
            for _ in range(calls):
                state = fn(state, length)[0]
            jax.block_until_ready(state)
            built[name][2] = state
            ms[name].append((time.perf_counter() - start) / (calls * length) * 1e3)
    for run, *_ in built.values():
        run.lock.release()
        run.saver.close()
        run.monitor.close()
    out = {}
    for name in names:
        ratios = [a / b for a, b in zip(ms[name], ms["none"])]
        # The minimum over rounds estimates the uncontended cost on a shared machine (as timeit advises).
        out[name] = {"ms_per_update_median": float(np.median(ms[name])), "ms_per_update_min": float(np.min(ms[name])),
                     "ms_per_update_rounds": ms[name],
                     "ratio_to_none_median": float(np.median(ratios)), "ratio_to_none_min": float(np.min(ratios)),
                     "ratio_to_none_max": float(np.max(ratios)), "flops_per_update": built[name][4]}
    return out


def aggregate(runs: list[dict], names: list[str]) -> dict:
    base = {(r["seed"], r["repeat"]): r["time_to_target_s"] for r in runs if r["config"] == "none"}
    out = {}
    for name in names:
        mine = [r for r in runs if r["config"] == name]
        ttt = [r["time_to_target_s"] if r["time_to_target_s"] is not None else float("inf") for r in mine]
        ratios = [r["time_to_target_s"] / base[(r["seed"], r["repeat"])] for r in mine
                  if r["time_to_target_s"] is not None and base.get((r["seed"], r["repeat"]))]
        kls = [r["max_kl_learner_actor"] for r in mine if r["max_kl_learner_actor"] is not None]
        out[name] = {
            "flags": flags(name), "runs": len(mine), "reached": int(np.isfinite(ttt).sum()),
            "time_to_target_median_s": float(np.median(ttt)) if ttt and np.isfinite(np.median(ttt)) else None,
            "ratio_to_none_median": float(np.median(ratios)) if ratios else None,
            "ratio_to_none_min": float(np.min(ratios)) if ratios else None,
            "ratio_to_none_max": float(np.max(ratios)) if ratios else None,
            "max_kl_learner_actor": float(np.max(kls)) if kls else None,
            "process_s_median": float(np.median([r["process_s"] for r in mine])) if mine else None,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--programs", action="store_true", help="time the compiled chunks alone (docstring)")
    parser.add_argument("--rounds", type=int, default=8, help="--programs: interleaved rounds")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "distill_schedule.json"))
    args = parser.parse_args()
    names = list(dict.fromkeys(["none", *args.configs]))
    if args.programs:
        result = {"host": platform.node(), "cpus": os.cpu_count(), "load_1min_before": os.getloadavg()[0],
                  "programs": measure_programs(names, args.rounds)}
        result["load_1min_after"] = os.getloadavg()[0]
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        for name, row in result["programs"].items():
            print(f"{name:>14}: {row['ms_per_update_median']:.2f} ms/update (min {row['ms_per_update_min']:.2f}), "
                  f"min ratio to none {row['ms_per_update_min'] / result['programs']['none']['ms_per_update_min']:.3f}, ratio to none "
                  f"{row['ratio_to_none_median']:.3f} [{row['ratio_to_none_min']:.3f}, {row['ratio_to_none_max']:.3f}]"
                  f"  {row['flops_per_update'] / 1e6:.1f} MFLOP/update")
        return
    runs: list[dict] = []
    k = 0
    for repeat in range(args.repeats):
        for seed in args.seeds:
            order = names[k % len(names):] + names[:k % len(names)]  # rotate who runs first
            k += 1
            for name in order:
                r = dict(run_one(name, seed), repeat=repeat)
                runs.append(r)
                print(json.dumps(r), flush=True)
                result = {"target_return": TARGET_RETURN, "host": platform.node(), "cpus": os.cpu_count(),
                          "seeds": args.seeds, "repeats": args.repeats, "configs": aggregate(runs, names),
                          "runs": runs}
                os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
                with open(args.out, "w") as f:
                    json.dump(result, f, indent=1)
    for name, row in result["configs"].items():
        print(f"{name:>14}: reached {row['reached']}/{row['runs']}  time to {TARGET_RETURN:g}: "
              f"{row['time_to_target_median_s']} s  ratio to none {row['ratio_to_none_median']} "
              f"[{row['ratio_to_none_min']}, {row['ratio_to_none_max']}]  max KL {row['max_kl_learner_actor']}")


if __name__ == "__main__":
    main()
