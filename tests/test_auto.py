"""``--compressor auto`` (accerl_jax.compressor.auto): its choice under a tiny and a huge KL bound, its
triggers, evaluations that warm only the candidates able to change the choice, parameter-structure
switching in the sequential and the Anakin loop (one compiled chunk program per candidate, the learner
state continuing across switches), and the logged decisions.

The candidates' speeds come from a deterministic timer (parameter bytes: distill:tiny < int8 < none, so
the ranking does not depend on the load of the machine)."""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from accerl_jax import networks
from accerl_jax.platform import speed
from accerl_jax import run_training
from accerl_jax.run import checkpoint
from accerl_jax.compressor import make_compressor
from accerl_jax.compressor.auto import CLIP_MARGIN, auto, candidate_key, parse_candidates
from accerl_jax.config import Config
from accerl_jax.run.plan import choose_loop
from accerl_jax.monitor import policy_divergence
from accerl_jax.types import Rollout

T, B = 4, 16
SPEC = networks.default_spec((4,), 2)
APPLY = networks.make_apply(SPEC)
# A fresh policy head's logits are ~0.01, where int8's KL(pi || mu) can round to exactly 0 on some CPUs and
# tie with `none`'s; scaled up, the logits are O(1), as a trained policy's, and every compressed
# candidate's KL is clearly above the tests' tiny bound (1e-12).
_FRESH = networks.init_params(SPEC, jax.random.PRNGKey(0))
PARAMS = {"params": dict(_FRESH["params"], policy_head=jax.tree.map(lambda w: 100.0 * w, _FRESH["params"]["policy_head"]))}
OBS = jax.random.normal(jax.random.PRNGKey(1), (T, B, 4))


def bytes_timer(apply, family="mlp"):
    """A forward timer ranking candidates by their parameter bytes (seconds: 1 ns per byte)."""
    return lambda params, obs: 1e-9 * networks.param_bytes(params)


@pytest.fixture(scope="module")
def shared():
    """One AutoCompressor for the unit tests (its jitted functions compile once); each test sets its bounds."""
    return auto("none,distill:tiny,int8", SPEC, APPLY, lambda s: make_compressor(s, SPEC, APPLY, distill_steps=2),
                divergence=policy_divergence, forward_timer=bytes_timer, max_kl=1.0, every=5,
                check_every=2, warmup=1, rounds=1)


def _with(comp, max_kl, max_clip_fraction=0.2):
    comp.max_kl, comp.max_clip_fraction, comp.decisions, comp.skipped_evaluations = max_kl, max_clip_fraction, [], 0
    return comp


def _rollout(log_prob_shift: float = 0.0) -> Rollout:
    """A rollout whose behaviour log-probs are the learner's own, shifted by ``log_prob_shift`` (ρ = e^-shift)."""
    action = jax.random.randint(jax.random.PRNGKey(2), (T, B), 0, 2)
    log_pi = networks.policy_distribution(APPLY(PARAMS, OBS)[0], False).log_prob(action)
    zeros = jnp.zeros((T, B))
    return Rollout(obs=OBS, action=action, log_prob=log_pi + log_prob_shift, reward=zeros,
                   terminated=zeros.astype(bool), truncated=zeros.astype(bool), valid=jnp.ones((T, B), bool),
                   bootstrap_obs=OBS[-1:], episode_return=zeros, episode_length=zeros.astype(jnp.int32))


def _adapt(comp, update, params, state, actor_params, rollout, since=None):
    """The sequential loop's call: the triggers measured on ``rollout``."""
    measure = comp.rollout_measure(params, actor_params, state, rollout)
    return comp.adapt(update, params, state, actor_params, rollout.obs, measure, since)


def _first_decision(comp):
    actor_params, state = comp.init(PARAMS, jax.random.PRNGKey(3), OBS[0])
    actor_params, state = comp.compress(PARAMS, state, OBS.reshape(-1, 4))
    return _adapt(comp, 1, PARAMS, state, actor_params, _rollout())


