"""The runners of each kind of benchmark, and the one rule that turns their runs into a table.

Every runner has the signature ``run(bench, options, rounds, peer) -> {label: [run dict, ...]}`` and runs
each configuration of ``options["configs"]`` in rotated rounds (:func:`experiments.bench.harness.rotated`).
:data:`COLUMNS` names the metrics each kind reports; :func:`summarise` takes their medians and spread.
"""
from __future__ import annotations

import os
import re
import tempfile
import time
from typing import NamedTuple

import numpy as np

from experiments.bench import harness


class Peer(NamedTuple):
    """A peer's command-line flags (``python -m experiments.bench run``): its checkout's and its venv's Python,
    and the file a checkout of it must hold."""

    checkout_flag: str
    python_flag: str
    marker: str


PEERS = {"purejaxrl": Peer("--purejaxrl", "--peer-python", os.path.join("purejaxrl", "ppo.py")),
         "stoix": Peer("--stoix", "--stoix-python", os.path.join("stoix", "systems", "search", "ff_az.py"))}


def _steady(run_dir: str) -> dict:
    """``{"steady_steps_per_s": ...}`` of a run folder (:func:`harness.steady_rate`; None with too few rows)."""
    try:
        return {"steady_steps_per_s": harness.steady_rate(run_dir)["steps_per_s"]}
    except ValueError:
        return {"steady_steps_per_s": None}


def process(b, o: dict, rounds: int, peer: dict | None) -> dict:
    """Whole processes of the main job (``flags`` + the options' ``flags``; ``rerun``: run again on the
    compilation cache the first run filled, recorded as ``<label>, rerun``; ``steady``: also its steady
    steps/s, ``steady_steps_per_s``) and of a peer (``peer``: ``{name: {"checkout", "python"}}``, a
    configuration's ``"peer"`` naming one: PureJaxRL or Stoix)."""
    def one(label, seed, r):
        c = b.configs[label]
        if "peer" in c:
            given = (peer or {}).get(c["peer"])
            if not given:
                flags = PEERS[c["peer"]]
                return {"skipped": f"no {c['peer']} checkout given ({flags.checkout_flag}, {flags.python_flag})"}
            steps = o.get("peer_steps", c["steps"])
            if c["peer"] == "stoix":
                out = harness.stoix_process(given["checkout"], given["python"], seed, steps, c["epochs"], c["batch"])
                return dict(out, steady_steps_per_s=out["steps_per_s"])
            return harness.purejaxrl_process(given["checkout"], given["python"], seed, steps,
                                             o.get("target"), config=c.get("config", "cartpole"),
                                             env=c.get("env", "CartPole-v1"), episodes=c.get("episodes", False))
        flags, rerun = c["flags"] + o.get("flags", []), c.get("rerun") and o.get("rerun", True)
        inspect = _steady if o.get("steady") else None
        with tempfile.TemporaryDirectory() as cache:  # empty: a first run on this machine
            first = harness.train_process(flags, seed, o.get("target"), cache, inspect=inspect)
            return dict(first, rerun=harness.train_process(flags, seed, o.get("target"), cache, inspect=inspect)
                        if rerun else None)

    runs = harness.interleave(o["configs"], o["seeds"], rounds, one)
    out = {}
    for label, rs in runs.items():
        out[label] = [{k: v for k, v in r.items() if k != "rerun"} for r in rs]
        if b.configs[label].get("rerun") and o.get("rerun", True):
            out[f"{label}, rerun"] = [dict(r["rerun"], seed=r["seed"], round=r["round"]) for r in rs]
    return out


def per_run_returns(run_dir: str) -> dict:
    """``{"returns": {"<name>=<value>,...-seed<k>" or "seed<k>": final return}}`` of a run folder's replicas
    (its summary's ``seeds``, each named by its swept values and seed index)."""
    import json

    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    return {"returns": {os.path.basename(p["logdir"]): p["final_return_mean"] for p in s.get("seeds") or []}}


