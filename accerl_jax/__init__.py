"""accerl_jax: AcceRL (arXiv 2211.15023) in JAX.

Components (docs/DESIGN.md): Actor (:mod:`accerl_jax.actor`), Compressor (:mod:`accerl_jax.compressor`),
Corrector (:mod:`accerl_jax.corrector`), Learner (:mod:`accerl_jax.learner`), Monitor
(:mod:`accerl_jax.monitor`); the loop that wires them is :mod:`accerl_jax.loop`, the CLI
:mod:`accerl_jax.train`.
"""

import time as _time

__version__ = "0.1.0"
IMPORTED_AT = _time.perf_counter()  # accerl_jax.clock.process_age's origin where /proc is missing
