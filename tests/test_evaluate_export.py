"""Evaluate, watch and export a trained policy (python -m accerl_jax.evaluate / accerl_jax.export).

One real run is trained (CartPole, ``distill:small+int8``, two updates) and evaluated, filmed and exported;
the other policies (MLP ``none`` and ``distill:small``; a CNN on Breakout-MinAtar with ``distill:small``
and with ``distill:small+int8``, whose learner policy stands for the CNN's ``none``) are checkpoints written the way training writes them
(:class:`accerl_jax.run.checkpoint.Checkpointer`, the run's configuration, a learner and the compressor's
``init`` output) without training, which the export does not need. Every exported program is loaded
by the README's plain-JAX loader and must give the framework's actions for the same observations and key.
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from accerl_jax import evaluate, export, networks
from accerl_jax.run import checkpoint
from accerl_jax.tools import trained
from accerl_jax.run import plan as plan_lib
from accerl_jax.config import Config
from accerl_jax.envs import make_env
from accerl_jax.learner import LearnerState, learner_key
from accerl_jax import run_training
from accerl_jax.run.build import make_run_compressor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tree_hashes(root) -> dict:
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


# The MLP runs' learner widths: a student of MLP(256, 256) is large enough that its int8 weights, not the
# exported program's fixed overhead (~16 kB), decide the program's size (the sizes the tests compare).
MLP_WIDTHS = (256, 256)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """A trained run: CartPole, distill:small+int8, 2 updates of 2 envs x 4 steps, checkpoint 2."""
    logdir = tmp_path_factory.mktemp("real") / "run"
    cfg = Config(compressor="distill:small+int8", total_steps=16, num_envs=2, rollout_length=4, distill_steps=1,
                 hidden_sizes=MLP_WIDTHS, logdir=str(logdir), progress=False)
    summary = run_training(cfg)
    assert summary["updates"] == 2
    return logdir


def _write_run(logdir, env_id: str, compressor: str) -> str:
    """A run folder holding checkpoint 1 of untrained networks, written as training writes it."""
    cfg = Config(env=env_id, compressor=compressor, num_envs=2, rollout_length=4, total_steps=8, distill_steps=1,
                 hidden_sizes=MLP_WIDTHS if env_id == "gymnax:CartPole-v1" else (8,) if "Pendulum" in env_id else (), logdir=str(logdir), progress=False)
    env = make_env(cfg.env, cfg.num_envs)
    spec = plan_lib.make_plan(cfg, env.info).spec
    k_net, k_comp, k_env = jax.random.split(jax.random.PRNGKey(3), 3)
    params = networks.init_params(spec, k_net)
    compressor_ = make_run_compressor(cfg, spec, networks.make_apply(spec), False)
    actor_params, comp_state = compressor_.init(params, k_comp, env.reset(k_env)[1])
    os.makedirs(logdir)
    saver = checkpoint.Checkpointer(str(logdir), 1, dataclasses.asdict(cfg))
    state = checkpoint.TrainState(LearnerState(params, (), jnp.zeros((), jnp.int32), learner_key(cfg.seed)),
                                  (actor_params,), comp_state, ())
    saver.save(1, state, {"completed": 1})
    saver.close()
    return str(logdir)


def _readme_loader(folder: str):
    """The README's plain-JAX loader (its code block that calls ``jax.export.deserialize``), run on ``folder``."""
    with open(os.path.join(REPO, "README.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    (code,) = [b for b in blocks if "jax.export.deserialize" in b]
    assert "accerl_jax" not in code
    namespace: dict = {}
    exec(code.replace('"exported/', f'"{folder}/'), namespace)
    return namespace["spec"], namespace["policy"]


CASES = [  # (id, env, compressor)
    ("mlp-none", "gymnax:CartPole-v1", "none"),
    ("mlp-distill", "gymnax:CartPole-v1", "distill:small"),
    ("cnn-distill", "gymnax:Breakout-MinAtar", "distill:small"),
    ("cnn-distill-int8", "gymnax:Breakout-MinAtar", "distill:small+int8"),
    ("mlp-gaussian", "gymnax:Pendulum-v1", "none"),  # continuous actions in [-2, 2]
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, real_run):
    root = tmp_path_factory.mktemp("written")
    out = {"mlp-distill-int8": str(real_run)}
    for case, env_id, compressor in CASES:
        out[case] = _write_run(root / case, env_id, compressor)
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory, runs):
    """Every run's actor, loaded and exported as the CLI does: {case: (out folder, policy.json record, Trained)}."""
    root = tmp_path_factory.mktemp("exported")
    out = {}
    for case, run in runs.items():
        loaded = trained.load(run, policy="actor", num_envs=1)
        out[case] = (str(root / case), export.export_trained(loaded, str(root / case)), loaded)
    return out


@pytest.mark.parametrize("case", ["mlp-none", "mlp-distill", "mlp-distill-int8", "cnn-learner", "cnn-distill",
                                  "cnn-distill-int8"])
def test_exported_policy_gives_the_frameworks_actions(runs, exported, tmp_path, case):
    if case == "cnn-learner":  # the uncompressed CNN policy (what 'none' runs): the learner's of a CNN run
        actor = exported["cnn-distill-int8"][2]
        ref = dataclasses.replace(actor, policy="learner", apply=actor.learner_apply, params=actor.learner_params)
        program = export.export_program(ref.apply, ref.params, ref.info)
        (tmp_path / export.PROGRAM_FILE).write_bytes(program)
        (tmp_path / export.SPEC_FILE).write_text(json.dumps({"obs_shape": list(ref.info.obs_shape),
                                                             "obs_dtype": ref.info.obs_dtype}))
        spec, policy = _readme_loader(str(tmp_path))
        record = {"exported_matches_framework": {"actions_equal": True}, "compressor": ref.cfg.compressor,
                  "param_count": networks.param_count(ref.params)}
    else:
        folder, record, ref = exported[case]
        spec, policy = _readme_loader(folder)
        # The run folder is recorded relative to policy.json's folder (the pair can move together).
        assert not os.path.isabs(record["run_dir"])
        assert os.path.samefile(os.path.join(folder, record["run_dir"]), runs[case])
    env = make_env(ref.cfg.env, 8, 0)
    state, obs = env.reset(jax.random.PRNGKey(0))
    for _ in range(3):  # a few steps in, so that observations differ between envs
        state, tr = env.step(state, jnp.zeros((8,), jnp.int32) + 1)
    obs = np.asarray(tr.obs)
    assert spec["obs_shape"] == list(obs.shape[1:]) and spec["obs_dtype"] == str(obs.dtype)
    for seed in (0, 1):
        key = jax.random.PRNGKey(seed)
        want = jax.jit(trained.make_forward(ref.apply, ref.params, ref.info))(obs, key)
        got = policy(obs, key)
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))  # sampled actions
        np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))  # greedy actions
        np.testing.assert_allclose(np.asarray(got[2]), np.asarray(want[2]), rtol=1e-5, atol=1e-6)
    # The batch dimension is symbolic: another batch size runs too.
    assert np.asarray(policy(obs[:3], jax.random.PRNGKey(0))[0]).shape == (3,)
    assert record["exported_matches_framework"]["actions_equal"]
    assert record["compressor"] == ref.cfg.compressor
    assert record["param_count"] == networks.param_count(ref.params)
    if ref.cfg.compressor == "none":  # the actor is the learner
        assert record["param_count"] == record["learner_param_count"]
        assert record["kl_learner_actor"] == pytest.approx(0.0, abs=1e-6) and record["action_agreement"] == 1.0