def sweep(b, o: dict, rounds: int, peer: dict | None) -> dict:
    """``--sweep NAME=V1,...,Vn`` (with ``--num-seeds``) as one whole process against n whole processes, one
    per value (each with the same ``--num-seeds``), back to back on one compilation cache (empty at the
    start of each round, as on a fresh machine; the separate runs share it as one user's runs would):
    ``process_s`` is the sum of a configuration's processes. ``return_gap``: the largest difference between
    a run's final return in the sweep and the same run's (value, seed) alone, in the same round."""
    from accerl_jax.config import flag
    from accerl_jax.run import replicas

    name, values = o["name"], o["values"]
    flags = list(o.get("flags", [])) + ["--num-seeds", str(o["num_seeds"])]

    def one(label, seed, r):
        with tempfile.TemporaryDirectory() as cache:
            if b.configs[label]["sweep"]:
                item = f"{name}={','.join(format(v, 'g') for v in values)}"
                out = harness.train_process(flags + ["--sweep", item], seed, None, cache, inspect=per_run_returns)
                return dict(out, processes=1)
            runs, returns = [], {}
            for v in values:
                out = harness.train_process(flags + [flag(name), format(v, "g")], seed, None, cache,
                                            inspect=per_run_returns)
                runs.append(out)  # its seed<j> is the sweep's run of (v, seed j)
                returns.update({replicas.folder({name: v}, int(k[len("seed"):])): x for k, x in out["returns"].items()})
            finals = [x for x in returns.values() if x is not None]
            return dict(process_s=sum(x["process_s"] for x in runs), processes=len(runs), returns=returns,
                        final_return_mean=float(np.mean(finals)) if finals else None,
                        compile_cache_misses=sum(x["compile_cache_misses"] for x in runs),
                        first_misses=runs[0]["compile_cache_misses"])

    runs = harness.interleave(o["configs"], o["seeds"], rounds, one)
    swept, alone = (runs[label] for label in o["configs"])
    for a, c in zip(swept, alone):  # the same round and seed
        gaps = [abs(a["returns"][k] - c["returns"][k]) for k in c["returns"]
                if a["returns"].get(k) is not None and c["returns"][k] is not None]
        a["return_gap"] = c["return_gap"] = max(gaps) if gaps else None
    return runs


def student_fields(fields: dict, compressor: str) -> dict:
    """The Config fields ``{"network": family, "hidden_sizes": widths}`` of ``compressor``'s distillation
    student (``distill:<preset>``) of the network a run of Config ``fields`` trains (its ``--network`` and
    ``--hidden-sizes`` included): the student's network, to train it directly."""
    from accerl_jax import networks
    from accerl_jax.config import Config
    from accerl_jax.envs import make_env
    from accerl_jax.run.plan import make_spec

    cfg = Config(**fields)
    preset = compressor.split("distill:", 1)[1].split("+", 1)[0]
    student = networks.student_spec(make_spec(cfg, make_env(cfg.env, 1).info), preset)
    return {"network": student.family, "hidden_sizes": student.widths}


def training(b, o: dict, rounds: int, peer: dict | None, keep: str | None = None) -> dict:
    """In-process training runs (:func:`harness.train_in_process`) of each configuration's Config fields
    (over the options' ``fields``) at ``steps`` agent steps per seed: final return, seconds to ``target``
    from setup, wall seconds; with the option ``curve``, each run's learning curve (:func:`harness.learning_curve`);
    with ``matches`` (``{"every", "games", "opponent_simulations"}``, a two-player game), a checkpoint every
    ``every`` updates and each one's win rate against the MCTS opponent (:func:`harness.win_rates`): the
    target is then a win rate and ``final_win_rate`` the quality; with ``evaluation`` (``{"episodes"}``, a
    one-player run), its final checkpoint's learner policy played on that many fresh episodes after training
    (:func:`harness.evaluated_return`): ``final_eval_return`` is then the quality (:func:`quality_metric`).
    ``student_of``: the named compressor's student network, trained directly (no compressor).
    ``keep``: a folder whose :func:`kept_folder` of each run keeps it (:func:`harness.kept_in_process`:
    finished runs are read back, stopped ones resume)."""
    def one(label, seed, r):
        fields = dict(o.get("fields", {}), **{k: o[k] for k in ("env", "log_every") if k in o})
        fields.update(b.configs[label], total_steps=o["steps"], seed=seed)
        student = fields.pop("student_of", None)
        if student:
            fields.update(student_fields(fields, student))
        m, inspect = o.get("matches"), None
        if m:  # a two-player game: each checkpoint's win rate against the MCTS opponent, evaluated after training
            fields.update(checkpoint_every=m["every"], keep_checkpoints=10_000)

            def inspect(run_dir):
                return harness.win_rates(run_dir, m["games"], m["opponent_simulations"], o.get("target"))
        if o.get("evaluation"):  # the trained policy's quality: its final checkpoint evaluated after training
            episodes = o["evaluation"]["episodes"]

            def inspect(run_dir):
                return harness.evaluated_return(run_dir, episodes)
        return harness.train_in_process(fields, None if m else o.get("target"), keep_curve=o.get("curve", False),
                                        inspect=inspect, keep=keep and kept_folder(keep, b.name, label, seed, r))

    return harness.interleave(o["configs"], o["seeds"], rounds, one)


