"""Two-player games by self-play (``--env pgx:<game>``, ``--agent search``): the pgx adapter's ends and
masks, the search's sign convention (a one-move win is found, no illegal move is chosen), the learner's
game-outcome value targets and masked policy, and the win/draw/loss matches of evaluation."""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from accerl_jax.envs import make_env

pytest.importorskip("pgx")


def _uniform_apply(num_actions):
    """A network with zero logits and zero value: the search alone decides."""
    def apply(params, obs):
        b = obs.shape[0]
        return jnp.zeros((b, num_actions), jnp.float32), jnp.zeros((b,), jnp.float32)
    return apply


@functools.lru_cache(maxsize=None)
def _env(game):
    """One adapter per game for the whole file (its jitted functions compile once)."""
    env = make_env(f"pgx:{game}", 1)
    return env, jax.jit(env.model.step)


def _position(game_id, moves, b=4):
    """``b`` games after the same ``moves``, and their observations (the player to move's)."""
    env, step = _env(game_id)
    game = jax.jit(env.model.init)(jax.random.split(jax.random.PRNGKey(0), b))
    for a in moves:
        _, game, _, _ = step(jax.random.split(jax.random.PRNGKey(1), b), game, jnp.full((b,), a, jnp.int32))
    from accerl_jax.envs.pgx_env import observe

    return game, observe(game)


def test_adapter_rewards_ends_and_reset():
    """The mover's reward at the game-ending move, terminated (never truncated), next_obs the final board,
    obs the new game's (empty board), legal masks of the new game; episode return 1 for a win."""
    env = make_env("pgx:tic_tac_toe", 2)
    state, obs = jax.jit(env.reset)(jax.random.PRNGKey(0))
    assert obs.shape == (2, 18) and obs.dtype == jnp.float32 and env.info.num_actions == 9
    step = jax.jit(env.step)
    # X: 0, 1, 2 (a row), O: 3, 4: X wins at its third move, the fifth ply.
    for ply, a in enumerate([0, 3, 1, 4, 2]):
        state, tr = step(state, jnp.full((2,), a, jnp.int32))
        if ply < 4:
            assert not tr.terminated.any() and (tr.reward == 0).all()
    assert tr.terminated.all() and not tr.truncated.any() and tr.valid.all()
    np.testing.assert_array_equal(tr.reward, [1.0, 1.0])  # the mover's (the winner's) reward
    np.testing.assert_array_equal(tr.episode_return, [1.0, 1.0])
    np.testing.assert_array_equal(tr.episode_length, [5, 5])
    assert float(tr.next_obs.sum()) == 2 * 5 and float(tr.obs.sum()) == 0  # final board; the new, empty one
    assert env.legal_actions(state).all()  # a new game: every square free
    assert (state.episode_return == 0).all() and (state.episode_length == 0).all()


def test_observation_is_the_movers():
    """After one move the stone is the opponent's, in the second plane (pgx's view of the player to move)."""
    _, obs0 = _position("connect_four", [])
    _, obs1 = _position("connect_four", [3])
    planes = obs1.reshape((4, 6, 7, 2))
    assert float(obs0.sum()) == 0 and float(planes[..., 0].sum()) == 0 and float(planes[..., 1].sum()) == 4


def test_game_outcomes_alternate_and_cut_at_rollout_end():
    from accerl_jax.search.targets import game_outcomes

    # One column: a game of 3 plies won by its last mover, then a game of 2 plies drawn, then an unfinished one.
    r = jnp.array([0, 0, 1, 0, 0, 0, 0], jnp.float32)[:, None]
    done = jnp.array([0, 0, 1, 0, 1, 0, 0], bool)[:, None]
    z, known = game_outcomes(r, done)
    np.testing.assert_array_equal(z[:5, 0], [1, -1, 1, 0, 0])
    np.testing.assert_array_equal(known[:, 0], [1, 1, 1, 1, 1, 0, 0])