def test_tiny_bound_picks_the_uncompressed_policy(shared):
    comp = _with(shared, max_kl=1e-12)
    actor_params, state, decision = _first_decision(comp)
    rows = decision["candidates"]
    assert rows["none"]["kl"] == 0.0 and rows["none"]["within_bound"]
    assert not rows["distill:tiny"]["within_bound"]  # a student differs by more than 1e-12
    # Only policies identical to the learner's qualify (`none`; int8 too if its KL rounded to exactly 0):
    # the fastest of those, by the measured times, is chosen, and every faster one is named as over the bound.
    exact = [c for c, r in rows.items() if r["within_bound"]]
    chosen = decision["chosen"]
    assert decision["trigger"] == "initial" and chosen == min(exact, key=lambda c: rows[c]["forward_s"])
    assert f"{chosen} is the fastest with KL" in decision["reason"]
    for c, r in rows.items():
        assert (f"{c} (KL" in decision["reason"]) == (r["forward_s"] < rows[chosen]["forward_s"])
    assert list(actor_params) == [candidate_key(chosen)]


def test_huge_bound_picks_the_fastest_measured(shared):
    comp = _with(shared, max_kl=1e9)
    actor_params, state, decision = _first_decision(comp)
    rows = decision["candidates"]
    fastest = min(rows, key=lambda s: rows[s]["forward_s"])
    assert decision["chosen"] == fastest and all(r["within_bound"] for r in rows.values())
    assert list(actor_params) == [candidate_key(fastest)]
    assert comp.running(state) == fastest and decision["switched"] == (fastest != "none")
    # The dispatching apply runs whichever candidate the params belong to, as that candidate would.
    run_apply = comp.actor_apply(APPLY)
    i = comp.specs.index(fastest)
    np.testing.assert_allclose(run_apply(actor_params, OBS[0])[0],
                               comp.candidates[i].actor_apply(APPLY)(actor_params[candidate_key(fastest)], OBS[0])[0])


def test_triggers_clipping_divergence_and_periodic(shared):
    comp = _with(shared, max_kl=1e-12, max_clip_fraction=0.5)
    actor_params, state, decision = _first_decision(comp)
    assert comp.running(state) == "none"
    # Not a check update (3 % 2), nothing due: no evaluation.
    assert _adapt(comp, 3, PARAMS, state, actor_params, _rollout())[2] is None
    # Check update, on-policy rollout: KL 0 and no ρ clipped -> no evaluation.
    assert _adapt(comp, 4, PARAMS, state, actor_params, _rollout())[2] is None
    # Behaviour log-probs lower by 0.5: every ρ = e^0.5 > 1.1 -> the clipping trigger.
    assert np.exp(0.5) > CLIP_MARGIN
    assert _adapt(comp, 2, PARAMS, state, actor_params, _rollout(-0.5))[2] is None  # within the cooldown (2)
    _, kept_state, d = _adapt(comp, 4, PARAMS, state, actor_params, _rollout(-0.5))
    assert d["trigger"] == "clipping" and d["measured"]["clip_fraction_margin"] == 1.0 and "of rho above" in d["reason"]
    # `none` runs within the bound: only the faster candidates can replace it, and are evaluated (both here).
    assert d["evaluated"] == ["none", "distill:tiny", "int8"]
    # The choice stood: the next trigger waits twice as long (4 updates), while ρ stays clipped.
    assert not d["switched"] and int(kept_state.cooldown) == 4 and d["next_trigger_cooldown"] == 4
    assert _adapt(comp, 6, PARAMS, kept_state, actor_params, _rollout(-0.5))[2] is None
    d = _adapt(comp, 8, PARAMS, kept_state, actor_params, _rollout(-0.5))[2]
    assert d["trigger"] == "clipping" and d["next_trigger_cooldown"] == 5  # doubled, capped at `every`
    # Every `every` (5) updates since the last evaluation (update 1): periodic.
    assert _adapt(comp, 6, PARAMS, state, actor_params, _rollout())[2]["trigger"] == "periodic"
    # Running a student whose KL exceeds the bound: the divergence trigger switches back to `none`.
    student_state = state._replace(current=jnp.int32(1))
    student_params, student_state = comp.compress(PARAMS, student_state, OBS.reshape(-1, 4))
    params, new_state, d = _adapt(comp, 4, PARAMS, student_state, student_params, _rollout())
    assert d["trigger"] == "divergence" and d["previous"] == "distill:tiny" and d["chosen"] == "none"
    assert d["evaluated"] == ["none", "distill:tiny", "int8"]  # over the bound: every candidate is evaluated
    assert d["switched"] and list(params) == ["none"] and int(new_state.last_evaluation) == 4
    assert [x["trigger"] for x in comp.decisions] == ["initial", "clipping", "clipping", "periodic", "divergence"]


