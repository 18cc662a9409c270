"""The Anakin loop's state: a new run's (:func:`initial_state`), a resumed run's (:func:`restored_state`),
where it is placed (:func:`place_state`: one process's devices, or global arrays over every process's),
and this process's view of it for host code (:func:`local_view`)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from accerl_jax import learner as learner_lib
from accerl_jax import networks
from accerl_jax import normalize
from accerl_jax.platform import xla
from accerl_jax.run import replicas
from accerl_jax.run.guard import FINITE
from accerl_jax.loops.anakin_program import AnakinState, normalizing, state_sharding
from accerl_jax.loops.shared import learner_update, resumed_carry
from accerl_jax.run.build import Run, policy_versions


def initial_state(run: Run, seed: int, values: dict | None = None) -> AnakinState:
    """A new run's state for ``seed``, with the keys :func:`accerl_jax.run.build.setup` derives from it, and
    its hyperparameters (:func:`hyper_values`: the run's, ``values`` in place of theirs, a sweep's replica's).

    With several processes it is built by one jitted program over the global mesh (every process runs
    it), so its arrays are global, placed as :func:`state_sharding` ``(run)`` says. Its pieces (network,
    optimiser and student initialisation) compile with :func:`accerl_jax.platform.xla.one_shot_options`: each runs
    once."""
    if run.plan.num_processes > 1:
        return jax.jit(lambda: _initial_state(run, seed, values), out_shardings=state_sharding(run),
                       compiler_options=xla.one_shot_options(run.plan.spec.family))()
    return _initial_state(run, seed, values)


def _initial_state(run: Run, seed: int, values: dict | None) -> AnakinState:
    cfg = run.cfg
    k_net, k_comp, k_actor = jax.random.split(jax.random.PRNGKey(seed), 3)
    params = networks.init_params(run.plan.spec, k_net)
    carry = run.actor.reset(k_actor)
    actor_params, comp_state = run.compressor.init(params, k_comp, carry.obs)  # first obs calibrate int8
    lag = cfg.policy_lag + 1
    batch = run.info.num_envs * run.plan.num_processes  # the global batch
    obs = jnp.zeros((cfg.rollout_length * batch,) + tuple(run.info.obs_shape), carry.obs.dtype)
    zero = jnp.zeros((), jnp.int32)
    learner = learner_lib.init_state(params, run.optimizer, run.mesh, key=learner_lib.learner_key(seed))
    normalizer = (normalize.init_state(run.info.obs_shape, batch, cfg.normalize_observations, cfg.normalize_rewards)
                  if normalizing(run) else None)
    return AnakinState(learner, (actor_params,) * lag, jnp.zeros((lag,), jnp.int32), comp_state, carry, obs, zero, zero,
                       zero, zero,
                       jnp.full((), FINITE, jnp.int32), normalizer, hyper_values(run, values))


def hyper_values(run: Run, values: dict | None = None) -> dict:
    """The run's learner hyperparameters as ``{name: [] float32}`` (the update's defaults,
    :func:`accerl_jax.learner.default_hyper`, with ``values`` in place of theirs: a sweep's replica's): the
    Anakin program's input, not its constants. None for an update that names none (a hand-made one: its
    values stay its constants)."""
    hyper = getattr(learner_update(run), "hyper", None)
    if hyper is None:
        return None
    return {k: jnp.asarray(np.float32((values or {}).get(k, v))) for k, v in hyper.items()}


def replica_states(run: Run) -> AnakinState:
    """A new run's state for every replica (:mod:`accerl_jax.run.replicas`: ``--num-seeds``, ``--sweep``),
    stacked along a leading replica axis when there are several: replica ``k`` starts as a run of its
    seed and its swept values alone would."""
    return _stacked([initial_state(run, r.seed, r.values) for r in replicas.replicas(run.cfg)])


def _stacked(trees: list):
    """One replica's tree as it is; several stacked along a new leading replica axis."""
    return trees[0] if len(trees) == 1 else jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def restored_state(run: Run, skipped) -> AnakinState:
    """The state of a ``--resume`` checkpoint: its (trimmed) lagged parameter sets padded to
    ``--policy-lag + 1`` by repeating the oldest, as a new run starts."""
    cfg, completed = run.cfg, run.start_update
    learner, lagged, comp_state, carry, normalizer = run.restored
    carry = resumed_carry(run, carry)  # host (envpool) envs restart; the actor's key continues
    lag = cfg.policy_lag + 1
    lagged = (lagged[0],) * (lag - len(lagged)) + tuple(lagged)
    versions = jnp.asarray(policy_versions(completed, lag, cfg.compress_every), jnp.int32)
    seeds = replicas.count(cfg)
    batch = run.info.num_envs * run.plan.num_processes  # the global batch
    obs = jnp.zeros((cfg.rollout_length * batch,) + tuple(run.info.obs_shape), carry.obs.dtype)

    def per_seed(x):
        return jnp.broadcast_to(x, (seeds,) + x.shape) if seeds > 1 else x

    return AnakinState(learner, lagged, per_seed(versions), comp_state, carry, per_seed(obs),
                       per_seed(jnp.int32(completed)), jnp.asarray(skipped, jnp.int32),
                       per_seed(jnp.int32(0)), per_seed(jnp.int32(0)), per_seed(jnp.int32(FINITE)), normalizer,
                       _replica_hyper(run))


def _replica_hyper(run: Run):
    """Each replica's hyperparameters (:func:`hyper_values`), stacked along the replica axis when there
    are several."""
    hypers = [hyper_values(run, r.values) for r in replicas.replicas(run.cfg)]
    return None if hypers[0] is None else _stacked(hypers)


def place_state(run: Run, state: AnakinState) -> AnakinState:
    """``state`` placed where the loop starts from. One process: replicated on its devices
    (:func:`state_sharding` ``()``; the first chunk moves the carry to the run's own sharding). Several
    processes: global arrays as :func:`state_sharding` ``(run)`` says; a leaf that is not yet global
    (a restored checkpoint's, the same on every process) is cut into each device's slice
    (:func:`jax.make_array_from_callback`)."""
    if run.plan.num_processes == 1:
        return jax.device_put(state, state_sharding())

    def place(sharding, x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return x
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(lambda s, sub: jax.tree.map(lambda x: place(s, x), sub), state_sharding(run), state,
                        is_leaf=lambda x: isinstance(x, NamedSharding))


def local_view(tree):
    """``tree`` with each global replicated array (a multi-host run's) replaced by this process's copy,
    for host code that runs on one process only (measurements, the summary); other leaves unchanged."""
    def local(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if not x.is_fully_replicated:
                raise ValueError(f"a {x.shape} array sharded over several processes has no local copy")
            return x.addressable_data(0)
        return x

    return jax.tree.map(local, tree)
