"""docs/CLI.md is what ``python -m accerl_jax.cli_reference`` writes from the commands' real ``--help``: a
flag added, renamed or re-documented without regenerating the reference fails here."""
from __future__ import annotations

import os

from accerl_jax import cli_reference

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_committed_cli_reference_is_current():
    with open(os.path.join(REPO, "docs", "CLI.md"), encoding="utf-8") as f:
        committed = f.read()
    assert committed == cli_reference.markdown(), (
        f"docs/CLI.md is out of date with the commands' --help; regenerate it with: {cli_reference.REGENERATE}")


def test_every_command_is_in_the_reference():
    text = cli_reference.markdown()
    for module, _, _ in cli_reference.COMMANDS:
        assert f"usage: python -m {module}" in text


def test_no_command_shows_tyro_none_artefacts():
    text = cli_reference.markdown()
    for artefact in ("{None}", "None|", "(default: None)"):
        assert artefact not in text, f"{artefact!r} in some command's --help"
