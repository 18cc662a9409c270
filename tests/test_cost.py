"""accerl_jax.platform.cost: the per-update cost split and its Amdahl ceiling, by hand."""
import jax.numpy as jnp
import pytest

from accerl_jax.platform import cost


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


def test_amdahl_in_flops_names_its_unit():
    out = cost.amdahl(1.0, 2.0, 6.0, 1.0, unit="flops")
    assert out["actor_flops_per_update"] == 1.0 and out["update_flops"] == 8.0
    assert out["ceiling"] == pytest.approx(2 / 8) and out["actor_share"] == pytest.approx(1 / 8)


def test_flops_counts_every_step_of_a_loop_not_its_body_once():
    """XLA's cost analysis counts a loop body once; cost.flops unrolls every scan (a static fori_loop is
    one), so a loop of 5 matmul steps counts 5 matmuls: at least 5 x 2·8·32·32."""
    import jax

    x, w = jnp.ones((8, 32)), jnp.ones((32, 32))
    one = cost.flops(lambda x, w: jnp.tanh(x @ w), x, w)
    assert one >= 2 * 8 * 32 * 32

    def scanned(x, w):
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=5)[0]

    def fori(x, w):
        return jax.lax.fori_loop(0, 5, lambda _, c: jnp.tanh(c @ w), x)

    for fn in (scanned, fori):
        assert cost.flops(fn, x, w) == pytest.approx(5 * one, rel=0.05), fn.__name__
        assert jax.jit(fn).lower(x, w).cost_analysis()["flops"] < 2 * one  # what XLA alone reports
    # Only shapes count: abstract arguments give the same figure, and no arithmetic counts 0.
    spec = jax.ShapeDtypeStruct((8, 32), jnp.float32)
    assert cost.flops(scanned, spec, jax.ShapeDtypeStruct((32, 32), jnp.float32)) == cost.flops(scanned, x, w)
    assert cost.flops(lambda x: x, x) == 0.0
