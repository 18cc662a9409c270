"""Training throughput of the loops against a bare jitted rollout+update function.

Measured side by side in ONE process, on gymnax CartPole-v1 at the default job's sizes (16 envs x 16
steps per update, the default network, IMPALA's V-trace actor-critic: one gradient step per update, as
the bare program takes; ``--loss actor-critic`` in the loops), each with compressor ``none`` and with a
compressor (``distill:small`` by default):

* ``bare``: a hand-written jitted ``lax.scan`` over updates -- the AnakinActor-style rollout (policy sample
  + gymnax step), the learner update and (with a compressor) its ``compress`` call -- no guard, no
  policy versions, no logging, no host work: the framework-free floor.
* ``anakin``: ``python -m accerl_jax.train --loop anakin`` (in-process ``loop.train``).
* ``sequential``: ``--loop sequential``, with its per-stage split (actor, learner, compress).

Steps/s of the loops are steady-state: from the first to the last row of ``metrics.csv`` (compilation
and the end-of-run measurements are outside the window); ``bare`` times the same number of updates after
a compiling warm-up call. Configurations are interleaved ``--repeats`` times and the median kept, so
load on a shared machine hits every configuration alike. The target: ``anakin`` adds at most
10% over ``bare`` (``overhead = bare_sps / anakin_sps - 1``).

Other measurements plug in through :data:`MEASUREMENTS` (name -> ``measure(args) -> dict``): a file
``experiments/throughput_sebulba.py`` exposing ``measure(args)`` (Sebulba vs sequential on envpool
Pong-v5) is imported if present and its result stored under ``"sebulba"``.

    python experiments/throughput.py --out experiments/results/throughput_cpu.json
    python experiments/throughput.py --quick            # a smoke run (few updates, one repeat)
"""
from __future__ import annotations

import argparse
import csv
import importlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The loops' loss: the bare program's (one V-trace actor-critic step per update), not the main job's APPO.
LOSS = dict(loss="actor-critic")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="write the results as JSON here (and a .md table beside it)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="JAX platform to run on")
    p.add_argument("--quick", action="store_true", help="few updates and one repeat (a smoke run)")
    p.add_argument("--updates", type=int, default=600, help="learner updates per measured run")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats per configuration (median kept)")
    p.add_argument("--compressor", default="distill:small", help="the compressed configuration")
    p.add_argument("--env", default="gymnax:CartPole-v1")
    p.add_argument("--only", default="", help="comma list of measurement names to run (default: all)")
    args = p.parse_args(argv)
    if args.quick:
        args.updates, args.repeats = min(args.updates, 60), 1
    return args


def _rows(logdir: str) -> list[dict]:
    with open(os.path.join(logdir, "metrics.csv")) as f:
        return [{k: float(v) if v not in ("", None) else float("nan") for k, v in r.items()} for r in csv.DictReader(f)]


def run_loop(loop_name: str, compressor: str, args) -> dict:
    """One in-process training run; steady-state steps/s between the first and last metrics rows."""
    from accerl_jax import loop
    from accerl_jax.config import Config

    cfg = Config(env=args.env, compressor=compressor, loop=loop_name, total_steps=16 * 16 * args.updates, **LOSS,
                 logdir=tempfile.mkdtemp(prefix=f"throughput-{loop_name}-"), progress=False, checkpoint_every=0)
    summary = loop.train(cfg)
    rows = _rows(cfg.logdir)
    first, last = rows[0], rows[-1]
    wall = last["wall_time_s"] - first["wall_time_s"]
    steps = last["env_steps"] - first["env_steps"]
    out = {"steps_per_s": steps / wall, "window_s": wall, "window_updates": int(last["update"] - first["update"]),
           "run_wall_s": summary["wall_time_s"], "final_return_mean": summary["final_return_mean"]}
    stages = {}
    for name in ("actor", "learner", "compress", "fused_wait"):
        key = f"time_{name}_s"
        if key in last and last[key] == last[key]:
            stages[name] = last[key] - first[key]
    stages["host_other"] = wall - sum(v for k, v in stages.items())
    out["stage_s"] = stages
    out["stage_ms_per_update"] = {k: 1e3 * v / max(out["window_updates"], 1) for k, v in stages.items()}
    return out