def test_evaluation_warms_only_candidates_that_can_win(shared):
    """With every speed known and the running candidate within the bound, only faster candidates are
    evaluated; running the fastest, the evaluation is skipped (nothing to gain) but counts as done."""
    comp = _with(shared, max_kl=1e9)
    actor_params, state, decision = _first_decision(comp)
    # Speeds known (an earlier test timed them): the fastest, distill:tiny, is within the bound, so int8
    # (slower) was never warmed: its state is still None.
    assert comp.running(state) == "distill:tiny" and decision["evaluated"] == ["none", "distill:tiny"]
    assert state.states[candidate_key("int8")] is None
    assert "not evaluated (slower than distill:tiny" in decision["reason"]
    # Periodic (every = 5) while running the fastest within the bound: no evaluation, no decision.
    params, skipped_state, d = _adapt(comp, 6, PARAMS, state, actor_params, _rollout())
    assert d is None and comp.skipped_evaluations == 1 and params is actor_params
    assert int(skipped_state.last_evaluation) == 6 and comp.running(skipped_state) == "distill:tiny"
    assert _adapt(comp, 7, PARAMS, skipped_state, actor_params, _rollout())[2] is None  # the period restarted
    # Running int8 (between tiny and none): only distill:tiny is faster, so only it is warmed and measured.
    s8 = comp.candidates[2].init(PARAMS, jax.random.PRNGKey(4), OBS[0])[1]
    int8_state = state._replace(current=jnp.int32(2), states={**state.states, candidate_key("int8"): s8})
    int8_params, int8_state = comp.compress(PARAMS, int8_state, OBS.reshape(-1, 4))
    student = int8_state.states[candidate_key("distill:tiny")]
    _, new_state, d = _adapt(comp, 6, PARAMS, int8_state, int8_params, _rollout())
    assert d["trigger"] == "periodic" and d["evaluated"] == ["distill:tiny", "int8"] and "none" not in d["candidates"]
    assert d["chosen"] == "distill:tiny" and d["switched"] and "not evaluated (slower than distill:tiny" in d["reason"]
    # The student was warmed (its distillation state moved on); `none`'s state was not touched.
    assert new_state.states[candidate_key("distill:tiny")] is not student
    assert new_state.states["none"] is int8_state.states["none"]
    assert [x["update"] for x in comp.decisions] == [1, 6]


def test_init_is_pure_and_checks_follow_crossed_multiples(shared):
    """``init`` traces (its candidates' keys live in the state, not on the object), and the triggers are
    measured when a multiple of ``check_every`` (2) lies in ``(since, update]``: the Sebulba compressor
    thread skips versions, so update 5 after 3 is a check (4 crossed), update 5 after 4 is not."""
    comp = _with(shared, max_kl=1e9, max_clip_fraction=-1.0)  # any measured clipping fires the trigger
    comp.every = 100  # no periodic evaluation
    try:
        actor_params, state = jax.jit(comp.init)(PARAMS, jax.random.PRNGKey(3), OBS[0])
        assert state.init_keys.shape == (3, 2) and list(actor_params) == ["none"]
        actor_params, state, d = _adapt(comp, 1, PARAMS, state, actor_params, _rollout())
        assert d["trigger"] == "initial" and d["chosen"] == "distill:tiny"
        assert _adapt(comp, 2, PARAMS, state, actor_params, _rollout())[2] is None  # within the cooldown (2)
        assert _adapt(comp, 5, PARAMS, state, actor_params, _rollout(), since=4)[2] is None  # no multiple of 2 crossed
        assert comp.skipped_evaluations == 0
        _, state, d = _adapt(comp, 5, PARAMS, state, actor_params, _rollout(), since=3)
        assert d is None and comp.skipped_evaluations == 1  # measured: clipping fired; the fastest already runs
        assert int(state.last_evaluation) == 5
    finally:
        comp.every = 5


