"""The command-line reference (docs/CLI.md), generated from the real parsers' ``--help``.

``python -m accerl_jax.tools.cli_reference > docs/CLI.md`` writes it; ``tests/test_cli_reference.py`` fails when
the committed file differs from what this produces now. Each command's ``--help`` runs in a subprocess at a
fixed terminal width (:data:`COLUMNS`), so the text does not depend on the terminal that regenerates it.
"""
from __future__ import annotations

import os
import subprocess
import sys

COLUMNS = 100
# (module, what it does, also installed as)
COMMANDS = (
    ("accerl_jax.train", "train a run", "accerl-train"),
    ("accerl_jax.evaluate", "play a trained run's policy on fresh episodes", None),
    ("accerl_jax.export", "export a trained run's policy as a plain-JAX program", None),
    ("accerl_jax.plot", "plot run folders' curves", None),
)
REGENERATE = "python -m accerl_jax.tools.cli_reference > docs/CLI.md"


# The flag that prints a command's whole reference (training's --help shows only the common flags).
FULL_HELP = {"accerl_jax.train": "--help-all"}


def help_text(module: str) -> str:
    """``python -m <module> --help`` (``--help-all`` where :data:`FULL_HELP` says) at :data:`COLUMNS`
    columns, without colours or trailing blanks."""
    env = dict(os.environ, COLUMNS=str(COLUMNS), NO_COLOR="1", TERM="dumb")
    env.pop("FORCE_COLOR", None)
    out = subprocess.run([sys.executable, "-m", module, FULL_HELP.get(module, "--help")], env=env, capture_output=True, text=True,
                         check=True).stdout
    return "\n".join(line.rstrip() for line in out.strip("\n").splitlines())


def markdown() -> str:
    """docs/CLI.md: one section per command, its whole ``--help`` (:func:`help_text`) verbatim."""
    parts = ["# Command-line reference", "",
             f"Generated from each command's `--help` (training's `--help-all`) by `{REGENERATE}` ({COLUMNS} columns); do not edit "
             "by hand. Flags given later on a command line override earlier ones; for training, the order "
             "of precedence is defaults < `--preset` < `--config` < flags.", ""]
    for module, what, script in COMMANDS:
        also = f" (installed also as `{script}`)" if script else ""
        parts += [f"## `python -m {module}`", "", f"{what[0].upper()}{what[1:]}{also}.", "", "```text",
                  help_text(module), "```", ""]
    return "\n".join(parts)


def main() -> int:
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
