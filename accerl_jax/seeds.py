"""Seeds of envpool environments, derived from the run's seed. Imports nothing of JAX, so that the plan can
check them before a multi-host process joins its run (importing gymnax, hence ``accerl_jax.envs``,
starts JAX's backend)."""
from __future__ import annotations

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
