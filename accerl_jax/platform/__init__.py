"""Helpers below the components: XLA settings and workarounds (:mod:`~accerl_jax.platform.xla`), modules
imported on first use (:mod:`~accerl_jax.platform.lazy`), the process clock and stage timing
(:mod:`~accerl_jax.platform.clock`), XLA's persistent compilation cache
(:mod:`~accerl_jax.platform.compile_cache`), forward-pass timing (:mod:`~accerl_jax.platform.speed`) and
the cost split of an update (:mod:`~accerl_jax.platform.cost`).

They import nothing else of accerl_jax but each other (docs/DESIGN.md, "Layout"); this file imports
nothing, so that importing one of them stays cheap.
"""
