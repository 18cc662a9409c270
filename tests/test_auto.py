"""``--compressor auto`` (accerl_jax.compressor.auto): its choice under a tiny and a huge KL bound, its
triggers, parameter-structure switching in the loop, and the logged decisions (issue 6)."""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from accerl_jax import loop, networks, speed
from accerl_jax.compressor import make_compressor
from accerl_jax.compressor.auto import CLIP_MARGIN, auto, candidate_key, parse_candidates
from accerl_jax.config import Config
from accerl_jax.monitor import policy_divergence
from accerl_jax.types import Rollout

T, B = 4, 16
SPEC = networks.default_spec((4,), 2)
APPLY = networks.make_apply(SPEC)
PARAMS = networks.init_params(SPEC, jax.random.PRNGKey(0))
OBS = jax.random.normal(jax.random.PRNGKey(1), (T, B, 4))


@pytest.fixture(scope="module")
def shared():
    """One AutoCompressor for the unit tests (its jitted functions compile once); each test sets its bounds."""
    return auto("none,distill:tiny,int8", SPEC, APPLY, lambda s: make_compressor(s, SPEC, APPLY, distill_steps=2),
                divergence=policy_divergence, forward_timer=speed.forward_timer, max_kl=1.0, every=5,
                check_every=2, warmup=1, rounds=1)


def _with(comp, max_kl, max_clip_fraction=0.2):
    comp.max_kl, comp.max_clip_fraction, comp.decisions = max_kl, max_clip_fraction, []
    return comp


def _rollout(log_prob_shift: float = 0.0) -> Rollout:
    """A rollout whose behaviour log-probs are the learner's own, shifted by ``log_prob_shift`` (ρ = e^-shift)."""
    action = jax.random.randint(jax.random.PRNGKey(2), (T, B), 0, 2)
    log_pi = networks.policy_distribution(APPLY(PARAMS, OBS)[0], False).log_prob(action)
    zeros = jnp.zeros((T, B))
    return Rollout(obs=OBS, action=action, log_prob=log_pi + log_prob_shift, reward=zeros,
                   terminated=zeros.astype(bool), truncated=zeros.astype(bool), valid=jnp.ones((T, B), bool),
                   next_obs=OBS, episode_return=zeros, episode_length=zeros.astype(jnp.int32))


def _first_decision(comp):
    actor_params, state = comp.init(PARAMS, jax.random.PRNGKey(3), OBS[0])
    actor_params, state = comp.compress(PARAMS, state, OBS.reshape(-1, 4))
    return comp.adapt(1, PARAMS, state, actor_params, _rollout())


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
    assert comp.adapt(3, PARAMS, state, actor_params, _rollout())[2] is None
    # Check update, on-policy rollout: KL 0 and no ρ clipped -> no evaluation.
    assert comp.adapt(4, PARAMS, state, actor_params, _rollout())[2] is None
    # Behaviour log-probs lower by 0.5: every ρ = e^0.5 > 1.1 -> the clipping trigger.
    assert np.exp(0.5) > CLIP_MARGIN
    assert comp.adapt(2, PARAMS, state, actor_params, _rollout(-0.5))[2] is None  # within the cooldown (2)
    _, kept_state, d = comp.adapt(4, PARAMS, state, actor_params, _rollout(-0.5))
    assert d["trigger"] == "clipping" and d["measured"]["clip_fraction_margin"] == 1.0 and "of rho above" in d["reason"]
    # The choice stood: the next trigger waits twice as long (4 updates), while ρ stays clipped.
    assert not d["switched"] and int(kept_state.cooldown) == 4 and d["next_trigger_cooldown"] == 4
    assert comp.adapt(6, PARAMS, kept_state, actor_params, _rollout(-0.5))[2] is None
    d = comp.adapt(8, PARAMS, kept_state, actor_params, _rollout(-0.5))[2]
    assert d["trigger"] == "clipping" and d["next_trigger_cooldown"] == 5  # doubled, capped at `every`
    # Every `every` (5) updates since the last evaluation (update 1): periodic.
    assert comp.adapt(6, PARAMS, state, actor_params, _rollout())[2]["trigger"] == "periodic"
    # Running a student whose KL exceeds the bound: the divergence trigger switches back to `none`.
    student_state = state._replace(current=jnp.int32(1))
    student_params, student_state = comp.compress(PARAMS, student_state, OBS.reshape(-1, 4))
    params, new_state, d = comp.adapt(4, PARAMS, student_state, student_params, _rollout())
    assert d["trigger"] == "divergence" and d["previous"] == "distill:tiny" and d["chosen"] == "none"
    assert d["switched"] and list(params) == ["none"] and int(new_state.last_evaluation) == 4
    assert [x["trigger"] for x in comp.decisions] == ["initial", "clipping", "clipping", "periodic", "divergence"]


def test_candidate_list_errors():
    assert parse_candidates("none, int8") == ["none", "int8"]
    for bad, msg in [("none,,int8", "empty entry"), ("none,auto", "'auto' cannot"), ("int8,int8", "more than once")]:
        with pytest.raises(ValueError, match=msg):
            parse_candidates(bad)


def test_auto_run_switches_and_logs_every_decision(tmp_path, monkeypatch, capsys):
    """A real run: the timer is replaced by one that ranks candidates by parameter count (deterministic), so
    the huge bound makes auto switch from `none` to the student at update 1 (the actor's params change
    structure mid-run, and the final checkpoint saves them); every decision is logged with its reason."""
    monkeypatch.setattr(speed, "forward_timer",
                        lambda apply, family="mlp": lambda params, obs: 1e-9 * networks.param_count(params))
    cfg = Config(compressor="auto", auto_candidates="none,distill:tiny", max_actor_kl=1e9, auto_every=3,
                 total_steps=8 * 8 * 7, num_envs=8, rollout_length=8, log_every=2, logdir=str(tmp_path / "run"),
                 progress=False)
    summary = loop.train(cfg)
    assert summary["stopped"] is None and summary["updates"] == 7
    with open(os.path.join(cfg.logdir, "decisions.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    assert [d["update"] for d in lines] == [1, 4, 7]
    assert [d["trigger"] for d in lines] == ["initial", "periodic", "periodic"]
    assert lines[0]["switched"] and lines[0]["previous"] == "none" and lines[0]["chosen"] == "distill:tiny"
    assert all(d["reason"] and d["chosen"] == "distill:tiny" for d in lines)
    assert [d["update"] for d in summary["auto_decisions"]] == [1, 4, 7]
    assert summary["auto_running"] == "distill:tiny"
    assert summary["actor_params"] < summary["learner_params"]
    out = capsys.readouterr().out
    assert "auto, update 1: switched to distill:tiny [initial]" in out
    assert os.path.isdir(os.path.join(cfg.logdir, "checkpoints", "7"))