def test_measurements_go_through_agree(shared):
    """Every number a decision depends on (timings, KL and agreement, clipping) passes through ``agree``
    (process 0's values on every process of a multi-host run): with an ``agree`` that makes ``int8``'s
    KL huge, a bound between the two picks ``none`` although int8 is within it on this process."""
    seen = []

    def agree(tree):
        seen.append(sorted(tree) if isinstance(tree, dict) else tree)
        return tree

    comp = auto("none,int8", SPEC, APPLY, lambda s: make_compressor(s, SPEC, APPLY), divergence=policy_divergence,
                forward_timer=bytes_timer, max_kl=1.0, every=5, check_every=2, warmup=1, rounds=1, agree=agree)
    actor_params, state = comp.init(PARAMS, jax.random.PRNGKey(3), OBS[0])
    _, state, d = _adapt(comp, 1, PARAMS, state, actor_params, _rollout())
    assert d["chosen"] == "int8"  # fewer bytes: faster, and within the bound
    assert ["base", "candidates"] in seen and ["agreement", "kl"] in seen and ["clip_fraction", "clip_fraction_margin"] in seen
    comp.agree = lambda tree: dict(tree, kl=99.0) if "agreement" in tree else tree
    comp.forward_s.clear()
    _, _, d = _adapt(comp, 1, PARAMS, comp.init(PARAMS, jax.random.PRNGKey(3), OBS[0])[1], {"none": PARAMS}, _rollout())
    assert d["chosen"] == "none" and d["candidates"]["int8"]["kl"] == 99.0


def test_candidate_list_errors():
    assert parse_candidates("none, int8") == ["none", "int8"]
    for bad, msg in [("none,,int8", "empty entry"), ("none,auto", "'auto' cannot"), ("int8,int8", "more than once")]:
        with pytest.raises(ValueError, match=msg):
            parse_candidates(bad)


