"""The Anakin loop: one jitted program per chunk of updates, vmapped over seeds.

Tiny budgets (4 updates of 4 envs x 8 steps, compressor none) so that the whole file stays a few
seconds of CPU; the loop's checkpoints, signals and NaN guard are tested in test_reliability.py and
test_loop.py for both loops.
"""
from __future__ import annotations

import functools
import json
import os

import numpy as np
import pytest

from accerl_jax import run_training
from accerl_jax.run import checkpoint
from accerl_jax.config import Config, ConfigError
from accerl_jax.run.plan import choose_loop
from tiny_config import tiny_config

UPDATES = 4


tiny = functools.partial(tiny_config, updates=UPDATES, num_envs=4, checkpoint_every=0, compressor="none")


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("anakin") / "run"
    return run_training(tiny(logdir, loop="anakin", cost_split=True)), str(logdir)


def test_auto_loop_is_anakin_for_gymnax_and_sebulba_for_envpool():
    assert choose_loop(Config(env="gymnax:CartPole-v1")) == "anakin"
    assert choose_loop(Config(env="envpool:CartPole-v1")) == "sebulba"
    # Asynchronous distillation runs in a host thread: auto falls back to the sequential loop. Auto
    # compression switches at the Anakin loop's chunk boundaries (tests/test_auto.py).
    assert choose_loop(Config(env="gymnax:CartPole-v1", distill_async=True)) == "sequential"
    assert choose_loop(Config(env="gymnax:CartPole-v1", compressor="auto")) == "anakin"


def test_auto_loop_on_several_processes():
    """Several processes: the Anakin loop on global arrays for gymnax; Sebulba for envpool (also for
    --compressor auto, which is the run its gate resolves to), but the sequential loop for auto's
    candidates with the gate off, whose decisions Sebulba's per-process compressor threads could not agree
    on (process 0's measurements decide for all in the other two: tests/test_devices.py)."""
    from accerl_jax.run.plan import check_config

    assert choose_loop(Config(env="gymnax:CartPole-v1"), num_processes=2) == "anakin"
    assert choose_loop(Config(env="envpool:CartPole-v1"), num_processes=2) == "sebulba"
    assert check_config(Config(env="gymnax:CartPole-v1", compressor="auto"), num_processes=2) == "anakin"
    assert check_config(Config(env="envpool:CartPole-v1", compressor="auto"), num_processes=2) == "sebulba"
    candidates = Config(env="envpool:CartPole-v1", compressor="auto", auto_min_actor_share=0.0)
    assert check_config(candidates, num_processes=2) == "sequential"
    with pytest.raises(ConfigError, match="bad --num-seeds 2 with several processes"):
        check_config(Config(env="gymnax:CartPole-v1", num_seeds=2), num_processes=2)


@pytest.mark.parametrize("flags, message", [
    (dict(loop="anakin", env="envpool:CartPole-v1", num_seeds=2),
     "bad --num-seeds 2 with --loop anakin and envpool:CartPole-v1: .* vmap cannot copy"),
    (dict(loop="anakin", env="envpool:HalfCheetah-v4"),
     "bad --loop anakin for envpool:HalfCheetah-v4: .*64-bit arrays"),
    (dict(loop="anakin", distill_async=True), "drop --distill-async .* or use --loop sequential"),
    (dict(loop="sequential", num_seeds=2), "bad --num-seeds 2 with --loop sequential"),
    (dict(num_seeds=2, env="envpool:CartPole-v1"), "bad --num-seeds 2 with --loop auto"),
    (dict(loop="anakin", compress_every=0), "bad --compress-every 0"),
    (dict(loop="anakin", num_seeds=0), "bad --num-seeds 0"),
    (dict(loop="anakin", compressor="auto", num_seeds=2, auto_min_actor_share=0.0),
     r"bad --num-seeds 2 with --compressor auto \(--auto-min-actor-share 0\): each seed"),
    # The gate counts (the actor is ~2% of an update) and keeps auto's candidates under a 1% threshold:
    # refused after the count, before anything is written.
    (dict(compressor="auto", num_seeds=2, auto_min_actor_share=0.01),
     r"bad --num-seeds 2 with --compressor auto \(its cost-split gate kept auto's candidates: the actor is "),
])
def test_anakin_refuses_what_it_cannot_run(tmp_path, flags, message):
    with pytest.raises(ConfigError, match=message):
        run_training(tiny(tmp_path / "run", **flags))
    assert not (tmp_path / "run").exists()


