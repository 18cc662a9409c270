"""Measurements of accerl_jax; they import the package, never the reverse (``python -m experiments.bench``)."""
