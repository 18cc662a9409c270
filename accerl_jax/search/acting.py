"""Acting with search: at every env step, Gumbel MuZero (``mctx.gumbel_muzero_policy``) searches with the
actor's (compressed) parameters and the environment's own gymnax ``step_env`` as the model.

The model (:func:`search_policy`): the embedding is the gymnax env state of each environment
(:attr:`accerl_jax.envs.gymnax_env.GymnaxEnv.model`, stepped *without* the auto-reset) and whether the
episode has terminated on the way; a transition into a terminal state has discount 0 and the terminal
node value 0, and every transition below it reward 0, discount 0 and value 0. A time limit inside the
tree is not an end (the value of the state bootstraps, as the learner's targets do). Prior logits and
values come from the actor network's policy and value heads: ``S`` simulations evaluate it ``S`` times,
the root once more (``S + 1`` evaluations per env step). Stochastic envs (MinAtar's sticky actions) are
sampled with the search's own keys. With ``--learner-children`` (actor parameters paired with the
learner's, :mod:`accerl_jax.compressor.paired`) the learner's network evaluates the root's ``A``
children, expanded before the search, and the compressed one the root and every node below them.

The rollout (:class:`SearchRollout`) is today's :class:`~accerl_jax.types.Rollout` with the search's
action weights (the policy targets), root value and the root's Q-values and visit counts besides (what
``--search-target learner`` rebuilds the targets from, :func:`accerl_jax.search.targets.improved_policy`);
its ``log_prob`` is ``log w_a`` of the action the search chose (Gumbel MuZero picks it by sequential
halving, not by sampling ``w``).

Two-player games (pgx, :class:`accerl_jax.envs.pgx_env.PgxModel`, ``model.two_player``): the embedding is
the pgx game state; every value is from the perspective of the player to move at its node and every
reward that of the move's mover, so the discount is -1 per ply (0 into and below a game end), which makes
mctx's ``Q(s, a) = r + discount · v(s')`` the mover's value of its move (the convention of mctx's and pgx's
own AlphaZero examples). Illegal moves are masked: at the root by mctx's ``invalid_actions``, below it by
setting their prior logits to the float32 minimum (mctx's own masking), so no simulation takes one.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import mctx

from accerl_jax.platform import xla
from accerl_jax.actor import ActorCarry, AnakinActor, ShardedActor, rollout_from_steps
from accerl_jax.compressor.paired import PairedApply
from accerl_jax.types import ApplyFn, Rollout


@dataclasses.dataclass(frozen=True)
class SearchSettings:
    """The search's settings (``--num-simulations``, ``--max-depth``, ``--max-num-considered-actions``,
    ``--gumbel-scale``; ``discount`` is ``--discount``, γ per agent step)."""

    num_simulations: int = 16
    max_depth: int | None = None
    max_num_considered_actions: int = 16
    gumbel_scale: float = 1.0
    discount: float = 0.99

    def first_visits(self, num_actions: int) -> int:
        """How many simulations open a search, one per considered root action (``min(S, A, m)`` for ``A =
        num_actions`` legal actions and ``m = max_num_considered_actions``): Gumbel's sequential halving
        visits each considered action once before anything else, so each of these expands a root's child
        (Danihelka et al. 2022, "Policy improvement by planning with Gumbel", Sequential Halving at the
        root; mctx ``seq_halving.get_sequence_of_considered_visits``)."""
        return min(self.num_simulations, num_actions, self.max_num_considered_actions)

    @classmethod
    def from_config(cls, cfg) -> "SearchSettings":
        """The settings of a :class:`~accerl_jax.config.Config`."""
        return cls(cfg.num_simulations, cfg.max_depth, cfg.max_num_considered_actions, cfg.gumbel_scale,
                   cfg.discount)


class SearchRollout(NamedTuple):
    """A :class:`~accerl_jax.types.Rollout` ``[T, B, ...]`` of a search agent: its fields (same meaning,
    ``log_prob`` being ``log w`` of the chosen action) and four more.

    Attributes:
      action_weights: ``[T, B, A]`` float32, the search's improved policy ``w`` at each step (sums to 1):
        the learner's policy target.
      root_value: ``[T, B]`` float32, the search's value of each step's root (``mctx`` tree summary).
      root_qvalues: ``[T, B, A]`` float32, the root's Q-values ``r + γ v(child)`` of the tree (``mctx``
        ``SearchSummary.qvalues``; 0 for an unvisited action, whose Q the targets complete).
      root_visits: ``[T, B, A]`` float32, the root's visit counts per action (``SearchSummary.visit_counts``).
      legal_actions: ``[T, B, A]`` bool, the legal moves at each step (two-player games), or None (every
        action legal: gymnax envs).
      child_obs: ``[T, B, A, *obs_shape]`` float32, the observation of each root's child per action as the
        search's tree holds it (the model's step from the root), where the actor records the children
        (``record_children``: ``--distill-children``), else None.
      child_valid: ``[T, B, A]`` bool, whether that child was expanded and is not past an episode's or
        game's end (the search then used its network's value there), or None.
    """

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    valid: jax.Array
    bootstrap_obs: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array
    action_weights: jax.Array
    root_value: jax.Array
    root_qvalues: jax.Array
    root_visits: jax.Array
    legal_actions: Any = None
    child_obs: Any = None
    child_valid: Any = None


class SearchOutput(NamedTuple):
    """What :func:`search_policy` returns for ``B`` roots.

    Attributes:
      action: ``[B]`` int32, the search's action (sequential halving).
      log_prob: ``[B]`` float32, ``log w`` of that action.
      action_weights: ``[B, A]`` float32, the improved policy ``w`` (sums to 1).
      root_value: ``[B]`` float32, the tree's value of the root.
      root_qvalues: ``[B, A]`` float32, the root's Q-values (0 where unvisited).
      root_visits: ``[B, A]`` float32, the root's visit counts.
      child_obs: ``[B, A, *obs_shape]`` float32 observations of the root's children (zeros where not
        expanded), with ``record_children``; else None.
      child_valid: ``[B, A]`` bool, the children expanded and not past an episode's end; else None.
    """

    action: jax.Array
    log_prob: jax.Array
    action_weights: jax.Array
    root_value: jax.Array
    root_qvalues: jax.Array
    root_visits: jax.Array
    child_obs: Any = None
    child_valid: Any = None


class Node(NamedTuple):
    """The search's embedding of one state: the model's state (gymnax env state or pgx game, leaves
    ``[B, ...]``), whether its episode has terminated on the way from the root (``[B]`` bool), where
    the search records its root's children the state's observation (``[B, *obs_shape]``; else None), and
    where another network evaluates the root's children (``exact``) whether the node is the root (``[B]``
    bool; else None)."""

    state: Any
    terminal: jax.Array
    obs: Any = None
    root: Any = None


class GymnaxModel:
    """A gymnax environment as the search's model: one player, no action masks.

    Args:
      model: ``(environment, env params)`` (:attr:`accerl_jax.envs.gymnax_env.GymnaxEnv.model`).
    """

    two_player = False

    def __init__(self, model):
        self.env, self.params = model

    def step(self, keys: jax.Array, state, action: jax.Array):
        """``(next obs [B, *obs_shape] float32, state, reward [B] float32, terminated [B] bool)`` of one
        ``step_env`` (no auto-reset) from ``keys [B, 2]``, ``state`` and ``action [B]``."""
        obs, state, reward, terminated, _ = jax.vmap(self.env.step_env, in_axes=(0, 0, 0, None))(
            keys, state, action, self.params)
        return obs.astype(jnp.float32), state, reward.astype(jnp.float32), terminated

    def legal(self, state) -> None:
        """None: every action is legal."""
        return None


def search_model(model):
    """The search's model for an adapter's ``model``: a gymnax ``(environment, params)`` pair becomes a
    :class:`GymnaxModel`; a model with its own ``step``/``legal``/``two_player`` (pgx's
    :class:`~accerl_jax.envs.pgx_env.PgxModel`) is returned as it is."""
    return GymnaxModel(model) if isinstance(model, tuple) else model


def mask_logits(logits: jax.Array, legal: jax.Array | None) -> jax.Array:
    """``[B, A]`` float32 logits with illegal actions (``legal [B, A]`` bool False) at the float32 minimum
    after subtracting the max (mctx's masking), or ``logits`` unchanged for ``legal`` None."""
    if legal is None:
        return logits
    logits = logits - jnp.max(logits, axis=-1, keepdims=True)
    return jnp.where(legal, logits, jnp.finfo(logits.dtype).min)


def search_policy(apply: ApplyFn, model, settings: SearchSettings, params, obs: jax.Array, env_state,
                  key: jax.Array, record_children: bool = False, exact=None):
    """One Gumbel MuZero search from each of ``B`` states.

    Args:
      apply: the actor's network, ``(params, obs [B, *obs_shape]) -> (logits [B, A], value [B], ...)``.
      model: ``(environment, env params)`` of gymnax (:attr:`~accerl_jax.envs.gymnax_env.GymnaxEnv.model`),
        or a two-player game's model (:attr:`~accerl_jax.envs.pgx_env.PgxEnv.model`; ``settings.discount``
        is then replaced by -1 per ply, module docstring).
      settings: :class:`SearchSettings`.
      params: the actor's parameters (whatever the compressor produced).
      obs: ``[B, *obs_shape]`` float32 observations of the roots (the player to move's, in a game).
      env_state: the model states of the roots (leaves ``[B, ...]``; a pgx game's State).
      key: ``[2]`` uint32 PRNG key (Gumbel noise, the model's own randomness).
      record_children: also return the observations of the root's children as the tree holds them
        (``child_obs``, ``child_valid``: what ``--distill-children`` distils the student on). The search's
        choices are the same either way.
      exact: ``(apply, params)`` of another network (the learner's, uncompressed) that evaluates each of
        the root's ``A`` children, all expanded with the model before the search (``A`` of its evaluations
        per root: the values the root's actions are compared by, ``r + γ v(child)``, are its own where the
        tree does not go deeper); ``apply``/``params`` evaluate the root and every node below the
        children. In a one-player env with every action legal, Gumbel's first ``min(S, A, m)``
        simulations (``m``: ``settings.max_num_considered_actions``), which expand one of the root's
        children at every root, run neither the model nor ``apply``; later ones that reach a root's child
        (past ``max_depth``) and a game's evaluate ``apply`` there too, the outputs discarded.
        None: ``apply``/``params`` evaluate every node, unless ``apply`` is a
        :class:`~accerl_jax.compressor.paired.PairedApply` (``--learner-children``), whose learner's
        network on ``params`` then evaluates the children.

    Returns:
      :class:`SearchOutput` (a tuple ``(action, log_prob, action_weights, root_value, root_qvalues,
      root_visits, child_obs, child_valid)``).
    """
    model = search_model(model)
    if exact is None and isinstance(apply, PairedApply):
        exact = (apply.learner, params)
    # Two players: each node's value is its mover's, so a child's value counts negated (discount -1).
    discount = jnp.float32(-1.0 if model.two_player else settings.discount)

    evaluate = lambda p, o: _evaluate_with((apply, p), o)  # noqa: E731

    legal = model.legal(env_state)
    b = obs.shape[0]
    logits, value = evaluate(params, obs)
    at_root = children = None
    if exact is not None:
        # the search's own keys unchanged: on a deterministic model the tree is that of exact=None with
        # the exact network evaluating the root's children
        children = _expand_root(model, exact, env_state, jax.random.fold_in(key, 1), logits.shape[-1])
        at_root = jnp.ones((b,), bool)
    root = mctx.RootFnOutput(prior_logits=mask_logits(logits, legal), value=value,
                             embedding=Node(env_state, jnp.zeros((b,), bool), obs if record_children else None,
                                            at_root))

    def expanded(action):  # the root's children, expanded before the search, at action [B]
        return jax.tree.map(lambda pre: jnp.take_along_axis(
            pre, action.reshape((b, 1) + (1,) * (pre.ndim - 2)), axis=1)[:, 0], children)

    def stepped(p, rng, action, node: Node):  # the model's step and the compressed network's evaluation
        next_obs, state, reward, terminated = model.step(jax.random.split(rng, b), node.state, action)
        return (next_obs, state, reward, terminated) + evaluate(p, next_obs)

    def mixed(p, rng, action, node: Node):  # some roots' children (the exact network's), some deeper nodes
        pick = lambda pre, new: jnp.where(  # noqa: E731
            node.root.reshape((b,) + (1,) * (new.ndim - 1)), pre, new)
        return jax.tree.map(pick, expanded(action), stepped(p, rng, action, node))

    # One player, every action legal: Gumbel's first min(S, A, m) simulations each expand a root's child at
    # every root (sequential halving visits each considered action once first), which the exact network
    # evaluated before the search. They are traced apart, before mctx's loop over the rest, and run neither
    # the model nor the compressed network. (A lax.cond on "every parent is a root" made the whole search
    # 3.3x slower on XLA:CPU.) In a game the legal moves, so the first visits, vary between roots.
    first = 0 if children is None or legal is not None else settings.first_visits(logits.shape[-1])
    at_roots = [False]  # while tracing: whether the simulation being traced is one of the first

    def loop_fn(lower, upper, body, state):
        for sim in range(lower, lower + first):
            at_roots[0] = True
            state = body(sim, state)
        at_roots[0] = False
        return jax.lax.fori_loop(lower + first, upper, body, state)

    def recurrent_fn(p, rng, action, node: Node):
        next_obs, state, reward, terminated, child_logits, child_value = (
            stepped(p, rng, action, node) if children is None else
            expanded(action) if at_roots[0] else mixed(p, rng, action, node))
        ended = node.terminal | terminated  # below a terminal state nothing happens any more
        out = mctx.RecurrentFnOutput(
            reward=jnp.where(node.terminal, 0.0, reward),
            discount=jnp.where(ended, 0.0, discount),
            prior_logits=mask_logits(child_logits, model.legal(state)),
            value=jnp.where(ended, 0.0, child_value),
        )
        return out, Node(state, ended, next_obs if record_children else None,
                         None if at_root is None else jnp.zeros((b,), bool))

    out = mctx.gumbel_muzero_policy(
        params, key, root, recurrent_fn, num_simulations=settings.num_simulations, max_depth=settings.max_depth,
        loop_fn=loop_fn,
        invalid_actions=None if legal is None else jnp.logical_not(legal),
        max_num_considered_actions=settings.max_num_considered_actions, gumbel_scale=settings.gumbel_scale)
    action = out.action.astype(jnp.int32)
    weights = out.action_weights.astype(jnp.float32)
    log_prob = jnp.log(jnp.take_along_axis(weights, action[:, None], axis=1)[:, 0])
    tree = out.search_tree
    summary = tree.summary()
    child_obs = child_valid = None
    if record_children:
        index = tree.children_index[:, tree.ROOT_INDEX]  # [B, A] node of each root child, UNVISITED (-1) if none
        take = lambda x: jnp.take_along_axis(  # noqa: E731  [B, N, ...] -> [B, A, ...] at index
            x, jnp.maximum(index, 0).reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)
        expanded = index != tree.UNVISITED
        child_valid = expanded & ~take(tree.embeddings.terminal)
        child_obs = jnp.where(expanded.reshape(expanded.shape + (1,) * (obs.ndim - 1)),
                              take(tree.embeddings.obs), 0.0).astype(jnp.float32)
    return SearchOutput(action, log_prob, weights, summary.value.astype(jnp.float32),
                        summary.qvalues.astype(jnp.float32), summary.visit_counts.astype(jnp.float32),
                        child_obs, child_valid)


def _evaluate_with(network, obs: jax.Array):
    """``(logits [B, A] float32, value [B] float32)`` of ``network = (apply, params)`` at ``obs``."""
    logits, value = network[0](network[1], obs)[:2]
    return logits.astype(jnp.float32), value.astype(jnp.float32)


def _expand_root(model, exact, env_state, key: jax.Array, num_actions: int):
    """Every action of each of ``B`` roots stepped with ``model`` and evaluated by ``exact = (apply,
    params)``: ``(obs, state, reward, terminated, logits, value)``, leaves ``[B, A, ...]``."""
    b = jax.tree.leaves(env_state)[0].shape[0]
    states = jax.tree.map(lambda x: jnp.repeat(x, num_actions, axis=0), env_state)  # row b * A + a
    actions = jnp.tile(jnp.arange(num_actions, dtype=jnp.int32), b)
    obs, state, reward, terminated = model.step(jax.random.split(key, b * num_actions), states, actions)
    logits, value = _evaluate_with(exact, obs)
    return jax.tree.map(lambda x: x.reshape((b, num_actions) + x.shape[1:]),
                        (obs, state, reward, terminated, logits, value))


class SearchActor(AnakinActor):
    """:class:`~accerl_jax.actor.AnakinActor` whose every step is a :func:`search_policy` with the actor's
    parameters: the same carry, reset, env-only timing (random actions, the ceiling) and compiled
    rollout, returning a :class:`SearchRollout` ``[T, B, ...]``.

    Args:
      env: a gymnax adapter (:class:`~accerl_jax.envs.gymnax_env.GymnaxEnv`) with discrete actions, or a
        pgx one (:class:`~accerl_jax.envs.pgx_env.PgxEnv`: self-play, legal moves recorded).
      apply, rollout_length, family: as :class:`~accerl_jax.actor.AnakinActor`.
      settings: :class:`SearchSettings`.
      record_children: record each root's children's observations in the rollout
        (:attr:`SearchRollout.child_obs`, ``child_valid``; ``--distill-children``).

    Raises:
      ValueError: an env with no gymnax model (envpool) or with continuous actions.
    """

    def __init__(self, env, apply: ApplyFn, rollout_length: int, family: str = "mlp", *,
                 settings: SearchSettings = SearchSettings(), record_children: bool = False):
        if not hasattr(env, "model") or not env.info.jittable:
            raise ValueError(f"{env.info.name}: a search needs a gymnax or pgx env as its model")
        if env.info.continuous:
            raise ValueError(f"{env.info.name}: a search needs discrete actions")
        super().__init__(env, apply, rollout_length, family)
        self.settings = settings
        model = env.model
        slots = env.info.bootstrap_slots(rollout_length)

        def run(params, carry: ActorCarry):
            def step(c: ActorCarry, _):
                key, sub = jax.random.split(c.key)
                out = search_policy(apply, model, settings, params, c.obs, c.env_state.env_state, sub, record_children)
                legal = search_model(model).legal(c.env_state.env_state)
                env_state, tr = env.step(c.env_state, out.action)
                return ActorCarry(env_state, tr.obs, key), (c.obs, tr, out, legal)

            carry, (obs, tr, out, legal) = jax.lax.scan(step, carry, None, length=rollout_length)
            rollout: Rollout = rollout_from_steps(obs, out.action, out.log_prob, tr, slots)
            return carry, SearchRollout(*rollout, action_weights=out.action_weights, root_value=out.root_value,
                                        root_qvalues=out.root_qvalues, root_visits=out.root_visits,
                                        legal_actions=legal, child_obs=out.child_obs, child_valid=out.child_valid)

        self.rollout_fn = run
        self._rollout = xla.jit(run, family)


def make_search_actor(env, apply: ApplyFn, rollout_length: int, family: str = "mlp",
                      groups: Sequence[int] | None = None, mesh=None, *, settings: SearchSettings,
                      record_children: bool = False):
    """:func:`accerl_jax.actor.make_actor` for a search agent: a :class:`SearchActor`, or with ``groups`` a
    :class:`~accerl_jax.actor.ShardedActor` of such (one group's env in ``env``) placed over ``mesh``.

    Raises:
      ValueError: as :class:`SearchActor`, or groups that do not split evenly over ``mesh``.
    """
    actor = SearchActor(env, apply, rollout_length, family, settings=settings, record_children=record_children)
    # mctx's loops start from constant carries, which shard_map's varying-axes check refuses on several devices.
    return actor if groups is None else ShardedActor(actor, groups, family, mesh, check_vma=False)
