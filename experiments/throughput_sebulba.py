"""Is the Sebulba loop faster than the sequential loop on envpool Pong-v5?

Runs the real training loop (:func:`accerl_jax.loop.train`) side by side in one process: for each
compressor (``none`` and ``distill:small`` by default), ``--loop sequential`` and ``--loop sebulba`` (one
variant per ``--actor-batches`` value) with the same sizes (envs, rollout length, budget), alternating,
``--repeats`` times. Steps/s is the
*steady* rate, measured from ``metrics.csv`` between the second logged update (the first ones include
compilation) and the last; wall time and per-stage seconds are recorded too. In the sequential loop the stages add up
to the wall time; in Sebulba they overlap (actor threads, learner, compressor thread), which is the point.
Ratios: each Sebulba variant / sequential for the same compressor, the fastest of them per compressor,
and each run against the fastest uncompressed configuration (docs/DESIGN.md, "A fair baseline").

Usage: python experiments/throughput_sebulba.py [--quick] [--device cpu|gpu] \\
           [--out experiments/results/throughput_sebulba_cpu.json]
(writes the JSON and a markdown table beside it). :func:`measure` is the library entry point
(``experiments/throughput.py`` imports it).
"""
from __future__ import annotations

import argparse
import csv
import os
import platform
import sys
import tempfile
import time

DEFAULTS = dict(env="envpool:Pong-v5", compressors=("none", "distill:small"), num_envs=16, rollout_length=16,
                updates=32, log_every=4, repeats=1, actor_threads=1, actor_batches=(0,), queue_size=2,
                distill_steps=4, device="cpu")
QUICK = dict(updates=16, log_every=4)
STAGES = ("env_time_s", "inference_time_s", "actor_time_s", "transfer_time_s", "queue_wait_time_s",
          "learner_time_s", "compress_time_s", "actor_put_wait_s", "learner_compress_wait_s")


