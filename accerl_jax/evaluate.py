"""Command line: ``python -m accerl_jax.evaluate RUN_DIR [--episodes N] [--policy actor|learner] [--greedy]
[--num-envs B] [--seed S] [--video PATH] [--step K]``; ``--help`` lists all flags.

Runs ``N`` whole episodes of a trained policy (:mod:`accerl_jax.tools.trained`) on fresh environments of the
run's env id, through the same adapters as training (:mod:`accerl_jax.envs`: episode ends and time
limits as the learner saw them), prints the return and length statistics and writes them atomically to
``<RUN_DIR>/eval.json`` (for a run of several seeds or a sweep, the chosen run's own folder's
``eval.json``, e.g. ``<RUN_DIR>/seed1/eval.json``); nothing else in the run folder changes. Each of the
``B`` envs plays a fixed quota of the ``N`` episodes (``N // B``, one more for the first ``N % B``), so short episodes are not
over-represented. ``--video`` writes one episode as an animated GIF or MP4 (:mod:`accerl_jax.tools.video`).
Bad input exits with status 2 and one line naming it (no traceback).
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

EVAL_FILE = "eval.json"
CHUNK = 32  # agent steps per jitted call between progress-bar updates (jittable envs)
DIVERGENCE_OBS = 512  # at most this many visited observations for the KL/agreement of --policy actor


@dataclasses.dataclass
class Args:
    """Evaluate a trained run's policy on fresh episodes; writes <RUN_DIR>/eval.json (a --num-seeds or
    --sweep run: the chosen run's own folder's, <RUN_DIR>/seed<k>/eval.json)."""

    run_dir: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="RUN_DIR")]
    """The run folder (--logdir of training), or one of its checkpoints/<update> folders."""
    episodes: int = 100
    """Whole episodes to play (over all environments)."""
    policy: Annotated[str, tyro.conf.arg(help=cli.POLICY_HELP)] = cli.DEFAULT_POLICY
    greedy: bool = False
    """Take the most likely action (continuous: the mean) instead of sampling as the actor does."""
    num_envs: int = 16
    """Environments stepped together."""
    seed: int = 1
    """Seed of the fresh environments and of the action sampling; evaluation's own seeds and keys, disjoint
    from those of every training run (whatever its --seed)."""
    video: Annotated[Optional[str], tyro.conf.arg(metavar="FILE", help_behavior_hint="(default: unset: no video)")] = None
    """Also write one of the evaluated episodes (env 0's first) as an animated .gif or .mp4 here."""
    step: Annotated[Optional[int], tyro.conf.arg(metavar="INT", help_behavior_hint="(default: unset: the latest)")] = None
    """Evaluate checkpoint <RUN_DIR>/checkpoints/<step> instead of the latest."""
    seed_index: int = 0
    """For a --num-seeds run: which of its seeds (0-based)."""
    progress: bool = True
    """Show a progress bar."""
    num_simulations: Annotated[Optional[int], tyro.conf.arg(metavar="INT", help_behavior_hint="(default: unset: the run's)")] = None
    """A search run (--agent search): simulations of the search at every evaluated step."""
    no_search: tyro.conf.FlagCreatePairsOff[bool] = False  # one flag, --no-search (no --no-no-search)
    """A search run: play its network alone (sampled, or with --greedy its argmax) instead of searching."""
    opponent_simulations: int = 64
    """A two-player game (pgx:<game>): simulations per move of the MCTS opponent (random rollouts)."""


def check_args(args: Args) -> None:
    """The checks the flags alone decide, before the run folder is read.

    Raises:
      ConfigError: naming the bad flag and value and what is accepted.
    """
    from accerl_jax.seeds import eval_envpool_seed
    from accerl_jax.tools.video import check_video_path

    if not 0 < args.episodes <= 10_000_000:
        raise ConfigError(f"bad --episodes {args.episodes}; expected an integer in [1, 10^7]")
    if not 0 < args.num_envs <= 65536:
        raise ConfigError(f"bad --num-envs {args.num_envs}; expected an integer in [1, 65536]")
    if not 0 <= args.seed < 2**31:
        raise ConfigError(f"bad --seed {args.seed}; expected an integer in [0, 2^31)")
    try:
        eval_envpool_seed(args.seed, args.num_envs)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if args.policy not in cli.POLICIES:
        raise ConfigError(f"bad --policy {args.policy!r}; expected one of {', '.join(cli.POLICIES)}")
    if args.step is not None and args.step < 0:
        raise ConfigError(f"bad --step {args.step}; expected a checkpoint's update (an integer >= 0)")
    if args.video is not None:
        check_video_path(args.video)
    if not 0 < args.opponent_simulations <= 4096:
        raise ConfigError(f"bad --opponent-simulations {args.opponent_simulations}; expected an integer in [1, 4096]")


def play(trained, episodes: int, *, greedy: bool = False, seed: int = 1, progress: bool = False,
         search=None, keep_obs: int = DIVERGENCE_OBS) -> dict:
    """Play ``episodes`` whole episodes of ``trained`` (:class:`accerl_jax.tools.trained.Trained`) on its env
    (``search``: a :class:`~accerl_jax.search.acting.SearchSettings` to search with at every step,
    :mod:`accerl_jax.search.evaluation`; a gymnax env).

    Returns:
      ``{"returns": [episodes] float list, "lengths": [episodes] int list (agent steps), "obs":
      [<= keep_obs, *obs_shape] numpy array of the first visited observations (time-major per chunk),
      "first_episode": [L + 1, *obs_shape] numpy array}``; episodes in the order they finished.
      ``first_episode`` holds the observations of env 0's first episode (one of those counted), from its first
      to its final one: what ``--video`` shows, recorded by the same program, so that a video costs no
      compilation of its own.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    from accerl_jax.seeds import EvalUse, eval_key
    from accerl_jax.tools.trained import make_forward

    env, info = trained.env, trained.info
    b = info.num_envs
    quota = np.full(b, episodes // b) + (np.arange(b) < episodes % b)
    forward = make_forward(trained.apply, trained.params, info)

    def act(obs, key):
        action, best, _ = forward(obs, key)
        return best if greedy else action

    if search is not None:
        from accerl_jax.search.evaluation import make_search_act

        search_act = make_search_act(trained, search, greedy)

    def one(carry):
        env_state, obs, key = carry
        key, sub = jax.random.split(key)
        env_state, tr = env.step(env_state, act(obs, sub) if search is None else search_act(env_state, obs, sub))
        done = jnp.logical_and(jnp.logical_or(tr.terminated, tr.truncated), tr.valid)
        return (env_state, tr.obs, key), (obs, done, tr.episode_return, tr.episode_length, tr.next_obs[0], tr.valid[0])

    if info.jittable:
        chunk = jax.jit(lambda c: jax.lax.scan(lambda c, _: one(c), c, None, length=CHUNK))
        env_state, obs = jax.jit(env.reset)(eval_key(seed, EvalUse.EPISODES_RESET))
    else:
        step_policy = jax.jit(act)

        def chunk(carry):  # host envs: the policy jitted, the env stepped from Python
            env_state, obs, key = carry
            key, sub = jax.random.split(key)
            env_state, tr = env.step(env_state, np.asarray(step_policy(obs, sub)))
            done = np.logical_and(np.logical_or(tr.terminated, tr.truncated), tr.valid)
            out = (np.asarray(obs), done, np.asarray(tr.episode_return), np.asarray(tr.episode_length),
                   np.asarray(tr.next_obs[0]), np.asarray(tr.valid[0]))
            return (env_state, tr.obs, key), jax.tree.map(lambda x: x[None], out)

        env_state, obs = env.reset(eval_key(seed, EvalUse.EPISODES_RESET))
    carry = (env_state, obs, eval_key(seed, EvalUse.EPISODES_ACTIONS))
    counts = np.zeros(b, np.int64)
    returns, lengths, seen = [], [], []
    first, first_done = [], False  # env 0's first episode
    bar = _progress_bar(episodes) if progress else None
    try:
        while (counts < quota).any():
            carry, (obs_t, done, ret, length, next0, valid0) = chunk(carry)
            done, ret, length = np.asarray(done), np.asarray(ret), np.asarray(length)
            if not first_done:
                first_done = _extend_episode(first, np.asarray(obs_t[0, 0]), np.asarray(next0), np.asarray(valid0),
                                             done[:, 0])
            if sum(len(o) for o in seen) < keep_obs:
                seen.append(np.asarray(obs_t).reshape((-1,) + tuple(info.obs_shape)))
            for t, i in zip(*np.nonzero(done)):  # time-major: in the order the episodes ended
                if counts[i] < quota[i]:
                    counts[i] += 1
                    returns.append(float(ret[t, i]))
                    lengths.append(int(length[t, i]))
            if bar is not None:
                bar[0].update(bar[1], completed=len(returns),
                              ret=f"{np.mean(returns):.1f}" if returns else "-")
    finally:
        if bar is not None:
            bar[0].stop()
    kept = np.concatenate(seen)[:keep_obs] if seen else np.zeros((0,) + tuple(info.obs_shape), np.float32)
    return {"returns": returns, "lengths": lengths, "obs": kept, "first_episode": np.stack(first)}


def _extend_episode(frames: list, obs0, next_obs, valid, done) -> bool:
    """Append one chunk's ``T`` steps of one env (numpy ``next_obs [T, *obs_shape]``, bool ``valid [T]`` and
    ``done [T]``) to ``frames``: its first observation ``obs0`` when ``frames`` is empty, then each valid
    step's next observation, up to and including the first step that ends the episode; returns whether
    one did."""
    import numpy as np

    if not frames:
        frames.append(obs0)
    for t in np.flatnonzero(valid):  # an invalid step (envpool's reset step) shows nothing
        frames.append(next_obs[t])
        if done[t]:
            return True
    return False


def _progress_bar(total: int):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("[bold]eval"), BarColumn(), TextColumn("{task.completed:>6,}/{task.total:,} episodes"),
                        TextColumn("return {task.fields[ret]}"), TimeElapsedColumn())
    task = progress.add_task("eval", total=total, ret="-")
    progress.start()
    return progress, task


def stats(values) -> dict:
    """``{"mean", "std", "min", "max"}`` of a list of numbers (population std), as floats."""
    import numpy as np

    x = np.asarray(values, np.float64)
    return {"mean": float(x.mean()), "std": float(x.std()), "min": float(x.min()), "max": float(x.max())}


def own_folder(trained, seed_index: int) -> str:
    """Where the evaluation of run ``seed_index`` of ``trained``'s run is written: the run folder itself, or,
    for a run of several (``--num-seeds``, ``--sweep``), that run's own folder (``seed<k>/``,
    ``<name>=<value>-seed<k>/``: :func:`accerl_jax.run.replicas.folder`) beside its own summary, so that the
    seeds' evaluations do not overwrite one another; the run folder where an older run has no such folder."""
    from accerl_jax.run import replicas

    runs = replicas.replicas(trained.cfg)
    if len(runs) == 1:
        return trained.run_dir
    own = os.path.join(trained.run_dir, runs[seed_index].folder)
    return own if os.path.isdir(own) else trained.run_dir