def make_bare(compressor_spec: str, args):
    """The framework-free floor: ``(state, n) -> state`` jitted, ``n`` updates in one ``lax.scan``."""
    import jax

    from accerl_jax import learner as learner_lib
    from accerl_jax import networks
    from accerl_jax.actor import rollout_from_steps, sample_action
    from accerl_jax.compressor import make_compressor
    from accerl_jax.envs import make_env
    from accerl_jax.config import Config

    cfg = Config(env=args.env, compressor=compressor_spec, **LOSS)
    env = make_env(cfg.env, cfg.num_envs, cfg.seed)
    info = env.info
    spec = networks.default_spec(info.obs_shape, info.num_actions, info.channels_first)
    apply = networks.make_apply(spec)
    comp = make_compressor(compressor_spec, spec, apply, distill_steps=cfg.distill_steps,
                           distill_learning_rate=cfg.distill_learning_rate)
    actor_apply = comp.actor_apply(apply)
    optimizer = learner_lib.make_optimizer(cfg.learning_rate, cfg.max_grad_norm, args.updates)
    loss_cfg = learner_lib.LossConfig(corrector=cfg.corrector, discount=cfg.discount, lambda_=cfg.lambda_,
                                      value_coef=cfg.value_coef, entropy_coef=cfg.entropy_coef)
    update = learner_lib.make_update(apply, optimizer, loss_cfg)
    k_net, k_comp, k_env, k_act = jax.random.split(jax.random.PRNGKey(cfg.seed), 4)
    params = networks.init_params(spec, k_net)
    env_state, obs = jax.jit(env.reset)(k_env)
    actor_params, comp_state = comp.init(params, k_comp, obs)

    def one_update(c, _):
        learner, actor_params, comp_state, env_state, obs, key = c

        def env_step(e, _):
            env_state, obs, key = e
            key, sub = jax.random.split(key)
            action, log_prob = sample_action(actor_apply, actor_params, obs, sub)
            env_state, tr = env.step(env_state, action)
            return (env_state, tr.obs, key), (obs, action, log_prob, tr)

        (env_state, obs, key), (o, a, lp, tr) = jax.lax.scan(env_step, (env_state, obs, key), None,
                                                             length=cfg.rollout_length)
        rollout = rollout_from_steps(o, a, lp, tr, info.bootstrap_slots(cfg.rollout_length))
        learner, _ = update(learner, rollout)
        actor_params, comp_state = comp.compress(learner.params, comp_state, o.reshape((-1,) + info.obs_shape))
        return (learner, actor_params, comp_state, env_state, obs, key), None

    @jax.jit
    def run(c, n_dummy):
        return jax.lax.scan(one_update, c, None, length=n_dummy.shape[0])[0]

    state = (learner_lib.init_state(params, optimizer, key=learner_lib.learner_key(0)), actor_params, comp_state, env_state, obs, k_act)
    return run, state, cfg


