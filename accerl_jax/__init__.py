"""accerl_jax: AcceRL (arXiv 2211.15023) in JAX.

The five components (docs/DESIGN.md), each findable by name here:

* **Actor** -- :class:`Actor` (protocol), :func:`make_actor` (:mod:`accerl_jax.actor`);
* **Compressor** -- :class:`Compressor` ``(init, compress)``, :func:`make_compressor`,
  :func:`register_compressor`, :func:`chain` (:mod:`accerl_jax.compressor`);
* **Corrector** -- pure functions :func:`vtrace`, :func:`retrace`, :func:`importance_sampling`, chosen by
  name with :func:`correct` from :data:`CORRECTORS` (:mod:`accerl_jax.corrector`);
* **Learner** -- :class:`Learner` ``(init, update)``, :func:`make_learner`, :class:`LossConfig`
  (:mod:`accerl_jax.learner`);
* **Monitor** -- :class:`Monitor` (:mod:`accerl_jax.monitor`).

Between them: :class:`Rollout` (:mod:`accerl_jax.types`), and the environments :func:`make_env` and
:func:`register_env` (:mod:`accerl_jax.envs`).

A whole run: :func:`run_training` of a :class:`Config` returns the run's summary
(:mod:`accerl_jax.run.training`); the command line is ``python -m accerl_jax.train``. The rest of the
package (docs/DESIGN.md, "Layout"): :mod:`accerl_jax.run` (one run's life: plan, build, driver, folder,
checkpoints), :mod:`accerl_jax.loops` (the steppers), :mod:`accerl_jax.platform` (XLA and timing
helpers) and :mod:`accerl_jax.tools` (what the commands share). The names load on first use, so
``import accerl_jax`` stays cheap.
"""

import importlib as _importlib
import time as _time

__version__ = "0.1.0"
IMPORTED_AT = _time.perf_counter()  # accerl_jax.platform.clock.process_age's origin where /proc is missing

# Public name -> the module that defines it (loaded at the name's first use: PEP 562).
_EXPORTS = {
    # Actor
    "Actor": "accerl_jax.actor",
    "ActorCarry": "accerl_jax.actor",
    "make_actor": "accerl_jax.actor",
    # Compressor
    "Compressor": "accerl_jax.compressor",
    "make_compressor": "accerl_jax.compressor",
    "register_compressor": "accerl_jax.compressor",
    "chain": "accerl_jax.compressor",
    # Corrector
    "CORRECTORS": "accerl_jax.corrector",
    "correct": "accerl_jax.corrector",
    "vtrace": "accerl_jax.corrector",
    "retrace": "accerl_jax.corrector",
    "importance_sampling": "accerl_jax.corrector",
    # Learner
    "Learner": "accerl_jax.learner",
    "LearnerState": "accerl_jax.learner",
    "LossConfig": "accerl_jax.learner",
    "make_learner": "accerl_jax.learner",
    # Monitor
    "Monitor": "accerl_jax.monitor",
    # What flows between them, and the environments
    "Rollout": "accerl_jax.types",
    "make_env": "accerl_jax.envs",
    "register_env": "accerl_jax.envs",
    # A whole run
    "Config": "accerl_jax.config",
    "ConfigError": "accerl_jax.config",
    "run_training": "accerl_jax.run.training",
    "run_training_result": "accerl_jax.run.training",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'accerl_jax' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
