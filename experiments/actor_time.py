"""The paper's actor-time table: actor steps/s of every compression method, side by side in one process.

For one environment and number of environments it

1. gets a *trained* learner policy: restored from ``--checkpoint`` (an orbax folder) if it exists, else
   trained here with ``accerl_jax.loop.train`` (compressor ``none``, ``--train-steps`` agent steps) and
   saved there if ``--checkpoint`` is given;
2. collects observations with that policy at ``--num-envs``: one set to distil students on and to
   calibrate int8 (``fit``), and a later, disjoint set on which fidelity is measured (``held``);
3. builds each ``--methods`` compressor (``accerl_jax.compressor.make_compressor``), distilling
   students for ``--distill-steps`` gradient steps from the trained teacher;
4. measures actor steps/s (env stepping + policy inference, the real Actor of ``accerl_jax.actor``) for
   each method and for the no-policy ceiling (random actions), interleaved over ``--rounds`` rounds of
   ``--repeats`` rollouts, each method in the faster of the XLA:CPU configurations (for conv networks:
   default and YNN fusion off; docs/DESIGN.md "A fair baseline" -- ``none`` included). ``sps`` uses the
   *fastest* rollout of each (the least disturbed by other jobs on a shared machine, as ``timeit``
   advises); ``sps_median`` the median rollout;
5. reports per method ``sps``, ``speedup_vs_none``, ``inference_share`` (share of the actor's time not
   spent stepping the environments), ``kl`` (KL(π_learner ‖ π_actor), nats) and ``agreement`` (greedy
   action) on the held observations, ``params``, ``bytes``, and the policy's forward speed alone vs
   ``none`` (``forward_speedup``, accerl_jax.speed.policy_speedup) -- as JSON (``--out``), a markdown
   table (same name, ``.md``) and a bar chart (``.png``).

Usage:
  python experiments/actor_time.py --env gymnax:CartPole-v1 --num-envs 1024 \\
      --methods none,mask:0.9,prune:0.5,prune:0.75,int8,bf16,distill:small,distill:small+int8 \\
      --out experiments/results/actor_time_cartpole.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from accerl_jax import networks, speed, xla
from accerl_jax.actor import make_actor
from accerl_jax.compressor import make_compressor
from accerl_jax.config import Config
from accerl_jax.envs import make_env
from accerl_jax.loop import train
from accerl_jax.monitor import atomic_write_json, policy_divergence

# The actor's compiler options come from its network family (accerl_jax.xla.options_for); on CPU the
# family names select "default" (mlp) and "no_ynn" (cnn) options, and nothing else.
CONFIG_FAMILIES = {"default": "mlp", "no_ynn": "cnn"}


def trained_policy(args, spec: networks.NetworkSpec):
    """Learner params of a short training run (or a checkpoint), and the training summary (or None)."""
    import orbax.checkpoint as ocp

    target = networks.init_params(spec, jax.random.PRNGKey(0))
    if args.checkpoint and os.path.isdir(args.checkpoint):
        params = ocp.StandardCheckpointer().restore(os.path.abspath(args.checkpoint), target)
        info = {"restored_from": args.checkpoint}
        if os.path.exists(args.checkpoint.rstrip("/") + ".json"):  # the training summary saved beside it
            with open(args.checkpoint.rstrip("/") + ".json") as f:
                info.update(json.load(f))
        return params, info
    final: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Config(env=args.env, compressor="none", total_steps=args.train_steps, num_envs=args.train_envs,
                     seed=args.seed, logdir=os.path.join(tmp, "run"), progress=False, log_every=50,
                     loss=args.loss, hidden_sizes=tuple(args.hidden_sizes or ()))
        summary = train(cfg, trained=final)
    if args.checkpoint:
        ckpt = ocp.StandardCheckpointer()
        ckpt.save(os.path.abspath(args.checkpoint), final["learner_params"])
        ckpt.wait_until_finished()
    keep = ("total_env_steps", "final_return_mean", "wall_time_s", "episodes", "num_envs")
    info = {k: summary[k] for k in keep}
    if args.checkpoint:
        atomic_write_json(args.checkpoint.rstrip("/") + ".json", info)
    return final["learner_params"], info


def collect_obs(actor, params, key, rollouts: int, limit: int):
    """Observations ``[N, *obs_shape]`` (N <= limit) of ``rollouts`` rollouts of the teacher's actor."""
    carry = actor.reset(key)
    chunks = []
    for _ in range(rollouts):
        carry, rollout, _ = actor.rollout(params, carry)
        chunks.append(np.asarray(rollout.obs).reshape((-1,) + rollout.obs.shape[2:]))
    obs = np.concatenate(chunks)
    idx = np.random.default_rng(0).permutation(len(obs))[:limit]
    return jnp.asarray(obs[idx])


