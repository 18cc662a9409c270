"""The runs one Anakin program trains side by side (``--num-seeds``, ``--sweep``): their seeds, their
hyperparameter values and their folders.

A *replica* is one run of the vmapped program: seed ``--seed + j`` for ``j < --num-seeds`` and, with
``--sweep NAME=V1,V2,...`` (several names form a grid), one combination of the swept values. The swept
names are the learner's numeric hyperparameters that change no shape (:data:`SWEEPABLE`, the same names as
:data:`accerl_jax.learner.HYPER`): the program takes them as an input (``AnakinState.hyper``), so every
combination runs in the one compiled program. Replicas are ordered combination-major, seed-minor; each
has its own folder under the run's ``--logdir`` (``seed<j>`` without a sweep, as before;
``<name>=<value>[,<name>=<value>]-seed<j>`` with one) holding its own summary, metrics and curves.
"""
from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
from typing import NamedTuple

from accerl_jax.config import Config, ConfigError, common_name, validate

# Config field names a sweep may vary: the learner's traced hyperparameters (accerl_jax.learner.HYPER; a test
# holds the two equal, this module does not import the learner).
SWEEPABLE = ("discount", "lambda_", "clip_rho_threshold", "clip_pg_rho_threshold", "value_coef", "entropy_coef",
             "ppo_clip", "learning_rate", "max_grad_norm")
MAX_REPLICAS = 4096  # as --num-seeds


class Replica(NamedTuple):
    """One run of the vmapped program."""

    index: int  # its position on the program's run axis
    seed: int  # its --seed
    values: dict  # {Config field name: float} of the sweep's combination ({} without a sweep)
    folder: str  # its folder's name under the run's --logdir


def _name(text: str) -> str:
    name = text.strip().lstrip("-").replace("-", "_")
    return "lambda_" if name == "lambda" else name


def _format(value: float) -> str:
    return format(value, "g")


def parse_sweep(sweep) -> list[tuple[str, tuple[float, ...]]]:
    """``--sweep`` 's ``NAME=V1,V2,...`` items as ``[(Config field name, values)]`` in the order given.

    Raises:
      ConfigError: an item without ``=``, a name not in :data:`SWEEPABLE` (with the closest spelling), a
        name given twice, a value that is not a number or is given twice for its name.
    """
    out: list[tuple[str, tuple[float, ...]]] = []
    for item in sweep:
        name_text, eq, values_text = str(item).partition("=")
        if not eq or not values_text.strip():
            raise ConfigError(f"bad --sweep {item!r}; expected NAME=V1,V2,... (e.g. learning_rate=1e-3,3e-3)")
        name = _name(name_text)
        if name not in SWEEPABLE:
            close = [common_name(name)] if common_name(name) in SWEEPABLE else difflib.get_close_matches(
                name, SWEEPABLE, n=1)
            hint = f" (perhaps {close[0]})" if close else ""
            raise ConfigError(f"bad --sweep {item!r}: {name_text.strip()!r} cannot be swept{hint}; expected one of "
                              f"{', '.join(SWEEPABLE)} (numbers that change no shape)")
        if name in dict(out):
            raise ConfigError(f"bad --sweep {item!r}: {name} is swept twice; give all its values in one item")
        values = []
        for text in values_text.split(","):
            try:
                value = float(text)
            except ValueError:
                raise ConfigError(f"bad --sweep {item!r}: {text.strip()!r} is not a number") from None
            if value in values:
                raise ConfigError(f"bad --sweep {item!r}: the value {text.strip()} is given twice")
            values.append(value)
        out.append((name, tuple(values)))
    return out


def check_sweep(cfg: Config) -> None:
    """The checks of ``--sweep`` that the settings alone decide: its items parse (:func:`parse_sweep`),
    every swept value is one its flag accepts (:func:`accerl_jax.config.validate`), the grid has at least
    two combinations and at most :data:`MAX_REPLICAS` replicas with ``--num-seeds``.

    Raises:
      ConfigError: naming the bad item or value and what is accepted.
    """
    grid = parse_sweep(cfg.sweep)
    if not grid:
        return
    for name, values in grid:
        for value in values:
            try:
                validate(dataclasses.replace(cfg, sweep=(), **{name: value}))
            except ConfigError as err:
                raise ConfigError(f"bad --sweep {name}={','.join(map(_format, values))}: {err}") from None
    combos = math.prod(len(v) for _, v in grid)
    if combos < 2:
        raise ConfigError(f"bad --sweep {' '.join(cfg.sweep)}: one combination; a sweep takes at least two values "
                          "(to set one value, give its own flag)")
    if combos * cfg.num_seeds > MAX_REPLICAS:
        raise ConfigError(f"bad --sweep {' '.join(cfg.sweep)} with --num-seeds {cfg.num_seeds}: "
                          f"{combos * cfg.num_seeds} runs; expected at most {MAX_REPLICAS}")


def replicas(cfg: Config) -> list[Replica]:
    """The runs of ``cfg``'s program, combination-major, seed-minor (module docstring)."""
    grid = parse_sweep(cfg.sweep)
    names = [name for name, _ in grid]
    combos = [dict(zip(names, values)) for values in itertools.product(*(v for _, v in grid))] or [{}]
    out = []
    for combo in combos:
        for j in range(cfg.num_seeds):
            out.append(Replica(len(out), cfg.seed + j, combo, folder(combo, j)))
    return out


def folder(values: dict, j: int) -> str:
    """The folder of the run with swept ``values`` (``{name: float}``, {} without a sweep) and seed index
    ``j``: ``seed<j>``, or ``<name>=<value>[,<name>=<value>]-seed<j>``."""
    label = ",".join(f"{k}={_format(v)}" for k, v in values.items())
    return f"{label}-seed{j}" if values else f"seed{j}"


def count(cfg: Config) -> int:
    """How many runs ``cfg``'s program trains side by side (its leading state axis when above 1)."""
    return len(replicas(cfg))


def replica_config(cfg: Config, replica: Replica) -> Config:
    """``cfg`` as the one run ``replica`` is: its seed and swept values, no sweep (``num_seeds`` kept, as a
    seed's own summary has it)."""
    return dataclasses.replace(cfg, seed=replica.seed, sweep=(), **replica.values)
