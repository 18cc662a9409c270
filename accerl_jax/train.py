"""Command line: ``python -m accerl_jax.train [--env ...] [--compressor ...] ...``; ``--help`` lists all flags.

Bad settings exit with status 2 and a one-line message (no traceback), before anything is written.
"""
from __future__ import annotations

import sys

import tyro

from accerl_jax.config import Config


def main(argv: list[str] | None = None) -> int:
    cfg = tyro.cli(Config, args=argv, prog="python -m accerl_jax.train")
    from accerl_jax.loop import train  # heavy imports after --help has been served
    from accerl_jax.monitor import print_summary

    try:
        summary = train(cfg)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print_summary(summary)
    print(f"outputs (summary.json, metrics.csv, TensorBoard events): {summary['logdir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