def evaluate(args: Args) -> dict:
    """Evaluate as the CLI does and return the record written to ``<RUN_DIR>/eval.json`` (:func:`own_folder`).

    Raises:
      ConfigError: any bad flag or run folder (see the module docstring), before anything is written.
    """
    from accerl_jax import monitor
    from accerl_jax.tools import trained as trained_lib

    check_args(args)
    trained = trained_lib.load(args.run_dir, policy=args.policy, step=args.step, num_envs=args.num_envs,
                               seed=args.seed, seed_index=args.seed_index)
    out_dir = own_folder(trained, args.seed_index)
    out_path = os.path.join(out_dir, EVAL_FILE)
    # Which run of a run of several (--num-seeds, --sweep) this is: its own folder's name; None for a single run.
    replica = None if os.path.samefile(out_dir, trained.run_dir) else os.path.basename(out_dir)
    if not os.access(out_dir, os.W_OK):
        raise ConfigError(f"bad {trained_lib.WHAT} {args.run_dir!r}: cannot write {EVAL_FILE} in {out_dir} (no "
                          "write permission); copy the run folder somewhere writable")
    from accerl_jax.search.evaluation import search_settings

    search = search_settings(trained.cfg, args.num_simulations, args.no_search)
    if trained.cfg.env.startswith("pgx:"):
        if args.video is not None:
            raise ConfigError(f"bad --video {args.video!r} for {trained.cfg.env}: a two-player game is evaluated by "
                              "matches, which film nothing; drop --video")
        record = dict(_two_player_record(trained, args, search), run=replica, written=out_path)
        monitor.atomic_write(out_path, json.dumps(record, indent=2) + "\n")
        return record
    played = play(trained, args.episodes, greedy=args.greedy, seed=args.seed, progress=args.progress, search=search)
    record = {
        "run_dir": trained.run_dir,
        "checkpoint_update": trained.step,
        "env": trained.cfg.env,
        "compressor": trained.cfg.compressor,
        "policy": args.policy,
        "greedy": args.greedy,
        "search_simulations": None if search is None else search.num_simulations,  # None: the network alone
        "episodes": len(played["returns"]),
        "num_envs": args.num_envs,
        "seed": args.seed,
        "seed_index": args.seed_index,
        "run": replica,  # the evaluated run's own folder in a run of several (seed<k>, <name>=<value>-seed<k>)
        "written": out_path,
        "return": stats(played["returns"]),
        "length": stats(played["lengths"]),
    }
    if args.policy == "actor":
        # The actor against the learner on the states this evaluation visited, beside the run's own last
        # logged values (its summary.json, measured on training rollouts).
        record.update({f"eval_obs_{k}": v for k, v in trained_lib.divergence(trained, played["obs"]).items()})
        summary = _read_json(os.path.join(out_dir, "summary.json"))
        record["run_kl_learner_actor"] = summary.get("kl_learner_actor")
        record["run_action_agreement"] = summary.get("action_agreement")
    if args.video is not None:
        from accerl_jax.tools.video import write_video

        frames = played["first_episode"]
        write_video(frames, trained.info, args.video, progress=args.progress)
        record["video"] = args.video
        record["video_frames"] = len(frames)
    monitor.atomic_write(out_path, json.dumps(record, indent=2) + "\n")
    return record