def test_anakin_computes_the_same_run_as_the_sequential_loop(single, tmp_path):
    """The fused program and the stage-by-stage loop do the same arithmetic: same episodes, returns and
    (to float32 rounding) the same final parameters."""
    fused, fused_dir = single
    staged = run_training(tiny(tmp_path / "seq", loop="sequential"))
    assert fused["loop"] == "anakin" and staged["loop"] == "sequential"
    # Every run counts its pieces' FLOPs (only --cost-split times them): the same pieces in both loops.
    assert not staged["cost_split"]["timed"] and staged["cost_split"]["ceiling_source"] == "flops"
    assert staged["cost_split"]["flops"] == fused["cost_split"]["flops"]
    for key in ("updates", "total_env_steps", "episodes", "final_return_mean", "final_length_mean"):
        assert fused[key] == staged[key], key
    a, b = checkpoint.read_leaves(fused_dir, UPDATES), checkpoint.read_leaves(str(tmp_path / "seq"), UPDATES)
    assert list(a) == list(b)
    for path in a:
        np.testing.assert_allclose(a[path], b[path], rtol=1e-4, atol=1e-6, err_msg=path)


def test_normalisation_computes_the_same_run_in_both_loops(tmp_path):
    """--normalize-observations/--normalize-rewards in the sequential loop: the actor acts on observations
    normalised with the statistics the update starts with, the learner and the student train on the
    rollout normalised with them, and the statistics then take the raw rollout, as the Anakin program
    does: the same episodes, the same statistics and (to float32 rounding) the same networks."""
    norm = dict(normalize_observations=True, normalize_rewards=True, compressor="distill:tiny", distill_steps=2)
    fused = run_training(tiny(tmp_path / "fused", loop="anakin", **norm))
    staged = run_training(tiny(tmp_path / "seq", loop="sequential", **norm))
    assert fused["loop"] == "anakin" and staged["loop"] == "sequential"
    for key in ("updates", "total_env_steps", "episodes", "final_return_mean", "final_length_mean"):
        assert fused[key] == staged[key], key
    a, b = (checkpoint.read_leaves(str(tmp_path / d), UPDATES) for d in ("fused", "seq"))
    assert list(a) == list(b)
    assert float(b[".normalizer.obs.count"]) == pytest.approx(UPDATES * 4 * 8, abs=1e-3)  # every step valid
    assert float(b[".normalizer.reward.m2"]) > 0 and np.any(b[".normalizer.returns"] != 0)
    assert any(path.startswith(".actor_params") for path in b)
    for path in a:
        np.testing.assert_allclose(a[path], b[path], rtol=1e-4, atol=1e-6, err_msg=path)
    # Without the statistics in the actor's and the learner's inputs the run differs (the check can fail).
    run_training(tiny(tmp_path / "plain", loop="sequential", compressor="distill:tiny", distill_steps=2))
    plain = checkpoint.read_leaves(str(tmp_path / "plain"), UPDATES)
    path = next(p for p in a if p.startswith(".learner.params"))
    assert not np.allclose(plain[path], b[path], rtol=1e-4, atol=1e-6)