def random_rollout_seconds(env, actor, carry, length: int):
    """Wall seconds of ``length`` env steps with uniform-random actions and no policy (the ceiling)."""
    if env.info.jittable:
        return actor.time_env_only(carry)
    rng = np.random.default_rng(0)
    env_state = carry.env_state
    start = time.perf_counter()
    for _ in range(length):
        env_state, _ = env.step(env_state, rng.integers(0, env.info.num_actions, env.info.num_envs).astype(np.int32))
    return time.perf_counter() - start


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env", required=True)
    p.add_argument("--num-envs", type=int, required=True)
    p.add_argument("--methods", default="none,mask:0.9,prune:0.5,prune:0.75,int8,bf16,distill:small,distill:small+int8")
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", default=None, help="orbax folder of trained learner params (restored, or written)")
    p.add_argument("--train-steps", type=int, default=200_000, help="agent steps of the built-in training")
    p.add_argument("--train-envs", type=int, default=16)
    p.add_argument("--hidden-sizes", type=int, nargs="+", default=None,
                   help="the learner network's widths (default: the default network, accerl_jax.networks.default_spec)")
    p.add_argument("--loss", default="auto", help="the teacher's training loss (--loss of accerl_jax.train)")
    p.add_argument("--distill-steps", type=int, default=2000, help="distillation gradient steps per student")
    p.add_argument("--distill-lr", type=float, default=1e-3)
    p.add_argument("--rollout-length", type=int, default=16, help="T of each timed actor rollout")
    p.add_argument("--fit-rollouts", type=int, default=4)
    p.add_argument("--fit-samples", type=int, default=8192, help="observations to distil/calibrate on")
    p.add_argument("--held-samples", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3, help="rollouts timed per round and method")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if methods[0] != "none":
        methods = ["none"] + [m for m in methods if m != "none"]
    t_start = time.perf_counter()
    load_start = os.getloadavg()[0]

    env = make_env(args.env, args.num_envs, args.seed)
    info = env.info
    spec = networks.default_spec(info.obs_shape, info.num_actions, info.channels_first)
    if args.hidden_sizes:
        spec = networks.with_widths(spec, args.hidden_sizes)
    learner_apply = networks.make_apply(spec)
    teacher, training = trained_policy(args, spec)
    print(f"[{time.perf_counter() - t_start:6.0f}s] teacher ready: {training}", flush=True)

    teacher_actor = make_actor(env, learner_apply, args.rollout_length, family=spec.family)
    fit_obs = collect_obs(teacher_actor, teacher, jax.random.PRNGKey(100), args.fit_rollouts, args.fit_samples)
    held_obs = collect_obs(teacher_actor, teacher, jax.random.PRNGKey(200), args.fit_rollouts, args.held_samples)
    learner_logits = jax.jit(lambda p, o: learner_apply(p, o)[0])
    held_teacher = learner_logits(teacher, held_obs)

    configs = list(xla.candidate_configs(spec.family))
    entries = {}
    per_call = 50
    for m in methods:
        t0 = time.perf_counter()
        comp = make_compressor(m, spec, learner_apply, distill_steps=per_call, distill_learning_rate=args.distill_lr)
        actor_params, state = comp.init(teacher, jax.random.PRNGKey(1), fit_obs)
        calls = 0
        if "distill" in state:
            calls = max(1, args.distill_steps // per_call)
            for _ in range(calls):
                actor_params, state = comp.compress(teacher, state, fit_obs)
        actor_params = jax.block_until_ready(actor_params)
        actor_apply = comp.actor_apply(learner_apply)
        div = policy_divergence(held_teacher, jax.jit(lambda p, o: actor_apply(p, o)[0])(actor_params, held_obs))
        actors = {c: make_actor(env, actor_apply, args.rollout_length, family=CONFIG_FAMILIES[c]) for c in configs}
        entries[m] = {
            "apply": actor_apply, "params": actor_params, "actors": actors, "times": {c: [] for c in configs},
            "kl": float(div["kl_learner_actor"]), "agreement": float(div["action_agreement"]),
            "distill_steps": calls * per_call, "build_s": time.perf_counter() - t0,
        }
        print(f"[{time.perf_counter() - t_start:6.0f}s] built {m}: kl={entries[m]['kl']:.4f} "
              f"agreement={entries[m]['agreement']:.3f} (distill steps {calls * per_call})", flush=True)

    # Timing: every method and configuration, interleaved in rounds so machine noise is shared.
    carries = {}
    for m, e in entries.items():
        for c, actor in e["actors"].items():
            carries[(m, c)] = actor.reset(jax.random.PRNGKey(300))
            carries[(m, c)], r, _ = actor.rollout(e["params"], carries[(m, c)])  # compile + warm up
            jax.block_until_ready(r)
    ceiling_carry = teacher_actor.reset(jax.random.PRNGKey(301))
    random_rollout_seconds(env, teacher_actor, ceiling_carry, args.rollout_length)  # compile + warm up
    ceiling_t = []
    for _ in range(args.rounds):
        ceiling_t += [random_rollout_seconds(env, teacher_actor, ceiling_carry, args.rollout_length)
                      for _ in range(args.repeats)]
        for m, e in entries.items():
            for c, actor in e["actors"].items():
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    carries[(m, c)], r, _ = actor.rollout(e["params"], carries[(m, c)])
                    jax.block_until_ready(r)
                    e["times"][c].append(time.perf_counter() - start)
    print(f"[{time.perf_counter() - t_start:6.0f}s] timed", flush=True)

    steps = args.num_envs * args.rollout_length
    ceiling_s = float(np.min(ceiling_t))
    obs_seq = held_obs[: (len(held_obs) // args.num_envs) * args.num_envs].reshape((-1, args.num_envs) + info.obs_shape)
    obs_seq = obs_seq[:4] if len(obs_seq) else held_obs[None, : args.num_envs]
    out = {"env": args.env, "num_envs": args.num_envs, "ceiling_sps": steps / ceiling_s, "methods": {}}
    for m, e in entries.items():
        best = min(e["times"], key=lambda c: np.min(e["times"][c]))
        sec = float(np.min(e["times"][best]))
        fwd = speed.policy_speedup(learner_apply, teacher, e["apply"], e["params"], obs_seq, family=spec.family,
                                   rounds=2, repeats=3)
        out["methods"][m] = {
            "sps": steps / sec,
            "inference_share": max(0.0, 1.0 - ceiling_s / sec),
            "kl": e["kl"],
            "agreement": e["agreement"],
            "params": networks.param_count(e["params"]),
            "bytes": networks.param_bytes(e["params"]),
            "xla_config": best,
            "sps_median": steps / float(np.median(e["times"][best])),
            "sps_by_config": {c: steps / float(np.min(t)) for c, t in e["times"].items()},
            "forward_speedup": fwd["actor_policy_speedup"],
            "forward_s": fwd["actor_forward_s"],
            "distill_steps": e["distill_steps"],
        }
    base = out["methods"]["none"]["sps"]
    for r in out["methods"].values():
        r["speedup_vs_none"] = r["sps"] / base
        r["share_of_ceiling"] = r["sps"] / out["ceiling_sps"]
    out["ceiling_sps_median"] = steps / float(np.median(ceiling_t))
    out["setup"] = {
        "network": dataclasses.asdict(spec), "teacher": training, "rollout_length": args.rollout_length,
        "rounds": args.rounds, "repeats": args.repeats, "fit_samples": int(len(fit_obs)),
        "held_samples": int(len(held_obs)), "distill_lr": args.distill_lr, "forward_batch": int(obs_seq.shape[1]),
        "backend": jax.default_backend(), "jax": jax.__version__, "machine": platform.machine(),
        "cpu_count": os.cpu_count(), "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "runtime_s": time.perf_counter() - t_start,
        "load_average_1min": {"start": load_start, "end": os.getloadavg()[0]},
        "note": "sps from the fastest of rounds x repeats interleaved rollouts, sps_median from the median; ratios "
                "are from one process; load_average_1min is os.getloadavg() when the script started and ended",
    }
    write_outputs(out, args.out)
    print(markdown(out))
    return out


def markdown(out: dict) -> str:
    lines = [
        f"### {out['env']}, {out['num_envs']} envs: ceiling {out['ceiling_sps']:,.0f} steps/s (random actions, no policy)",
        "",
        "| method | steps/s | speedup vs none | % of ceiling | inference share | KL (nats) | agreement | params | bytes | forward speedup | XLA config |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for m, r in out["methods"].items():
        lines.append(
            f"| `{m}` | {r['sps']:,.0f} | {r['speedup_vs_none']:.2f}x | {100 * r['share_of_ceiling']:.0f}% | "
            f"{100 * r['inference_share']:.0f}% | {r['kl']:.4f} | {100 * r['agreement']:.1f}% | {r['params']:,} | "
            f"{r['bytes']:,} | {r['forward_speedup']:.2f}x | {r['xla_config']} |"
        )
    return "\n".join(lines) + "\n"


def write_outputs(out: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_json(path, out)
    stem = os.path.splitext(path)[0]
    with open(stem + ".md", "w") as f:
        f.write(markdown(out))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(out["methods"])
    sps = [out["methods"][m]["sps"] for m in names]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(names)), 4))
    bars = ax.bar(range(len(names)), sps, color=["gray"] + ["tab:blue"] * (len(names) - 1))
    ax.axhline(out["ceiling_sps"], color="red", linestyle="--", label="ceiling (no policy)")
    for b, m in zip(bars, names):
        ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{out['methods'][m]['speedup_vs_none']:.2f}x",
                ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("actor steps/s")
    ax.set_title(f"{out['env']}, {out['num_envs']} envs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