def _two_player_record(trained, args: Args, search) -> dict:
    """The eval record of a two-player game's run: ``--episodes`` games against each fixed opponent
    (:mod:`accerl_jax.search.matches`: uniformly random legal moves, and plain MCTS with random rollouts
    at ``--opponent-simulations``), half of them with each colour; the agent searches with ``search``
    (None: its network alone)."""
    import jax

    from accerl_jax.search import matches
    from accerl_jax.seeds import EvalUse, eval_key

    model = trained.env.model
    if search is None:
        agent = matches.network_player(trained.apply, trained.params, model, args.greedy)
    else:
        agent = matches.search_player(trained.apply, trained.params, model, search, args.greedy)
    key = eval_key(args.seed, EvalUse.MATCHES)
    opponents = {"random": matches.random_player(model), "mcts": matches.mcts_player(model, args.opponent_simulations)}
    results = {name: matches.play_match(model, agent, opponent, args.episodes, jax.random.fold_in(key, i))
               for i, (name, opponent) in enumerate(opponents.items())}
    return {
        "run_dir": trained.run_dir, "checkpoint_update": trained.step, "env": trained.cfg.env,
        "compressor": trained.cfg.compressor, "policy": args.policy, "greedy": args.greedy,
        "search_simulations": None if search is None else search.num_simulations,
        "episodes": args.episodes, "seed": args.seed, "opponent_simulations": args.opponent_simulations,
        "matches": results,
    }


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            value = json.load(f)
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def main(argv: list[str] | None = None) -> int:
    try:
        args = cli.parse_args(Args, argv, "python -m accerl_jax.evaluate")
        record = evaluate(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    searched = "" if record["search_simulations"] is None else f", search of {record['search_simulations']} simulations"
    which = f", run {record['run']}" if record.get("run") else ""
    if "matches" in record:
        print(f"{record['env']} {record['policy']} policy (compressor {record['compressor']}, checkpoint "
              f"{record['checkpoint_update']}{which}{', greedy' if record['greedy'] else ''}{searched}), "
              f"{record['episodes']} games per opponent, half each colour:")
        for name, m in record["matches"].items():
            what = "uniformly random legal moves" if name == "random" else \
                f"MCTS, {record['opponent_simulations']} simulations, random rollouts"
            print(f"  vs {name} ({what}): win {m['wins']} draw {m['draws']} loss {m['losses']}")
        print(f"written: {record['written']}")
        return 0
    r, n = record["return"], record["length"]
    print(f"{record['env']} {record['policy']} policy (compressor {record['compressor']}, checkpoint "
          f"{record['checkpoint_update']}{which}{', greedy' if record['greedy'] else ''}{searched}): {record['episodes']} episodes, "
          f"return {r['mean']:.2f} ± {r['std']:.2f} (min {r['min']:.1f}, max {r['max']:.1f}), "
          f"length {n['mean']:.1f} ± {n['std']:.1f}")
    if "eval_obs_kl_learner_actor" in record:
        run_kl = record["run_kl_learner_actor"]
        print(f"actor vs learner on evaluated states: KL {record['eval_obs_kl_learner_actor']:.4g} nats, agreement "
              f"{record['eval_obs_action_agreement']:.3f}" + (f" (run's last log: KL {run_kl:.4g}, agreement "
                                                             f"{record['run_action_agreement']:.3f})" if run_kl is not None else ""))
    if "video" in record:
        print(f"video ({record['video_frames']} frames): {record['video']}")
    print(f"written: {record['written']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
