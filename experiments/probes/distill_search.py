"""Does a distilled copy of a trained search network search as well as the network? A by-hand probe, not a
benchmark (docs/RESULTS.md, "Breakout-MinAtar past 150k steps").

It reads a finished ``--agent search`` run on a gymnax env (its learner's network N, the teacher), plays
``--episodes`` episodes of N's own search and keeps the first ``--observations`` observations they visit,
distils a fresh student (``networks.student_spec``'s ``--student`` widths, the ``distill`` compressor's
loss: T² KL(teacher ‖ student) + c_v value MSE with T = 1 and c_v = ``--value-coef``) offline on them for
``--steps`` Adam steps of ``--batch`` observations drawn uniformly, measures the student on the last 4,096
observations (held out of training; a quarter of those kept if fewer than 16,384), then plays ``--episodes``
episodes of each of:

* ``teacher_search``: N searching (the same as ``python -m accerl_jax.evaluate RUN --policy learner``);
* ``student_search``: the student searching, its prior and its value;
* ``student_prior_teacher_value``: the search with the student's prior logits and N's value;
* ``teacher_prior_student_value``: the search with N's prior logits and the student's value;
* ``student_search_teacher_children``: the student searching, N evaluating each of the root's children
  (``search_policy(..., exact=N)``: N's ``A`` evaluations per step, the student's at the root and below);
* ``teacher_alone``, ``student_alone``: each network sampling its own action, no search.

With ``--children`` the kept observations come from the probe's own play of N's search recording each root's
children as the tree holds them (``search_policy(..., record_children=True)``, what ``--distill-children``
distils on in training), and the student also learns N at every root's children with
:func:`accerl_jax.compressor.distill.children_loss` (``--sibling-coef``, the sibling term's weight); the
held numbers then add ``sibling_mse``, the squared error of the held children's values centred on each
root's mean (the value differences the search compares).

Usage::

    python -m experiments.probes.distill_search RUN [--student small] [--observations 100000]
        [--steps 4000] [--batch 1024] [--learning-rate 1e-3] [--value-coef 0.5] [--children]
        [--sibling-coef 10] [--episodes 256] [--seed 3] [--out FILE.json]

Prints one line per stage and, with ``--out``, writes the numbers as JSON (returns: mean return of the
whole episodes, undiscounted; ``distill.held`` and ``distill.held_before``, after and before distilling:
``kl`` KL(teacher ‖ student) in nats, ``value_mse``, ``agreement`` the share of held observations where both
networks' most likely actions are the same).
Exit 2 with one line for a run that is not a gymnax search run or bad numbers.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

from experiments.bench.__main__ import Parser  # bad input: one line on stderr, exit 2

HELD = 4096  # observations held out of the student's training, at most


def _parser() -> Parser:
    p = Parser(prog="python -m experiments.probes.distill_search", description=__doc__.split("\n\n")[0])
    p.add_argument("run", metavar="RUN", help="a finished --agent search run folder on a gymnax env")
    p.add_argument("--student", default="small",
                   help="the student, networks.STUDENT_PRESETS: tiny, small or half of N's widths, or mlp "
                        "(an MLP on the flattened frames) [small]")
    p.add_argument("--observations", type=int, default=100_000, help="observations of N's search play kept [100000]")
    p.add_argument("--steps", type=int, default=4000, help="Adam steps of the offline distillation [4000]")
    p.add_argument("--batch", type=int, default=1024, help="observations per Adam step [1024]")
    p.add_argument("--learning-rate", type=float, default=1e-3, help="Adam learning rate [1e-3]")
    p.add_argument("--value-coef", type=float, default=0.5,
                   help="weight of the value MSE in the loss (the distill compressor's: 0.5) [0.5]")
    p.add_argument("--children", action="store_true",
                   help="also distil on each kept root's search-tree children (--distill-children's loss)")
    p.add_argument("--sibling-coef", type=float, default=10.0,
                   help="with --children: weight of the sibling term (--distill-sibling-coef's) [10]")
    p.add_argument("--episodes", type=int, default=256, help="episodes played per evaluated policy [256]")
    p.add_argument("--seed", type=int, default=3, help="evaluation seed (the same episodes' starts for all) [3]")
    p.add_argument("--out", default=None, help="write the numbers here as JSON [unset: print only]")
    return p


def probe(args) -> dict:
    """Run the probe of :mod:`experiments.probes.distill_search` for the parsed ``args``; returns its numbers.

    Raises:
      accerl_jax.config.ConfigError: the run is not a search run on a gymnax env, or cannot be read.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from accerl_jax import evaluate, networks
    from accerl_jax.compressor.distill import children_loss, distillation_loss
    from accerl_jax.compressor.paired import PairedApply
    from accerl_jax.config import ConfigError
    from accerl_jax.monitor import policy_divergence
    from accerl_jax.search.evaluation import search_settings
    from accerl_jax.tools import trained as trained_lib

    t = trained_lib.load(args.run, policy="learner")
    if t.cfg.agent != "search" or not t.cfg.env.startswith("gymnax:"):
        raise ConfigError(f"bad RUN {args.run!r}: a --agent {t.cfg.agent} run on {t.cfg.env}; expected a finished "
                          "--agent search run on a gymnax env")
    settings = search_settings(t.cfg, None, False)
    out = {"run": args.run, "step": t.step, "env": t.cfg.env, "student": args.student, "value_coef": args.value_coef,
           "teacher_widths": list(t.spec.widths)}

    def play(name, apply, params, search=settings, keep_obs=0):
        start = time.perf_counter()
        played = evaluate.play(dataclasses.replace(t, apply=apply, params=params), args.episodes, seed=args.seed,
                               search=search, keep_obs=keep_obs)
        r = np.asarray(played["returns"])
        out[name] = {"return_mean": float(r.mean()), "return_std": float(r.std()), "episodes": len(r)}
        print(f"{name}: return {r.mean():.2f} ± {r.std():.2f} over {len(r)} episodes "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
        return played

    played = play("teacher_search", t.apply, t.params, keep_obs=0 if args.children else args.observations)
    if args.children:
        obs, kids, valid = _tree_play(t, settings, args.observations, args.seed)
        out["children"] = {"sibling_coef": args.sibling_coef, "valid_share": float(valid.mean())}
    else:
        obs = jnp.asarray(played["obs"], jnp.float32)
    held_n = min(HELD, obs.shape[0] // 4)
    train, held = obs[:-held_n], obs[-held_n:]
    teacher = jax.jit(lambda o: t.apply(t.params, o)[:2])
    t_logits, t_value = teacher(train)
    h_logits, h_value = teacher(held)
    if args.children:
        rows = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731  [n, A, ...] -> [n * A, ...]
        k_logits, k_value = _batched(teacher, rows(kids))
        k_logits, k_value = k_logits.reshape(valid.shape + k_logits.shape[1:]), k_value.reshape(valid.shape)
        kids_train = (kids[:-held_n], valid[:-held_n], k_logits[:-held_n], k_value[:-held_n])
        kids_held = (kids[-held_n:], valid[-held_n:], k_logits[-held_n:], k_value[-held_n:])
    sspec = networks.student_spec(t.spec, args.student)
    out["student_widths"] = list(sspec.widths)
    s_apply = networks.make_apply(sspec)
    params = networks.build(sspec).init(jax.random.PRNGKey(args.seed), train[:1])
    opt = optax.adam(args.learning_rate)
    opt_state = opt.init(params)

    @jax.jit
    def step(params, opt_state, idx):
        def loss_fn(p):
            s_logits, s_value = s_apply(p, train[idx])[:2]
            loss = distillation_loss(t_logits[idx], t_value[idx], s_logits, s_value, 1.0, args.value_coef)
            if args.children:
                c_obs, c_valid, c_logits, c_value = (x[idx] for x in kids_train)
                cs_logits, cs_value = _on_children(s_apply, p, c_obs)
                loss = loss + children_loss(c_logits, c_value, cs_logits, cs_value, c_valid, 1.0, args.value_coef,
                                            args.sibling_coef)
            return loss

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    @jax.jit
    def held_numbers(params):
        s_logits, s_value = s_apply(params, held)[:2]
        policy = policy_divergence(h_logits, s_logits)  # the measure the runs log, the teacher as the learner
        numbers = {"kl": policy["kl_learner_actor"], "value_mse": jnp.mean((s_value - h_value) ** 2),
                   "agreement": policy["action_agreement"]}
        if args.children:
            c_obs, c_valid, _, c_value = kids_held
            _, cs_value = _on_children(s_apply, params, c_obs)
            # the sibling term alone: its mean over the valid children
            numbers["sibling_mse"] = children_loss(jnp.zeros(c_value.shape + (1,)), c_value,
                                                   jnp.zeros(c_value.shape + (1,)), cs_value, c_valid, 1.0, 0.0, 1.0)
        return numbers

    before = {k: float(v) for k, v in held_numbers(params).items()}
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    for i in range(args.steps):
        params, opt_state, loss = step(params, opt_state, jnp.asarray(rng.integers(0, train.shape[0], args.batch)))
        if (i + 1) % max(1, args.steps // 8) == 0 or i + 1 == args.steps:
            numbers = {k: round(float(v), 5) for k, v in held_numbers(params).items()}
            print(f"distil step {i + 1}: loss {float(loss):.4f}, held {numbers}", flush=True)
    out["distill"] = {"train_observations": int(train.shape[0]), "held_observations": held_n, "steps": args.steps,
                      "batch": args.batch, "seconds": time.perf_counter() - start,
                      "held_before": before, "held": {k: float(v) for k, v in held_numbers(params).items()}}
    both = (params, t.params)
    play("student_search", s_apply, params)
    play("student_prior_teacher_value", lambda p, o: (s_apply(p[0], o)[0], t.apply(p[1], o)[1]), both)
    play("teacher_prior_student_value", lambda p, o: (t.apply(p[1], o)[0], s_apply(p[0], o)[1]), both)
    play("student_search_teacher_children", PairedApply(s_apply, t.apply), both)  # as --learner-children
    play("teacher_alone", t.apply, t.params, search=None)
    play("student_alone", s_apply, params, search=None)
    return out


def _tree_play(t, settings, n: int, seed: int):
    """N's search from fresh resets of ``t``'s env (keys of ``seed``) for at least ``n`` roots, recording each
    root's children (``search_policy(..., record_children=True)``): ``(obs [n, *obs_shape], child_obs
    [n, A, *obs_shape], child_valid [n, A] bool)`` as device arrays, time-major over the env batch."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from accerl_jax.search.acting import search_policy

    env = t.env

    @jax.jit
    def chunk(carry):
        def one(c, _):
            env_state, obs, key = c
            key, sub = jax.random.split(key)
            out = search_policy(t.apply, env.model, settings, t.params, obs, env_state.env_state, sub,
                                record_children=True)
            env_state, tr = env.step(env_state, out.action)
            return (env_state, tr.obs, key), (obs, out.child_obs, out.child_valid)

        return jax.lax.scan(one, carry, None, length=16)

    key = jax.random.PRNGKey(seed)
    carry = (*jax.jit(env.reset)(key), key)
    parts, kept = [], 0
    while kept < n:
        carry, part = chunk(carry)
        parts.append(jax.tree.map(lambda x: np.asarray(x).reshape((-1,) + x.shape[2:]), part))
        kept += parts[-1][0].shape[0]
    return tuple(jnp.asarray(np.concatenate(x)[:n]) for x in zip(*parts))


def _batched(f, x, size: int = 8192):
    """``f`` over ``x``'s rows in batches of ``size``, concatenated (a forward pass over many observations)."""
    import jax.numpy as jnp

    outs = [f(x[i:i + size]) for i in range(0, x.shape[0], size)]
    return tuple(jnp.concatenate(parts) for parts in zip(*outs))


def _on_children(apply, params, c_obs):
    """``apply``'s (logits ``[n, A, A']``, values ``[n, A]``) at children ``c_obs [n, A, *obs_shape]``."""
    logits, value = apply(params, c_obs.reshape((-1,) + c_obs.shape[2:]))[:2]
    return logits.reshape(c_obs.shape[:2] + logits.shape[1:]), value.reshape(c_obs.shape[:2])


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit code (2: bad input, one line on stderr)."""
    from accerl_jax.config import ConfigError
    from accerl_jax.networks import STUDENT_PRESETS

    p = _parser()
    args = p.parse_args(argv)
    for name in ("observations", "steps", "batch", "episodes"):
        if getattr(args, name) < 1:
            p.error(f"bad --{name} {getattr(args, name)}; expected an integer >= 1")
    for name in ("learning_rate", "value_coef"):
        if not getattr(args, name) > 0:
            p.error(f"bad --{name.replace('_', '-')} {getattr(args, name)}; expected a number > 0")
    if not args.sibling_coef >= 0:
        p.error(f"bad --sibling-coef {args.sibling_coef}; expected a number >= 0")
    if args.observations < 8:
        p.error(f"bad --observations {args.observations}; expected at least 8 (a quarter, at most {HELD}, is held out)")
    if args.student not in STUDENT_PRESETS:
        p.error(f"bad --student {args.student!r}; expected one of {', '.join(STUDENT_PRESETS)}")
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        p.error(f"bad --out {args.out!r}: its folder does not exist")
    try:
        out = probe(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