def run_bare(compressor: str, args, chunk: int = 10) -> dict:
    """Steps/s of the bare function over ``args.updates`` updates (chunks of ``chunk`` = the default
    --log-every, dispatched back to back with no host sync in between), after a compiling warm-up."""
    import jax
    import jax.numpy as jnp

    run, state, cfg = make_bare(compressor, args)
    n = jnp.zeros((chunk,))
    for _ in range(2):  # compile; the second call compiles again for the outputs' shardings
        state = jax.block_until_ready(run(state, n))
    start = time.perf_counter()
    for _ in range(args.updates // chunk):
        state = run(state, n)
    jax.block_until_ready(state)
    wall = time.perf_counter() - start
    updates = (args.updates // chunk) * chunk
    return {"steps_per_s": updates * cfg.num_envs * cfg.rollout_length / wall, "window_s": wall,
            "window_updates": updates}


def measure_programs(compressor: str, args, chunk: int = 10, rounds: int = 8) -> dict:
    """The programs alone, no host work: the bare scan vs the Anakin loop's jitted chunk (guard, policy
    versions, metrics, divergence at the chunk's end), ``chunk`` updates per call, 5 calls per round,
    rounds interleaved; ms per update (medians). Separates in-program overhead from the loop's host work."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from accerl_jax import run as run_lib
    from accerl_jax.config import Config
    from accerl_jax.loops import anakin_program, anakin_state

    bare, bare_state, _ = make_bare(compressor, args)
    n = jnp.zeros((chunk,))
    cfg = Config(env=args.env, compressor=compressor, progress=False, **LOSS,
                 logdir=tempfile.mkdtemp(prefix="throughput-program-"))
    run = run_lib.setup(cfg, [])
    fn = anakin_program.make_chunk(run)
    state = anakin_state.place_state(run, anakin_state.initial_state(run, cfg.seed))
    for _ in range(2):
        bare_state = jax.block_until_ready(bare(bare_state, n))
        state = jax.block_until_ready(fn(state, chunk)[0])
    ms = {"bare": [], "anakin_chunk": []}
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(5):
            bare_state = bare(bare_state, n)
        jax.block_until_ready(bare_state)
        ms["bare"].append((time.perf_counter() - start) / (5 * chunk) * 1e3)
        start = time.perf_counter()
        for _ in range(5):
            state = fn(state, chunk)[0]
        jax.block_until_ready(state)
        ms["anakin_chunk"].append((time.perf_counter() - start) / (5 * chunk) * 1e3)
    run.lock.release()
    run.saver.close()
    run.monitor.close()
    med = {k: float(np.median(v)) for k, v in ms.items()}
    return {"ms_per_update": med, "ms_per_update_rounds": ms,
            "anakin_program_overhead_vs_bare": med["anakin_chunk"] / med["bare"] - 1.0}


def measure_core(args) -> dict:
    """bare / anakin / sequential x (none, compressor), interleaved repeats, medians."""
    configs = [(kind, comp) for comp in ("none", args.compressor) for kind in ("bare", "anakin", "sequential")]
    samples: dict = {f"{k}|{c}": [] for k, c in configs}
    for rep in range(args.repeats):
        for kind, comp in configs:
            res = run_bare(comp, args) if kind == "bare" else run_loop(kind, comp, args)
            samples[f"{kind}|{comp}"].append(res)
            print(f"  repeat {rep + 1}/{args.repeats} {kind:10s} {comp:14s} {res['steps_per_s']:>10,.0f} steps/s",
                  flush=True)
    out = {}
    for key, runs in samples.items():
        sps = [r["steps_per_s"] for r in runs]
        best = runs[sps.index(statistics.median_low(sps))]
        out[key] = dict(best, steps_per_s=statistics.median(sps), steps_per_s_runs=sps)
    ratios = {}
    for comp in ("none", args.compressor):
        bare, ana, seq = (out[f"{k}|{comp}"]["steps_per_s"] for k in ("bare", "anakin", "sequential"))
        ratios[comp] = {"anakin_overhead_vs_bare": bare / ana - 1.0, "anakin_speedup_vs_sequential": ana / seq,
                        "sequential_overhead_vs_bare": bare / seq - 1.0, "target_anakin_overhead_le_10pct": bare / ana - 1.0 <= 0.10}
    programs = {comp: measure_programs(comp, args) for comp in ("none", args.compressor)}
    for comp, p in programs.items():
        print(f"  program only, {comp}: bare {p['ms_per_update']['bare']:.2f} ms/update, anakin chunk "
              f"{p['ms_per_update']['anakin_chunk']:.2f} ms/update", flush=True)
    return {"runs": out, "ratios": ratios, "programs": programs}


def _sebulba(args) -> dict:
    if not os.path.exists(os.path.join(HERE, "throughput_sebulba.py")):
        return {"skipped": "experiments/throughput_sebulba.py not present"}
    sys.path.insert(0, HERE)
    # Its own sizes (envpool Pong-v5, 16 x 16, 32 updates); only --quick and --device carry over, since this
    # script's --env/--updates/--compressor describe the gymnax measurement.
    return importlib.import_module("throughput_sebulba").measure({"quick": args.quick, "device": args.device})


# name -> measure(args) -> dict; results are stored under their name. The Sebulba-vs-sequential
# measurement on envpool Pong-v5 lives in experiments/throughput_sebulba.py.
MEASUREMENTS = {"core": measure_core, "sebulba": _sebulba}


def to_markdown(result: dict) -> str:
    core = result.get("core")
    lines = [f"# Training throughput ({result['env']}, {result['device']}, {result['updates']} updates per run, "
             f"median of {result['repeats']})", ""]
    if core:
        lines += ["| loop | compressor | steps/s | ms/update by stage |", "|---|---|---:|---|"]
        for key, r in core["runs"].items():
            kind, comp = key.split("|")
            stages = ", ".join(f"{k} {v:.2f}" for k, v in r.get("stage_ms_per_update", {}).items())
            lines.append(f"| {kind} | {comp} | {r['steps_per_s']:,.0f} | {stages} |")
        lines += ["", "| compressor | anakin overhead vs bare | anakin / sequential | sequential overhead vs bare |",
                  "|---|---:|---:|---:|"]
        for comp, r in core["ratios"].items():
            lines.append(f"| {comp} | {100 * r['anakin_overhead_vs_bare']:+.1f}% | {r['anakin_speedup_vs_sequential']:.2f}x "
                         f"| {100 * r['sequential_overhead_vs_bare']:+.1f}% |")
    if core and "programs" in core:
        lines += ["", "Programs alone (no host work; interleaved rounds, medians):", "",
                  "| compressor | bare ms/update | anakin chunk ms/update | overhead |", "|---|---:|---:|---:|"]
        for comp, p in core["programs"].items():
            m = p["ms_per_update"]
            lines.append(f"| {comp} | {m['bare']:.2f} | {m['anakin_chunk']:.2f} | "
                         f"{100 * p['anakin_program_overhead_vs_bare']:+.1f}% |")
    for name, res in result.items():
        if name in MEASUREMENTS and name != "core":
            lines += ["", f"## {name}", "", "```", json.dumps(res, indent=2)[:4000], "```"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    result = {"env": args.env, "device": args.device, "backend": jax.default_backend(),
              "devices": [str(d) for d in jax.devices()], "updates": args.updates, "repeats": args.repeats,
              "compressor": args.compressor, "jax": jax.__version__, "host": platform.node(),
              "cpu_count": os.cpu_count(), "command": " ".join(["python", "experiments/throughput.py", *(argv or sys.argv[1:])])}
    only = [n for n in args.only.split(",") if n]
    for name, measure in MEASUREMENTS.items():
        if only and name not in only:
            continue
        print(f"[{name}]", flush=True)
        result[name] = measure(args)
    md = to_markdown(result)
    print(md)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(md)
    return result


if __name__ == "__main__":
    main()
