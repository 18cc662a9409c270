"""The actor-bound Sebulba setting (the paper's): training throughput with a compressed actor against
``none``, beside the actor's own speedup (docs/DESIGN.md, "Where compression can pay").

Runs the real training loop (:func:`accerl_jax.loop.train`, ``--loop sebulba --actor-device cpu-apart``):
the actor threads run the policy on the host CPU (``cpu:0``) and the learner on the other devices: the
GPU on a GPU machine, or on a CPU-only machine the other forced XLA:CPU devices (this script forces 2
with ``--device cpu``; both share the same cores, so the learner is a stand-in, not extra hardware).
For each compressor (``none`` first), alternating, ``--repeats`` times, it records

* the *steady* training rate (env steps/s from ``metrics.csv`` between the second and the last logged
  update: :func:`experiments.throughput_sebulba.steady_rate`), the per-stage seconds, and over the same
  window each stage's busy share of the wall time (:func:`steady_shares`): the run is ``actor_bound``
  when the actor thread was busier than the learner (the learner then waits in ``queue_wait``);
* the final KL(learner || actor) of the run (nats, the Monitor's ``kl_learner_actor``);

and then times the *actor's inference alone*, for each compressor's trained actor and the same batch the
actor thread uses (``--actor-batch``): the jitted policy step of the real actor
(:meth:`accerl_jax.actor.HostActor.act`: forward pass, action sampling and fetching the actions, on
``cpu:0``), interleaved over ``--rounds`` rounds, fastest round kept. ``inference_speedup`` is ``none``'s
seconds per call divided by the compressor's. ``best`` is the fastest compressor (median steady rate)
whose KL stays at most ``--max-kl``; ``throughput_ratio`` (its rate / ``none``'s) and its
``inference_speedup`` are printed side by side.

Usage:
  python experiments/actor_bound.py [--device cpu|gpu] [--quick] \\
      [--out experiments/results/cpu-2core/actor_bound.json]

:func:`measure` is the library entry point (``experiments/device_check.py`` calls it).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULTS = dict(env="envpool:Pong-v5", compressors=("none", "prune:0.5", "distill:tiny"), num_envs=16,
                rollout_length=16, updates=20, log_every=4, repeats=2, actor_batch=1, queue_size=2,
                distill_steps=1, rounds=5, calls=20, max_kl=0.05)
QUICK = dict(env="envpool:CartPole-v1", compressors=("none", "distill:tiny"), num_envs=4, rollout_length=8,
             updates=6, log_every=2, repeats=1, actor_batch=2, rounds=2, calls=5)
STAGES = ("env_time_s", "inference_time_s", "actor_time_s", "transfer_time_s", "queue_wait_time_s",
          "learner_time_s", "compress_time_s", "actor_put_wait_s", "learner_compress_wait_s")


def _steady_rate(logdir: str):
    sys.path.insert(0, HERE)
    from throughput_sebulba import steady_rate

    return steady_rate(logdir)


def steady_shares(logdir: str) -> dict:
    """Each stage's seconds per wall second over the steady window (the second to the last row of
    ``metrics.csv``, whose ``time_<stage>_s`` columns are cumulative): ``actor`` (env + inference +
    hand-over, not its waits for room in the queue), ``inference``, ``env``, ``learner``, ``queue_wait``
    (the learner waiting for rollouts), ``compress``. The busier of ``actor`` and ``learner`` is the
    bottleneck (they run in parallel threads)."""
    import csv

    with open(os.path.join(logdir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    first, last = rows[1], rows[-1]
    wall = float(last["wall_time_s"]) - float(first["wall_time_s"])
    return {k: (float(last[f"time_{k}_s"]) - float(first[f"time_{k}_s"])) / wall
            for k in ("actor", "inference", "env", "learner", "queue_wait", "compress") if f"time_{k}_s" in last}


def inference_seconds(actors: dict, rounds: int, calls: int) -> dict:
    """Seconds per actor policy step (fastest of ``rounds`` rounds of ``calls`` calls, the methods
    interleaved in each round) for ``actors``: name -> ``(HostActor, params, obs [M, ...], key)``, the
    params and key on the actor's device. Each is called once before timing (compilation)."""
    import jax
    import numpy as np

    for actor, params, obs, key in actors.values():
        jax.device_get(actor.act(params, obs, key)[:2])
    times = {name: [] for name in actors}
    for _ in range(rounds):
        for name, (actor, params, obs, key) in actors.items():
            start = time.perf_counter()
            for _ in range(calls):
                action, log_prob, key = actor.act(params, obs, key)
                jax.device_get((action, log_prob))
            times[name].append((time.perf_counter() - start) / calls)
    return {name: float(np.min(t)) for name, t in times.items()}


