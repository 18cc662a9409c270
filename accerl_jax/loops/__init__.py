"""The training loops over the same components (docs/DESIGN.md, "Execution styles"):

* :mod:`~accerl_jax.loops.sequential` -- actor, learner and compressor as separate timed jitted calls.
* :mod:`~accerl_jax.loops.sebulba` -- envpool actor threads, the learner and a compressor thread, joined by
  a bounded queue of versioned rollouts.

Each takes a :class:`accerl_jax.run.Run` from :func:`accerl_jax.run.setup` and returns its summary.
"""
