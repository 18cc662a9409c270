"""Does asynchronous distillation (a background thread beside the learner) overlap with it here?

Runs the real training loop (``accerl_jax.loop.train``) with ``--compressor distill:<student>`` twice per
seed, synchronous and ``--distill-async``, alternating, with the same budget, and records wall time,
steps/s, the time the loop spent in the compress stage, and the final KL(π_learner ‖ π_actor) and
return. Async can only win if the machine has idle cores while the learner and actor run.

Usage: python experiments/distill_overlap.py [--env gymnax:CartPole-v1] [--seeds 0 1] \\
           [--out experiments/results/distill_overlap.json]
"""
from __future__ import annotations

import argparse
import os
import platform
import tempfile

import jax
import numpy as np

from accerl_jax.config import Config
from accerl_jax.loop import train
from accerl_jax.monitor import atomic_write_json

KEEP = ("wall_time_s", "steps_per_s", "compress_time_s", "learner_time_s", "actor_time_s",
        "kl_learner_actor", "action_agreement", "final_return_mean", "total_env_steps")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env", default="gymnax:CartPole-v1")
    p.add_argument("--compressor", default="distill:small")
    p.add_argument("--total-steps", type=int, default=300_000)
    p.add_argument("--distill-steps", type=int, default=4)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--out", default="experiments/results/distill_overlap.json")
    args = p.parse_args(argv)
    load_start = os.getloadavg()[0]
    runs = {"sync": [], "async": []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for mode in ("sync", "async"):
                cfg = Config(env=args.env, compressor=args.compressor, total_steps=args.total_steps, seed=seed,
                             distill_steps=args.distill_steps, distill_async=mode == "async",
                             logdir=os.path.join(tmp, f"{mode}-{seed}"), progress=False)
                s = train(cfg)
                runs[mode].append({k: s[k] for k in KEEP} | {"seed": seed})
                print(mode, seed, {k: round(float(s[k]), 4) for k in KEEP if s[k] is not None}, flush=True)
    med = {m: {k: float(np.median([r[k] for r in rs if r[k] is not None])) for k in KEEP} for m, rs in runs.items()}
    out = {
        "env": args.env, "compressor": args.compressor, "total_steps": args.total_steps,
        "distill_steps": args.distill_steps, "runs": runs, "median": med,
        "async_wall_speedup": med["sync"]["wall_time_s"] / med["async"]["wall_time_s"],
        "cpu_count": os.cpu_count(), "machine": platform.machine(), "jax": jax.__version__,
        "load_average_1min": {"start": load_start, "end": os.getloadavg()[0]},
        "note": "sync and async alternate so that any load is shared; load_average_1min is os.getloadavg() "
                "when the script started and ended",
    }
    atomic_write_json(args.out, out)
    print(f"async/sync wall-time speedup: {out['async_wall_speedup']:.2f}x")
    return out


if __name__ == "__main__":
    main()