@pytest.mark.parametrize("case", ["mlp-none", "mlp-distill-int8", "mlp-gaussian", "cnn-distill", "cnn-distill-int8"])
def test_exported_actions_stay_in_the_action_space_far_off_distribution(exported, case):
    """Every network family's exported program (MLP discrete, MLP Gaussian, MinAtar conv net), through the
    README's loader, on observations far outside anything training saw: sampled and greedy actions are valid
    discrete indices or lie inside the box, and policy.json says what is clipped."""
    folder, record, ref = exported[case]
    spec, policy = _readme_loader(folder)
    env = make_env(ref.cfg.env, 8, 0)
    _, obs = env.reset(jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    shape = tuple(spec["obs_shape"])
    obs = np.concatenate([np.asarray(obs) * 1e3, np.asarray(obs) * -1e3, rng.normal(0, 1e4, (8,) + shape),
                          rng.uniform(-1e6, 1e6, (8,) + shape)]).astype(spec["obs_dtype"])
    space = spec["action_space"]
    for seed in range(3):
        action, greedy, _ = policy(obs, jax.random.PRNGKey(seed))
        for a in (np.asarray(action), np.asarray(greedy)):
            assert np.all(np.isfinite(a)) if space["kind"] == "box" else a.dtype == np.int32
            if space["kind"] == "box":
                assert a.shape == (len(obs), *space["shape"])
                assert np.all(a >= np.asarray(space["low"], np.float32)), a.min()
                assert np.all(a <= np.asarray(space["high"], np.float32)), a.max()
            else:
                assert a.shape == (len(obs),) and np.all((0 <= a) & (a < space["n"])), a
    if space["kind"] == "box":  # the framework's forward (evaluate, video) is the same clipped program
        want = jax.jit(trained.make_forward(ref.apply, ref.params, ref.info))(obs, jax.random.PRNGKey(0))
        np.testing.assert_array_equal(np.asarray(policy(obs, jax.random.PRNGKey(0))[0]), np.asarray(want[0]))
        assert space["low"] == [-2.0] and space["high"] == [2.0]
        assert spec["action_clipping"]["clipped"] == ["action", "greedy_action"]
        assert spec["action_clipping"]["low"] == space["low"] and spec["action_clipping"]["high"] == space["high"]
    else:
        assert spec["action_clipping"] is None


@pytest.mark.parametrize("family", ["mlp", "cnn"])
def test_int8_program_keeps_int8_weights_and_is_smaller(exported, family):
    folder8, rec8, _ = exported[f"{family}-distill-int8"]
    with open(os.path.join(folder8, export.PROGRAM_FILE), "rb") as f:
        text = jax.export.deserialize(bytearray(f.read())).mlir_module()
    assert re.search(r"dense<.*> : tensor<\d+x\d+xi8>", text)  # int8 weight constants in the program
    # The whole program is smaller than its parameters stored as float32 would be (heads stay float32).
    assert rec8["program_bytes"] < rec8["param_bytes_if_float32"]
    assert rec8["param_bytes"] < 0.5 * rec8["param_bytes_if_float32"]
    assert rec8["program_bytes"] < 0.1 * rec8["learner_program_bytes"]
    if family == "mlp":  # against the same float student network exported from its own run
        _, rec32, _ = exported["mlp-distill"]
        # int8 adds one float32 scale per output channel and per activation
        assert rec32["param_count"] <= rec8["param_count"] < 1.1 * rec32["param_count"]
        assert rec8["program_bytes"] < 0.7 * rec32["program_bytes"]


def test_evaluate_writes_eval_json_and_a_gif(real_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(real_run, run)
    before = _tree_hashes(run)
    gif = tmp_path / "episode.gif"
    record = evaluate.evaluate(evaluate.Args(run_dir=str(run), episodes=5, num_envs=2, policy="actor",
                                             video=str(gif), progress=False))
    after = _tree_hashes(run)
    assert set(after) - set(before) == {evaluate.EVAL_FILE}
    assert {k: v for k, v in after.items() if k != evaluate.EVAL_FILE} == before
    with open(run / evaluate.EVAL_FILE) as f:
        assert json.load(f) == record
    assert record["episodes"] == 5 and record["checkpoint_update"] == 2
    # CartPole: reward 1 per step, so returns equal lengths; episodes last 9 .. 500 steps.
    assert record["return"] == record["length"]
    assert 9 <= record["length"]["min"] <= record["length"]["mean"] <= record["length"]["max"] <= 500
    assert 0 <= record["eval_obs_kl_learner_actor"] < 0.05 and record["run_kl_learner_actor"] is not None
    from PIL import Image

    with Image.open(gif) as im:
        assert im.n_frames == record["video_frames"] >= 10
        assert im.size[0] > 100


def test_play_gives_each_env_its_quota(real_run):
    pol = trained.load(str(real_run), policy="learner", num_envs=3)
    played = evaluate.play(pol, 7, greedy=True, seed=2)
    assert len(played["returns"]) == len(played["lengths"]) == 7
    assert played["obs"].shape[1:] == (4,)
    # --video's episode is one of those counted (env 0's first): its first observation to its final one.
    first = played["first_episode"]
    assert first.shape[1:] == (4,) and len(first) - 1 in played["lengths"]
    np.testing.assert_array_equal(first[0], played["obs"][0])


def test_video_renders_faster_than_the_episode_plays_with_progress(tmp_path, capsys):
    """A 501-frame CartPole episode (16.7 s at 30 fps) is drawn and written in less time than it shows, with
    a progress bar of its frames; every frame is in the GIF."""
    import time
    import types

    from PIL import Image

    from accerl_jax.tools import video

    info = types.SimpleNamespace(name="gymnax:CartPole-v1", channels_first=False)
    frames = np.random.default_rng(0).normal(0, 0.3, (501, 4)).astype(np.float32)
    start = time.perf_counter()
    video.write_video(frames, info, str(tmp_path / "e.gif"), progress=True)
    seconds = time.perf_counter() - start
    assert seconds < len(frames) / video.FPS, seconds
    assert "501/501 frames" in capsys.readouterr().out
    with Image.open(tmp_path / "e.gif") as im:
        assert im.n_frames == 501 and im.size == (video.WIDTH, video.HEIGHT + video.BAND)


def test_mp4_frames_are_piped_to_ffmpeg(tmp_path, monkeypatch):
    """MP4: raw RGB frames of even size piped to ffmpeg (a stand-in that records its arguments and input)."""
    import types

    from accerl_jax.tools import video

    fake = tmp_path / "bin" / "ffmpeg"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport sys\ndata = sys.stdin.buffer.read()\n"
                    "open(sys.argv[-1], 'w').write(' '.join(sys.argv[1:]) + '\\n' + str(len(data)))\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    info = types.SimpleNamespace(name="gymnax:Breakout-MinAtar", channels_first=False)
    frames = (np.random.default_rng(0).random((5, 10, 10, 4)) > 0.7).astype(np.float32)
    video.write_video(frames, info, str(tmp_path / "e.mp4"))
    args, size = (tmp_path / "e.mp4").read_text().splitlines()
    h, w = 10 * video.CELL + video.BAND, 10 * video.CELL
    assert f"-s {w}x{h}" in args and "-pix_fmt rgb24" in args and int(size) == 5 * h * w * 3
    assert h % 2 == w % 2 == 0
    assert not list(tmp_path.glob("*.tmp.mp4"))


def _flip_byte(run):
    data = max(glob.glob(str(run / "checkpoints" / "2" / "state" / "**" / "d" / "*"), recursive=True),
               key=os.path.getsize)
    raw = bytearray(open(data, "rb").read())
    raw[len(raw) // 2] ^= 0xFF
    open(data, "wb").write(bytes(raw))


def _other_env(run):
    path = run / "checkpoints" / "2" / "meta" / "metadata"
    meta = json.loads(path.read_text())
    meta["config"]["env"] = "gymnax:NoSuchEnv-v0"
    path.write_text(json.dumps(meta))


def _half_written(run):
    os.rename(run / "checkpoints" / "2", run / "checkpoints" / "2.orbax-checkpoint-tmp-99")


def _out_file(t):
    (t / "a_file").write_text("x")
    return str(t / "a_file")


BAD = [  # (id, cli "evaluate"/"export", args(tmp, run), prepare(run), parts of the one-line error)
    ("not-a-run", "evaluate", lambda t, r: [str(t)], None, ["bad RUN_DIR", "no checkpoints/ folder there"]),
    ("no-such-folder", "evaluate", lambda t, r: [str(t / "nope")], None, ["bad RUN_DIR", "no such folder"]),
    ("a-file", "evaluate", lambda t, r: [_out_file(t)], None, ["bad RUN_DIR", "it is a file"]),
    ("half-written", "evaluate", lambda t, r: [r], _half_written, ["bad RUN_DIR", "no finished checkpoint"]),
    ("altered", "evaluate", lambda t, r: [r], _flip_byte, ["bad RUN_DIR", "is damaged"]),
    ("env-not-built", "export", lambda t, r: [r, "--out", str(t / "o")], _other_env,
     ["bad RUN_DIR", "gymnax:NoSuchEnv-v0", "cannot be built"]),
    ("episodes-0", "evaluate", lambda t, r: [r, "--episodes", "0"], None, ["bad --episodes 0", "expected"]),
    ("bad-policy", "evaluate", lambda t, r: [r, "--policy", "student"], None, ["bad --policy 'student'", "actor, learner"]),
    ("no-such-step", "evaluate", lambda t, r: [r, "--step", "7"], None,
     ["bad --step 7", "no checkpoint of update 7", "counts updates of 8 env steps", "its checkpoints: 2 (env step 16)"]),
    # an env step given for an update: named as such, with the update to give
    ("step-as-env-step", "export", lambda t, r: [r, "--out", str(t / "o"), "--step", "16"], None,
     ["bad --step 16", "env step 16 is update 2: --step 2", "its checkpoints: 2 (env step 16)"]),
    ("bad-video", "evaluate", lambda t, r: [r, "--video", str(t / "x.avi")], None, ["bad --video", ".gif or .mp4"]),
    # /proc passes the access() check (as root) but takes no new file: refused before the episode is played.
    ("video-cannot-write", "evaluate", lambda t, r: [r, "--video", "/proc/accerl-video-test.gif"], None,
     ["bad --video '/proc/accerl-video-test.gif'", "cannot"]),
    ("misspelled-flag", "evaluate", lambda t, r: [r, "--epsiodes", "3"], None,
     ["unknown flag --epsiodes (perhaps --episodes", "python -m accerl_jax.evaluate --help"]),
    ("episodes-not-an-integer", "evaluate", lambda t, r: [r, "--episodes", "2.5"], None,
     ["bad --episodes '2.5'", "expected an integer"]),
    ("step-not-a-number", "export", lambda t, r: [r, "--out", str(t / "o"), "--step", "last"], None,
     ["bad --step 'last'", "expected an integer"]),
    ("out-is-file", "export", lambda t, r: [r, "--out", _out_file(t)], None, ["bad --out", "it is a file"]),
    ("out-unwritable", "export", lambda t, r: [r, "--out", _out_file(t) + "/sub"], None,
     ["bad --out", "not a writable folder"]),
    # /proc passes the access() check (as root) but refuses mkdir: still one line, not a traceback.
    ("out-cannot-mkdir", "export", lambda t, r: [r, "--out", "/proc/accerl-export-test"], None,
     ["bad --out '/proc/accerl-export-test'", "cannot"]),
    # a missing required argument: one line naming it and the usage (tyro printed a box of 9 lines)
    ("no-run-dir", "evaluate", lambda t, r: ["--episodes", "2"], None,
     ["missing RUN_DIR", "usage: python -m accerl_jax.evaluate RUN_DIR [FLAGS]"]),
    ("no-run-dir-after-flags", "export", lambda t, r: ["--out", str(t / "o"), "--seed", "3"], None,
     ["missing RUN_DIR", "usage: python -m accerl_jax.export RUN_DIR [FLAGS]"]),
    ("no-out", "export", lambda t, r: [r], None, ["missing --out, which is required", "--help lists every flag"]),
]


@pytest.mark.parametrize("case, cli, args, prepare, parts", BAD, ids=[c[0] for c in BAD])
def test_bad_input_exits_2_and_changes_nothing(tmp_path, real_run, capsys, case, cli, args, prepare, parts):
    run = tmp_path / "run"
    shutil.copytree(real_run, run)
    if prepare is not None:
        prepare(run)
    argv = args(tmp_path, str(run))
    before = _tree_hashes(tmp_path)
    capsys.readouterr()
    code = (evaluate if cli == "evaluate" else export).main(argv)
    err = capsys.readouterr().err
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    for part in parts:
        assert part in lines[0], (part, lines[0])
    assert _tree_hashes(tmp_path) == before


def test_export_cli_subprocess(real_run, tmp_path):
    """The real entry point (``python -m accerl_jax.export``): a folder that is not a run exits 2 with one line."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    bad = subprocess.run([sys.executable, "-m", "accerl_jax.export", str(tmp_path), "--out", str(tmp_path / "o")],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("error: bad RUN_DIR") and "Traceback" not in bad.stderr
    assert not (tmp_path / "o").exists()


class _Stop(Exception):
    """Raised by :class:`_Recorder` once a fresh env is reset: the seeds and keys are all the test needs."""


class _Recorder:
    """An env adapter that records the key of its reset and stops there."""

    def __init__(self, env, seen):
        self.info, self.step, self._seen = env.info, env.step, seen

    def reset(self, key):
        self._seen["keys"].append(tuple(np.asarray(key).tolist()))
        raise _Stop


def _training_keys(seeds, groups: int) -> set:
    """Training's PRNG keys of run seeds ``seeds`` (accerl_jax.run.build, loops/anakin_state, learner, actor):
    the root key, its split into network/compressor/actor keys, the learner's stream, and each env group's
    key ``fold_in(actor_key, g)`` with its env/action split."""
    from accerl_jax.learner import learner_key

    out = set()
    for s in seeds:
        root = jax.random.PRNGKey(s)
        k_net, k_comp, k_actor = jax.random.split(root, 3)
        keys = [root, k_net, k_comp, k_actor, learner_key(s)]
        for g in range(groups):
            group = jax.random.fold_in(k_actor, g)
            keys += [group, *jax.random.split(group)]
        out |= {tuple(np.asarray(k).tolist()) for k in keys}
    return out


def test_evaluation_seeds_and_keys_are_disjoint_from_trainings(real_run, monkeypatch):
    """evaluate (its --video is one of its episodes) and export's held observations use evaluation's own env seeds (envpool: below
    zero, where no training run's env is) and keys (gymnax: fold_in(PRNGKey(seed), EVAL_STREAM)), none of
    a training run's of any seed 0..N: an evaluation with --seed 1 replays no training episode's start."""
    from accerl_jax import envs, seeds

    seen = {"seeds": [], "keys": []}
    real = envs.make_env

    def make(name, n, seed=0, **kw):
        seen["seeds"].append((seed, n))
        return _Recorder(real(name, n, seed, **kw), seen)

    monkeypatch.setattr(envs, "make_env", make)
    monkeypatch.setattr(trained, "make_env", make)
    n_seeds, num_envs = 8, 16
    with jax.disable_jit():  # the recorder sees concrete keys
        for s in range(n_seeds):
            pol = trained.load(str(real_run), num_envs=num_envs, seed=s)
            for use in (lambda: evaluate.play(pol, 1, seed=s), lambda: export.held_observations(pol, s)):
                with pytest.raises(_Stop):
                    use()
    assert len(seen["seeds"]) == 2 * n_seeds and len(seen["keys"]) == 2 * n_seeds
    # envpool: env i of a pool is seeded seed + i; training's env seeds are [0, 2^31) (envpool_seed).
    env_seeds = [base + i for base, n in seen["seeds"] for i in range(n)]
    assert all(-(2**31) <= x < 0 for x in env_seeds), sorted(env_seeds)[-3:]
    assert len({x for base, n in seen["seeds"] if n == num_envs for x in range(base, base + n)}) == n_seeds * num_envs
    # gymnax: every evaluation key (the recorded resets and each use's action keys) is none of training's.
    eval_keys = set(seen["keys"]) | {tuple(np.asarray(seeds.eval_key(s, u)).tolist())
                                     for s in range(n_seeds) for u in seeds.EvalUse}
    assert len(eval_keys) == n_seeds * len(seeds.EvalUse)
    assert not eval_keys & _training_keys(range(n_seeds), groups=num_envs)
    with pytest.raises(ValueError, match=r"bad --seed 134217728 with 16 envs.*below 134217728"):
        seeds.eval_envpool_seed(2**27, 16)


def test_evaluate_and_export_default_to_the_same_policy(capsys):
    """One --policy default for both commands (the run's actor), said so in both helps."""
    assert evaluate.Args.policy == export.Args.policy == "actor"
    for module in (evaluate, export):
        with pytest.raises(SystemExit):
            module.main(["--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "'actor' (the default, in evaluate and export alike" in text


def test_a_runs_checkpoints_folder_is_read_as_the_run(real_run, capsys):
    """``--resume RUN/checkpoints`` and ``evaluate RUN/checkpoints`` mean the run RUN (not "no checkpoints/
    folder there"); a folder merely named checkpoints that holds its own checkpoints/ is left as given."""
    from accerl_jax.tools import cli
    from accerl_jax import train as train_cli

    given = os.path.join(str(real_run), "checkpoints")
    cfg = train_cli.parse_config(["--resume", given + os.sep, "--total-steps", "24"])
    assert os.path.samefile(cfg.resume, real_run) and cfg.total_steps == 24
    assert os.path.samefile(train_cli.parse_config([f"--resume={given}"]).resume, real_run)
    assert trained.load(given, policy="learner", num_envs=1).step == 2
    assert cli.run_folder(str(real_run)) == str(real_run)
    assert cli.run_folder(os.path.join(given, "2")) == os.path.join(given, "2")


def test_a_resumed_run_says_where_it_continues_from(real_run):
    """One line before the first log block: the checkpoint (update, env step) and the budget it continues to;
    nothing for a new run or for a resume that training refuses (its budget done)."""
    from accerl_jax import train as train_cli

    cfg = train_cli.parse_config(["--resume", str(real_run), "--total-steps", "24"])
    assert train_cli.resume_line(cfg) == (f"resuming {real_run} from checkpoint 2 (update 2, env step 16); "
                                          "continuing to --total-steps 24 (update 3)")
    assert train_cli.resume_line(train_cli.parse_config(["--resume", str(real_run)])) is None  # already done
    assert train_cli.resume_line(train_cli.parse_config(["--seed", "3"])) is None


def test_a_refused_resume_prints_the_refusal_alone(real_run, capsys):
    """The resume line comes once the settings pass their checks: a resume with another global batch is
    refused with exit 2 and one error line, and no "resuming ..." line before it."""
    from accerl_jax import train as train_cli

    before = sorted(os.listdir(os.path.join(str(real_run), "checkpoints")))
    assert train_cli.main(["--resume", str(real_run), "--num-envs", "4", "--total-steps", "48"]) == 2
    out, err = capsys.readouterr()
    assert "resuming" not in out and err.startswith("error: bad --resume") and err.count("\n") == 1
    assert sorted(os.listdir(os.path.join(str(real_run), "checkpoints"))) == before  # nothing written


def test_normalised_run_exports_and_evaluates_with_its_frozen_statistics(tmp_path):
    """A run trained with --normalize-observations: the exported program takes raw observations and gives
    the actions of the run's network on those observations normalised with the checkpoint's statistics;
    evaluation plays the same normalising policy."""
    logdir = tmp_path / "run"
    run_training(Config(total_steps=64, num_envs=4, rollout_length=8, normalize_observations=True,
                        normalize_rewards=True, logdir=str(logdir), progress=False))
    leaves = checkpoint.read_leaves(str(logdir), 2)
    mean, m2, count = (leaves[f".normalizer.obs.{k}"] for k in ("mean", "m2", "count"))
    assert count == pytest.approx(64, abs=1e-3) and np.all(m2 > 0)
    loaded = trained.load(str(logdir), policy="actor", num_envs=1)
    record = export.export_trained(loaded, str(tmp_path / "out"))
    assert record["normalize_observations"] is True and record["exported_matches_framework"]["actions_equal"]
    spec, policy = _readme_loader(str(tmp_path / "out"))
    env = make_env("gymnax:CartPole-v1", 8, 0)
    state, obs = env.reset(jax.random.PRNGKey(0))
    for _ in range(3):
        state, tr = env.step(state, jnp.ones((8,), jnp.int32))
    raw = np.asarray(tr.obs) * 3.0  # raw observations, away from the statistics' mean
    normalised = np.clip((raw - mean) / np.sqrt(m2 / count + 1e-8), -10, 10).astype(np.float32)
    net = networks.make_apply(plan_lib.make_plan(loaded.cfg, env.info).spec)
    for seed in (0, 1):
        key = jax.random.PRNGKey(seed)
        want = jax.jit(trained.make_forward(net, loaded.params, loaded.info))(normalised, key)
        got = policy(raw, key)
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
        np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
        np.testing.assert_allclose(np.asarray(got[2]), np.asarray(want[2]), rtol=1e-5, atol=1e-5)
    # The program differs from the network on raw observations: the statistics are really applied.
    raw_out = net(loaded.params, raw)[0]
    assert not np.allclose(np.asarray(raw_out), np.asarray(policy(raw, jax.random.PRNGKey(0))[2]), atol=1e-4)
    record = evaluate.evaluate(evaluate.Args(run_dir=str(logdir), episodes=2, num_envs=2, progress=False))
    assert record["episodes"] == 2 and record["eval_obs_kl_learner_actor"] == pytest.approx(0.0, abs=1e-6)