def kept_folder(keep: str, name: str, label: str, seed: int, round_: int) -> str:
    """The log folder under ``keep`` of benchmark ``name``'s run of configuration ``label`` (characters
    other than letters, digits, ``.``, ``_`` and ``-`` become ``_``), seed ``seed``, round ``round_``:
    ``<keep>/<name>/<label>/seed<seed>-round<round_>``."""
    return os.path.join(keep, name, re.sub(r"[^A-Za-z0-9._-]", "_", label), f"seed{seed}-round{round_}")


def compression(b, o: dict, rounds: int, peer: dict | None, keep: str | None = None) -> dict:
    """The (a)/(b)/(c) comparison: :func:`training` of its three configurations (see :func:`verdict`)."""
    return training(b, o, rounds, peer, keep)


def quality_metric(b) -> str:
    """The metric benchmark ``b``'s configurations are held equal on: ``final_win_rate`` for a two-player
    game's (its options have ``matches``, :func:`training`), ``final_eval_return`` for one whose options have
    ``evaluation`` (the trained policy evaluated), else ``final_return_mean`` (the last training episodes)."""
    return ("final_win_rate" if "matches" in b.options else "final_eval_return" if "evaluation" in b.options
            else "final_return_mean")


def seconds_to_target(row: dict) -> float | None:
    """A summarised row's median seconds to the target (over the runs that reached it); None (never) unless
    most of its runs reached it."""
    t = row["time_to_target_s"]
    return t["median"] if t["n"] * 2 > t["of"] else None


def ratio_to_a(table: dict, a: str, b: str) -> float | None:
    """(b)'s :func:`seconds_to_target` over (a)'s; None where either has none."""
    ta, tb = seconds_to_target(table[a]), seconds_to_target(table[b])
    return None if ta is None or tb is None else tb / ta


def verdict(table: dict, labels: list[str], quality: str = "final_return_mean", goal_ratio: float | None = None) -> dict:
    """Does compression pay? ``labels``: (a), one or more (b) (a compressor each), then (c). A (b) pays when
    it reaches the target sooner (median seconds over the runs that reached it; never, unless most runs
    did) than both (a) and (c) and its mean final ``quality`` (the final return, or a game's final win
    rate) is at least (a)'s lowest seed's (equal final quality within (a)'s spread); ``best``: the (b) that
    pays soonest, else the soonest (b). ``ratio_to_a``: (b)'s seconds over (a)'s by the same rule (None where
    either did not reach the target on most runs: no ratio can be stated); ``within_goal_ratio``: that ratio
    <= ``goal_ratio`` (the benchmark's :attr:`~experiments.bench.manifest.Benchmark.goal_ratio`, issue 31's
    0.5; None with either None)."""
    a, c = table[labels[0]], table[labels[-1]]

    def judged(label):
        b = table[label]
        t = [seconds_to_target(x) for x in (a, b, c)]
        sooner = t[1] is not None and all(x is None or t[1] < x for x in (t[0], t[2]))
        equal = (b[quality]["mean"] is not None and a[quality]["min"] is not None
                 and b[quality]["mean"] >= a[quality]["min"])
        ratio = ratio_to_a(table, labels[0], label)
        return {"pays": bool(sooner and equal), "sooner_than_a_and_c": bool(sooner), "equal_final_return": bool(equal),
                "ratio_to_a": ratio,
                "within_goal_ratio": None if ratio is None or goal_ratio is None else bool(ratio <= goal_ratio)}

    judgements = {label: judged(label) for label in labels[1:-1]}

    def soonest(label):
        t = seconds_to_target(table[label])
        return (not judgements[label]["pays"], float("inf") if t is None else t)

    best = min(judgements, key=soonest)
    return dict(judgements[best], best=best)