def test_distillation_reuses_the_learners_outputs_alike_in_both_loops(tmp_path):
    """With a distill compressor both loops hand the learner's own outputs at the rollout's observations to
    the student's steps (--distill-reuse-teacher, the default; ``Run.teacher_update``): the same student
    and learner to float32 rounding. Without the flag, or for a compressor without a distill stage, the
    run has no such update (the student then distils on a forward pass of the updated learner)."""
    from accerl_jax.run import build as run_lib

    kw = dict(compressor="distill:tiny", distill_steps=2, total_steps=4 * 8 * 2)
    for flags, reuse in ((kw, True), (dict(kw, distill_reuse_teacher=False), False), ({}, False)):
        run = run_lib.setup(tiny(tmp_path / f"setup{len(flags)}", **flags))
        run.outputs.lock.release()
        run.outputs.saver.close()
        run.outputs.monitor.close()
        assert (run.teacher_update is not None) == reuse, flags
    fused = run_training(tiny(tmp_path / "fused", loop="anakin", **kw))
    staged = run_training(tiny(tmp_path / "seq", loop="sequential", **kw))
    assert fused["updates"] == staged["updates"] == 2
    a, b = (checkpoint.read_leaves(str(tmp_path / d), 2) for d in ("fused", "seq"))
    assert list(a) == list(b) and any("student_params" in p for p in a)
    for path in a:
        np.testing.assert_allclose(a[path], b[path], rtol=1e-4, atol=1e-6, err_msg=path)


def test_summary_table_shows_the_fused_program_not_zero_stage_times(single, capsys, monkeypatch):
    """The Anakin loop's stages run inside one program and are not timed apart: the summary table shows the
    time the host waited for that program, never "actor time 0.0 s"."""
    from accerl_jax.monitor import print_summary

    summary, _ = single
    assert summary["actor_time_s"] == 0.0 and summary["fused_wait_s"] > 0  # what the table must not misreport
    print_summary(summary)
    out = capsys.readouterr().out
    labels = {line.split("  ")[0] for line in out.splitlines()}
    assert "fused program" in labels and "actor" not in labels and "learner" not in labels
    # The pieces, each timed alone after training (--cost-split, accerl_jax.loops.pieces): no stage reads 0.
    split = summary["cost_split"]
    for key in ("actor", "uncompressed_actor", "learner", "compress"):
        assert split[f"{key}_s_per_update"] >= 0, key
    assert split["actor_s_per_update"] > 0 and split["learner_s_per_update"] > 0
    assert 0 < split["actor_share"] < 1 and 0 < split["ceiling"] < 1
    assert split["timed"] and split["ceiling_source"] == "timed"
    # Their FLOPs as well (compressor none: the actor is the uncompressed one, compression does no arithmetic).
    flops = split["flops"]
    assert flops["actor_flops_per_update"] == flops["uncompressed_actor_flops_per_update"] > 0
    assert flops["learner_flops_per_update"] > flops["actor_flops_per_update"] and flops["compress_flops_per_update"] == 0
    assert {"ms/update", "MFLOP/update", "actor share"} <= labels and "(timed)" in out


def test_summary_reports_the_start_up(single):
    """Start-up: process start to the end of the first update (its first chunk), the part before the training
    call included; both no later than now."""
    from accerl_jax.platform import clock

    summary, _ = single
    assert 0 < summary["startup_before_train_s"] < summary["startup_s"] < clock.process_age()
    assert "process start" in summary["startup_scope"]


def test_the_default_jobs_pieces_have_positive_flops(tmp_path):
    """The default job's pieces (B=16, T=16, APPO) with a distill:small student acting, counted by XLA's cost
    analysis without compiling: every piece does work, the student's rollout less than the learner's own
    policy's."""
    import jax

    from accerl_jax.run import build as run_lib
    from accerl_jax.loops import pieces

    run = run_lib.setup(Config(compressor="distill:small", logdir=str(tmp_path / "run"), progress=False,
                               total_steps=16 * 16 * 2))
    try:  # only shapes count: the actor's and compressor's states as shapes (nothing compiled)
        carry = jax.eval_shape(run.actor.reset, run.k_actor)
        actor_params, comp_state = jax.eval_shape(run.compressor.init, run.params, run.k_comp, carry.obs)
        split = pieces.cost_split(run, run.state, actor_params, comp_state, carry, timed=False)
    finally:
        run.outputs.lock.release()
        run.outputs.saver.close()
        run.outputs.monitor.close()
    flops = split["flops"]
    assert run.cfg.compressor == "distill:small" and (run.cfg.num_envs, run.cfg.rollout_length) == (16, 16)
    for key in ("actor", "uncompressed_actor", "learner", "compress"):
        assert flops[f"{key}_flops_per_update"] > 0, key
    assert flops["actor_flops_per_update"] < flops["uncompressed_actor_flops_per_update"]
    assert 0 < flops["ceiling"] < 1 and split["ceiling"] == flops["ceiling"] and split["ceiling_source"] == "flops"
    assert not split["timed"] and "actor_s_per_update" not in split


