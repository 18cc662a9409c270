"""The five components as types: each is found by name on the package, the package import stays cheap,
today's actors are Actors, and the Learner pair is the learner's own init and update."""
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import accerl_jax
from accerl_jax import actor as actor_lib
from accerl_jax import learner as learner_lib
from accerl_jax import networks
from accerl_jax.envs import make_env


def test_every_exported_name_resolves_to_what_its_module_defines():
    for name in accerl_jax.__all__:
        value = getattr(accerl_jax, name)
        assert value is getattr(sys.modules[accerl_jax._EXPORTS[name]], name)
        assert name in dir(accerl_jax)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        accerl_jax.no_such_name


def test_importing_the_package_loads_no_component_and_no_jax():
    code = ("import json, sys, accerl_jax; "
            "print(json.dumps(sorted(m for m in sys.modules if m == 'jax' or m.startswith('accerl_jax.'))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                       check=True).stdout)
    assert loaded == []


@pytest.mark.parametrize("env_id", ["gymnax:CartPole-v1", "envpool:CartPole-v1"])
def test_the_actors_that_make_actor_builds_are_actors(env_id):
    env = make_env(env_id, num_envs=2, seed=0)
    apply = lambda params, obs: (jnp.zeros(obs.shape[:1] + (2,)), jnp.zeros(obs.shape[:1]))  # noqa: E731
    built = [actor_lib.make_actor(env, apply, rollout_length=3)]
    if env.info.jittable:
        built.append(actor_lib.make_actor(make_env(env_id, num_envs=1, seed=0), apply, 3, groups=[0, 1]))
    for actor in built:
        assert isinstance(actor, accerl_jax.Actor), type(actor).__name__
        carry = actor.reset(jax.random.PRNGKey(0))
        _, rollout, seconds = actor.rollout(None, carry)
        assert rollout.action.shape == (3, 2) and rollout.log_prob.shape == (3, 2) and isinstance(seconds, dict)
    assert not isinstance(object(), accerl_jax.Actor)


def test_the_learner_pair_is_init_state_and_make_update():
    env = make_env("gymnax:CartPole-v1", num_envs=4, seed=0)
    spec = networks.with_widths(networks.default_spec(env.info.obs_shape, env.info.num_actions), (8, 8))
    params, apply = networks.init_params(spec, jax.random.PRNGKey(0)), networks.make_apply(spec)
    actor = actor_lib.make_actor(env, apply, rollout_length=4)
    _, batch, _ = actor.rollout(params, actor.reset(jax.random.PRNGKey(1)))
    optimizer, cfg, key = optax.adam(1e-2), learner_lib.LossConfig(), learner_lib.learner_key(0)

    learner = accerl_jax.make_learner(apply, optimizer, cfg)
    state, metrics = learner.update(learner.init(params, key), batch)
    expected_state, expected_metrics = learner_lib.make_update(apply, optimizer, cfg)(
        learner_lib.init_state(params, optimizer, key=key), batch)
    for got, want in zip(jax.tree.leaves((state, metrics)), jax.tree.leaves((expected_state, expected_metrics))):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert int(state.step) == cfg.optimizer_steps and float(metrics["grad_norm"]) > 0