def amdahl(runs: dict, labels: list[str]) -> dict:
    """Per (b) of ``labels`` (see :func:`verdict`), the Amdahl check of the issue's target "the realized
    saving is >= 80% of what the model predicts", in two models: ``p`` and ``s`` are

    - ``flops``: the uncompressed actor's share of an update by XLA FLOPs ((a)'s summary ``cost_split``;
      median over (a)'s runs) and the compressed policy's measured *forward* speedup (the run's
      ``actor_policy_speedup``, median): what compression would give if the actor were its network alone;
    - ``timed`` (runs with ``--cost-split``): that share by measured seconds (each piece compiled and timed
      alone) and the measured speedup of the whole actor, the rollout with the compressed policy against the
      same rollout with the learner's (search trees, envs and all: what compression actually speeds up).

    ``predicted`` = 1 / ((1 - p) + p / s), the whole-update speedup the model expects; ``realized``, the
    median steady env steps/s of (b) over (a)'s (same rounds, compilation excluded); ``fraction``:
    (realized - 1) / (predicted - 1), the share of the predicted saving realized (None where a value is
    missing). The FLOPs model's keys are at the top level (as before ``timed`` existed); ``timed`` holds the
    other's, or None. ``timed`` also holds ``upkeep`` u, (b)'s compressor timed alone per update as a share of
    its uncompressed update (the run's ``compress_share_timed``, median; None in results without it), and
    ``predicted_with_upkeep`` = 1 / ((1 - p) + p / s + u) with its ``fraction_with_upkeep``: a diagnostic of
    where the saving went (the issue's target is held against ``predicted``, which counts no upkeep)."""
    def median(label, value):  # value(run) -> float or None; None where no run has one
        xs = [x for x in map(value, runs[label]) if x is not None]
        return float(np.median(xs)) if xs else None

    def steady(r):
        return (r.get("steady") or {}).get("steps_per_s")

    def model(p, s, realized, upkeep=0.0):
        predicted = None if p is None or not s else 1.0 / ((1.0 - p) + p / s + upkeep)
        fraction = (None if predicted is None or realized is None or abs(predicted - 1.0) < 1e-9
                    else (realized - 1.0) / (predicted - 1.0))
        return dict(p=p, s=s, predicted=predicted, realized=realized, fraction=fraction)

    base = median(labels[0], steady)
    p_flops = median(labels[0], lambda r: r.get("actor_share_uncompressed"))
    p_timed = median(labels[0], lambda r: r.get("actor_share_uncompressed_timed"))
    out = {}
    for label in labels[1:-1]:
        rate = median(label, steady)
        realized = None if rate is None or not base else rate / base
        s_timed = median(label, lambda r: r.get("actor_rollout_speedup"))
        timed = model(p_timed, s_timed, realized) if p_timed is not None and s_timed else None
        if timed is not None:
            upkeep = median(label, lambda r: r.get("compress_share_timed"))
            charged = model(p_timed, s_timed, realized, upkeep) if upkeep is not None else {}
            timed.update(upkeep=upkeep, predicted_with_upkeep=charged.get("predicted"),
                         fraction_with_upkeep=charged.get("fraction"))
        out[label] = dict(model(p_flops, median(label, lambda r: r.get("actor_policy_speedup")), realized),
                          timed=timed)
    return out


