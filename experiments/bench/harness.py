"""What every benchmark shares: the machine record, the ``metrics.csv`` reading rules, rotated rounds,
runs in this process or as whole processes, and PureJaxRL run in its own virtual environment.

Follows cleanba's ``benchmark.sh``: one runner, results tagged with the git revision and the machine,
read back by one reporting tool (:mod:`experiments.bench.page`).
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

from accerl_jax.plot import load_run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("jax", "jaxlib", "flax", "optax", "chex", "gymnax", "envpool", "numpy", "orbax-checkpoint", "qwix")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_revision() -> str:
    """``HEAD``'s commit of the checkout this package is in, with ``+dirty`` for uncommitted changes to
    tracked files; ``unknown`` outside a git checkout."""
    def git(*args):
        return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, timeout=30)

    head = git("rev-parse", "HEAD")
    if head.returncode != 0:
        return "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head.stdout.strip() + ("+dirty" if dirty else "")


_PROCESS_REVISION: list[str] = []


def process_revision() -> str:
    """:func:`git_revision` taken once per process, at its first call: :func:`record` makes it at a benchmark's
    start, before any run imports the trainer, so it names the code this process runs in-process. A
    revision read at each later run would mark ``+dirty`` runs that never ran the edit made meanwhile (the
    process had already imported the package)."""
    if not _PROCESS_REVISION:
        _PROCESS_REVISION.append(git_revision())
    return _PROCESS_REVISION[0]


def machine_kind() -> str:
    """The results folder's name: ``cpu-<n>core`` on a CPU-only machine, ``<backend>-<device kind>``
    otherwise (e.g. ``gpu-nvidia_h200``)."""
    import jax

    backend = jax.default_backend()
    if backend == "cpu":
        return f"cpu-{os.cpu_count()}core"
    return f"{backend}-{jax.devices()[0].device_kind}".lower().replace(" ", "_")


def record() -> dict:
    """The machine, software and load a result was measured with: ``machine_kind``, ``platform``,
    ``cpu_model``, ``cpu_count``, ``backend``, ``devices``, ``python``, ``git_revision``, ``packages``
    (name -> version or None) and ``load_1min_before`` (``os.getloadavg``; :func:`finish_record` adds
    ``load_1min_after``)."""
    import jax

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {"machine_kind": machine_kind(), "platform": platform.platform(), "cpu_model": _cpu_model(),
            "cpu_count": os.cpu_count(), "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
            "python": platform.python_version(), "git_revision": process_revision(), "packages": versions,
            "load_1min_before": os.getloadavg()[0]}


def finish_record(rec: dict, started: float) -> dict:
    """``rec`` with ``load_1min_after`` and ``wall_s`` (seconds since ``started``, ``time.perf_counter``)."""
    return dict(rec, load_1min_after=os.getloadavg()[0], wall_s=time.perf_counter() - started)


def curve(logdir: str) -> dict:
    """``metrics.csv`` of a run folder as float64 arrays per column (an empty cell or text is NaN:
    :func:`accerl_jax.plot.load_run`'s rule, the one rule for every benchmark)."""
    return load_run(logdir).columns


def time_to_target(logdir: str, target: float, offset_s: float = 0.0) -> float | None:
    """``offset_s`` + ``wall_time_s`` of the first logged row whose ``return_mean`` (mean of the last
    episodes' returns) is at least ``target``; None if no row reaches it (NaN never does)."""
    c = curve(logdir)
    hit = np.flatnonzero(np.nan_to_num(c["return_mean"], nan=-np.inf) >= target)
    return None if not len(hit) else offset_s + float(c["wall_time_s"][hit[0]])


def steady_rate(logdir: str, first_row: int = 1) -> dict:
    """Env steps/s between row ``first_row`` and the last row of ``metrics.csv`` (the rows before include
    compilation), and each stage's busy share over that window (``time_<stage>_s`` columns are
    cumulative seconds): ``{"steps_per_s", "window_steps", "shares": {stage: s per wall s}}``.

    Raises:
      ValueError: fewer than ``first_row + 2`` rows (raise the budget or lower ``--log-every``).
    """
    c = curve(logdir)
    if len(c["env_steps"]) < first_row + 2:
        raise ValueError(f"{logdir}: {len(c['env_steps'])} logged rows; a steady rate needs {first_row + 2}")
    d = {k: float(v[-1] - v[first_row]) for k, v in c.items()}
    shares = {k[5:-2]: d[k] / d["wall_time_s"] for k in sorted(c) if k.startswith("time_") and np.isfinite(d[k])}
    return {"steps_per_s": d["env_steps"] / d["wall_time_s"], "window_steps": int(d["env_steps"]), "shares": shares}


def rotated(items: list, round_: int) -> list:
    """``items`` rotated left by ``round_`` places: in round r each configuration runs at another place in
    the order, so a busy spell of a shared machine falls on all of them alike."""
    k = round_ % len(items) if items else 0
    return items[k:] + items[:k]


def interleave(labels: list[str], seeds: list[int], rounds: int, run) -> dict:
    """Call ``run(label, seed, round) -> dict`` for every label and seed in ``rounds`` rotated rounds;
    returns ``{label: [run dicts with "seed" and "round"]}``, labels in their given order."""
    out: dict = {label: [] for label in labels}
    for r in range(rounds):
        for seed in seeds:
            for label in rotated(labels, r):
                out[label].append(dict(run(label, seed, r), seed=seed, round=r))
                print(f"round {r} seed {seed} {label}: " + json.dumps({k: v for k, v in out[label][-1].items()
                                                                       if not isinstance(v, (dict, list))}), flush=True)
    return out


def summary_keys(run: dict) -> dict:
    """The fields of a training run's ``summary.json`` that benchmarks keep."""
    keep = ("final_return_mean", "wall_time_s", "steps_per_s", "total_env_steps", "startup_before_train_s",
            "kl_learner_actor", "action_agreement", "actor_params", "learner_params", "actor_time_s",
            "learner_time_s", "compress_time_s", "policy_lag_mean", "compile_cache_hits", "compile_cache_misses",
            "actor_policy_speedup", "search_agreement", "network_evaluations_per_step", "learner_params_digest",
            "compressor")
    out = {k: run.get(k) for k in keep if k in run}
    if run.get("auto_gate"):  # --compressor auto: what its gate resolved the run to ("none", or a compressor)
        out["auto_resolved"] = run["auto_gate"].get("resolved")
    split = run.get("cost_split") or {}
    flops = split.get("flops") or {}
    if "ceiling" in flops:  # the uncompressed actor's share of an update by FLOPs: Amdahl's p (kinds.amdahl)
        out["actor_share_uncompressed"] = flops["ceiling"]
    if split.get("timed"):  # --cost-split: the same share by measured seconds, and the whole actor's speedup
        out["actor_share_uncompressed_timed"] = split["ceiling"]
        actor, uncompressed = split.get("actor_s_per_update"), split.get("uncompressed_actor_s_per_update")
        out["actor_rollout_speedup"] = uncompressed / actor if actor and uncompressed else None
        compress, learner = split.get("compress_s_per_update"), split.get("learner_s_per_update")
        # the compressor's own cost per update (distillation, pruning; per --compress-every) as a share of the
        # uncompressed update (kinds.amdahl's upkeep)
        out["compress_share_timed"] = (compress / (uncompressed + learner)
                                       if None not in (compress, uncompressed, learner) and uncompressed + learner > 0
                                       else None)
    return out


def learning_curve(logdir: str) -> dict:
    """A run's learning curve from its ``metrics.csv``: ``agent_steps`` (env steps summed over envs),
    ``return_mean`` (mean of the last episodes' returns; None before the first episode ends) and
    ``wall_time_s`` per logged row, as JSON-ready lists."""
    c = curve(logdir)
    return {k: [None if not np.isfinite(x) else float(x) for x in c[col]]
            for k, col in (("agent_steps", "env_steps"), ("return_mean", "return_mean"), ("wall_time_s", "wall_time_s"))}


def win_rates(logdir: str, games: int, opponent_simulations: int, target: float | None = None,
              seed: int = 1) -> dict:
    """Every checkpoint of a two-player (pgx) search run against the plain MCTS opponent, as
    ``python -m accerl_jax.evaluate RUN --step U --episodes games --opponent-simulations N --seed seed`` plays
    its ``mcts`` match (the same key; the learner's network searching with the run's simulations, its
    sampled move; half the games with each colour), one compiled match for all checkpoints.

    Returns:
      ``{"win_rates": [{"update", "wall_time_s", "win_rate", "draw_rate"}] by update, "final_win_rate",
      "time_to_target_s"}``: ``wall_time_s`` the run's seconds from setup at that update (its
      ``metrics.csv`` row; checkpoints fall on logged updates), the time to ``target`` that of the first
      checkpoint at or above it (None if none is; evaluation time is not training time).
    """
    import jax

    from accerl_jax.search import matches
    from accerl_jax.search.evaluation import search_settings
    from accerl_jax.seeds import EvalUse, eval_key
    from accerl_jax.tools import trained as trained_lib

    folder = os.path.join(logdir, "checkpoints")
    updates = sorted(int(n) for n in os.listdir(folder) if n.isdigit())
    last = trained_lib.load(logdir, step=updates[-1])
    model, search = last.env.model, search_settings(last.cfg, None, False)
    opponent = matches.mcts_player(model, opponent_simulations)
    key = jax.random.fold_in(eval_key(seed, EvalUse.MATCHES), 1)  # evaluate's key of its "mcts" match
    play = jax.jit(lambda params: matches.match_scores(
        model, matches.search_player(last.apply, params, model, search), opponent, games, key))
    c = curve(logdir)
    wall = dict(zip(c["update"].astype(int).tolist(), c["wall_time_s"].tolist()))
    rows = []
    for u in updates:
        params = last.params if u == updates[-1] else trained_lib.load(logdir, step=u).params
        r = matches.tally(*jax.device_get(play(params)))
        rows.append({"update": u, "wall_time_s": wall.get(u), "win_rate": r["wins"] / r["games"],
                     "draw_rate": r["draws"] / r["games"]})
    hit = [r["wall_time_s"] for r in rows if target is not None and r["win_rate"] >= target]
    return {"win_rates": rows, "final_win_rate": rows[-1]["win_rate"], "time_to_target_s": hit[0] if hit else None}


EVAL_NUM_ENVS = 64  # environments an evaluated return (:func:`evaluated_return`) plays at once


def evaluated_return(logdir: str, episodes: int, seed: int = 1) -> dict:
    """The trained policy's return on fresh episodes: the final checkpoint of the one-player run in ``logdir``
    played as ``python -m accerl_jax.evaluate RUN --policy learner --episodes episodes --num-envs 64 --seed
    seed`` plays it (the learner's network, uncompressed, searching with the run's simulations in a search
    run; its sampled action; evaluation's own env seeds, not the run's). A run's logged final return averages
    its last 100 training episodes, the compressed actor's in a compressed run; on Breakout-MinAtar an
    episode's return varies with a standard deviation near 20 (docs/RESULTS.md, "The trained policy
    evaluated"), so that average moves by about 2 between seeds of one policy.

    Returns:
      ``{"final_eval_return": mean, "final_eval_return_std": population std (returns per episode),
      "eval_episodes": episodes}``.
    """
    from accerl_jax import evaluate
    from accerl_jax.search.evaluation import search_settings
    from accerl_jax.tools import trained as trained_lib

    trained = trained_lib.load(logdir, policy="learner", num_envs=EVAL_NUM_ENVS, seed=seed)
    played = evaluate.play(trained, episodes, seed=seed, search=search_settings(trained.cfg, None, False))
    stats = evaluate.stats(played["returns"])
    return {"final_eval_return": stats["mean"], "final_eval_return_std": stats["std"],
            "eval_episodes": len(played["returns"])}


def train_in_process(fields: dict, target: float | None = None, keep_curve: bool = False, inspect=None,
                     keep: str | None = None) -> dict:
    """One :func:`accerl_jax.run_training_result` run of ``Config(**fields)`` in a fresh temporary log folder:
    the summary's kept fields, the time to ``target`` (seconds from setup, compilation included), the
    steady rate (None when the run logged too few rows) and, with ``keep_curve``, its :func:`learning_curve`.
    ``inspect(run_dir) -> dict``, if given, reads the run's folder before it is deleted; its fields join
    (and replace) the result's. With ``keep`` (a folder), the run is :func:`kept_in_process` there instead."""
    if keep is not None:
        return kept_in_process(fields, keep, target, keep_curve, inspect)
    return trained_in_process(fields, target, keep_curve, inspect)[0]


def trained_in_process(fields: dict, target: float | None = None, keep_curve: bool = False, inspect=None):
    """:func:`train_in_process`'s fields and the run's :class:`accerl_jax.run.driver.Result` (its final
    parameters, for experiments that study the trained policy)."""
    from accerl_jax.config import Config
    from accerl_jax import run_training_result

    with tempfile.TemporaryDirectory() as tmp:
        cfg = Config(**dict(dict(progress=False, checkpoint_every=0), **fields, logdir=os.path.join(tmp, "run")))
        result = run_training_result(cfg)
        out = _run_outputs(result.summary, cfg.logdir, target, keep_curve, inspect)
    return out, result


def _run_outputs(summary: dict, logdir: str, target: float | None, keep_curve: bool, inspect) -> dict:
    """:func:`train_in_process`'s fields of the finished run in ``logdir`` whose summary is ``summary``."""
    out = summary_keys(summary)
    out["time_to_target_s"] = None if target is None else time_to_target(logdir, target)
    if keep_curve:
        out["curve"] = learning_curve(logdir)
    if inspect is not None:
        out.update(inspect(logdir))
    try:
        out["steady"] = steady_rate(logdir)
    except ValueError:
        out["steady"] = None
    return out


KEPT_CHECKPOINTS = 40  # a kept run writes about this many checkpoints over its budget (2 are kept)


def kept_checkpoint_every(cfg) -> int:
    """Updates between a kept run's checkpoints (:func:`kept_in_process`) for a
    :class:`~accerl_jax.config.Config` ``cfg``: about :data:`KEPT_CHECKPOINTS` over its budget, rounded up to
    a multiple of its ``log_every`` where that at most doubles the interval. The Anakin loop's compiled
    chunks end at every log and every checkpoint, so intervals that are not multiples of each other split
    chunks: on 2 forced host devices (the learner-children benchmark's (b), 140 updates) checkpoints every 24
    updates with a log every 20 ran at 281 ms per update, every 20 at 241 ms, none at 229 ms (1 device: 308
    and 304 ms)."""
    every = max(1, cfg.total_steps // (cfg.num_envs * cfg.rollout_length) // KEPT_CHECKPOINTS)
    aligned = -(-every // cfg.log_every) * cfg.log_every
    return aligned if aligned <= 2 * every else every


class KeptRunError(RuntimeError):
    """A kept run (:func:`kept_in_process`) that cannot give its result now: it stopped before its budget
    (a signal; running the same command again resumes it: ``exit_code`` 1) or its folder holds another
    configuration's run (bad input: ``exit_code`` 2)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def kept_in_process(fields: dict, folder: str, target: float | None = None, keep_curve: bool = False,
                    inspect=None) -> dict:
    """:func:`train_in_process`'s run of ``Config(**fields)`` kept in the log folder ``folder``, so that a
    benchmark longer than one sitting finishes over several: a run that finished there is read back (not run
    again), a stopped one (killed, interrupted) resumes from its latest checkpoint (the trainer's
    ``--resume``: gymnax runs continue exactly, envpool runs restart their episodes in flight), else it
    starts. The run checkpoints about :data:`KEPT_CHECKPOINTS` times over its budget unless ``fields`` set
    ``checkpoint_every`` (:func:`kept_checkpoint_every`). Each sitting that trains is a line of
    ``<folder>.jsonl`` (``git_revision``, ``resumed_from_update``: None for the start, ``fields``); the
    result's ``sessions`` lists them. A resumed run's ``wall_time_s`` adds its sittings' seconds up to the
    checkpoints they left (updates lost to a kill after its last checkpoint are run again and counted once).

    Raises:
      KeptRunError: the folder's run was made with other ``fields`` (names the differences; keep the runs of
        another configuration in another folder), or the run stopped before its budget (Ctrl-C, SIGTERM: it
        saved a checkpoint; the same call again resumes it).
    """
    from accerl_jax.config import Config
    from accerl_jax import run_training_result
    from accerl_jax.run import checkpoint

    given = json.loads(json.dumps(fields))
    sessions = []
    if os.path.isfile(folder + ".jsonl"):
        with open(folder + ".jsonl") as f:
            sessions = [json.loads(line) for line in f if line.strip()]
    if sessions and sessions[0]["fields"] != given:
        saved = sessions[0]["fields"]
        diffs = [f"{k}: {saved.get(k)!r} (kept) vs {given.get(k)!r} (now)" for k in sorted(set(saved) | set(given))
                 if saved.get(k) != given.get(k)]
        raise KeptRunError(f"the run kept in {folder} was made with other settings ({'; '.join(diffs)}); keep this "
                         "configuration's runs in another folder, or delete that run", 2)
    summary = None
    if os.path.isfile(os.path.join(folder, "summary.json")):
        with open(os.path.join(folder, "summary.json")) as f:
            summary = json.load(f)
    if summary is None or summary.get("stopped") == "interrupted":
        steps = checkpoint.finished_steps(folder) if os.path.isdir(os.path.join(folder, checkpoint.CHECKPOINT_DIR)) else []
        base = dict(progress=False, keep_checkpoints=2)
        if "checkpoint_every" not in fields:
            base["checkpoint_every"] = kept_checkpoint_every(Config(**fields))
        cfg = Config(**dict(base, **fields, logdir=folder, resume=folder if steps else None, overwrite=not steps))
        os.makedirs(os.path.dirname(os.path.abspath(folder)), exist_ok=True)
        sessions.append({"git_revision": process_revision(), "resumed_from_update": steps[-1] if steps else None,
                         "fields": given})
        with open(folder + ".jsonl", "a") as f:
            f.write(json.dumps(sessions[-1], sort_keys=True) + "\n")
        summary = run_training_result(cfg).summary
        if summary.get("stopped") == "interrupted":
            raise KeptRunError(f"the run kept in {folder} stopped at update {summary['updates']} "
                               f"({summary.get('exit_signal')}); run the same command again to resume it", 1)
    out = _run_outputs(summary, folder, target, keep_curve, inspect)
    out["sessions"] = [{k: v for k, v in s.items() if k != "fields"} for s in sessions]
    return out


def train_process(flags: list[str], seed: int, target: float | None, cache: str, python: str = sys.executable,
                  timeout_s: float = 1800, inspect=None) -> dict:
    """One whole process ``python -m accerl_jax.train`` with ``flags``, run from the repository root
    with the compilation cache folder ``cache``: ``process_s`` (interpreter start to exit, as a user
    waits), the summary's kept fields, and the seconds from process start to the first logged mean
    return of at least ``target`` (start-up before training + the row's ``wall_time_s``).

    Raises:
      RuntimeError: the process failed (its exit code and the end of its stderr).

    ``inspect(run_dir) -> dict``, if given, reads the run's folder before it is deleted; its fields join
    the result.
    """
    with tempfile.TemporaryDirectory() as tmp:
        argv = [python, "-m", "accerl_jax.train", "--seed", str(seed), "--logdir", os.path.join(tmp, "run"),
                "--no-progress", "--compile-cache", cache, *flags]
        start = time.perf_counter()
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
        process_s = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[1:])} exited {proc.returncode}: {proc.stderr[-1500:]}")
        with open(os.path.join(tmp, "run", "summary.json")) as f:
            s = json.load(f)
        ttt = None if target is None else time_to_target(os.path.join(tmp, "run"), target, s["startup_before_train_s"])
        seen = inspect(os.path.join(tmp, "run")) if inspect is not None else {}
    return dict(summary_keys(s), process_s=process_s, time_to_target_s=ttt, **seen)


# PureJaxRL's CartPole-v1 config (purejaxrl/ppo.py's __main__) with its per-episode host printing off,
# its jitted make_train called once (compile included), run from purejaxrl/purejaxrl/ in its own venv.
# argv: seed, total steps, and a JSON object of config entries replacing these (a peer config of
# PUREJAXRL_CONFIGS). Prints the mean return of the last update's rollout (every env and step, as
# PureJaxRL's own plots) and the mean of the last 100 completed episodes (as accerl_jax's summary).
PUREJAXRL_RUN = """
import json, sys, time
start = time.perf_counter()
sys.path.insert(0, ".")
import jax
import numpy as np
from ppo import make_train
config = {"LR": 2.5e-4, "NUM_ENVS": 4, "NUM_STEPS": 128, "TOTAL_TIMESTEPS": float(sys.argv[2]),
          "UPDATE_EPOCHS": 4, "NUM_MINIBATCHES": 4, "GAMMA": 0.99, "GAE_LAMBDA": 0.95, "CLIP_EPS": 0.2,
          "ENT_COEF": 0.01, "VF_COEF": 0.5, "MAX_GRAD_NORM": 0.5, "ACTIVATION": "tanh", "ENV_NAME": "CartPole-v1",
          "ANNEAL_LR": True, "DEBUG": False}
config.update(json.loads(sys.argv[3]) if len(sys.argv) > 3 else {})
imported = time.perf_counter()
out = jax.block_until_ready(jax.jit(make_train(config))(jax.random.PRNGKey(int(sys.argv[1]))))
returns = out["metrics"]["returned_episode_returns"]  # [updates, steps, envs]
ended = out["metrics"].get("returned_episode")  # [updates, steps, envs] bool: an episode ended there
episodes = np.asarray(returns).reshape(-1)[np.asarray(ended).reshape(-1)] if ended is not None else np.zeros(0)
print(json.dumps({"final_return_mean": float(returns[-1].mean()), "import_s": imported - start,
                  "train_s": time.perf_counter() - imported,
                  "last_100_episodes_mean": float(episodes[-100:].mean()) if episodes.size else None}))
"""
# Peer configs by name: PureJaxRL's MinAtar config (its README's MinAtar notebook: 64 envs x 128 steps,
# 4 epochs x 8 minibatches, LR 5e-3 annealed, relu, its MLP(64, 64) on the flattened grid).
PUREJAXRL_CONFIGS = {
    "cartpole": {},
    "minatar": {"LR": 5e-3, "NUM_ENVS": 64, "NUM_STEPS": 128, "NUM_MINIBATCHES": 8, "ACTIVATION": "relu"},
}


def peer_process(name: str, argv: list[str], cwd: str, timeout_s: float, **env: str):
    """Run a peer's whole process ``argv`` in ``cwd`` on the CPU (``JAX_PLATFORMS=cpu``, no ``XLA_FLAGS`` of
    ours; ``env`` added to the environment): ``(the completed process, its wall seconds)``.

    Raises:
      RuntimeError: it exited non-zero (``name``, its exit code and the end of its output).
    """
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
                          env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="", **env))
    process_s = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{name} exited {proc.returncode}: {(proc.stdout + proc.stderr)[-1500:]}")
    return proc, process_s


def purejaxrl_process(checkout: str, python: str, seed: int, total_steps: int, target: float | None,
                      timeout_s: float = 1800, config: str = "cartpole", env: str = "CartPole-v1",
                      episodes: bool = False) -> dict:
    """PureJaxRL's PPO (``purejaxrl/ppo.py``) on gymnax ``env`` with the named peer ``config``
    (:data:`PUREJAXRL_CONFIGS`) as one whole process of ``python`` (its own virtual environment, the pins
    in ``peers.md``) in ``checkout/purejaxrl``: ``process_s``, ``final_return_mean``, ``import_s``,
    ``train_s``, ``last_100_episodes_mean``. ``episodes``: ``final_return_mean`` is the mean of the last
    100 completed episodes (accerl_jax's summary's measure) rather than of the last update's rollout. It
    logs nothing while training, so its time to ``target`` is its whole process when its final return
    reaches ``target``, else None.

    Raises:
      RuntimeError: the process failed (its exit code and the end of its output).
      KeyError: ``config`` is not a key of :data:`PUREJAXRL_CONFIGS`.
    """
    overrides = dict(PUREJAXRL_CONFIGS[config], ENV_NAME=env)
    argv = [python, "-c", PUREJAXRL_RUN, str(seed), str(total_steps), json.dumps(overrides)]
    proc, process_s = peer_process(f"purejaxrl seed {seed}", argv, os.path.join(checkout, "purejaxrl"), timeout_s)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if episodes and out.get("last_100_episodes_mean") is not None:
        out["final_return_mean"] = out["last_100_episodes_mean"]
    reached = target is not None and out["final_return_mean"] >= target
    return dict(out, process_s=process_s, time_to_target_s=process_s if reached else None)


# Stoix's AlphaZero-like agent (stoix/systems/search/ff_az.py, hydra overrides) at accerl_jax's `search` preset's
# shapes: gymnax CartPole-v1, Gumbel MuZero search with 8 simulations, 16 envs x 16 steps, its own default MLP
# (separate actor and critic torsos, 256 x 256, ReLU: the preset's network), console logging only, a light
# evaluation (10 periods of 8 episodes; not part of its steps/s, which times its jitted learn() call: the
# search's rollout and the training). ``epochs`` and ``batch`` set how much its learner trains per update
# (its defaults: 8 epochs of 32 sequences of 16 steps; accerl_jax's learner trains each sample once).
STOIX_FF_AZ = ("env=gymnax/cartpole", "network=mlp", "system.search_method=gumbel", "system.num_simulations=8",
               "system.rollout_length=16", "arch.total_num_envs=16", "arch.num_evaluation=10",
               "arch.num_eval_episodes=8", "arch.absolute_metric=False", "logger.loggers.console.enabled=True",
               "logger.loggers.wandb.enabled=False", "logger.loggers.neptune.enabled=False",
               "logger.loggers.json.enabled=False", "logger.loggers.tensorboard.enabled=False",
               "logger.checkpointing.save_model=False")


def stoix_log(text: str) -> dict:
    """What Stoix's console log says (colour codes removed): ``steps_per_s``, the median of its "ACTOR - Steps
    per second" over the evaluation periods after the first (which includes compilation); ``periods``,
    those values in order; ``final_return_mean``, the last period's mean return of its training episodes;
    ``eval_return_mean``, its last evaluation's; ``total_env_steps``, its last "MISC - Timestep"."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)

    def value(line: str, key: str):
        m = re.search(re.escape(key) + r":\s*([-+0-9.eE]+)", line)
        return float(m.group(1)) if m else None

    sps, train, evals, steps = [], [], [], []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("ACTOR - "):
            sps.append(value(line, "Steps per second"))
            train.append(value(line, "Episode return mean"))
        elif line.startswith("EVALUATOR - "):
            evals.append(value(line, "Episode return mean"))
        elif line.startswith("MISC - Timestep"):
            steps.append(value(line, "Timestep"))
    steady = sps[1:] or sps
    return {"steps_per_s": float(np.median(steady)) if steady else None, "periods": sps,
            "final_return_mean": train[-1] if train else None, "eval_return_mean": evals[-1] if evals else None,
            "total_env_steps": int(steps[-1]) if steps else None}


def stoix_process(checkout: str, python: str, seed: int, total_steps: int, epochs: int, batch: int,
                  timeout_s: float = 1800) -> dict:
    """Stoix's ``ff_az`` (:data:`STOIX_FF_AZ`) as one whole process of ``python`` (its own virtual environment)
    in ``checkout``, ``epochs`` epochs of ``batch`` sequences per update: ``process_s`` and
    :func:`stoix_log`'s fields (``steps_per_s``: its steady rate, compilation and evaluation excluded).

    Raises:
      RuntimeError: the process failed (its exit code and the end of its output).
    """
    with tempfile.TemporaryDirectory() as tmp:
        argv = [python, "stoix/systems/search/ff_az.py", *STOIX_FF_AZ, f"arch.seed={seed}",
                f"arch.total_timesteps={total_steps}", f"system.epochs={epochs}", f"system.total_batch_size={batch}",
                f"logger.base_exp_path={tmp}/results", f"hydra.run.dir={tmp}/hydra"]
        proc, process_s = peer_process(f"stoix ff_az seed {seed}", argv, checkout, timeout_s, WANDB_MODE="disabled")
    return dict(stoix_log(proc.stdout + proc.stderr), process_s=process_s)