def test_anakin_refuses_envpool_on_several_devices(monkeypatch):
    """XLA's partitioner rejects envpool's side-effecting step in a program over several devices."""
    with pytest.raises(ConfigError, match="bad --loop anakin for envpool:CartPole-v1 on 2 local devices"):
        choose_loop(Config(env="envpool:CartPole-v1", loop="anakin"), local_devices=2)


def test_anakin_steps_envpool_through_its_xla_interface_as_the_sequential_loop_does(tmp_path):
    """--loop anakin with envpool: the pool stepped inside the jitted program (envpool's XLA interface)
    gives the sequential loop's run on host envpool (sync envpool is deterministic per seed): the same
    episodes (each ending in a reset step that must be invalid, or the counts would differ) and returns,
    and to float32 rounding the same parameters."""
    flags = dict(env="envpool:CartPole-v1", log_every=4, checkpoint_every=UPDATES, compressor="mask:0.5")
    fused = run_training(tiny(tmp_path / "fused", loop="anakin", **flags))
    staged = run_training(tiny(tmp_path / "seq", loop="sequential", **flags))
    assert fused["loop"] == "anakin" and staged["loop"] == "sequential"
    # Host (envpool) envs: the rollout is not a piece that can be lowered alone, so no cost split.
    assert fused["cost_split"] is None and staged["cost_split"] is None
    assert fused["episodes"] >= 4  # 32 steps per env: every env finished an episode and reset
    for key in ("updates", "total_env_steps", "episodes", "final_return_mean", "final_length_mean"):
        assert fused[key] == staged[key], key
    assert all(np.isfinite(fused[k]) for k in ("kl_learner_actor", "abs_log_rho_mean", "final_return_mean"))
    a = checkpoint.read_leaves(str(tmp_path / "fused"), UPDATES)
    b = checkpoint.read_leaves(str(tmp_path / "seq"), UPDATES)
    assert list(a) == list(b) and list(a)[-1] == ".actor"  # the actor's key only: a host pool is not saved
    for path in a:
        np.testing.assert_allclose(a[path], b[path], rtol=1e-4, atol=1e-6, err_msg=path)