def _bare(fields: dict, updates: int, chunk: int) -> dict:
    """The framework-free floor: rollout (policy sample + env step), learner update and compression in
    one jitted ``lax.scan`` over ``chunk`` updates, dispatched back to back; steps/s after a warm-up."""
    import jax
    import jax.numpy as jnp

    from accerl_jax import learner as learner_lib
    from accerl_jax import networks
    from accerl_jax.actor import rollout_from_steps, sample_action
    from accerl_jax.compressor import make_compressor
    from accerl_jax.config import Config
    from accerl_jax.envs import make_env
    from accerl_jax.run.plan import make_spec

    cfg = Config(**{k: v for k, v in fields.items() if k != "loop"})
    env = make_env(cfg.env, cfg.num_envs, cfg.seed)
    info = env.info
    spec = make_spec(cfg, info)  # the network a run of cfg trains (--hidden-sizes included)
    apply = networks.make_apply(spec)
    comp = make_compressor(cfg.compressor, spec, apply, distill_steps=cfg.distill_steps,
                           distill_learning_rate=cfg.distill_learning_rate)
    actor_apply = comp.actor_apply(apply)
    optimizer = learner_lib.make_optimizer(cfg.learning_rate, cfg.max_grad_norm, updates)
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
        learner, _ = update(learner, rollout_from_steps(o, a, lp, tr, info.bootstrap_slots(cfg.rollout_length)))
        actor_params, comp_state = comp.compress(learner.params, comp_state, o.reshape((-1,) + info.obs_shape))
        return (learner, actor_params, comp_state, env_state, obs, key), None

    run = jax.jit(lambda c, n: jax.lax.scan(one_update, c, None, length=n.shape[0])[0])
    state = (learner_lib.init_state(params, optimizer, key=learner_lib.learner_key(0)), actor_params, comp_state,
             env_state, obs, k_act)
    n = jnp.zeros((chunk,))
    for _ in range(2):  # compile; the second call compiles again for the outputs' shardings
        state = jax.block_until_ready(run(state, n))
    start = time.perf_counter()
    for _ in range(updates // chunk):
        state = run(state, n)
    jax.block_until_ready(state)
    steps = (updates // chunk) * chunk * cfg.num_envs * cfg.rollout_length
    return {"steps_per_s": steps / (time.perf_counter() - start), "window_steps": steps}


def throughput(b, o: dict, rounds: int, peer: dict | None) -> dict:
    """Steady env steps/s of each configuration's loop (``bare``: :func:`_bare`) at ``updates`` updates,
    rows from the second to the last of ``metrics.csv`` (the first include compilation); a configuration's
    ``hidden_sizes`` sets the learner's widths (the default network's otherwise)."""
    sizes = {k: o[k] for k in ("env", "loss", "num_envs", "rollout_length") if k in o}

    def one(label, seed, r):
        c = b.configs[label]
        fields = dict(sizes, compressor=c["compressor"], loop=c["loop"], seed=seed, log_every=o["log_every"],
                      **{k: c[k] for k in ("hidden_sizes",) if k in c})
        steps = o["updates"] * fields.get("num_envs", 16) * fields.get("rollout_length", 16)
        if c["loop"] == "bare":
            return _bare(fields, o["updates"], o["log_every"])
        run = harness.train_in_process(dict(fields, total_steps=steps))
        steady = run.pop("steady")
        return dict(run, steps_per_s=steady["steps_per_s"], window_steps=steady["window_steps"],
                    shares=steady["shares"])

    return harness.interleave(o["configs"], o.get("seeds", [0]), rounds, one)


def actor_time(b, o: dict, rounds: int, peer: dict | None) -> dict:
    """Actor steps/s of each compressor's policy (:func:`accerl_jax.actor.make_actor` over ``num_envs``
    envs, ``rollout_length`` steps per timed rollout), the fastest of 3 rollouts per round in the faster
    XLA configuration, rounds rotated; fidelity (KL(π‖μ) nats, greedy agreement) against a teacher
    trained for ``teacher_steps`` steps, on observations its actor collected after those it was fitted on."""
    import jax
    import jax.numpy as jnp

    from accerl_jax import networks
    from accerl_jax.platform import xla
    from accerl_jax.actor import make_actor
    from accerl_jax.compressor import make_compressor
    from accerl_jax.envs import make_env
    from accerl_jax.monitor import policy_divergence

    fields = dict(o.get("fields", {}), env=o["env"], compressor="none", total_steps=o["teacher_steps"], seed=0)
    teacher_run, trained = harness.trained_in_process(
        dict(fields, log_every=o["log_every"]) if "log_every" in o else fields)
    teacher = trained.learner_params
    env = make_env(o["env"], o["num_envs"], 0)
    spec = networks.default_spec(env.info.obs_shape, env.info.num_actions, env.info.channels_first)
    learner_apply = networks.make_apply(spec)
    teacher_actor = make_actor(env, learner_apply, o["rollout_length"], family=spec.family)

    def observations(seed: int, rollouts: int = 4):
        carry, chunks = teacher_actor.reset(jax.random.PRNGKey(seed)), []
        for _ in range(rollouts):
            carry, rollout, _ = teacher_actor.rollout(teacher, carry)
            chunks.append(np.asarray(rollout.obs).reshape((-1,) + rollout.obs.shape[2:]))
        return jnp.asarray(np.concatenate(chunks)[:8192])

    fit_obs, held_obs = observations(100), observations(200)
    held_teacher = jax.jit(lambda p, x: learner_apply(p, x)[0])(teacher, held_obs)
    families = {"default": "mlp", "no_ynn": "cnn"}  # accerl_jax.platform.xla's CPU options, selected by family name
    entries = {}
    for m in o["configs"]:
        comp = make_compressor(m, spec, learner_apply, distill_steps=50, distill_learning_rate=1e-3)
        params, state = comp.init(teacher, jax.random.PRNGKey(1), fit_obs)
        for _ in range(o["distill_steps"] // 50 if "distill" in state else 0):
            params, state = comp.compress(teacher, state, fit_obs)
        apply = comp.actor_apply(learner_apply)
        div = policy_divergence(held_teacher, jax.jit(lambda p, x: apply(p, x)[0])(params, held_obs))
        actors = {c: make_actor(env, apply, o["rollout_length"], family=families[c])
                  for c in xla.candidate_configs(spec.family)}
        carries = {}
        for c, actor in actors.items():  # compile and warm up
            carries[c], r, _ = actor.rollout(params, actor.reset(jax.random.PRNGKey(300)))
            jax.block_until_ready(r)
        entries[m] = dict(params=params, actors=actors, carries=carries, fixed={
            "kl": float(div["kl_learner_actor"]), "agreement": float(div["action_agreement"]),
            "params": networks.param_count(params), "bytes": networks.param_bytes(params)})
    ceiling_carry = teacher_actor.reset(jax.random.PRNGKey(301))
    teacher_actor.time_env_only(ceiling_carry)
    steps = o["num_envs"] * o["rollout_length"]
    runs: dict = {m: [] for m in o["configs"]}
    for r in range(rounds):
        ceiling = steps / min(teacher_actor.time_env_only(ceiling_carry) for _ in range(3))
        for m in harness.rotated(list(o["configs"]), r):
            e, best = entries[m], {}
            for c, actor in e["actors"].items():
                times = []
                for _ in range(3):
                    start = time.perf_counter()
                    e["carries"][c], out, _ = actor.rollout(e["params"], e["carries"][c])
                    jax.block_until_ready(out)
                    times.append(time.perf_counter() - start)
                best[c] = steps / min(times)
            fastest = max(best, key=best.get)
            runs[m].append(dict(e["fixed"], steps_per_s=best[fastest], xla_config=fastest, ceiling_steps_per_s=ceiling,
                                teacher_return=teacher_run["final_return_mean"], round=r, seed=0))
    return runs


KEEPS_RUNS = ("training", "compression")  # the kinds whose runs --keep-runs keeps (in-process training runs)
KINDS = {"process": process, "training": training, "compression": compression, "throughput": throughput,
         "actor_time": actor_time, "sweep": sweep}
# (metric, column header, format) per kind, in the page's order.
COLUMNS = {
    "process": (("process_s", "whole process s", ".1f"), ("time_to_target_s", "to target from process start s", ".1f"),
                ("final_return_mean", "final return", ".1f")),
    "training": (("time_to_target_s", "to target s", ".1f"), ("final_return_mean", "final return", ".1f"),
                 ("wall_time_s", "wall s", ".1f")),
    "throughput": (("steps_per_s", "steady steps/s", ",.0f"),),
    "actor_time": (("steps_per_s", "actor steps/s", ",.0f"), ("kl", "KL(π‖μ) nats", ".4f"),
                   ("agreement", "agreement", ".3f"), ("bytes", "actor bytes", ",.0f")),
}
COLUMNS["compression"] = COLUMNS["training"]
COLUMNS["sweep"] = (("process_s", "whole time s", ".1f"), ("final_return_mean", "final return, mean over runs", ".1f"),
                    ("return_gap", "largest per-run return gap, sweep vs alone", ".3g"))


def columns(b) -> tuple:
    """The (metric, header, format) columns of benchmark ``b``'s table: its own (``b.columns``), else its
    kind's (:data:`COLUMNS`)."""
    return b.columns or COLUMNS[b.kind]


def summarise(kind: str, runs: dict, cols: tuple | None = None) -> dict:
    """Per configuration and metric of ``cols`` (default ``COLUMNS[kind]``): ``median``, ``mean``, ``min``,
    ``max`` over the runs that have a value (None: skipped, or a target never reached), ``n`` of them and
    ``of`` runs."""
    table = {}
    for label, rs in runs.items():
        table[label] = {}
        for metric, _, _ in cols or COLUMNS[kind]:
            values = [r[metric] for r in rs if r.get(metric) is not None]
            stats = dict(median=float(np.median(values)), mean=float(np.mean(values)), min=float(np.min(values)),
                         max=float(np.max(values))) if values else dict(median=None, mean=None, min=None, max=None)
            table[label][metric] = dict(stats, n=len(values), of=sum("skipped" not in r for r in rs))
    return table


def ratios(table: dict, ratio: tuple[str, str] | None) -> dict:
    """Each configuration's median of the ratio's metric over the baseline's (None where either is missing)."""
    if not ratio or ratio[1] not in table:
        return {}
    metric, base = ratio
    b = table[base][metric]["median"]
    return {label: (row[metric]["median"] / b if row[metric]["median"] is not None and b else None)
            for label, row in table.items()}


def measure(b, quick: bool, rounds: int | None, peer: dict | None, seeds: list[int] | None = None,
            keep: str | None = None) -> dict:
    """Run benchmark ``b`` (its ``quick`` options over ``options`` with ``quick``; ``seeds`` replacing its
    seeds; ``keep``, a folder keeping a training or compression benchmark's runs: :func:`training`) and
    return its result:
    ``options``, ``rounds``, ``runs``, ``table`` (:func:`summarise`), ``ratios`` and, for the compression
    kind, ``verdict``; or ``skipped`` with the reason when ``b.requires`` is not installed."""
    import importlib.util

    o = dict(b.options, **(b.quick if quick else {}))
    o.setdefault("configs", list(b.configs))
    o.pop("repeats", None)
    if seeds is not None:
        o["seeds"] = list(seeds)
    rounds = rounds or (b.quick if quick else b.options).get("repeats", 1 if quick else 2)
    out = {"benchmark": b.name, "kind": b.kind, "quick": quick, "rounds": rounds, "options": o}
    if b.requires and importlib.util.find_spec(b.requires) is None:
        return dict(out, skipped=f"{b.requires} is not installed")
    if keep is not None and b.kind not in KEEPS_RUNS:
        raise ValueError(f"{b.name} is a {b.kind} benchmark; runs are kept only by {' and '.join(KEEPS_RUNS)} ones")
    runs = KINDS[b.kind](b, o, rounds, peer, **({} if keep is None else {"keep": keep}))
    table = summarise(b.kind, runs, columns(b))
    out.update(runs=runs, table=table, ratios=ratios(table, b.ratio))
    if b.kind == "compression":
        labels = [label for label in b.configs if label in table]  # --quick may measure (a), one (b), (c)
        if labels[:1] == list(b.configs)[:1] and labels[-1:] == list(b.configs)[-1:] and len(labels) > 2:
            out["verdict"] = verdict(table, labels, quality_metric(b), b.goal_ratio)
            out["amdahl"] = amdahl(runs, labels)  # else a --quick smoke of (b)s alone: nothing to hold them against
    if o.get("same_run") and b.ratio:
        out["same_run"] = same_run(runs, b.ratio[1])
    return out


def same_run(runs: dict, base: str) -> dict:
    """Per configuration other than ``base``: ``equal``, how many of its runs end with the same learner
    parameter digest as ``base``'s run of the same seed and round, ``of`` how many have both, and
    ``resolved``: what ``--compressor auto`` resolved each run to (its summary's ``auto_gate``; None where
    the run was not an auto run) -- whether two configurations are the same training run."""
    def by_key(rs):
        return {(r["seed"], r["round"]): r for r in rs if "skipped" not in r}

    baseline = by_key(runs[base])
    out = {}
    for label, rs in runs.items():
        if label == base:
            continue
        pairs = [(r, baseline[k]) for k, r in by_key(rs).items() if k in baseline]
        digests = [(r.get("learner_params_digest"), b.get("learner_params_digest")) for r, b in pairs]
        out[label] = dict(equal=sum(a is not None and a == d for a, d in digests), of=len(digests),
                          resolved=sorted({str(r.get("auto_resolved")) for r, _ in pairs}))
    return out
