"""Seeds of environments and keys, derived from a seed: training's (:func:`envpool_seed`) and evaluation's
(:func:`eval_envpool_seed`, :func:`eval_key`), disjoint from every training run's.

Imports nothing of JAX at import time, so that the plan can check the seeds before a multi-host process
joins its run (importing gymnax, hence ``accerl_jax.envs``, starts JAX's backend).

Training seeds envpool's environments in ``[0, 2^31)`` and draws its PRNG keys from ``PRNGKey(seed)``:
``split(., 3)`` for the network, compressor and actor (the actor's groups ``fold_in(actor_key, g)``), and
``fold_in(., LEARNER_STREAM)`` for the learner (:mod:`accerl_jax.learner`). Evaluation (its video is one
of its episodes) and export's held observations (``accerl_jax.evaluate``, ``accerl_jax.export``) seed
envpool below zero, and draw every key from ``fold_in(PRNGKey(seed), EVAL_STREAM)``: an evaluation with
``--seed S`` replays no environment and no key of a training run of any seed.
"""
from __future__ import annotations

import enum

MAX_ENV_SEED = 2**31 - 1  # envpool's seed is a C++ int


def envpool_seed(run_seed: int, total_envs: int, first_env: int = 0) -> int:
    """The ``seed`` argument of the envpool pool whose first environment is environment ``first_env`` of a run.

    envpool seeds the ``i``-th environment of a pool with ``seed + i``; with this base, environment ``g``
    (``0 <= g < total_envs``, counted over all of the run's pools: every Sebulba thread's and every
    process's) is seeded ``run_seed * total_envs + g``. Runs with distinct ``--seed`` values thus get
    disjoint blocks ``[s * G, (s + 1) * G)`` of env seeds, and the ``--num-seeds`` replicas ``seed + k``
    do too.

    Args:
      run_seed: the run's ``--seed`` (``>= 0``).
      total_envs: ``G``, the run's environments over all pools and processes.
      first_env: the pool's first environment, in ``[0, G)``.

    Raises:
      ValueError: if the block's last seed ``(run_seed + 1) * G - 1`` passes :data:`MAX_ENV_SEED`.
    """
    if (run_seed + 1) * total_envs - 1 > MAX_ENV_SEED:
        raise ValueError(f"bad --seed {run_seed} with {total_envs} envpool environments: environment g is seeded "
                         f"seed x {total_envs} + g, which passes envpool's largest seed 2^31 - 1; use a --seed "
                         f"below {(MAX_ENV_SEED + 1) // total_envs}")
    return run_seed * total_envs + first_env


# Evaluation's stream of a seed: fold_in(PRNGKey(seed), EVAL_STREAM), apart from training's split(., 3)
# (counters 0..5) and the learner's fold_in(., LEARNER_STREAM).
EVAL_STREAM = 0x45564C


class EvalUse(enum.IntEnum):
    """What an evaluation key is for: ``eval_key(seed, use)`` is ``fold_in(fold_in(PRNGKey(seed), EVAL_STREAM), use)``."""

    EPISODES_RESET = 0  # evaluate (and its --video, one of its episodes): the fresh envs' reset (gymnax)
    EPISODES_ACTIONS = 1  # evaluate: the sampled actions
    HELD_RESET = 2  # export: the envs whose observations the KL/agreement are measured on
    HELD_ACTIONS = 3
    EXPORT_CHECK = 4  # export: the key the exported program is checked against the framework with
    MATCHES = 5  # evaluate of a two-player game: the matches against the fixed opponents (accerl_jax.search.matches)


def eval_envpool_seed(eval_seed: int, num_envs: int) -> int:
    """The ``seed`` argument of an evaluation's envpool pool of ``num_envs`` environments.

    Environment ``i`` of the pool is seeded ``-(eval_seed + 1) * num_envs + i``: evaluation seeds
    ``0, 1, ...`` get the blocks ``[-B, 0)``, ``[-2B, -B)``, ..., all below zero, where no training run's
    environment is (:func:`envpool_seed` gives ``[0, 2^31)``). envpool 1.2.5 takes negative seeds.

    Args:
      eval_seed: evaluation's ``--seed`` (``>= 0``).
      num_envs: ``B``, the pool's environments.

    Raises:
      ValueError: if the block's lowest seed ``-(eval_seed + 1) * B`` is below envpool's ``-2^31``.
    """
    if (eval_seed + 1) * num_envs > MAX_ENV_SEED + 1:
        raise ValueError(f"bad --seed {eval_seed} with {num_envs} envs: evaluation seeds environment i with "
                         f"-(seed + 1) x {num_envs} + i, which passes envpool's smallest seed -2^31; use a --seed "
                         f"below {(MAX_ENV_SEED + 1) // num_envs}")
    return -(eval_seed + 1) * num_envs


def eval_key(eval_seed: int, use: EvalUse):
    """The PRNG key of evaluation ``use`` for evaluation's ``--seed``: ``fold_in(fold_in(PRNGKey(eval_seed),
    EVAL_STREAM), use)``, ``[2]`` uint32 (module docstring)."""
    import jax  # here, not at import: see the module docstring

    return jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(eval_seed), EVAL_STREAM), int(use))
