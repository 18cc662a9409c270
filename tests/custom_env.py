"""A gymnax environment written outside gymnax, for tests/test_envs.py: 'Lever'. Each step, action 1
pays 1 and action 0 pays 0; an episode is cut at 10 steps (a time limit). A random policy returns 5, the
best 10."""
from __future__ import annotations

import jax.numpy as jnp
from flax import struct
from gymnax.environments import environment, spaces


@struct.dataclass
class LeverState(environment.EnvState):
    time: int


@struct.dataclass
class LeverParams(environment.EnvParams):
    max_steps_in_episode: int = 10


class Lever(environment.Environment):
    @property
    def default_params(self) -> LeverParams:
        return LeverParams()

    def step_env(self, key, state, action, params):
        state = LeverState(time=state.time + 1)
        return self.get_obs(state, params), state, action.astype(jnp.float32), jnp.bool_(False), {}

    def reset_env(self, key, params):
        state = LeverState(time=0)
        return self.get_obs(state, params), state

    def get_obs(self, state, params=None, key=None):
        return jnp.array([1.0, state.time / params.max_steps_in_episode], jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(2)

    def observation_space(self, params):
        return spaces.Box(0.0, 1.0, (2,), jnp.float32)


def lever_with_params():
    return Lever(), LeverParams(max_steps_in_episode=10)

