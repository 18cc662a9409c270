"""One training run's life (docs/DESIGN.md, "One run lifecycle"):

* :mod:`~accerl_jax.run.plan` -- ``make_plan``: every check of the settings and every decision, before a
  file is written;
* :mod:`~accerl_jax.run.build` -- ``setup``: the plan, then the run it describes (networks, compressor,
  learner, devices, the folder claimed, a checkpoint restored);
* :mod:`~accerl_jax.run.driver` -- ``Driver``: the one writer of Monitor rows, checkpoints and the summary
  around a stepper (:mod:`accerl_jax.loops`);
* :mod:`~accerl_jax.run.training` -- :func:`~accerl_jax.run.training.run_training`, the whole run
  (``accerl_jax.run_training``);
* the run's parts: its folder (:mod:`~accerl_jax.run.folder`), checkpoints
  (:mod:`~accerl_jax.run.checkpoint`), the non-finite guard (:mod:`~accerl_jax.run.guard`), signals
  (:mod:`~accerl_jax.run.signals`), several processes (:mod:`~accerl_jax.run.distributed`) and the
  learner batch over devices (:mod:`~accerl_jax.run.shards`).

This file imports nothing, so that importing one of them stays cheap.
"""
