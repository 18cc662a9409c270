"""What the commands (``python -m accerl_jax.train``, ``.evaluate``, ``.export``, ``.plot``) share: the
command line's flags and run folders (:mod:`~accerl_jax.tools.cli`), presets and settings files
(:mod:`~accerl_jax.tools.presets`), a trained run read back from its folder
(:mod:`~accerl_jax.tools.trained`), episode videos (:mod:`~accerl_jax.tools.video`) and the generated
flag reference, docs/CLI.md (``python -m accerl_jax.tools.cli_reference``).

This file imports nothing, so that importing one of them stays cheap.
"""
