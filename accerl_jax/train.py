"""Command line: ``python -m accerl_jax.train [--env ...] [--compressor ...] ...``; ``--help`` lists all flags.

Bad settings exit with status 2 and a message naming the bad value (no traceback), before anything is
written. Ctrl-C stops training, writes the summary of what ran, and exits with status 130; a run whose
loss became non-finite writes its summary and exits with status 1.
"""
from __future__ import annotations

import sys

import tyro

from accerl_jax.config import Config, ConfigError


def main(argv: list[str] | None = None) -> int:
    cfg = tyro.cli(Config, args=argv, prog="python -m accerl_jax.train")
    from accerl_jax.loop import train  # heavy imports after --help has been served
    from accerl_jax.monitor import print_summary

    try:
        summary = train(cfg)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted before the first update finished; nothing to summarise (the log folder was freed)",
              file=sys.stderr)
        return 130
    print_summary(summary)
    print(f"outputs (summary.json, metrics.csv, curves.png, TensorBoard events): {summary['logdir']}")
    if summary["stopped"] == "interrupted":
        print("interrupted: the summary covers the updates that ran", file=sys.stderr)
        return 130
    if summary["stopped"] == "diverged":
        print("error: training diverged (non-finite loss); try a lower --learning-rate, or smaller loss "
              "coefficients or --distill-learning-rate", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
