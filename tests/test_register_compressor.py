"""A compressor kind of one's own, registered by name (notebooks/custom_compressor.ipynb), and the chain's
per-stage timer the Monitor uses for distillation's time."""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import pytest

from accerl_jax import networks
from accerl_jax.compressor import Compressor, make_compressor, register_compressor, unregister_compressor

SPEC = networks.default_spec((4,), 2)
APPLY = networks.make_apply(SPEC)


def halve() -> Compressor:
    """Weights times 0.5 (a stand-in stage that visibly changes the parameters)."""
    scale = jax.jit(lambda p: jax.tree.map(lambda w: 0.5 * w, p))
    return Compressor(init=lambda params, key, obs=None: (scale(params), ()),
                      compress=lambda params, state, obs: (scale(params), state), actor_apply=lambda apply: apply)


@pytest.fixture
def registered():
    seen = []

    def factory(network, teacher_apply, arg):
        seen.append((network, arg))
        if arg not in ("", "x"):
            raise ValueError(f"halve takes no value or 'x', got {arg!r}")
        return halve()

    register_compressor("halve", factory)
    yield seen
    unregister_compressor("halve")


def test_registered_kind_is_built_by_name_and_chained_last(registered):
    params = networks.init_params(SPEC, jax.random.PRNGKey(0))
    comp = make_compressor("distill:small+halve:x", SPEC, APPLY)
    actor_params, state = comp.init(params, jax.random.PRNGKey(1))
    assert list(state) == ["distill", "halve"]
    student = registered[0][0]
    assert registered[0][1] == "x" and student == networks.student_spec(SPEC, "small")  # gets the student's spec
    # The halving stage really runs after distillation: its output is half the student's parameters.
    distilled = state["distill"].student_params
    for a, b in zip(jax.tree.leaves(actor_params), jax.tree.leaves(distilled)):
        assert jnp.allclose(a, 0.5 * b)
    with pytest.raises(ValueError, match="cannot follow"):
        make_compressor("halve+distill:small", SPEC, APPLY)
    with pytest.raises(ValueError, match="bad --compressor 'halve:y'.*got 'y'"):
        make_compressor("halve:y", SPEC, APPLY)


def test_register_refuses_builtin_names_and_unknown_kinds_stay_errors():
    with pytest.raises(ValueError, match="cannot register compressor kind 'int8'"):
        register_compressor("int8", lambda *a: halve())
    with pytest.raises(ValueError, match="unknown kind 'halve'"):
        make_compressor("halve", SPEC, APPLY)


def test_chain_timer_wraps_each_stage(registered):
    params = networks.init_params(SPEC, jax.random.PRNGKey(0))
    comp = make_compressor("mask:0.5+halve", SPEC, APPLY)
    _, state = comp.init(params, jax.random.PRNGKey(1))
    entered = []

    @contextlib.contextmanager
    def timer(name):
        entered.append(name)
        yield

    plain, _ = comp.compress(params, state, None)
    timed, _ = comp.compress(params, state, None, timer=timer)
    assert entered == ["mask", "halve"]
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(timed)):
        assert jnp.array_equal(a, b)
