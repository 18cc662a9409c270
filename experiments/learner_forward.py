"""The learner update with one forward pass over the rollout vs the two it used to take, side by side.

The learner used to apply the network to ``obs [T, B]`` and again to ``next_obs [T, B]``; it now takes the
bootstrap values from its own pass and applies the network only to ``Rollout.bootstrap_obs`` (``K + 1``
rows: the last row's next observation and K slots for truncated steps' final observations;
docs/DESIGN.md, "Where compression can pay"). This script times the jitted
``accerl_jax.learner.make_update`` both ways in one process:

* **before**: the learner module as it was at ``--before-rev`` (git; default: the parent of the commit
  that removed its ``apply(params, batch.next_obs)``), fed the old rollout layout with
  ``next_obs [T, B, ...]``;
* **after**: the current learner, fed the packed rollout (``K`` from gymnax CartPole's time limit,
  :meth:`accerl_jax.envs.base.EnvInfo.bootstrap_slots`: 1 at T=16).

Both get the same data: CartPole-like observations ``(4,)``, 2 actions, the default MLP(256, 256)
(:func:`accerl_jax.networks.default_spec`), V-trace, with terminations in every column (one every ~8
rows) and truncations in a quarter of the columns. Before timing, the script checks that both updates
give the same parameters and metrics. Timings are interleaved (before, after, before, ...) over
``--rounds`` rounds; each sample is the mean of ``--calls`` calls; it reports the median and the spread
(min, max) of the samples and the ratio of the medians (before / after).

Usage:
  python experiments/learner_forward.py [--batch 16,256] [--out experiments/results/learner_forward.json]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from accerl_jax import learner, networks
from accerl_jax.monitor import atomic_write_json
from accerl_jax.types import Rollout, pack_bootstrap_obs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OBS_SHAPE, NUM_ACTIONS = (4,), 2
CARTPOLE_MAX_EPISODE_STEPS = 500


class OldRollout(NamedTuple):
    """The rollout layout of the two-forward learner (``next_obs [T, B, ...]`` for every row)."""

    obs: Any
    action: Any
    log_prob: Any
    reward: Any
    terminated: Any
    truncated: Any
    valid: Any
    next_obs: Any
    episode_return: Any
    episode_length: Any


def before_rev() -> str:
    """The commit before the one that removed the learner's ``apply(params, batch.next_obs)``."""
    out = subprocess.run(["git", "log", "-1", "--format=%H", "-S", "apply(params, batch.next_obs)", "--",
                          "accerl_jax/learner.py"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    if not out.strip():
        raise SystemExit("cannot find the two-forward learner in git history; pass --before-rev")
    return out.strip() + "^"


def load_before(rev: str):
    """``accerl_jax/learner.py`` at git revision ``rev``, imported as a separate module."""
    src = subprocess.run(["git", "show", f"{rev}:accerl_jax/learner.py"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    if "batch.next_obs" not in src:
        raise SystemExit(f"accerl_jax/learner.py at {rev} is not the two-forward learner (no batch.next_obs)")
    path = os.path.join(tempfile.mkdtemp(), "learner_before.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("learner_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def batches(t: int, b: int, seed: int = 0) -> tuple[OldRollout, Rollout]:
    """The same random CartPole-like rollout ``[t, b]`` in the old and the packed layout."""
    rng = np.random.default_rng(seed)
    terminated = rng.random((t, b)) < 1 / 8
    truncated = np.zeros((t, b), bool)
    cols = np.arange(0, b, 4)
    truncated[rng.integers(0, t, size=cols.size), cols] = True
    terminated &= ~truncated
    obs = rng.normal(size=(t, b) + OBS_SHAPE).astype(np.float32)
    next_obs = np.concatenate([obs[1:], obs[-1:]])
    ends = terminated | truncated
    ends[-1] = True
    next_obs[ends] = rng.normal(size=next_obs[ends].shape)
    slots = (t - 2) // CARTPOLE_MAX_EPISODE_STEPS + 1  # EnvInfo.bootstrap_slots for gymnax CartPole
    common = {
        "obs": obs, "action": rng.integers(0, NUM_ACTIONS, size=(t, b)).astype(np.int32),
        "log_prob": np.log(rng.uniform(0.3, 0.7, size=(t, b))).astype(np.float32),
        "reward": np.ones((t, b), np.float32), "terminated": terminated, "truncated": truncated,
        "valid": np.ones((t, b), bool), "episode_return": np.zeros((t, b), np.float32),
        "episode_length": np.zeros((t, b), np.int32),
    }
    old = OldRollout(next_obs=next_obs, **common)
    new = Rollout(bootstrap_obs=pack_bootstrap_obs(obs, next_obs, truncated, slots), **common)
    return jax.device_put(old), jax.device_put(new)


def time_calls(fn, calls: int) -> float:
    """Mean wall seconds of ``calls`` blocking calls of ``fn``."""
    start = time.perf_counter()
    for _ in range(calls):
        jax.block_until_ready(fn())
    return (time.perf_counter() - start) / calls


def measure(before_mod, t: int, b: int, rounds: int, calls: int) -> dict:
    spec = networks.default_spec(OBS_SHAPE, NUM_ACTIONS)
    apply = networks.make_apply(spec)
    params = networks.init_params(spec, jax.random.PRNGKey(0))
    opt = learner.make_optimizer(2.5e-4, 0.5, 1000)
    cfg = learner.LossConfig()
    old_batch, new_batch = batches(t, b)
    state = learner.init_state(params, opt, key=learner.learner_key(0))
    updates = {
        "before": (before_mod.make_update(apply, opt, before_mod.LossConfig()), old_batch),
        "after": (learner.make_update(apply, opt, cfg), new_batch),
    }
    results = {name: jax.block_until_ready(fn(state, batch)) for name, (fn, batch) in updates.items()}  # compile
    (s_old, m_old), (s_new, m_new) = results["before"], results["after"]
    worst = max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(s_old.params),
                                                                jax.tree.leaves(s_new.params)))
    for k in m_old:
        np.testing.assert_allclose(float(m_new[k]), float(m_old[k]), rtol=1e-4, atol=1e-5, err_msg=k)
    samples = {name: [] for name in updates}
    for _ in range(rounds):
        for name, (fn, batch) in updates.items():
            samples[name].append(time_calls(lambda fn=fn, batch=batch: fn(state, batch), calls))
    out = {"T": t, "B": b, "bootstrap_rows": int(new_batch.bootstrap_obs.shape[0]), "max_param_diff": worst}
    for name, xs in samples.items():
        out[name] = {"median_ms": 1e3 * statistics.median(xs), "min_ms": 1e3 * min(xs), "max_ms": 1e3 * max(xs),
                     "samples_ms": [1e3 * x for x in xs]}
    out["ratio_before_over_after"] = out["before"]["median_ms"] / out["after"]["median_ms"]
    # Round by round: the spread of the ratio when other jobs disturb single samples.
    ratios = [x / y for x, y in zip(samples["before"], samples["after"])]
    out["ratio_per_round"] = {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios)}
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="16,256", help="comma-separated B values")
    parser.add_argument("--rollout-length", type=int, default=16, help="T")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (samples per variant)")
    parser.add_argument("--calls", type=int, default=0, help="calls per sample (0: ~0.3 s per sample)")
    parser.add_argument("--before-rev", default=None,
                        help="git revision of the two-forward learner (default: found in the history)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    args.before_rev = args.before_rev or before_rev()
    before_mod = load_before(args.before_rev)
    rows = []
    for b in (int(x) for x in args.batch.split(",")):
        calls = args.calls or max(3, int(0.3 / (0.003 * max(b / 16, 1) ** 0.8)))
        row = measure(before_mod, args.rollout_length, b, args.rounds, calls)
        row["calls_per_sample"] = calls
        rows.append(row)
        print(f"B={b:4d} T={row['T']}: before {row['before']['median_ms']:.2f} ms "
              f"[{row['before']['min_ms']:.2f}, {row['before']['max_ms']:.2f}], "
              f"after {row['after']['median_ms']:.2f} ms [{row['after']['min_ms']:.2f}, {row['after']['max_ms']:.2f}] "
              f"(bootstrap rows {row['bootstrap_rows']}); before/after {row['ratio_before_over_after']:.2f}x "
              f"(per round {row['ratio_per_round']['min']:.2f}-{row['ratio_per_round']['max']:.2f}); "
              f"max |param diff| {row['max_param_diff']:.1e}", flush=True)
    if args.out:
        atomic_write_json(args.out, {
            "rows": rows, "before_rev": args.before_rev, "network": "MLP(256, 256)", "corrector": "vtrace",
            "jax": jax.__version__, "backend": jax.default_backend(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "load_average": os.getloadavg(), "argv": sys.argv[1:],
        })


if __name__ == "__main__":
    main()