def _actor_for(cfg, trained: dict, batch: int):
    """The run's actor (its compressor's apply, on ``cpu:0``) with its final parameters and ``batch``
    observations of its last rollout."""
    import jax

    from accerl_jax import networks, plan as plan_lib
    from accerl_jax.actor import HostActor
    from accerl_jax.envs import make_env
    from accerl_jax.run import make_run_compressor

    env = make_env(cfg.env, cfg.num_envs, cfg.seed)
    spec = plan_lib.make_plan(cfg, env.info, plan_lib.Machine(local_devices=2, backend="cpu")).spec
    learner_apply = networks.make_apply(spec)
    compressor = make_run_compressor(cfg, spec, learner_apply, env.info.continuous, env.info.obs_dtype)
    actor = HostActor(env, compressor.actor_apply(learner_apply), cfg.rollout_length, family=spec.family)
    cpu = jax.devices("cpu")[0]
    obs = jax.device_get(trained["obs"][:batch])
    return actor, jax.device_put(trained["actor_params"], cpu), obs, jax.device_put(jax.random.PRNGKey(0), cpu)


def measure(args, budget_s: float | None = None) -> dict:
    """The actor-bound comparison (module docstring). ``args``: a namespace or dict with any of
    :data:`DEFAULTS`' keys (``quick=True`` applies :data:`QUICK`). ``budget_s``: stop starting new runs
    once this many seconds have passed (the results so far are returned, ``"complete": False``).
    Returns a JSON-able dict."""
    import jax
    import numpy as np

    from accerl_jax.config import Config
    from accerl_jax.loop import train

    get = (lambda k: args.get(k)) if isinstance(args, dict) else (lambda k: getattr(args, k, None))
    opts = {k: DEFAULTS[k] if get(k) is None else get(k) for k in DEFAULTS}
    if get("quick"):
        opts.update({k: v for k, v in QUICK.items() if get(k) is None})
    compressors = list(opts["compressors"])
    if compressors[0] != "none":
        compressors = ["none"] + [c for c in compressors if c != "none"]
    start, load = time.perf_counter(), [os.getloadavg()[0]]
    steps_per_update = opts["num_envs"] * opts["rollout_length"]
    runs, actors, complete = [], {}, True
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(opts["repeats"]):
            for compressor in (compressors if repeat % 2 == 0 else compressors[::-1]):
                if budget_s is not None and time.perf_counter() - start > budget_s:
                    complete = False
                    break
                logdir = os.path.join(tmp, f"{compressor.replace(':', '_')}-{repeat}")
                cfg = Config(env=opts["env"], loop="sebulba", actor_device="cpu-apart", compressor=compressor,
                             loss="actor-critic",  # IMPALA's, as the Atari preset (one step per update)
                             num_envs=opts["num_envs"], rollout_length=opts["rollout_length"],
                             total_steps=opts["updates"] * steps_per_update, actor_batch=opts["actor_batch"],
                             queue_size=opts["queue_size"], distill_steps=opts["distill_steps"],
                             log_every=opts["log_every"], checkpoint_every=0, progress=False, logdir=logdir)
                trained: dict = {}
                s = train(cfg, trained=trained)
                rate, steady_steps = _steady_rate(logdir)
                stages = {k: s.get(k) for k in STAGES if s.get(k) is not None}
                shares = steady_shares(logdir)
                runs.append({"compressor": compressor, "repeat": repeat, "steady_steps_per_s": rate,
                             "steady_steps": steady_steps, "kl_learner_actor": s.get("kl_learner_actor"),
                             "steady_shares": shares, "actor_bound": shares["actor"] > shares["learner"],
                             **{k: s.get(k) for k in ("wall_time_s", "updates", "actor_device", "learner_devices",
                                                      "backend", "policy_lag_mean", "actor_params", "learner_params")},
                             "stages_s": stages})
                actors.setdefault(compressor, _actor_for(cfg, trained, opts["actor_batch"]))
                print(f"{compressor:<14} repeat {repeat}: steady {rate:8.1f} steps/s  kl {s.get('kl_learner_actor')}  "
                      "busy share " + " ".join(f"{k} {v:.2f}" for k, v in shares.items()), flush=True)
        load.append(os.getloadavg()[0])
        seconds = inference_seconds(actors, opts["rounds"], opts["calls"]) if "none" in actors else {}
    load.append(os.getloadavg()[0])
    by = {}
    for run in runs:
        by.setdefault(run["compressor"], []).append(run)
    methods = {}
    for c, rs in by.items():
        methods[c] = {
            "steady_steps_per_s": float(np.median([r["steady_steps_per_s"] for r in rs])),
            "kl_learner_actor": float(np.max([r["kl_learner_actor"] or 0.0 for r in rs])),
            "actor_bound_runs": sum(r["actor_bound"] for r in rs), "runs": len(rs),
            "steady_shares": {k: float(np.median([r["steady_shares"][k] for r in rs])) for k in rs[0]["steady_shares"]},
            "inference_s_per_call": seconds.get(c),
        }
    base = methods.get("none")
    for m in methods.values():
        m["throughput_ratio"] = m["steady_steps_per_s"] / base["steady_steps_per_s"] if base else None
        m["inference_speedup"] = (seconds["none"] / m["inference_s_per_call"]
                                  if base and m["inference_s_per_call"] else None)
    fit = [c for c in methods if c != "none" and methods[c]["kl_learner_actor"] <= opts["max_kl"]]
    best = max(fit, key=lambda c: methods[c]["steady_steps_per_s"], default=None)
    return {
        "env": opts["env"], "options": {k: list(v) if isinstance(v, tuple) else v for k, v in opts.items()},
        "steps_per_update": steps_per_update, "runs": runs, "methods": methods, "best": best,
        "best_throughput_ratio": methods[best]["throughput_ratio"] if best else None,
        "best_inference_speedup": methods[best]["inference_speedup"] if best else None,
        "complete": complete, "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
        "cpu_count": os.cpu_count(), "machine": platform.machine(), "jax": jax.__version__,
        "load_average_1min": {"start": load[0], "after_training": load[1], "end": load[-1]},
        "runtime_s": time.perf_counter() - start,
        "note": ("steady steps/s from metrics.csv between the second and last logged update (compilation excluded), "
                 "median over repeats, runs alternating between compressors in one process; inference seconds per "
                 "actor call at the actor batch, fastest of interleaved rounds; busy share: a stage's seconds per wall "
                 "second over the same window; actor_bound: the actor thread busier than the learner; "
                 "load_average_1min is os.getloadavg()"),
    }