@functools.lru_cache(maxsize=None)
def _search(game_id, s=16, gumbel=1.0):
    """A jitted search with a uniform network, ``(obs, game, key) -> SearchOutput``."""
    from accerl_jax.search.acting import SearchSettings, search_policy

    env = _env(game_id)[0]
    settings = SearchSettings(num_simulations=s, max_num_considered_actions=env.info.num_actions, gumbel_scale=gumbel)
    return jax.jit(functools.partial(search_policy, _uniform_apply(env.info.num_actions), env.model, settings, None))


def test_search_finds_a_one_move_win():
    """Connect Four: the player to move has three stones in column 0 (the opponent three in column 1): the
    search with a uniform network plays column 0, for every Gumbel draw; its Q there is +1 (mctx's
    ``r + discount v`` with the mover's reward), and the opponent's threat at column 1 does not mislead it."""
    game, obs = _position("connect_four", [0, 1, 0, 1, 0, 1])
    out = _search("connect_four")(obs, game, jax.random.PRNGKey(3))
    np.testing.assert_array_equal(out.action, np.zeros(4))
    np.testing.assert_allclose(out.root_qvalues[:, 0], 1.0)


@pytest.mark.slow
def test_search_blocks_a_one_move_loss():
    """The sign convention two plies deep: the opponent threatens column 1 and the player to move has no
    win of its own; with enough simulations the search blocks at column 1 (every other move loses: Q -1)."""
    game, obs = _position("connect_four", [1, 0, 1, 0, 1])  # the opponent has 3 in column 1
    out = _search("connect_four", 64, 0.0)(obs, game, jax.random.PRNGKey(0))
    np.testing.assert_array_equal(out.action, np.ones(4))


def test_learner_children_in_a_two_player_game():
    """Connect Four (the mover's values, discount -1 per ply): one level deep (``max_depth=1``) the search
    with N at the root's children has N's own search's root Q-values (every column visited), whatever the
    network at the root, and not the small network's own."""
    from accerl_jax.search.acting import SearchSettings, search_policy

    env = _env("connect_four")[0]
    game, obs = _position("connect_four", [3, 3, 2], b=4)

    def apply(p, o):
        flat = o.reshape(o.shape[0], -1).astype(jnp.float32)
        return flat @ p[0], jnp.tanh(flat @ p[1])

    small, n = ((jax.random.normal(jax.random.PRNGKey(k), (84, 7)) * 0.2,
                 jax.random.normal(jax.random.PRNGKey(k + 1), (84,)) * 0.5) for k in (5, 7))
    settings = SearchSettings(num_simulations=16, max_num_considered_actions=7, max_depth=1)

    def search(params, exact):
        return jax.jit(lambda: search_policy(apply, env.model, settings, params, obs, game, jax.random.PRNGKey(2),
                                             exact=exact))()

    n_own, small_own, mixed = search(n, None), search(small, None), search(small, (apply, n))
    assert (np.asarray(mixed.root_visits) > 0).all()
    np.testing.assert_allclose(mixed.root_qvalues, n_own.root_qvalues, rtol=1e-5, atol=1e-6)
    assert float(jnp.abs(mixed.root_qvalues - small_own.root_qvalues).max()) > 0.1


def test_search_never_chooses_an_illegal_move():
    """Columns 0-5 full (a legal position), only column 6 open: the search plays 6 whatever the noise, and
    its action weights are 0 on the full columns."""
    env = _env("connect_four")[0]
    moves = [0, 1, 0, 1, 0, 1, 1, 0, 1, 0, 1, 0, 2, 3, 2, 3, 2, 3, 3, 2, 3, 2, 3, 2, 4, 5, 4, 5, 4, 5, 5, 4, 5, 4, 5, 4]
    game, obs = _position("connect_four", moves)
    legal = np.asarray(env.model.legal(game))
    assert not game.terminated.any() and legal[:, 6].all() and not legal[:, :6].any()
    search = _search("connect_four")
    for k in range(3):
        out = search(obs, game, jax.random.PRNGKey(k))
        np.testing.assert_array_equal(out.action, np.full(4, 6))
        assert float(jnp.abs(out.action_weights[:, :6]).max()) == 0.0