def steady_rate(logdir: str) -> tuple[float, int]:
    """Env steps/s between the second and the last row of ``metrics.csv``, and the steps it covers.

    The first rows include compilation: of the update and rollout before the first row, and of the
    refresh-divergence measurement at the ``--log-every``-th refresh (in Sebulba's compressor thread,
    possibly after the first row), so the window starts at the second row.
    """
    with open(os.path.join(logdir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    if len(rows) < 3:
        raise ValueError(f"{logdir}: need at least 3 logged updates for a steady rate; raise updates/log_every")
    first, last = rows[1], rows[-1]
    steps = int(float(last["env_steps"]) - float(first["env_steps"]))
    return steps / (float(last["wall_time_s"]) - float(first["wall_time_s"])), steps


def _option(args, name):
    value = getattr(args, name, None) if not isinstance(args, dict) else args.get(name)
    return DEFAULTS[name] if value is None else value


def measure(args) -> dict:
    """Sebulba vs sequential on the same sizes; ``args`` is a namespace or dict with any of
    :data:`DEFAULTS`' keys (``quick=True`` shortens the runs). Returns the results dict (JSON-able):
    ``runs`` (one entry per run), ``median`` steady steps/s per ``loop/compressor``, ``vs_sequential``
    (each Sebulba variant / sequential), ``sebulba_speedup`` per compressor (the fastest variant /
    sequential) and ``vs_fastest_uncompressed`` (every configuration against
    the faster of the two uncompressed loops)."""
    import jax
    import numpy as np

    from accerl_jax.config import Config
    from accerl_jax.loop import train

    opts = {k: _option(args, k) for k in DEFAULTS}
    if (args.get("quick") if isinstance(args, dict) else getattr(args, "quick", False)):
        opts.update(QUICK)
    steps_per_update = opts["num_envs"] * opts["rollout_length"]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(opts["repeats"]):
            for compressor in opts["compressors"]:
                variants = [("sequential", None)] + [("sebulba", b) for b in opts["actor_batches"]]
                for loop, batch in (variants if repeat % 2 == 0 else variants[::-1]):
                    label = loop if batch in (None, 0) else f"{loop}-b{batch}"
                    logdir = os.path.join(tmp, f"{label}-{compressor.replace(':', '_')}-{repeat}")
                    sebulba = dict(actor_threads=opts["actor_threads"], actor_batch=batch,
                                   queue_size=opts["queue_size"]) if loop == "sebulba" else {}
                    cfg = Config(env=opts["env"], loop=loop, compressor=compressor, num_envs=opts["num_envs"],
                                 loss="actor-critic",  # IMPALA's, as the Atari preset (one step per update)
                                 rollout_length=opts["rollout_length"], total_steps=opts["updates"] * steps_per_update,
                                 distill_steps=opts["distill_steps"], log_every=opts["log_every"], checkpoint_every=0,
                                 progress=False, logdir=logdir, **sebulba)
                    start = time.perf_counter()
                    s = train(cfg)
                    rate, steady_steps = steady_rate(logdir)
                    run = {"loop": label, "compressor": compressor, "actor_batch": s.get("actor_batch"), "repeat": repeat, "steady_steps_per_s": rate,
                           "steady_steps": steady_steps, "process_wall_s": time.perf_counter() - start,
                           **{k: s.get(k) for k in ("wall_time_s", "steps_per_s", "total_env_steps", "updates",
                                                    "policy_lag_mean", "policy_lag_max", "final_return_mean",
                                                    "kl_learner_actor", "actor_params", "learner_params")},
                           "stages_s": {k: s.get(k) for k in STAGES if s.get(k) is not None}}
                    runs.append(run)
                    print(f"{label:>12} {compressor:<14} steady {rate:8.1f} steps/s  wall {s['wall_time_s']:.1f} s  "
                          + "  ".join(f"{k[:-2]} {v:.1f}" for k, v in run["stages_s"].items()), flush=True)
    median = {}
    for run in runs:
        median.setdefault(f"{run['loop']}/{run['compressor']}", []).append(run["steady_steps_per_s"])
    median = {k: float(np.median(v)) for k, v in median.items()}
    # The fastest Sebulba variant of each compressor against the sequential loop (each in its fastest
    # configuration, docs/DESIGN.md "A fair baseline"); every variant's ratio is in vs_sequential.
    vs_sequential = {k: v / median[f"sequential/{k.split('/', 1)[1]}"] for k, v in median.items()
                     if not k.startswith("sequential/")}
    speedup = {c: max(v for k, v in vs_sequential.items() if k.split("/", 1)[1] == c) for c in opts["compressors"]}
    baseline_key = max((k for k in median if k.endswith("/none")), key=median.get, default=None)
    vs_fastest = ({k: v / median[baseline_key] for k, v in median.items()} if baseline_key else {})
    return {
        "env": opts["env"], "options": {k: list(v) if isinstance(v, tuple) else v for k, v in opts.items()},
        "steps_per_update": steps_per_update, "runs": runs, "median": median, "sebulba_speedup": speedup, "vs_sequential": vs_sequential,
        "fastest_uncompressed": baseline_key, "vs_fastest_uncompressed": vs_fastest,
        "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
        "cpu_count": os.cpu_count(), "machine": platform.machine(), "jax": jax.__version__,
        "note": ("steady steps/s from metrics.csv between the second and last logged update (compilation "
                 "excluded); runs alternate between loops in one process, so shared load hits both"),
    }


def markdown(result: dict) -> str:
    """A markdown table of ``result`` (from :func:`measure`)."""
    lines = [f"# Sebulba vs sequential on {result['env']} ({result['backend']}, {result['cpu_count']} CPUs)", "",
             f"{result['options']['num_envs']} envs x {result['options']['rollout_length']} steps per update, "
             f"{result['options']['updates']} updates per run; steady steps/s (compilation excluded).", "",
             "| loop | compressor | steady steps/s | vs fastest uncompressed | wall s | policy lag mean/max | "
             "stage seconds |", "|---|---|---:|---:|---:|---|---|"]
    for run in result["runs"]:
        key = f"{run['loop']}/{run['compressor']}"
        lag = ("" if run["policy_lag_mean"] is None else f"{run['policy_lag_mean']:.2f} / {run['policy_lag_max']}")
        stages = ", ".join(f"{k[:-2]} {v:.1f}" for k, v in run["stages_s"].items())
        lines.append(f"| {run['loop']} | {run['compressor']} | {run['steady_steps_per_s']:.1f} | "
                     f"{result['vs_fastest_uncompressed'].get(key, float('nan')):.2f}x | {run['wall_time_s']:.1f} | "
                     f"{lag} | {stages} |")
    lines += ["", "Sebulba / sequential, each variant: " + ", ".join(f"{k}: {v:.2f}x" for k, v in result["vs_sequential"].items()),
              "", "Fastest Sebulba / sequential (median steady steps/s): "
              + ", ".join(f"{c}: **{v:.2f}x**" for c, v in result["sebulba_speedup"].items()), "",
              result["note"] + ".", ""]
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="JSON output (a .md table is written beside it)")
    p.add_argument("--quick", action="store_true", help=f"short runs ({QUICK['updates']} updates)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="cpu: force JAX's CPU backend; gpu: the learner on the GPU (actors stay on the host)")
    p.add_argument("--env", default=None)
    p.add_argument("--compressors", nargs="+", default=None)
    p.add_argument("--num-envs", type=int, default=None)
    p.add_argument("--rollout-length", type=int, default=None)
    p.add_argument("--updates", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--actor-threads", type=int, default=None)
    p.add_argument("--actor-batches", type=int, nargs="+", default=None,
                   help="Sebulba variants: --actor-batch of each (0: half of a thread's envs)")
    p.add_argument("--queue-size", type=int, default=None)
    args = p.parse_args(argv)
    if args.device == "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"  # before jax is imported (measure imports it)
    result = measure(args)
    if args.device == "gpu" and result["backend"] != "gpu":
        print(f"warning: --device gpu but JAX's backend is {result['backend']}", file=sys.stderr)
    text = markdown(result)
    print(text)
    if args.out:
        write_outputs(args.out, result, text)
    return result


def write_outputs(path: str, result: dict, text: str) -> None:
    """``result`` as JSON at ``path`` (atomically, its folder made if missing) and the markdown ``text``
    beside it (``.md`` for ``.json``)."""
    from accerl_jax.monitor import atomic_write_json

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_json(path, result)
    with open(os.path.splitext(path)[0] + ".md", "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