def test_num_seeds_trains_independent_seeds_each_with_its_summary(single, tmp_path, capsys, monkeypatch):
    """--num-seeds 2: seed 0 of the vmapped program is the single-seed run; seed 1 is another run."""
    one, _ = single
    logdir = tmp_path / "seeds"
    summary = run_training(tiny(logdir, loop="anakin", num_seeds=2))
    assert summary["num_seeds"] == 2 and len(summary["seeds"]) == 2
    per_seed = []
    for k in range(2):
        with open(os.path.join(logdir, f"seed{k}", "summary.json")) as f:
            per_seed.append(json.load(f))
        assert os.path.exists(os.path.join(logdir, f"seed{k}", "metrics.csv"))
    assert [s["seed"] for s in per_seed] == [0, 1]
    for key in ("updates", "total_env_steps", "episodes", "final_return_mean"):
        assert per_seed[0][key] == one[key], key
    assert per_seed[1]["final_return_mean"] != per_seed[0]["final_return_mean"]
    assert summary["final_return_mean_per_seed"] == [s["final_return_mean"] for s in per_seed]
    assert summary["total_env_steps"] == 2 * one["total_env_steps"]
    # The run's own numbers agree with its seeds': one seed's steps on the curves' axis, the mean over
    # seeds of each seed's return and length (not a pool of their episodes), every seed's episodes.
    assert summary["env_steps_per_seed"] == one["total_env_steps"]
    assert summary["final_return_mean"] == pytest.approx(np.mean([s["final_return_mean"] for s in per_seed]))
    assert summary["final_length_mean"] == pytest.approx(np.mean([s["final_length_mean"] for s in per_seed]))
    assert summary["episodes"] == sum(s["episodes"] for s in per_seed)
    with open(os.path.join(logdir, "metrics.jsonl")) as f:
        last = [json.loads(line) for line in f][-1]
    assert last["env_steps"] == one["total_env_steps"]
    assert last["return_mean"] == pytest.approx(summary["final_return_mean"])
    # The seed folders plot as one group: the mean over seeds with its band.
    from accerl_jax import plot
    from accerl_jax.train import plot_command
    folders = plot_command(summary).split()[3:]
    assert folders == [str(logdir / "seed0"), str(logdir / "seed1")]
    groups = plot.group_runs([plot.load_run(f) for f in folders])
    assert len(groups) == 1 and len(groups[0][1]) == 2
    from accerl_jax.monitor import print_summary
    capsys.readouterr()
    print_summary(summary)
    table = capsys.readouterr().out
    assert "mean over 2 seeds" in table and f"{summary['final_return_mean']:.1f}" in table
    # Three steps/s figures, each labelled: all seeds' (the run's steps_per_s, as before), per seed (the
    # progress bar counts one seed's steps) and each seed's own summary's (per seed too).
    flat = " ".join(table.split())
    assert f"whole run {summary['steps_per_s']:,.0f} all 2 seeds" in flat and "per seed" in flat
    assert f"{summary['steps_per_s']:,.0f}" in table and f"{summary['steps_per_s_per_seed']:,.0f}" in table
    assert summary["steps_per_s"] == pytest.approx(2 * summary["steps_per_s_per_seed"])
    assert summary["steps_per_s_scope"].startswith("all 2 seeds' env steps")
    for s in per_seed:
        assert s["steps_per_s_scope"].startswith("per seed") and s["steps_per_s"] == s["steps_per_s_per_seed"]
        # The same count over a wall time taken a little earlier (each seed's summary is written first).
        assert s["total_env_steps"] == summary["env_steps_per_seed"]
        assert summary["steps_per_s_per_seed"] <= s["steps_per_s"] <= 1.5 * summary["steps_per_s_per_seed"]
    # Each seed's evaluation is written beside its own summary; neither overwrites the other's.
    from accerl_jax import evaluate
    records = [evaluate.evaluate(evaluate.Args(str(logdir), episodes=2, num_envs=2, seed_index=k, progress=False))
               for k in range(2)]
    for k, record in enumerate(records):
        with open(os.path.join(logdir, f"seed{k}", evaluate.EVAL_FILE)) as f:
            assert json.load(f) == record and record["seed_index"] == k
        assert record["run"] == f"seed{k}" and record["written"] == os.path.join(logdir, f"seed{k}", evaluate.EVAL_FILE)
        assert record["run_kl_learner_actor"] == per_seed[k]["kl_learner_actor"]
    assert not os.path.exists(os.path.join(logdir, evaluate.EVAL_FILE))
    # The CLI names the evaluated run and the file it wrote (it had printed <RUN_DIR>/eval.json, not written).
    capsys.readouterr()
    assert evaluate.main([str(logdir), "--seed-index", "1", "--episodes", "2", "--num-envs", "2", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert ", run seed1)" in printed and f"written: {os.path.join(logdir, 'seed1', evaluate.EVAL_FILE)}\n" in printed


@pytest.mark.slow
@pytest.mark.parametrize("env", ["gymnax:CartPole-v1", "envpool:CartPole-v1"])
def test_anakin_default_job_solves_cartpole(tmp_path, env):
    """The default job (200k steps, APPO with 8 epochs on V-trace advantages, MLP(64, 64), the learner's own
    policy acting) in the Anakin loop reaches CartPole's solved
    return (mean of the last 100 episodes >= 475), with gymnax or with envpool through its XLA interface."""
    summary = run_training(Config(env=env, loop="anakin", logdir=str(tmp_path / "run"), progress=False))
    assert summary["loop"] == "anakin" and summary["stopped"] is None
    assert summary["final_return_mean"] >= 475.0


@pytest.mark.slow
def test_anakin_runs_envpool_atari_end_to_end(tmp_path):
    """envpool Pong (uint8 frames [4, 84, 84], a CNN) through envpool's XLA interface in the Anakin
    program: a tiny run finishes with finite metrics (slow: the fused CNN program compiles for minutes
    on a loaded CPU)."""
    summary = run_training(tiny(tmp_path / "run", env="envpool:Pong-v5", loop="anakin", num_envs=2,
                                total_steps=2 * 8 * 2))
    assert summary["loop"] == "anakin" and summary["stopped"] is None and summary["updates"] == 2
    assert summary["learner_network"]["family"] == "cnn" and summary["total_env_steps"] == 32
    assert np.isfinite(summary["kl_learner_actor"]) and np.isfinite(summary["abs_log_rho_mean"])


def test_family_jit_nests_inside_another_jit():
    """Conv-family functions carry compiler options, which JAX allows only at the top level: nested in the
    guarded update or the Anakin program they must still run (as plain nested jits)."""
    import jax
    import jax.numpy as jnp

    from accerl_jax.platform import xla

    inner = xla.jit(lambda x: x * 2.0, "cnn")
    outer = xla.jit(lambda x: inner(x) + 1.0, "cnn")
    assert float(outer(jnp.float32(3.0))) == 7.0 and float(inner(jnp.float32(3.0))) == 6.0
    assert float(jax.jit(lambda x: inner(x))(jnp.float32(1.0))) == 2.0


def test_family_options_follow_the_platform_a_call_runs_on():
    """A conv net's CPU options go with calls on the host CPU (a CPU actor beside a GPU learner gets them),
    not with the default backend; uncommitted arguments follow the default backend."""
    import jax
    import jax.numpy as jnp

    from accerl_jax.platform import xla

    assert xla.options_for("cnn", "cpu") == xla.NO_YNN and xla.options_for("cnn", "gpu") is None
    assert xla.options_for("mlp", "cpu") is None
    on_cpu = jax.device_put(jnp.ones(2), jax.devices("cpu")[0])
    assert xla._platform([1.0, on_cpu]) == "cpu" and xla._platform([jnp.ones(2)]) == jax.default_backend()


def test_one_shot_programs_compile_at_level_1_on_cpu_unless_the_caller_set_a_level(monkeypatch):
    """Programs that run once (the initial state) compile at LLVM level 1 on XLA:CPU, with a conv net's
    CPU options kept; a level set in XLA_FLAGS (this test session's) applies to them as to every program."""
    from accerl_jax.platform import xla

    monkeypatch.setenv("XLA_FLAGS", "")
    assert xla.one_shot_options("mlp", "cpu") == xla.ONE_SHOT_CPU
    assert xla.one_shot_options("cnn", "cpu") == {**xla.NO_YNN, **xla.ONE_SHOT_CPU}
    assert xla.one_shot_options("mlp", "gpu") is None and xla.one_shot_options(None, "cpu") == xla.ONE_SHOT_CPU
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")
    assert xla.one_shot_options("mlp", "cpu") is None and xla.one_shot_options("cnn", "cpu") == xla.NO_YNN


INITIAL_STATES = """
import tempfile
import jax, numpy as np
from accerl_jax.platform import xla
from accerl_jax.run import build as run_lib
from accerl_jax.config import Config
from accerl_jax.loops import anakin_state


def state():
    run = run_lib.setup(Config(logdir=tempfile.mkdtemp() + "/run", progress=False, compile_cache="off",
                               num_envs=4, rollout_length=4))
    return jax.tree.leaves(anakin_state.initial_state(run, 3))


one_shot = state()        # its pieces compiled at level 1
xla.ONE_SHOT_CPU = {}
default = state()         # the same pieces at XLA's default level
assert len(one_shot) == len(default)
for a, b in zip(one_shot, default):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=1e-6, atol=1e-7)
print("same", sum(x.size for x in one_shot))
"""


def test_the_initial_state_is_the_same_at_the_one_shot_level():
    """At the product's own optimisation level (no XLA_FLAGS level), the default job's initial state
    (parameters, optimiser state, env states, student, keys) built with the one-shot options (level 1)
    equals the one built at XLA's default level."""
    import subprocess
    import sys

    env = dict(os.environ, XLA_FLAGS="")
    proc = subprocess.run([sys.executable, "-c", INITIAL_STATES], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1].startswith("same"), proc.stdout  # after the auto gate's sentences


def test_flops_are_counted_after_the_last_chunk_not_beside_training(tmp_path, monkeypatch):
    """Counting the pieces' FLOPs (tenths of a second of host time) starts once the last step of the budget
    has been logged, so it never runs beside training or its rows; the summary still has them. Two chunks
    are in flight while the host logs one."""
    from accerl_jax.loops import anakin, pieces
    from accerl_jax.run import driver as driver_lib

    dispatched, started, taken = [], [], []
    take = driver_lib.Driver._take

    def recording_take(self, step):
        taken.append((step.update, len(dispatched)))
        return take(self, step)

    dispatch = anakin.AnakinStepper._dispatch

    def recording_dispatch(self, s, after):
        dispatched.append(self._boundary(after))  # the update the chunk being dispatched ends at
        return dispatch(self, s, after)

    class RecordingFlops(pieces.BackgroundFlops):
        def __init__(self, *args):
            started.append((list(dispatched), list(taken)))
            super().__init__(*args)

    monkeypatch.setattr(anakin.AnakinStepper, "_dispatch", recording_dispatch)
    monkeypatch.setattr(driver_lib.Driver, "_take", recording_take)
    monkeypatch.setattr(pieces, "BackgroundFlops", RecordingFlops)
    summary = run_training(tiny(tmp_path / "run", log_every=1))
    assert dispatched == [1, 2, 3, 4]
    # Two chunks in flight: while update u is logged, the chunk ending at u + 2 is already dispatched.
    assert taken == [(1, 3), (2, 4), (3, 4), (4, 4)]
    assert started == [([1, 2, 3, 4], [(1, 3), (2, 4), (3, 4), (4, 4)])]
    assert summary["cost_split"]["flops"]["learner_flops_per_update"] > 0


def test_packed_chunk_outputs_unpack_to_the_updates_outputs_bit_for_bit():
    """The chunk hands the host a few packed arrays (one host copy each); unpacking restores every
    update's metrics, episode records (returns, the finished mask, integer lengths) and counters exactly."""
    import jax
    import jax.numpy as jnp

    from accerl_jax.loops.anakin_program import UpdateOutput, pack, unpack

    rng = np.random.default_rng(0)
    c, t, b = 3, 4, 5
    out = UpdateOutput({"loss": jnp.asarray(rng.normal(size=c), jnp.float32),
                        "entropy": jnp.asarray(rng.normal(size=c), jnp.float32)},
                       jnp.asarray(rng.normal(size=(c, t, b)) * 1e3, jnp.float32),
                       jnp.asarray(rng.random((c, t, b)) < 0.3), jnp.asarray(rng.integers(0, 2**24, (c, t, b)), jnp.int32),
                       jnp.asarray([True, False, True]))

    class State:
        bad_update, bad_quantity, skipped = jnp.int32(7), jnp.int32(-1), jnp.int32(2)

    packed = jax.device_get(pack(out, State))
    assert packed.metrics.names == ("entropy", "loss") and len(jax.tree.leaves(packed)) == 4
    got, counters = unpack(packed)
    assert counters == (7, -1, 2) and list(got.metrics) == ["entropy", "loss"]
    for name in ("entropy", "loss"):
        np.testing.assert_array_equal(got.metrics[name], np.asarray(out.metrics[name]))
    for field in ("episode_return", "finished", "episode_length", "refreshed"):
        want = np.asarray(getattr(out, field))
        assert getattr(got, field).dtype == want.dtype, field
        np.testing.assert_array_equal(getattr(got, field), want)
