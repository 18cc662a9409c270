"""APPO's gradient steps with a conv net on XLA:CPU: in a ``lax.scan`` against unrolled, side by side.

XLA:CPU runs a conv net's gradient steps much slower inside a loop than in straight-line code
(docs/DESIGN.md, "Known XLA:CPU pitfall"), so :func:`accerl_jax.learner.make_update` unrolls APPO's
``--epochs x --minibatches`` steps for conv nets there (:func:`accerl_jax.xla.gradient_loop_unroll`).
This script builds the learner update of ``--env``'s default network both ways in one process (the scan
by making ``gradient_loop_unroll`` answer 1), checks that both give the same update, and times them
interleaved: compile seconds (first call) and the median seconds per update over ``--rounds`` calls
each, on one rollout of the env (``--num-envs`` x ``--rollout-length``).

Usage:
  python experiments/learner_unroll.py [--env gymnax:Breakout-MinAtar] [--epochs 8] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from unittest import mock

import jax
import numpy as np

from accerl_jax import learner, networks, xla
from accerl_jax.actor import AnakinActor
from accerl_jax.envs import make_env

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput_sebulba import write_outputs  # noqa: E402


def make_updates(env_id: str, num_envs: int, rollout_length: int, epochs: int, minibatches: int):
    """``(updates, state, rollout, spec, compile_s, results)``: ``updates`` maps ``"unrolled"``/``"scan"`` to
    the jitted update, each compiled by a first call (its seconds in ``compile_s``, its output in ``results``)."""
    env = make_env(env_id, num_envs, 0)
    info = env.info
    spec = networks.default_spec(info.obs_shape, info.num_actions, info.channels_first)
    apply = networks.make_apply(spec)
    params = networks.init_params(spec, jax.random.PRNGKey(0))
    actor = AnakinActor(env, apply, rollout_length, family=spec.family)
    _, rollout, _ = actor.rollout(params, actor.reset(jax.random.PRNGKey(1)))
    optimizer = learner.make_optimizer(1e-3, 40.0, 1000)
    cfg = learner.LossConfig(loss="appo", epochs=epochs, minibatches=minibatches)
    state = learner.init_state(params, optimizer, key=learner.learner_key(0))
    updates, compile_s, results = {}, {}, {}
    for name, unroll in (("unrolled", xla.gradient_loop_unroll), ("scan", lambda *a, **k: 1)):
        # The choice is read when the update is traced, at its first call: compile inside the patch.
        with mock.patch.object(xla, "gradient_loop_unroll", unroll):
            updates[name] = learner.make_update(apply, optimizer, cfg, family=spec.family)
            start = time.perf_counter()
            results[name] = jax.block_until_ready(updates[name](state, rollout))
            compile_s[name] = time.perf_counter() - start
    return updates, state, rollout, spec, compile_s, results


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="gymnax:Breakout-MinAtar")
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--rollout-length", type=int, default=16)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--minibatches", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3, help="timed calls of each update (interleaved)")
    p.add_argument("--out", default=None, help="write the results as JSON here (and a .md table beside it)")
    args = p.parse_args(argv)
    updates, state, rollout, spec, compile_s, results = make_updates(
        args.env, args.num_envs, args.rollout_length, args.epochs, args.minibatches)
    diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
               for a, b in zip(jax.tree.leaves(results["scan"][0].params), jax.tree.leaves(results["unrolled"][0].params)))
    samples: dict[str, list] = {name: [] for name in updates}
    for _ in range(args.rounds):
        for name, update in updates.items():
            start = time.perf_counter()
            jax.block_until_ready(update(state, rollout))
            samples[name].append(time.perf_counter() - start)
    med = {name: statistics.median(s) for name, s in samples.items()}
    result = {"env": args.env, "network": spec.family, "backend": jax.default_backend(), "jax": jax.__version__,
              "host": platform.node(), "cpu_count": os.cpu_count(), "epochs": args.epochs, "minibatches": args.minibatches,
              "num_envs": args.num_envs, "rollout_length": args.rollout_length,
              "unroll_used": xla.gradient_loop_unroll(spec.family, args.epochs * args.minibatches),
              "max_abs_param_diff": diff, "compile_s": compile_s, "update_s": med, "update_s_samples": samples,
              "scan_over_unrolled": med["scan"] / med["unrolled"],
              "command": "python experiments/learner_unroll.py " + " ".join(argv or sys.argv[1:])}
    md = (f"# APPO update, {args.env} ({spec.family}), {args.epochs} epochs x {args.minibatches} minibatches, "
          f"{args.num_envs} x {args.rollout_length} ({result['backend']}, {result['cpu_count']} CPUs)\n\n"
          "| steps | compile + first call s | s per update (median) |\n|---|---:|---:|\n"
          + "".join(f"| {n} | {compile_s[n]:.2f} | {med[n]:.3f} |\n" for n in updates)
          + f"\nscan / unrolled: {result['scan_over_unrolled']:.1f}x; largest parameter difference {diff:.1e}; "
          f"the library uses unroll={result['unroll_used']} here.\n")
    print(md)
    if args.out:
        write_outputs(args.out, result, md)
    return result


if __name__ == "__main__":
    main()
