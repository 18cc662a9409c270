"""Command line: ``python -m accerl_jax.export RUN_DIR --out DIR [--policy actor|learner] [--step K]``;
``--help`` lists all flags.

Writes a trained policy (:mod:`accerl_jax.tools.trained`) as a program that runs without accerl_jax:

* ``DIR/policy.jax``: the forward function :func:`accerl_jax.tools.trained.make_forward` serialized with
  ``jax.export`` (StableHLO bytecode; the batch dimension ``b`` symbolic, the parameters embedded as
  constants in their own dtypes, so an ``int8`` actor keeps its int8 weights and per-channel scales):
  ``(obs [b, *obs_shape] obs_dtype, key uint32[2]) -> (action [b], greedy_action [b], policy_out [b, A])``
  (continuous: ``action`` and ``greedy_action`` float32 ``[b, D]``, clipped to the action space's bounds;
  ``policy_out`` unclipped); a run trained with ``--normalize-observations`` has its frozen observation
  statistics baked in: the program takes raw observations and normalises them itself;
* ``DIR/policy.json``: what a user needs to run it (observation shape and dtype, action space, the run's
  env and compressor spec, the run folder as a path relative to ``DIR``), its parameter count and bytes and program size beside the learner's (the
  learner's forward is exported the same way to measure it), and KL(π_learner ‖ π) and greedy-action
  agreement on held observations (visited by the learner's policy on fresh envs).

Load it with plain JAX (README, "Evaluate, watch, export"): ``jax.export.deserialize(bytes).call(obs, key)``.
Both files are written atomically; bad input exits with status 2 and one line naming it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Annotated, Optional

import tyro

from accerl_jax.tools import cli
from accerl_jax.config import ConfigError

PROGRAM_FILE = "policy.jax"
SPEC_FILE = "policy.json"
HELD_ENVS, HELD_STEPS = 16, 64  # held observations: 16 fresh envs x 64 steps of the learner's policy


@dataclasses.dataclass
class Args:
    """Export a trained run's policy as a serialized JAX (StableHLO) program plus a JSON description."""

    run_dir: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="RUN_DIR")]
    """The run folder (--logdir of training), or one of its checkpoints/<update> folders."""
    out: str
    """Folder to write policy.jax and policy.json into (created if missing)."""
    policy: Annotated[str, tyro.conf.arg(help=cli.POLICY_HELP)] = cli.DEFAULT_POLICY
    step: Annotated[Optional[int], tyro.conf.arg(metavar="INT", help_behavior_hint="(default: unset: the latest)")] = None
    """Export checkpoint <RUN_DIR>/checkpoints/<step> instead of the latest."""
    seed: int = 1
    """Seed of the fresh envs whose observations the KL/agreement are measured on (evaluation's seeds, disjoint
    from every training run's)."""
    seed_index: int = 0
    """For a --num-seeds run: which of its seeds (0-based)."""


def check_out(out: str) -> None:
    """Refuse an ``--out`` folder that cannot be written (checked before anything is written).

    Raises:
      ConfigError: ``out`` is a file, or it (or the nearest existing folder above it) is not writable.
    """
    if not out.strip():
        raise ConfigError(f"bad --out {out!r}: empty; give a folder to write {PROGRAM_FILE} and {SPEC_FILE} into")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"bad --out {out!r}: it is a file; expected a folder")
    existing = os.path.abspath(out)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"bad --out {out!r}: cannot write there ({existing!r} is not a writable folder)")