def _decisions(logdir) -> list[dict]:
    with open(os.path.join(logdir, "decisions.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_auto_run_switches_and_logs_every_decision(tmp_path, monkeypatch, capsys):
    """A real run in the sequential loop: the huge bound makes auto switch from `none` to the (fastest)
    student at update 1 (the actor's params change structure mid-run, and the final checkpoint saves
    them); the periodic evaluations at updates 4 and 7 have nothing to gain and are skipped; every
    decision is logged with its reason."""
    monkeypatch.setattr(speed, "forward_timer", bytes_timer)
    cfg = Config(compressor="auto", auto_candidates="none,distill:tiny", max_actor_kl=1e9, auto_every=3,
                 auto_min_actor_share=0.0,  # the gate off: this job's actor is too small a share for auto to pay
                 total_steps=8 * 8 * 7, num_envs=8, rollout_length=8, log_every=2, logdir=str(tmp_path / "run"),
                 progress=False, loop="sequential")
    summary = run_training(cfg)
    assert summary["stopped"] is None and summary["updates"] == 7 and summary["loop"] == "sequential"
    lines = _decisions(cfg.logdir)
    assert [d["update"] for d in lines] == [1] and lines[0]["trigger"] == "initial" and lines[0]["reason"]
    assert lines[0]["switched"] and lines[0]["previous"] == "none" and lines[0]["chosen"] == "distill:tiny"
    assert [d["update"] for d in summary["auto_decisions"]] == [1]
    assert summary["auto_running"] == "distill:tiny"
    assert summary["actor_params"] < summary["learner_params"]
    out = capsys.readouterr().out
    assert "auto, update 1: switched to distill:tiny [initial]" in out
    assert os.path.isdir(os.path.join(cfg.logdir, "checkpoints", "7"))


def test_auto_in_anakin_switches_back_and_forth_reusing_compiled_chunks(tmp_path, monkeypatch, capsys):
    """--loop auto runs auto in the Anakin loop, whose triggers are measured at the end of each chunk. The
    bounds are changed at chunk boundaries so that each trigger fires: none -> distill:tiny at update 0
    (initial, huge KL bound), -> none at 10 (divergence: the student's KL > a tiny bound, checked once
    the 10-update cooldown has passed), -> distill:tiny at 20 (clipping: any fraction of ρ exceeds -1;
    only the faster student is evaluated), and at 30 the clipping trigger finds the fastest candidate
    running within the bound: skipped. Two chunk programs, each compiled once; the learner state, the
    update counter and the student's state continue across the switches."""
    from accerl_jax.compressor.auto import AutoCompressor
    from accerl_jax.loops import anakin

    monkeypatch.setattr(speed, "forward_timer", bytes_timer)
    adapt = AutoCompressor.adapt

    def scheduled_adapt(self, update, *args):
        self.max_kl = 1e-12 if 10 <= update < 20 else 1e9
        self.max_clip_fraction = -1.0 if update >= 20 else 1.0
        return adapt(self, update, *args)

    monkeypatch.setattr(AutoCompressor, "adapt", scheduled_adapt)
    chunks: list = []
    real = anakin.AutoChunks
    monkeypatch.setattr(anakin, "AutoChunks", lambda run: chunks.append(real(run)) or chunks[-1])
    updates = 32
    cfg = Config(compressor="auto", auto_candidates="none,distill:tiny", auto_every=1000, total_steps=4 * 8 * updates,
                 auto_min_actor_share=0.0,  # the gate off (test_gate_keeps_none_on_the_default_job)
                 num_envs=4, rollout_length=8, log_every=2, checkpoint_every=0, logdir=str(tmp_path / "run"),
                 progress=False)
    assert choose_loop(cfg) == "anakin"
    summary = run_training(cfg)
    assert summary["loop"] == "anakin" and summary["stopped"] is None and summary["updates"] == updates
    lines = _decisions(cfg.logdir)
    assert [(d["update"], d["trigger"], d["chosen"], d["switched"]) for d in lines] == [
        (0, "initial", "distill:tiny", True), (10, "divergence", "none", True), (20, "clipping", "distill:tiny", True)]
    assert lines[1]["measured"]["kl"] > 1e-12 and 0 <= lines[2]["measured"]["clip_fraction_margin"] <= 1
    assert lines[2]["evaluated"] == ["none", "distill:tiny"]
    assert summary["auto_skipped_evaluations"] == 1 and summary["auto_running"] == "distill:tiny"
    assert summary["auto_decide_s"] > 0
    assert [(d["update"], d["chosen"]) for d in summary["auto_decisions"]] == [(d["update"], d["chosen"])
                                                                              for d in lines]
    assert "auto, update 10: switched to none [divergence]" in capsys.readouterr().out
    # One program per candidate, each compiled exactly once (the switch back at update 20 compiled nothing).
    programs = chunks[0].programs
    assert sorted(programs) == [0, 1] and summary["auto_chunk_programs"] == ["distill:tiny", "none"]
    assert all(p.jitted._cache_size() == 1 for p in programs.values())
    # The learner continued across the switches: its optimizer took every update's steps (APPO's epochs
    # x minibatches), and the decisions read the update counter from the states the switches produced.
    leaves = checkpoint.read_leaves(cfg.logdir, updates)
    assert int(leaves[".learner.step"]) == updates * summary["epochs"] * summary["minibatches"], list(leaves)
    # The student resumed where it stopped: compress calls = 4 (warm-up, update 0) + 10 (updates 1-10)
    # + 4 (warm-up, update 20) + 12 (updates 21-32), each of cfg.distill_steps gradient steps.
    assert int(leaves[".compressor['distill'].steps"]) == (4 + 10 + 4 + 12) * cfg.distill_steps
    assert summary["total_env_steps"] == 4 * 8 * updates and summary["actor_params"] < summary["learner_params"]


@pytest.mark.parametrize("loop_name", ["sebulba", "anakin"])
def test_auto_with_envpool_in_sebulba_and_anakin(tmp_path, monkeypatch, loop_name):
    """Every loop runs auto: Sebulba (decisions in its compressor thread, on the versions it compresses)
    and Anakin with envpool's XLA actor. The huge bound makes auto switch to the student first; later
    evaluations find the fastest running and are skipped."""
    monkeypatch.setattr(speed, "forward_timer", bytes_timer)
    cfg = Config(env="envpool:CartPole-v1", loop=loop_name, compressor="auto", auto_candidates="none,distill:tiny",
                 max_actor_kl=1e9, auto_every=2, total_steps=4 * 8 * 8, num_envs=4, rollout_length=8, log_every=2,
                 checkpoint_every=0, progress=False, logdir=str(tmp_path / "run"), auto_min_actor_share=0.0)
    summary = run_training(cfg)
    assert summary["loop"] == loop_name and summary["stopped"] is None and summary["updates"] == 8
    lines = _decisions(cfg.logdir)
    assert [(d["trigger"], d["chosen"], d["switched"]) for d in lines] == [("initial", "distill:tiny", True)]
    assert summary["auto_running"] == "distill:tiny" and summary["auto_skipped_evaluations"] >= 1
    assert summary["actor_params"] < summary["learner_params"]
    # --auto-min-actor-share 0: the cost-split gate is off, auto runs its candidates and says so.
    gate = summary["auto_gate"]
    assert not gate["applied"] and gate["outcome"] == "auto" and gate["ceiling"] is None
    assert gate["reason"] == "auto ran its candidates without its cost-split gate (--auto-min-actor-share 0)"


@pytest.mark.parametrize("loop_name", ["sequential", "anakin", "sebulba"])
def test_gate_counts_envpool_runs_network_and_keeps_none(tmp_path, loop_name):
    """Envpool's host envs step outside XLA: the gate counts the actor's network part (NetworkOnlyEnv) and
    resolves the default-shaped run to none, which is then the --compressor none run (the deterministic
    loops: the same parameters; Sebulba's threads are not deterministic, so only its decision is held)."""
    budget = dict(env="envpool:CartPole-v1", loop=loop_name, total_steps=4 * 8 * 4, num_envs=4, rollout_length=8,
                  log_every=2, checkpoint_every=0, progress=False)
    kept = run_training(Config(compressor="auto", logdir=str(tmp_path / "auto"), **budget))
    gate = kept["auto_gate"]
    assert gate["applied"] and gate["outcome"] == "none" and kept["compressor"] == "none"
    assert 0 < gate["ceiling"] < 0.5 and gate["actor_flops_per_update"] > 0 and kept["updates"] == 4
    if loop_name != "sebulba":
        none = run_training(Config(compressor="none", logdir=str(tmp_path / "none"), **budget))
        assert kept["learner_params_digest"] == none["learner_params_digest"]
        assert kept["final_return_mean"] == none["final_return_mean"]


def test_network_only_env_counts_the_policys_part_of_a_rollout():
    """NetworkOnlyEnv's rollout counts the policy's FLOPs: on gymnax CartPole (whose env steps are a few
    FLOPs beside an MLP's forward) within a few percent of the real rollout's count, never above it, and
    proportional to the batch."""
    from accerl_jax import networks
    from accerl_jax.actor import AnakinActor, NetworkOnlyEnv
    from accerl_jax.envs import make_env
    from accerl_jax.platform import cost
    from accerl_jax.run.plan import make_spec

    cfg = Config()
    env = make_env(cfg.env, 16, 0)
    spec = make_spec(cfg, env.info)
    params = jax.eval_shape(lambda k: networks.init_params(spec, k), jax.random.PRNGKey(0))
    apply = networks.make_apply(spec)

    def count(e):
        actor = AnakinActor(e, apply, 16)
        return cost.flops(actor.rollout_fn, params, jax.eval_shape(actor.reset, jax.random.PRNGKey(0)))

    real, stand_in = count(env), count(NetworkOnlyEnv(env.info, 16))
    assert 0.9 * real < stand_in <= real, (stand_in, real)
    assert count(NetworkOnlyEnv(env.info, 32)) == pytest.approx(2 * stand_in, rel=0.02)


def test_gate_keeps_none_on_the_default_job(tmp_path, capsys):
    """The default job's actor is a few percent of an update by FLOPs: auto's gate resolves it to none
    before training, the run is the --compressor none run (same parameters), the summary's cost split is
    the gate's count (not counted again) and its verdict says why in words."""
    from accerl_jax.run import auto_gate

    budget = dict(total_steps=16 * 16 * 3, log_every=1, checkpoint_every=0, progress=False)
    kept = run_training(Config(compressor="auto", logdir=str(tmp_path / "auto"), **budget))
    none = run_training(Config(compressor="none", logdir=str(tmp_path / "none"), **budget))
    gate = kept["auto_gate"]
    assert gate["outcome"] == "none" and gate["resolved"] == "none" and kept["compressor"] == "none"
    assert gate["applied"] and 0 < gate["ceiling"] < gate["min_actor_share"] == 0.5
    assert kept["learner_params_digest"] == none["learner_params_digest"]
    assert kept["actor_params_digest"] == none["actor_params_digest"]
    assert kept["final_return_mean"] == none["final_return_mean"] and kept["episodes"] == none["episodes"]
    split = kept["cost_split"]
    assert split["flops_source"] == auto_gate.FLOPS_SOURCE and split["ceiling"] == gate["ceiling"]
    assert split["flops"] == none["cost_split"]["flops"]  # the gate counted what the none run counts
    out = capsys.readouterr().out
    assert f"auto kept none: the actor is {100 * gate['ceiling']:.1f}% of an update by FLOPs, below the 50%" in out
    assert kept["config"]["compressor"] == "none" and "auto_gate" not in none


@pytest.mark.parametrize("flags", [dict(num_seeds=2), dict(normalize_observations=True, normalize_rewards=True)],
                         ids=["seeds", "normalised"])
def test_gate_resolved_runs_take_what_autos_candidates_cannot(tmp_path, flags):
    """Several seeds in one vmapped program, and normalisation, are refused to a run of auto's candidates;
    a run the gate resolves to none before training is the --compressor none run, so it takes them."""
    budget = dict(total_steps=16 * 16 * 3, log_every=1, checkpoint_every=0, progress=False, **flags)
    kept = run_training(Config(compressor="auto", logdir=str(tmp_path / "auto"), **budget))
    none = run_training(Config(compressor="none", logdir=str(tmp_path / "none"), **budget))
    assert kept["auto_gate"]["resolved"] == "none" and kept["compressor"] == "none"
    for key in ("learner_params_digest", "actor_params_digest", "final_return_mean", "episodes"):
        assert kept[key] == none[key], key


def test_gate_turns_compression_on_for_a_search_run(tmp_path, monkeypatch, capsys):
    """A search run's actor evaluates the network S + 1 times per step: its share passes the gate, and auto
    picks the candidate with the fastest forward (ranked here by parameter bytes, deterministically)
    before training, kept for the whole run."""
    monkeypatch.setattr(speed, "forward_timer", bytes_timer)
    cfg = Config(agent="search", num_simulations=4, compressor="auto", total_steps=8 * 8 * 2, num_envs=8,
                 rollout_length=8, log_every=1, checkpoint_every=0, progress=False, logdir=str(tmp_path / "run"))
    summary = run_training(cfg)
    gate = summary["auto_gate"]
    assert gate["outcome"] == "pick" and gate["ceiling"] >= 0.5
    fastest = min(gate["forward_s"], key=gate["forward_s"].get)
    assert fastest != "none" and gate["resolved"] == fastest == summary["compressor"]
    assert summary["actor_param_bytes"] < 4 * summary["learner_params"]  # a compressed actor
    assert f"auto chose {fastest} for the search actor" in capsys.readouterr().out


def test_a_run_the_gate_resolved_resumes_with_its_decision(tmp_path, monkeypatch, capsys):
    """A --compressor auto run whose gate picked a compressor records the decision in its checkpoints: a
    --resume keeps it (nothing is timed again: a new timing could pick another candidate, whose actor would
    not fit the checkpoint) and continues as the uninterrupted run; evaluate rebuilds that actor."""
    from accerl_jax.run import auto_gate
    from accerl_jax.tools import trained

    monkeypatch.setattr(speed, "forward_timer", bytes_timer)
    # A constant learning rate: the resume extends the budget, which would change an annealed schedule.
    flags = dict(agent="search", num_simulations=4, compressor="auto", num_envs=8, rollout_length=8, log_every=1,
                 checkpoint_every=0, progress=False, anneal_lr=False)
    straight = run_training(Config(total_steps=8 * 8 * 4, logdir=str(tmp_path / "straight"), **flags))
    logdir = tmp_path / "run"
    first = run_training(Config(total_steps=8 * 8 * 2, logdir=str(logdir), **flags))
    assert first["updates"] == 2 and first["auto_gate"]["outcome"] == "pick"
    saved = checkpoint.find_checkpoint(str(logdir), "--resume").meta["extra"]["auto_gate"]
    assert saved["resolved"] == first["compressor"] == straight["compressor"] != "none"
    capsys.readouterr()

    def no_timing(*args, **kwargs):
        raise AssertionError("a resumed run timed the candidates again")

    monkeypatch.setattr(auto_gate, "pick_fastest", no_timing)
    resumed = run_training(Config(total_steps=8 * 8 * 4, resume=str(logdir), logdir=None, **flags))
    assert resumed["resumed_from_update"] == 2 and resumed["compressor"] == first["compressor"]
    gate = resumed["auto_gate"]
    assert gate["resumed"] is True and gate["resolved"] == saved["resolved"] and gate["forward_s"] == saved["forward_s"]
    printed = " ".join(capsys.readouterr().out.split())  # the reason is printed wrapped at 80 columns
    assert gate["reason"].endswith("(kept on --resume)") and " ".join(gate["reason"].split()) in printed
    for key in ("learner_params_digest", "actor_params_digest", "final_return_mean", "episodes"):
        assert resumed[key] == straight[key], key
    actor = trained.load(str(logdir), policy="actor")
    assert actor.cfg.compressor == first["compressor"]


def test_a_run_that_ran_autos_candidates_refuses_resume(tmp_path):
    """With the gate off (or not applicable) auto runs its candidates, whose actor parameters change
    structure with each decision: --resume of such a run is refused in one line, and nothing is written."""
    from accerl_jax.config import ConfigError

    logdir = tmp_path / "run"
    flags = dict(compressor="auto", auto_min_actor_share=0.0, auto_candidates="none", num_envs=8, rollout_length=8,
                 log_every=1, checkpoint_every=0, progress=False)
    summary = run_training(Config(total_steps=8 * 8 * 2, logdir=str(logdir), **flags))
    assert summary["auto_gate"]["outcome"] == "auto" and summary["auto_gate"]["resolved"] is None
    before = sorted(p.name for p in logdir.rglob("*"))
    with pytest.raises(ConfigError, match="with --compressor auto: that run ran auto's candidates"):
        run_training(Config(total_steps=8 * 8 * 4, resume=str(logdir), logdir=None, **flags))
    assert sorted(p.name for p in logdir.rglob("*")) == before
    from accerl_jax.tools import trained

    with pytest.raises(ConfigError, match="this --compressor auto run ran auto's candidates"):
        trained.load(str(logdir), policy="actor")


def test_gate_rules_and_the_search_pick_margin():
    """The gate's decision at, under and without a counted ceiling, and the search pick: a compressed
    candidate only where it beats the uncompressed forward by MIN_SPEEDUP (else timing noise decides)."""
    from accerl_jax.run import auto_gate

    assert auto_gate.decide(0.5, 0.49, search=False) == "none" == auto_gate.decide(0.5, 0.49, search=True)
    assert auto_gate.decide(0.5, 0.5, search=False) == "auto" and auto_gate.decide(0.5, 0.5, search=True) == "pick"
    assert auto_gate.decide(0.5, None, search=False) == "auto" and auto_gate.decide(0.0, None, search=True) == "pick"

    class Timed:  # AutoCompressor's timing, stubbed
        def __init__(self, seconds):
            self.seconds, self.base_forward_s = seconds, 1.0

        def forward_seconds(self, params, obs):
            assert obs.shape == (2, 3, 4)
            return dict(self.seconds)

    close = 0.5 * (1 + 1 / auto_gate.MIN_SPEEDUP)  # faster than none, but by less than the margin
    pick = lambda seconds: auto_gate.pick_fastest(Timed(seconds), {}, (4,), "float32", 3, 2)[0]  # noqa: E731
    assert close < 1.0 and pick({"none": 1.0, "int8": close}) == "none"
    assert pick({"none": 1.0, "int8": 0.5, "bf16": 0.7}) == "int8"
    # none's timing slowed by noise: the learner's forward (the same network, 1.0 here) is the reference.
    assert pick({"none": 2.0, "int8": close}) == "none"
    record = auto_gate.record(0.0, None, "auto")
    assert not record["applied"] and "(--auto-min-actor-share 0)" in record["reason"] and record["resolved"] is None
