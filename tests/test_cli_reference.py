"""docs/CLI.md is what ``python -m accerl_jax.tools.cli_reference`` writes from the commands' real ``--help``: a
flag added, renamed or re-documented without regenerating the reference fails here."""
from __future__ import annotations

import os

import pytest

from accerl_jax.tools import cli_reference

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def reference() -> str:
    """What the generator writes now (four --help subprocesses: made once for the module's tests)."""
    return cli_reference.markdown()


def test_committed_cli_reference_is_current(reference):
    with open(os.path.join(REPO, "docs", "CLI.md"), encoding="utf-8") as f:
        committed = f.read()
    assert committed == reference, (
        f"docs/CLI.md is out of date with the commands' --help; regenerate it with: {cli_reference.REGENERATE}")


def test_every_command_is_in_the_reference(reference):
    text = reference
    for module, _, _ in cli_reference.COMMANDS:
        assert f"usage: python -m {module}" in text


def test_no_command_shows_tyro_none_artefacts(reference):
    text = reference
    for artefact in ("{None}", "None|", "(default: None)"):
        assert artefact not in text, f"{artefact!r} in some command's --help"