def held_observations(trained, seed: int):
    """``(obs, learner_out)``: ``[HELD_ENVS * HELD_STEPS, *obs_shape]`` observations visited by
    ``trained``'s learner policy on fresh envs of its env id (sampled actions), and the learner's policy
    outputs on them ``[HELD_ENVS * HELD_STEPS, A]``. ``seed``: evaluation's (:mod:`accerl_jax.seeds`)."""
    import jax
    import numpy as np

    from accerl_jax.envs import make_env
    from accerl_jax.seeds import EvalUse, eval_envpool_seed, eval_key
    from accerl_jax.tools.trained import make_forward

    env = make_env(trained.cfg.env, HELD_ENVS, eval_envpool_seed(seed, HELD_ENVS))
    forward = jax.jit(make_forward(trained.learner_apply, trained.learner_params, env.info))
    step = jax.jit(env.step) if env.info.jittable else env.step
    env_state, obs = (jax.jit(env.reset) if env.info.jittable else env.reset)(eval_key(seed, EvalUse.HELD_RESET))
    key = eval_key(seed, EvalUse.HELD_ACTIONS)
    seen, outs = [], []
    for _ in range(HELD_STEPS):
        key, sub = jax.random.split(key)
        action, _, out = forward(obs, sub)
        seen.append(np.asarray(obs))
        outs.append(np.asarray(out))
        env_state, tr = step(env_state, np.asarray(action))
        obs = tr.obs
    return np.concatenate(seen), np.concatenate(outs)


def export_program(apply, params, info) -> bytes:
    """The serialized ``jax.export`` program of :func:`accerl_jax.tools.trained.make_forward` for ``apply`` and
    ``params`` (embedded), batch dimension symbolic (module docstring)."""
    import jax
    import numpy as np

    from accerl_jax.tools.trained import make_forward

    forward = make_forward(apply, params, info)
    (b,) = jax.export.symbolic_shape("b")
    obs = jax.ShapeDtypeStruct((b,) + tuple(info.obs_shape), np.dtype(info.obs_dtype))
    key = jax.ShapeDtypeStruct((2,), np.uint32)
    return bytes(jax.export.export(jax.jit(forward))(obs, key).serialize())


def export(args: Args) -> dict:
    """Export as the CLI does; returns the record written to ``<out>/policy.json``.

    Raises:
      ConfigError: a bad flag, run folder or ``--out`` (module docstring), before anything is written.
    """
    from accerl_jax.tools import trained as trained_lib

    check_out(args.out)
    loaded = trained_lib.load(args.run_dir, policy=args.policy, step=args.step, num_envs=1, seed=args.seed,
                              seed_index=args.seed_index)
    return export_trained(loaded, args.out, seed=args.seed)