def markdown(result: dict) -> str:
    """A markdown table of ``result`` (from :func:`measure`)."""
    o = result["options"]
    lines = [f"# Actor-bound Sebulba on {result['env']} ({result['backend']}: actor on cpu:0, learner on "
             f"{result['runs'][0]['learner_devices'] if result['runs'] else '?'} other device(s))", "",
             f"{o['num_envs']} envs x {o['rollout_length']} steps per update, actor batch {o['actor_batch']}, "
             f"{o['updates']} updates per run, {o['repeats']} repeat(s); load average (1 min) "
             + ", ".join(f"{k} {v:.2f}" for k, v in result["load_average_1min"].items()), "",
             "| compressor | steady steps/s | throughput vs none | inference s/call | inference speedup | KL | "
             "busy share actor / learner / queue wait | actor-bound runs |", "|---|---:|---:|---:|---:|---:|---|---|"]
    for c, m in result["methods"].items():
        fmt = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
        lines.append(f"| {c} | {m['steady_steps_per_s']:.1f} | {fmt(m['throughput_ratio'], '.2f')}x | "
                     f"{fmt(m['inference_s_per_call'], '.5f')} | {fmt(m['inference_speedup'], '.2f')}x | "
                     f"{m['kl_learner_actor']:.4f} | " + " / ".join(f"{m['steady_shares'].get(k, 0):.2f}" for k in
                                                                  ("actor", "learner", "queue_wait"))
                     + f" | {m['actor_bound_runs']}/{m['runs']} |")
    if result["best"]:
        lines += ["", f"Best ({result['best']}, KL <= {o['max_kl']}): throughput **{result['best_throughput_ratio']:.2f}x**"
                  f" against none, actor inference **{result['best_inference_speedup']:.2f}x**."]
    return "\n".join(lines + ["", result["note"] + ".", ""])


def force_cpu_devices(n: int = 2) -> None:
    """JAX on CPU with ``n`` forced devices (set before JAX starts its backend)."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="JSON output (a .md table is written beside it)")
    p.add_argument("--quick", action="store_true", help="tiny CartPole runs (a smoke test)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="cpu: 2 forced XLA:CPU devices (actor cpu:0, learner cpu:1); gpu: the learner on the GPU")
    p.add_argument("--env", default=None)
    p.add_argument("--compressors", nargs="+", default=None)
    for name in ("num_envs", "rollout_length", "updates", "repeats", "actor_batch", "queue_size", "distill_steps",
                 "rounds", "calls"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None)
    p.add_argument("--max-kl", type=float, default=None)
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no new training run after this many seconds (partial results, complete: false)")
    args = p.parse_args(argv)
    if args.device == "cpu":
        force_cpu_devices()
    result = measure(args, args.budget_s)
    text = markdown(result)
    print(text)
    if args.out:
        sys.path.insert(0, HERE)
        from throughput_sebulba import write_outputs

        write_outputs(args.out, result, text)
    return result


if __name__ == "__main__":
    main()