def test_rollout_actions_legal_and_loss_masks():
    """A search actor's rollout on Tic-tac-toe: every action legal under the recorded masks, the weights 0
    on illegal moves, and the learner's loss finite with the outcome targets (value counted only where the
    game ended inside the rollout); a logit on an illegal move changes neither the policy loss nor the entropy."""
    from accerl_jax import networks
    from accerl_jax.learner import LossConfig
    from accerl_jax.search.acting import SearchActor, SearchSettings
    from accerl_jax.search.targets import game_outcomes, search_loss_sums

    env = make_env("pgx:tic_tac_toe", 4)
    spec = networks.default_spec(env.info.obs_shape, env.info.num_actions, network="mlp")
    spec = dataclasses.replace(spec, widths=(16,))
    params = networks.init_params(spec, jax.random.PRNGKey(0))
    apply = networks.make_apply(spec)
    actor = SearchActor(env, apply, 16, settings=SearchSettings(num_simulations=4, max_num_considered_actions=9))
    carry = actor.reset(jax.random.PRNGKey(1))
    _, batch, _ = actor.rollout(params, carry)
    legal = np.asarray(batch.legal_actions)
    taken = np.take_along_axis(legal, np.asarray(batch.action)[..., None], -1)[..., 0]
    assert taken.all() and np.asarray(batch.terminated).any()
    assert float(np.abs(np.where(legal, 0.0, batch.action_weights)).max()) == 0.0
    cfg = LossConfig(loss="search", value_target="outcome")
    count, sums, _ = search_loss_sums(params, apply, batch, cfg)
    assert all(np.isfinite(float(v)) for v in sums.values())
    z, known = game_outcomes(batch.reward, batch.terminated)
    assert 0 < int(known.sum()) < known.size
    np.testing.assert_allclose(float(sums["vs"]), float(jnp.sum(jnp.where(known, z, 0.0))), atol=1e-5)

    logits_bump = jnp.where(batch.legal_actions, 0.0, 30.0)

    def bump(p, o):  # a large logit on every illegal move: masked out, it changes nothing
        logits, value = apply(p, o)[:2]
        return logits + logits_bump.reshape(logits.shape), value

    sums_b = search_loss_sums(params, bump, batch, cfg)[1]
    for k in ("pg", "entropy", "value"):
        np.testing.assert_allclose(float(sums[k]), float(sums_b[k]), rtol=1e-5)


def test_match_counts_add_up_and_a_strong_player_beats_random():
    """W + D + L = games, half each colour; MCTS with random rollouts beats the random player at Tic-tac-toe."""
    from accerl_jax.search.matches import mcts_player, play_match, random_player

    model = _env("tic_tac_toe")[0].model
    result = play_match(model, mcts_player(model, 16), random_player(model), 16, jax.random.PRNGKey(0))
    for part in (result, result["first"], result["second"]):
        assert part["wins"] + part["draws"] + part["losses"] == part["games"]
    assert result["first"]["games"] == result["second"]["games"] == 8
    assert result["wins"] >= 10 and result["losses"] <= 3, result


def test_bad_pgx_input_is_refused():
    from accerl_jax.config import Config, ConfigError
    from accerl_jax.run.plan import check_flags

    with pytest.raises(ConfigError, match="unknown pgx game 'connect4'.*connect_four"):
        check_flags(Config(env="pgx:connect4", agent="search"))
    with pytest.raises(ConfigError, match="bad --agent actor-critic for --env pgx:connect_four.*--agent search"):
        check_flags(Config(env="pgx:connect_four"))
    with pytest.raises(ValueError, match="unknown pgx game"):
        make_env("pgx:chekers", 1)