def export_trained(trained, out: str, *, seed: int = 1) -> dict:
    """Write ``trained``'s (:class:`accerl_jax.tools.trained.Trained`) ``policy.jax`` and ``policy.json`` into
    ``out`` (module docstring); returns the JSON record. ``seed``: of the held observations' envs."""
    import jax
    import numpy as np

    from accerl_jax import monitor, networks
    from accerl_jax.monitor import gaussian_policy_divergence, policy_divergence
    from accerl_jax.seeds import EvalUse, eval_key
    from accerl_jax.tools.trained import make_forward

    info = trained.info
    program = export_program(trained.apply, trained.params, info)
    learner_program = export_program(trained.learner_apply, trained.learner_params, info)
    held, learner_out = held_observations(trained, seed)
    # The deserialized program against the framework's forward on the held observations, one key.
    key = eval_key(seed, EvalUse.EXPORT_CHECK)
    exported = jax.export.deserialize(bytearray(program)).call(held, key)
    framework = jax.jit(make_forward(trained.apply, trained.params, info))(held, key)
    measure = gaussian_policy_divergence if info.continuous else policy_divergence
    divergence = {k: float(v) for k, v in measure(learner_out, framework[2]).items()}
    float_bytes = sum(int(np.prod(x.shape)) * 4 for x in jax.tree.leaves(trained.params))
    action = ({"kind": "box", "shape": list(info.action_shape), "low": list(info.action_low),
               "high": list(info.action_high)} if info.continuous else {"kind": "discrete", "n": info.num_actions})
    record = {
        "program": PROGRAM_FILE,
        "signature": "(obs [b, *obs_shape] obs_dtype, key uint32[2]) -> (action [b], greedy_action [b], policy_out [b, A])"
                     + ("; action, greedy_action float32 [b, D] clipped to action_space low/high" if info.continuous else ""),
        "jax_version": jax.__version__,
        "env": trained.cfg.env,
        "obs_shape": list(info.obs_shape),
        "obs_dtype": info.obs_dtype,
        # --normalize-observations: the run's frozen observation statistics are baked into the program, which
        # takes raw observations and normalises them itself (accerl_jax.normalize.normalize_obs).
        "normalize_observations": bool(trained.cfg.normalize_observations),
        "action_space": action,
        # Continuous: the program is an env boundary, so the Gaussian sample and the mean come out clipped to
        # the box (training clips in its env adapter and stores the unclipped sample's log-prob).
        "action_clipping": ({"clipped": ["action", "greedy_action"], "low": list(info.action_low),
                             "high": list(info.action_high), "unclipped": "policy_out (mean, log-std)"}
                            if info.continuous else None),
        "policy": trained.policy,
        "compressor": trained.cfg.compressor if trained.policy == "actor" else "none",
        "run_compressor": trained.cfg.compressor,
        "run_dir": _relative(trained.run_dir, out),  # from policy.json's folder: the pair moves together
        "checkpoint_update": trained.step,
        "param_count": networks.param_count(trained.params),
        "param_bytes": networks.param_bytes(trained.params),
        "param_bytes_if_float32": float_bytes,  # the same arrays stored as float32: what int8 saves
        "program_bytes": len(program),
        "learner_param_count": networks.param_count(trained.learner_params),
        "learner_param_bytes": networks.param_bytes(trained.learner_params),
        "learner_program_bytes": len(learner_program),
        "program_size_vs_learner": len(program) / len(learner_program),
        "held_observations": int(held.shape[0]),
        **divergence,
        "exported_matches_framework": {
            "actions_equal": bool(np.array_equal(np.asarray(exported[0]), np.asarray(framework[0]))),
            "policy_out_max_abs_diff": float(np.max(np.abs(np.asarray(exported[2]) - np.asarray(framework[2])))),
        },
    }
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as err:  # e.g. under /proc, where access() says yes and mkdir says no
        raise ConfigError(f"bad --out {out!r}: cannot make that folder ({err.strerror or err})") from None
    monitor.atomic_write(os.path.join(out, PROGRAM_FILE), program)
    monitor.atomic_write(os.path.join(out, SPEC_FILE), (json.dumps(record, indent=2) + "\n").encode())
    return record


def _relative(path: str, start: str) -> str:
    """``path`` relative to the folder ``start`` (POSIX separators), or absolute where no relative path
    exists (another drive)."""
    try:
        return os.path.relpath(os.path.abspath(path), os.path.abspath(start)).replace(os.sep, "/")
    except ValueError:
        return os.path.abspath(path)


def main(argv: list[str] | None = None) -> int:
    try:
        args = cli.parse_args(Args, argv, "python -m accerl_jax.export")
        record = export(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{record['env']} {record['policy']} policy (compressor {record['compressor']}, checkpoint "
          f"{record['checkpoint_update']}): {record['param_count']:,} parameters, {record['param_bytes']:,} bytes "
          f"(learner: {record['learner_param_count']:,}, {record['learner_param_bytes']:,} bytes)")
    print(f"program {record['program_bytes']:,} bytes = {record['program_size_vs_learner']:.3f} x the learner's "
          f"{record['learner_program_bytes']:,}; KL {record['kl_learner_actor']:.4g} nats, agreement "
          f"{record['action_agreement']:.3f} on {record['held_observations']} held observations")
    print(f"written: {os.path.join(args.out, PROGRAM_FILE)}, {os.path.join(args.out, SPEC_FILE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
