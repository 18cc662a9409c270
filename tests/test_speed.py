"""accerl_jax.platform.speed: the forward-pass timing of the actor's policy against the learner's."""
from __future__ import annotations

import jax
import pytest

from accerl_jax import networks
from accerl_jax.platform import speed

SPEC = networks.default_spec((4,), 2)
APPLY = networks.make_apply(SPEC)
PARAMS = networks.init_params(SPEC, jax.random.PRNGKey(0))
OBS = jax.random.normal(jax.random.PRNGKey(1), (4, 8, 4))  # [K, B, obs]
STUDENT = networks.student_spec(SPEC, "tiny")


def test_a_smaller_policy_is_timed_beside_the_learners():
    student_params = networks.init_params(STUDENT, jax.random.PRNGKey(2))
    out = speed.policy_speedup(APPLY, PARAMS, networks.make_apply(STUDENT), student_params, OBS, rounds=1, repeats=2)
    assert out["base_forward_s"] > 0 and out["actor_forward_s"] > 0 and out["forward_batch"] == 8
    assert out["actor_policy_speedup"] == pytest.approx(out["base_forward_s"] / out["actor_forward_s"])


def test_the_learners_own_policy_is_timed_once_with_speedup_one():
    def never(params, obs):
        raise AssertionError("identical=True must not trace the actor's apply")

    out = speed.policy_speedup(APPLY, PARAMS, never, PARAMS, OBS, rounds=1, repeats=2, identical=True)
    assert out["actor_policy_speedup"] == 1.0 and out["actor_forward_s"] == out["base_forward_s"] > 0
    assert out["actor_config"] == out["base_config"]
