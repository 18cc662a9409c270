"""accerl_jax.cost: the per-update cost split and its Amdahl ceiling, by hand."""
import jax.numpy as jnp
import pytest

from accerl_jax import cost


def test_amdahl_by_hand():
    # Uncompressed: 1 ms actor + 4 ms learner; compressed: 0.25 ms actor + 0.5 ms compression.
    out = cost.amdahl(actor_s=0.25e-3, uncompressed_actor_s=1e-3, learner_s=4e-3, compress_s=0.5e-3)
    assert out["update_s"] == pytest.approx(4.75e-3)
    assert out["actor_share"] == pytest.approx(0.25 / 4.75)
    assert out["ceiling"] == pytest.approx(1 / 5)  # the actor free: 5 ms -> 4 ms
    assert out["predicted_saving"] == pytest.approx(1 - 4.75 / 5)
    # A compression that costs more than the actor saves is a negative saving.
    assert cost.amdahl(0.5e-3, 1e-3, 4e-3, 1e-3)["predicted_saving"] == pytest.approx(1 - 5.5 / 5)


def test_time_pieces_warms_up_then_times_every_piece_each_round():
    calls = {"a": 0, "b": 0}

    def piece(name):
        def run():
            calls[name] += 1
            return jnp.ones(3) * calls[name]
        return run

    seconds = cost.time_pieces({"a": piece("a"), "b": piece("b")}, repeats=3)
    assert calls == {"a": 4, "b": 4}  # one warm-up call and three timed
    assert set(seconds) == {"a", "b"} and all(s >= 0 for s in seconds.values())
    with pytest.raises(ValueError, match="repeats must be >= 1, got 0"):
        cost.time_pieces({"a": piece("a")}, repeats=0)
